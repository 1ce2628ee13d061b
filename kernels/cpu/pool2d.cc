// max_pool2d, avg_pool2d (NCHW) and their backward ops; windows and divisors
// follow torch.nn.functional.{max,avg}_pool2d with ceil_mode=False.
//
// Threads: parallel over the N*C planes; each plane is read and written by
// one thread only, so the backward scatter-adds need no synchronization.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/nn_kernel_util.h"
#include "kernels/pool2d_attrs.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

using nn_kernels::InitFactory;
using nn_kernels::MinChunk;

using pool2d::PoolAttrs;
using pool2d::PoolGeometry;

// The input span of one output index along one dim, clipped to the input:
// [lo, hi), and its length counting padding (for torch's count_include_pad divisor).
struct Span {
  int64_t lo, hi, padded;
};

std::vector<Span> Spans(int64_t out, int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  std::vector<Span> spans(out);
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = o * stride - pad, end = std::min(start + kernel, in + pad);
    spans[o] = {std::max<int64_t>(start, 0), std::min(end, in), end - start};
  }
  return spans;
}

// The window of output (oh, ow), clipped to the input: rows [h0, h1), cols [w0, w1).
struct Window {
  int64_t h0, h1, w0, w1;
  int64_t padded_size;  // window area counting padding

  // avg_pool2d's divisor: the clipped area when exclusive, else the padded one (torch).
  int64_t divisor(bool exclusive) const { return exclusive ? (h1 - h0) * (w1 - w0) : padded_size; }
};

// Every output's window, from spans computed once per call rather than per output.
class Windows {
 public:
  explicit Windows(const PoolGeometry& g)
      : rows_(Spans(g.ho, g.h, g.kh, g.sh, g.ph)), cols_(Spans(g.wo, g.w, g.kw, g.sw, g.pw)) {}
  Window at(int64_t oh, int64_t ow) const {
    const Span& r = rows_[oh];
    const Span& c = cols_[ow];
    return {r.lo, r.hi, c.lo, c.hi, r.padded * c.padded};
  }
  // Calls fn(o, window) for every output o = oh * Wo + ow of a plane, in order.
  template <typename F>
  void ForEach(F&& fn) const {
    const int64_t wo = static_cast<int64_t>(cols_.size());
    for (int64_t oh = 0; oh < static_cast<int64_t>(rows_.size()); ++oh) {
      for (int64_t ow = 0; ow < wo; ++ow) fn(oh * wo + ow, at(oh, ow));
    }
  }

 private:
  std::vector<Span> rows_, cols_;
};

// Calls fn(plane) for the N*C planes, in parallel chunks.
template <typename F>
void ForEachPlane(const PoolGeometry& g, F&& fn) {
  ParallelFor(g.planes, MinChunk(g.h * g.w + g.ho * g.wo * g.kh * g.kw), [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl) fn(pl);
  });
}

// Index in the plane of the window's maximum: the first one, NaN winning (as torch).
template <typename T>
inline int64_t ArgMax(const T* plane, int64_t width, const Window& win) {
  int64_t best = win.h0 * width + win.w0;
  T best_value = -std::numeric_limits<T>::infinity();
  for (int64_t h = win.h0; h < win.h1; ++h) {
    for (int64_t w = win.w0; w < win.w1; ++w) {
      const T v = plane[h * width + w];
      if (v > best_value || std::isnan(v)) {
        best_value = v;
        best = h * width + w;
      }
    }
  }
  return best;
}

// The window's maximum, NaN winning: the value at ArgMax, without tracking an index.
template <typename T>
inline T MaxValue(const T* plane, int64_t width, const Window& win) {
  T best = -std::numeric_limits<T>::infinity();
  for (int64_t h = win.h0; h < win.h1; ++h) {
    const T* row = plane + h * width;
    for (int64_t w = win.w0; w < win.w1; ++w) best = (row[w] > best || std::isnan(row[w])) ? row[w] : best;
  }
  return best;
}

