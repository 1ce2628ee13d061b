// conv2d (NCHW cross-correlation) and its two backward ops, by im2col + GEMM.
//
// Threads: the batch is split into one contiguous share of images per pool
// thread; each thread walks its share in chunks whose im2col columns fit a
// fixed budget and does im2col / col2im, the NCHW re-layout and each group's
// single-threaded GEMM over the chunk ([O/g, C/g*kh*kw] x [C/g*kh*kw,
// images*Ho*Wo]) itself, so the columns stay in its cache and no barrier
// separates the steps. On the 2-core convnet this took the step from about
// 18.5 ms to 14.5 ms against OpenBLAS-threaded GEMMs between parallel im2cols.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_kernel_util.h"
#include "kernels/cpu/widened.h"
#include "kernels/conv2d_geometry.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

using nn_kernels::AttrPair;
using nn_kernels::InitFactory;
using nn_kernels::Scratch;

// im2col columns per chunk of images (elements): bounds the scratch memory
// while keeping the GEMMs wide. On the convnet 2^20 (4 MiB of F32) beat 2^22
// by about 12% single-threaded (the columns stay in cache) and matched it on
// 2 threads; smaller chunks lose on 2 threads (many small threaded GEMMs).
constexpr int64_t kColumnBudget = int64_t{1} << 20;

using conv2d::ConvAttrs;
using conv2d::ConvGeometry;
using conv2d::MakeGeometry;
using conv2d::ReadConvAttrs;

// Images per chunk so that the im2col columns stay within budget.
int64_t Chunk(const ConvGeometry& g) {
  return std::clamp<int64_t>(kColumnBudget / std::max<int64_t>(g.col_rows() * g.pixels(), 1), 1,
                             std::max<int64_t>(g.n, 1));
}

// First and one-past-last output index o with 0 <= o*stride - pad + offset < in.
void ValidRange(int64_t out, int64_t in, int64_t stride, int64_t pad, int64_t offset, int64_t* lo, int64_t* hi) {
  const int64_t shift = pad - offset;  // o*stride >= shift  and  o*stride < in + shift
  *lo = shift <= 0 ? 0 : (shift + stride - 1) / stride;
  *hi = in + shift <= 0 ? 0 : std::min(out, (in + shift - 1) / stride + 1);
  if (*hi < *lo) *hi = *lo;
}

// Writes image x [C, H, W] into the columns of `cols` (rows C*kh*kw, row stride ld):
//   cols[(c*kh + i)*kw + j][oh*Wo + ow] = x[c][oh*sh - ph + i*dh][ow*sw - pw + j*dw] (0 outside).
template <typename T>
void Im2Col(const ConvGeometry& g, const T* x, T* cols, int64_t ld) {
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      int64_t oh_lo, oh_hi;
      ValidRange(g.ho, g.h, g.sh, g.ph, i * g.dh, &oh_lo, &oh_hi);
      for (int64_t j = 0; j < g.kw; ++j) {
        int64_t ow_lo, ow_hi;
        ValidRange(g.wo, g.w, g.sw, g.pw, j * g.dw, &ow_lo, &ow_hi);
        T* row = cols + ((c * g.kh + i) * g.kw + j) * ld;
        std::fill(row, row + oh_lo * g.wo, T(0));
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          T* out = row + oh * g.wo;
          const T* in = x + (c * g.h + oh * g.sh - g.ph + i * g.dh) * g.w;
          const int64_t col0 = j * g.dw - g.pw;  // input column of ow = 0
          std::fill(out, out + ow_lo, T(0));
          if (g.sw == 1) {
            std::memcpy(out + ow_lo, in + ow_lo + col0, (ow_hi - ow_lo) * sizeof(T));
          } else {
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] = in[ow * g.sw + col0];
          }
          std::fill(out + ow_hi, out + g.wo, T(0));
        }
        std::fill(row + oh_hi * g.wo, row + g.ho * g.wo, T(0));
      }
    }
  }
}

// dst[i] += src[i] for i in [0, n) over distinct buffers; blocks of a fixed
// length so that gcc's -O2 vectorizer takes the loop.
template <typename T>
inline void AddTo(int64_t n, const T* __restrict src, T* __restrict dst) {
  constexpr int64_t kBlock = 16;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (int64_t k = 0; k < kBlock; ++k) dst[i + k] += src[i + k];
  }
  for (; i < n; ++i) dst[i] += src[i];
}