// Fast path for 2x2 windows at stride 2 without padding (the usual
// downsampling layer): disjoint windows, so one branch-free pass per pair of
// input rows, four outputs at a time with SSE2 for F32. It picks exactly what
// MaxValue / ArgMax pick, NaN and ties included.
bool IsDisjoint2x2(const PoolGeometry& g) {
  return g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0;
}

// One step of the window scan in ArgMax / MaxValue: v replaces the best so far
// when larger or NaN.
template <typename T>
inline bool MaxTakes(T best, T v) {
  return (v > best) | (v != v);
}

#if defined(__SSE2__)
// Lane masks of MaxTakes, and a lane-wise mask ? a : b.
inline __m128 MaxTakes4(__m128 best, __m128 v) { return _mm_or_ps(_mm_cmpgt_ps(v, best), _mm_cmpunord_ps(v, v)); }
inline __m128 Select4(__m128 mask, __m128 a, __m128 b) { return _mm_or_ps(_mm_and_ps(mask, a), _mm_andnot_ps(mask, b)); }

// The four window elements (top-left a, top-right b, bottom-left c,
// bottom-right d) of outputs [ow, ow + 4), split out of two input rows.
struct Windows4 {
  __m128 a, b, c, d;
  Windows4(const float* r0, const float* r1, int64_t ow) {
    const __m128 x0 = _mm_loadu_ps(r0 + 2 * ow), x1 = _mm_loadu_ps(r0 + 2 * ow + 4);
    const __m128 y0 = _mm_loadu_ps(r1 + 2 * ow), y1 = _mm_loadu_ps(r1 + 2 * ow + 4);
    a = _mm_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
    b = _mm_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
    c = _mm_shuffle_ps(y0, y1, _MM_SHUFFLE(2, 0, 2, 0));
    d = _mm_shuffle_ps(y0, y1, _MM_SHUFFLE(3, 1, 3, 1));
  }
};
#endif

// out [Ho, Wo] = max of each 2x2 window of plane [H, W] (row length w).
template <typename T>
void MaxPool2x2Plane(const T* plane, int64_t w, int64_t ho, int64_t wo, T* out) {
  for (int64_t oh = 0; oh < ho; ++oh) {
    const T* r0 = plane + 2 * oh * w;
    const T* r1 = r0 + w;
    T* o = out + oh * wo;
    int64_t ow = 0;
#if defined(__SSE2__)
    if constexpr (std::is_same_v<T, float>) {
      // Outputs [ow, ow + 4) read columns up to 2 * ow + 7 < 2 * wo <= w.
      auto four = [&](int64_t ow) {
        const Windows4 v(r0, r1, ow);
        __m128 best = v.a;
        best = Select4(MaxTakes4(best, v.b), v.b, best);
        best = Select4(MaxTakes4(best, v.c), v.c, best);
        best = Select4(MaxTakes4(best, v.d), v.d, best);
        _mm_storeu_ps(o + ow, best);
      };
      for (; ow + 4 <= wo; ow += 4) four(ow);
      // A ragged end redoes the last four outputs (same values) rather than
      // going scalar.
      if (ow < wo && wo >= 4) {
        four(wo - 4);
        ow = wo;
      }
    }
#endif
    for (; ow < wo; ++ow) {
      // MaxValue starts from -inf, and max(-inf, a) is a bit for bit.
      T best = r0[2 * ow];
      const T b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
      best = MaxTakes(best, b) ? b : best;
      best = MaxTakes(best, c) ? c : best;
      best = MaxTakes(best, d) ? d : best;
      o[ow] = best;
    }
  }
}