// The adjoint of Im2Col: x [C, H, W] = sum of the columns back onto the pixels they were read from.
template <typename T>
void Col2Im(const ConvGeometry& g, const T* cols, int64_t ld, T* x) {
  std::fill(x, x + g.c * g.h * g.w, T(0));
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      int64_t oh_lo, oh_hi;
      ValidRange(g.ho, g.h, g.sh, g.ph, i * g.dh, &oh_lo, &oh_hi);
      for (int64_t j = 0; j < g.kw; ++j) {
        int64_t ow_lo, ow_hi;
        ValidRange(g.wo, g.w, g.sw, g.pw, j * g.dw, &ow_lo, &ow_hi);
        const T* row = cols + ((c * g.kh + i) * g.kw + j) * ld;
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          const T* src = row + oh * g.wo;
          T* out = x + (c * g.h + oh * g.sh - g.ph + i * g.dh) * g.w;
          const int64_t col0 = j * g.dw - g.pw;
          if (g.sw == 1) {
            AddTo(ow_hi - ow_lo, src + ow_lo, out + ow_lo + col0);
          } else {
            for (int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow * g.sw + col0] += src[ow];
          }
        }
      }
    }
  }
}

// Moves images [n0+begin, n0+end) of the chunk [n0, n0+nb) between t [N, rows, P]
// and wide [rows, nb*P] (image-major columns): into wide when kToWide, back into t otherwise.
template <bool kToWide, typename T>
void MoveImageRange(const T* from, int64_t rows, int64_t pixels, int64_t n0, int64_t nb, int64_t begin,
                    int64_t end, T* to) {
  for (int64_t j = begin; j < end; ++j) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t wide_at = r * nb * pixels + j * pixels, t_at = ((n0 + j) * rows + r) * pixels;
      std::memcpy(to + (kToWide ? wide_at : t_at), from + (kToWide ? t_at : wide_at), pixels * sizeof(T));
    }
  }
}

// MoveImageRange over the whole chunk.
template <bool kToWide, typename T>
void MoveImagesSerial(const T* from, int64_t rows, int64_t pixels, int64_t n0, int64_t nb, T* to) {
  MoveImageRange<kToWide>(from, rows, pixels, n0, nb, 0, nb, to);
}

// The images split into `parts` contiguous shares of `per` images, one per
// thread, each processed in chunks of at most `chunk` images.
struct ThreadShares {
  int64_t parts, per, chunk;

  // Calls fn(t, n0, nb) for each chunk [n0, n0 + nb) of every thread t's
  // share of the n images, the shares in parallel, a share's chunks in order.
  template <typename F>
  void ForEachChunk(int64_t n, const F& fn) const {
    ParallelFor(parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t last = std::min(n, (t + 1) * per);
        for (int64_t n0 = t * per; n0 < last; n0 += chunk) fn(t, n0, std::min(chunk, last - n0));
      }
    });
  }
};

ThreadShares Shares(const ConvGeometry& g, int intra_op_threads = IntraOpThreads()) {
  ThreadShares s;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(intra_op_threads, g.n));
  s.per = std::max<int64_t>(1, (g.n + threads - 1) / threads);
  s.parts = g.n == 0 ? 0 : (g.n + s.per - 1) / s.per;
  s.chunk = std::min(Chunk(g), s.per);
  return s;
}

// Scratch elements the kernels below draw: every thread share's im2col
// columns and wide GEMM output, and for the filter gradient the partial dw
// of every share but the first.
struct ConvScratch {
  int64_t parts = 0;
  int64_t cols_per_share = 0, wide_per_share = 0, partial_per_share = 0;
  int64_t cols() const { return parts * cols_per_share; }
  int64_t wide() const { return parts * wide_per_share; }
  int64_t partial() const { return std::max<int64_t>(parts - 1, 0) * partial_per_share; }
  int64_t total() const { return cols() + wide() + partial(); }
};
ConvScratch ScratchOf(const ConvGeometry& g, const ThreadShares& sh, bool filter_gradient) {
  const int64_t p = g.pixels();
  ConvScratch s;
  s.parts = sh.parts;
  s.cols_per_share = g.col_rows() * sh.chunk * p;
  s.wide_per_share = sh.chunk > 1 ? g.o * sh.chunk * p : 0;
  if (filter_gradient) s.partial_per_share = g.o * g.group_rows();
  return s;
}