// dx [H, W] of one plane: each dy to its 2x2 window's ArgMax, zero elsewhere
// (written as 0 + dy, the sum the generic scatter-add computes).
template <typename T>
void MaxPool2x2GradPlane(const T* plane, const T* grad, int64_t h, int64_t w, int64_t ho, int64_t wo, T* dx) {
  for (int64_t oh = 0; oh < ho; ++oh) {
    const T* r0 = plane + 2 * oh * w;
    const T* r1 = r0 + w;
    const T* gr = grad + oh * wo;
    T* d0 = dx + 2 * oh * w;
    T* d1 = d0 + w;
    int64_t ow = 0;
#if defined(__SSE2__)
    if constexpr (std::is_same_v<T, float>) {
      const __m128 zero = _mm_setzero_ps();
      auto four = [&](int64_t ow) {
        const Windows4 v(r0, r1, ow);
        const __m128 tb = MaxTakes4(v.a, v.b);
        const __m128 best_ab = Select4(tb, v.b, v.a);
        const __m128 tc = MaxTakes4(best_ab, v.c);
        const __m128 td = MaxTakes4(Select4(tc, v.c, best_ab), v.d);
        const __m128 g = _mm_add_ps(zero, _mm_loadu_ps(gr + ow));
        // The last element taken wins: d if td, else c if tc, else b if tb, else a.
        const __m128 gd = _mm_and_ps(td, g);
        const __m128 gc = _mm_andnot_ps(td, _mm_and_ps(tc, g));
        const __m128 gb = _mm_andnot_ps(_mm_or_ps(tc, td), _mm_and_ps(tb, g));
        const __m128 ga = _mm_andnot_ps(_mm_or_ps(tb, _mm_or_ps(tc, td)), g);
        _mm_storeu_ps(d0 + 2 * ow, _mm_unpacklo_ps(ga, gb));
        _mm_storeu_ps(d0 + 2 * ow + 4, _mm_unpackhi_ps(ga, gb));
        _mm_storeu_ps(d1 + 2 * ow, _mm_unpacklo_ps(gc, gd));
        _mm_storeu_ps(d1 + 2 * ow + 4, _mm_unpackhi_ps(gc, gd));
      };
      for (; ow + 4 <= wo; ow += 4) four(ow);
      // As in the forward pass: plain stores, so redoing outputs is harmless.
      if (ow < wo && wo >= 4) {
        four(wo - 4);
        ow = wo;
      }
    }
#endif
    for (; ow < wo; ++ow) {
      const T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
      T best = a;
      int taken = 0;
      if (MaxTakes(best, b)) {
        best = b;
        taken = 1;
      }
      if (MaxTakes(best, c)) {
        best = c;
        taken = 2;
      }
      if (MaxTakes(best, d)) taken = 3;
      const T g = T(0) + gr[ow];
      d0[2 * ow] = taken == 0 ? g : T(0);
      d0[2 * ow + 1] = taken == 1 ? g : T(0);
      d1[2 * ow] = taken == 2 ? g : T(0);
      d1[2 * ow + 1] = taken == 3 ? g : T(0);
    }
    // An odd last column lies in no window.
    for (int64_t x = 2 * wo; x < w; ++x) d0[x] = d1[x] = T(0);
  }
  // So does an odd last row.
  std::fill(dx + 2 * ho * w, dx + h * w, T(0));
}

using PoolKernel = pool2d::PoolAttrsKernel;

// y [N, C, Ho, Wo] = max (kMax) or mean over each window of x [N, C, H, W];
// the mean's divisor counts padding unless exclusive.
template <typename T, bool kMax>
class Pool2dKernel : public PoolKernel {
 public:
  using PoolKernel::PoolKernel;

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(PoolGeometry g, attrs_.Geometry(x.shape(), kMax ? "max_pool2d" : "avg_pool2d"));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), Shape{x.dim(0), x.dim(1), g.ho, g.wo}));
    const T* px = x.data<T>();
    T* py = y->data<T>();
    const bool exclusive = attrs_.exclusive;
    if (kMax && IsDisjoint2x2(g)) {
      ForEachPlane(g, [&](int64_t pl) { MaxPool2x2Plane(px + pl * g.h * g.w, g.w, g.ho, g.wo, py + pl * g.ho * g.wo); });
      return absl::OkStatus();
    }
    const Windows windows(g);
    ForEachPlane(g, [&](int64_t pl) {
      const T* plane = px + pl * g.h * g.w;
      T* out = py + pl * g.ho * g.wo;
      windows.ForEach([&](int64_t o, const Window& win) {
        if constexpr (kMax) {
          out[o] = MaxValue(plane, g.w, win);
        } else {
          T sum = 0;
          for (int64_t h = win.h0; h < win.h1; ++h) {
            for (int64_t w = win.w0; w < win.w1; ++w) sum += plane[h * g.w + w];
          }
          out[o] = sum / static_cast<T>(win.divisor(exclusive));
        }
      });
    });
    return absl::OkStatus();
  }
};