// The scratch of one call, drawn from the run's allocator (so its byte
// counters, and the memory plan through ConvWorkspace, see it).
struct ConvBuffers {
  ConvScratch size;
  Tensor cols, wide, partial;
  template <typename T>
  T* cols_of(int64_t share) { return cols.data<T>() + share * size.cols_per_share; }
  template <typename T>
  T* wide_of(int64_t share) { return wide.data<T>() + share * size.wide_per_share; }
  // The partial dw of share `share` >= 1 (share 0 sums into dw itself).
  template <typename T>
  T* partial_of(int64_t share) { return partial.data<T>() + (share - 1) * size.partial_per_share; }
};
absl::StatusOr<ConvBuffers> DrawScratch(const KernelContext& ctx, DataType dtype, const ConvGeometry& g,
                                        const ThreadShares& sh, bool filter_gradient) {
  ConvBuffers b;
  b.size = ScratchOf(g, sh, filter_gradient);
  STRATA_ASSIGN_OR_RETURN(b.cols, Scratch(ctx, dtype, b.size.cols()));
  STRATA_ASSIGN_OR_RETURN(b.wide, Scratch(ctx, dtype, b.size.wide()));
  if (filter_gradient) {
    STRATA_ASSIGN_OR_RETURN(b.partial, Scratch(ctx, dtype, b.size.partial()));
  }
  return b;
}

// Base of the three conv kernels: reads the conv attrs and, for the backward
// ops, their two-int `size_attr` (input_size or filter_size).
class ConvKernel : public OpKernel {
 public:
  explicit ConvKernel(const char* size_attr) : size_attr_(size_attr) {}
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(ReadConvAttrs(op, &attrs_));
    if (size_attr_ != nullptr) {
      STRATA_ASSIGN_OR_RETURN(size_, AttrPair(op, size_attr_));
    }
    return absl::OkStatus();
  }

 protected:
  ConvAttrs attrs_;
  std::vector<int64_t> size_;  // the value of size_attr_

 private:
  const char* size_attr_;
};

// y [N, O, Ho, Wo] = conv2d(x [N, C, H, W], w [O, C/groups, kh, kw]).
template <typename T>
class Conv2dKernel : public ConvKernel {
 public:
  explicit Conv2dKernel(const KernelDef&) : ConvKernel(nullptr) {}

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(ConvGeometry g, MakeGeometry(attrs_, x.shape(), w.shape(), "conv2d"));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), Shape{g.n, g.o, g.ho, g.wo}));
    const int64_t p = g.pixels(), image = g.c * g.h * g.w;
    // Each thread takes a contiguous share of the images and runs im2col and
    // a single-threaded GEMM on its own chunks (the columns stay in its cache).
    const ThreadShares sh = Shares(g);
    STRATA_ASSIGN_OR_RETURN(ConvBuffers buf, DrawScratch(ctx, x.dtype(), g, sh, /*filter_gradient=*/false));
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    T* py = y->data<T>();
    sh.ForEachChunk(g.n, [&](int64_t t, int64_t n0, int64_t nb) {
      T* pcols = buf.cols_of<T>(t);
      T* pwide = buf.wide_of<T>(t);
      for (int64_t j = 0; j < nb; ++j) Im2Col(g, px + (n0 + j) * image, pcols + j * p, nb * p);
      // A chunk of one image writes its GEMM straight into y.
      T* out = nb == 1 ? py + n0 * g.o * p : pwide;
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        SerialGemmOrScale<T>(false, false, g.group_out(), nb * p, g.group_rows(), T(1),
                             pw + grp * g.group_out() * g.group_rows(), g.group_rows(),
                             pcols + grp * g.group_rows() * nb * p, nb * p, T(0),
                             out + grp * g.group_out() * nb * p, nb * p);
      }
      if (nb > 1) MoveImagesSerial<false>(pwide, g.o, p, n0, nb, py);
    });
    return absl::OkStatus();
  }
};

// dx [N, C, H, W] = conv2d_grad_input(dy [N, O, Ho, Wo], w): per group
// dcols = w_g^T @ dy_g, then col2im.
template <typename T>
class Conv2dGradInputKernel : public ConvKernel {
 public:
  explicit Conv2dGradInputKernel(const KernelDef&) : ConvKernel("input_size") {}

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& dy = ctx.input(0);
    const Tensor& w = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(ConvGeometry g, conv2d::GradInputGeometry(attrs_, size_, dy, w));
    const Shape xs{g.n, g.c, g.h, g.w};
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, dy.dtype(), xs));
    const int64_t p = g.pixels(), image = g.c * g.h * g.w;
    // Each thread takes a contiguous share of the images: single-threaded GEMMs and col2im on its own chunks.
    const ThreadShares sh = Shares(g);
    STRATA_ASSIGN_OR_RETURN(ConvBuffers buf, DrawScratch(ctx, dy.dtype(), g, sh, /*filter_gradient=*/false));
    const T* pdy = dy.data<T>();
    const T* pw = w.data<T>();
    T* pdx = dx->data<T>();
    sh.ForEachChunk(g.n, [&](int64_t t, int64_t n0, int64_t nb) {
      T* pcols = buf.cols_of<T>(t);
      T* pwide = buf.wide_of<T>(t);
      const T* dyw = pdy + n0 * g.o * p;
      if (nb > 1) {
        MoveImagesSerial<true>(pdy, g.o, p, n0, nb, pwide);
        dyw = pwide;
      }
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        SerialGemmOrScale<T>(true, false, g.group_rows(), nb * p, g.group_out(), T(1),
                             pw + grp * g.group_out() * g.group_rows(), g.group_rows(),
                             dyw + grp * g.group_out() * nb * p, nb * p, T(0),
                             pcols + grp * g.group_rows() * nb * p, nb * p);
      }
      for (int64_t j = 0; j < nb; ++j) Col2Im(g, pcols + j * p, nb * p, pdx + (n0 + j) * image);
    });
    return absl::OkStatus();
  }
};

// dw [O, C/groups, kh, kw] = conv2d_grad_filter(x, dy): per group
// dw_g = sum over chunks of dy_g @ cols_g^T.
template <typename T>
class Conv2dGradFilterKernel : public ConvKernel {
 public:
  explicit Conv2dGradFilterKernel(const KernelDef&) : ConvKernel("filter_size") {}

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(ConvGeometry g, conv2d::GradFilterGeometry(attrs_, size_, x, dy));
    const Shape ws{g.o, g.c / g.groups, g.kh, g.kw};
    STRATA_ASSIGN_OR_RETURN(Tensor * dw, ctx.AllocateOutput(0, x.dtype(), ws));
    T* pdw = dw->data<T>();
    const int64_t p = g.pixels(), dw_size = g.o * g.group_rows();
    // Each thread takes a contiguous share of the images and sums its own
    // partial dw (single-threaded GEMMs); the partials are added at the end.
    const ThreadShares sh = Shares(g);
    STRATA_ASSIGN_OR_RETURN(ConvBuffers buf, DrawScratch(ctx, x.dtype(), g, sh, /*filter_gradient=*/true));
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    sh.ForEachChunk(g.n, [&](int64_t t, int64_t n0, int64_t nb) {
      T* pcols = buf.cols_of<T>(t);
      T* pwide = buf.wide_of<T>(t);
      T* acc = t == 0 ? pdw : buf.partial_of<T>(t);
      if (n0 == t * sh.per) std::fill(acc, acc + dw_size, T(0));  // the share's first chunk
      for (int64_t j = 0; j < nb; ++j) Im2Col(g, px + (n0 + j) * g.c * g.h * g.w, pcols + j * p, nb * p);
      const T* dyw = pdy + n0 * g.o * p;
      if (nb > 1) {
        MoveImagesSerial<true>(pdy, g.o, p, n0, nb, pwide);
        dyw = pwide;
      }
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        SerialGemmOrScale<T>(false, true, g.group_out(), g.group_rows(), nb * p, T(1),
                             dyw + grp * g.group_out() * nb * p, nb * p, pcols + grp * g.group_rows() * nb * p,
                             nb * p, T(1), acc + grp * g.group_out() * g.group_rows(), g.group_rows());
      }
    });
    if (g.n == 0) std::fill(pdw, pdw + dw_size, T(0));
    for (int64_t t = 1; t < sh.parts; ++t) AddTo(dw_size, buf.partial_of<T>(t), pdw);
    return absl::OkStatus();
  }
};