template <typename T>
using MaxPool2dKernel = Pool2dKernel<T, true>;
template <typename T>
using AvgPool2dKernel = Pool2dKernel<T, false>;

// dx [N, C, H, W]: each dy goes to its window's maximum in x (recomputed).
template <typename T>
class MaxPool2dGradKernel : public PoolKernel {
 public:
  using PoolKernel::PoolKernel;

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(PoolGeometry g, pool2d::MaxPoolGradGeometry(attrs_, x, dy));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, x.dtype(), x.shape()));
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx->data<T>();
    if (IsDisjoint2x2(g)) {
      ForEachPlane(g, [&](int64_t pl) {
        MaxPool2x2GradPlane(px + pl * g.h * g.w, pdy + pl * g.ho * g.wo, g.h, g.w, g.ho, g.wo, pdx + pl * g.h * g.w);
      });
      return absl::OkStatus();
    }
    const Windows windows(g);
    ForEachPlane(g, [&](int64_t pl) {
      const T* plane = px + pl * g.h * g.w;
      const T* grad = pdy + pl * g.ho * g.wo;
      T* out = pdx + pl * g.h * g.w;
      std::fill(out, out + g.h * g.w, T(0));
      windows.ForEach([&](int64_t o, const Window& win) { out[ArgMax(plane, g.w, win)] += grad[o]; });
    });
    return absl::OkStatus();
  }
};

// dx [N, C, H, W] (H, W = input_size): each dy spread evenly over its window.
template <typename T>
class AvgPool2dGradKernel : public PoolKernel {
 public:
  using PoolKernel::PoolKernel;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(PoolKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(input_size_, nn_kernels::AttrPair(op, "input_size"));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& dy = ctx.input(0);
    Shape xs;
    STRATA_ASSIGN_OR_RETURN(PoolGeometry g, pool2d::AvgPoolGradGeometry(attrs_, input_size_, dy, &xs));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, dy.dtype(), xs));
    const T* pdy = dy.data<T>();
    T* pdx = dx->data<T>();
    const bool exclusive = attrs_.exclusive;
    const Windows windows(g);
    ForEachPlane(g, [&](int64_t pl) {
      const T* grad = pdy + pl * g.ho * g.wo;
      T* out = pdx + pl * g.h * g.w;
      std::fill(out, out + g.h * g.w, T(0));
      windows.ForEach([&](int64_t o, const Window& win) {
        const T share = grad[o] / static_cast<T>(win.divisor(exclusive));
        for (int64_t h = win.h0; h < win.h1; ++h) {
          for (int64_t w = win.w0; w < win.w1; ++w) out[h * g.w + w] += share;
        }
      });
    });
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> input_size_;
};

STRATA_REGISTER_KERNEL("max_pool2d", DEVICE_CPU, F32, InitFactory<MaxPool2dKernel<float>>());
STRATA_REGISTER_KERNEL("max_pool2d", DEVICE_CPU, F64, InitFactory<MaxPool2dKernel<double>>());
STRATA_REGISTER_KERNEL("max_pool2d_grad", DEVICE_CPU, F32, InitFactory<MaxPool2dGradKernel<float>>());
STRATA_REGISTER_KERNEL("max_pool2d_grad", DEVICE_CPU, F64, InitFactory<MaxPool2dGradKernel<double>>());
STRATA_REGISTER_KERNEL("avg_pool2d", DEVICE_CPU, F32, InitFactory<AvgPool2dKernel<float>>());
STRATA_REGISTER_KERNEL("avg_pool2d", DEVICE_CPU, F64, InitFactory<AvgPool2dKernel<double>>());
STRATA_REGISTER_KERNEL("avg_pool2d_grad", DEVICE_CPU, F32, InitFactory<AvgPool2dGradKernel<float>>());
STRATA_REGISTER_KERNEL("avg_pool2d_grad", DEVICE_CPU, F64, InitFactory<AvgPool2dGradKernel<double>>());

}  // namespace
}  // namespace strata