// The scratch of each conv kernel for the memory plan, from the same
// geometry and thread shares the kernels compute. BF16 and F16 run the
// float32 kernel (WidenedKernel): its columns are float32, and the widened
// copies of the inputs and outputs come on top.
absl::StatusOr<int64_t> ConvWorkspace(const KernelDef& def, int threads) {
  STRATA_ASSIGN_OR_RETURN(ConvGeometry g, conv2d::DefGeometry(def));
  const ConvScratch s = ScratchOf(g, Shares(g, threads), def.op->type() == "conv2d_grad_filter");
  const DataType dtype = def.input_types[0].dtype;
  const bool half = IsHalfFloating(dtype);
  const int64_t columns = s.total() * static_cast<int64_t>(DataTypeSize(half ? F32 : dtype));
  if (!half) return columns;
  return WidenedWorkspaceOver(def, columns);
}

STRATA_REGISTER_WORKSPACE("conv2d", DEVICE_CPU, ConvWorkspace);
STRATA_REGISTER_WORKSPACE("conv2d_grad_input", DEVICE_CPU, ConvWorkspace);
STRATA_REGISTER_WORKSPACE("conv2d_grad_filter", DEVICE_CPU, ConvWorkspace);

STRATA_REGISTER_KERNEL("conv2d", DEVICE_CPU, F32, InitFactory<Conv2dKernel<float>>());
STRATA_REGISTER_KERNEL("conv2d", DEVICE_CPU, F64, InitFactory<Conv2dKernel<double>>());
STRATA_REGISTER_KERNEL("conv2d_grad_input", DEVICE_CPU, F32, InitFactory<Conv2dGradInputKernel<float>>());
STRATA_REGISTER_KERNEL("conv2d_grad_input", DEVICE_CPU, F64, InitFactory<Conv2dGradInputKernel<double>>());
STRATA_REGISTER_KERNEL("conv2d_grad_filter", DEVICE_CPU, F32, InitFactory<Conv2dGradFilterKernel<float>>());
STRATA_REGISTER_KERNEL("conv2d_grad_filter", DEVICE_CPU, F64, InitFactory<Conv2dGradFilterKernel<double>>());

// BF16 and F16 (mixed precision): the float32 kernels on widened copies of
// the inputs, the output rounded to the low dtype once (kernels/cpu/widened.h).
template <typename Half>
using WidenedConv2d = WidenedKernel<Half, Conv2dKernel<float>>;
template <typename Half>
using WidenedConv2dGradInput = WidenedKernel<Half, Conv2dGradInputKernel<float>>;
template <typename Half>
using WidenedConv2dGradFilter = WidenedKernel<Half, Conv2dGradFilterKernel<float>>;
STRATA_REGISTER_KERNEL("conv2d", DEVICE_CPU, BF16, InitFactory<WidenedConv2d<bfloat16>>());
STRATA_REGISTER_KERNEL("conv2d", DEVICE_CPU, F16, InitFactory<WidenedConv2d<float16>>());
STRATA_REGISTER_KERNEL("conv2d_grad_input", DEVICE_CPU, BF16, InitFactory<WidenedConv2dGradInput<bfloat16>>());
STRATA_REGISTER_KERNEL("conv2d_grad_input", DEVICE_CPU, F16, InitFactory<WidenedConv2dGradInput<float16>>());
STRATA_REGISTER_KERNEL("conv2d_grad_filter", DEVICE_CPU, BF16, InitFactory<WidenedConv2dGradFilter<bfloat16>>());
STRATA_REGISTER_KERNEL("conv2d_grad_filter", DEVICE_CPU, F16, InitFactory<WidenedConv2dGradFilter<float16>>());

}  // namespace
}  // namespace strata
