// max_pool2d, avg_pool2d and their grads (kernels/cuda/pool.h).
// Blocks: grid-stride loops, 256 threads a block, at most kMaxBlocks blocks,
// 64-bit indices; one thread per output (forward) or input (backward) element.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/pool.h"

namespace strata {
namespace cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 65536;

int64_t NumBlocks(int64_t n) { return std::min(kMaxBlocks, (n + kThreadsPerBlock - 1) / kThreadsPerBlock); }

// The window of output index o along one dim, clipped to the input: [lo, hi),
// and its length counting padding (kernels/cpu/pool2d.cc's Spans).
struct Span {
  int64_t lo, hi, padded;
};
__device__ inline Span SpanOf(int64_t o, int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  const int64_t start = o * stride - pad;
  const int64_t end = min(start + kernel, in + pad);
  return {max(start, int64_t{0}), min(end, in), end - start};
}

// avg_pool2d's divisor (the CPU's Window::divisor).
__device__ inline int64_t Divisor(const Span& r, const Span& c, bool exclusive) {
  return exclusive ? (r.hi - r.lo) * (c.hi - c.lo) : r.padded * c.padded;
}

// The CPU's MaxTakes: v replaces the best so far when larger or NaN.
template <typename T>
__device__ inline bool MaxTakes(T best, T v) {
  return v > best || v != v;
}

// Index in the plane of the window's maximum: the CPU's ArgMax.
template <typename T>
__device__ inline int64_t ArgMax(const T* plane, int64_t width, const Span& r, const Span& c) {
  int64_t best = r.lo * width + c.lo;
  T best_value = -static_cast<T>(INFINITY);
  for (int64_t h = r.lo; h < r.hi; ++h) {
    for (int64_t w = c.lo; w < c.hi; ++w) {
      const T v = plane[h * width + w];
      if (MaxTakes(best_value, v)) {
        best_value = v;
        best = h * width + w;
      }
    }
  }
  return best;
}

// Outputs [lo, hi) along one dim whose windows cover input index i.
__device__ inline void Covering(int64_t i, int64_t out, int64_t kernel, int64_t stride, int64_t pad, int64_t* lo,
                                int64_t* hi) {
  // o * stride - pad <= i  and  i < o * stride - pad + kernel.
  const int64_t a = i + pad - kernel + 1;  // o * stride >= a
  *lo = a <= 0 ? 0 : (a + stride - 1) / stride;
  *hi = min(out, (i + pad) / stride + 1);
}

template <typename T, bool kMax>
__global__ void Pool2dKernel(T* y, const T* x, Pool2dShape g, bool exclusive, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ow = i % g.wo, oh = (i / g.wo) % g.ho, pl = i / (g.wo * g.ho);
    const T* plane = x + pl * g.h * g.w;
    const Span r = SpanOf(oh, g.h, g.kh, g.sh, g.ph), c = SpanOf(ow, g.w, g.kw, g.sw, g.pw);
    if (kMax) {
      T best = -static_cast<T>(INFINITY);
      for (int64_t h = r.lo; h < r.hi; ++h) {
        for (int64_t w = c.lo; w < c.hi; ++w) {
          const T v = plane[h * g.w + w];
          best = MaxTakes(best, v) ? v : best;
        }
      }
      y[i] = best;
    } else {
      T sum = 0;
      for (int64_t h = r.lo; h < r.hi; ++h) {
        for (int64_t w = c.lo; w < c.hi; ++w) sum += plane[h * g.w + w];
      }
      y[i] = sum / static_cast<T>(Divisor(r, c, exclusive));
    }
  }
}

// dx of one input element: the sum, from 0 in the CPU's order of outputs, of
// the dy of the windows covering it that pick it (max: its ArgMax; avg: every
// covering window, dy / divisor).
template <typename T, bool kMax>
__global__ void Pool2dGradKernel(T* dx, const T* x, const T* dy, Pool2dShape g, bool exclusive, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t w = i % g.w, h = (i / g.w) % g.h, pl = i / (g.w * g.h);
    const T* grad = dy + pl * g.ho * g.wo;
    int64_t oh_lo, oh_hi, ow_lo, ow_hi;
    Covering(h, g.ho, g.kh, g.sh, g.ph, &oh_lo, &oh_hi);
    Covering(w, g.wo, g.kw, g.sw, g.pw, &ow_lo, &ow_hi);
    T acc = 0;
    for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {
      const Span r = SpanOf(oh, g.h, g.kh, g.sh, g.ph);
      for (int64_t ow = ow_lo; ow < ow_hi; ++ow) {
        const Span c = SpanOf(ow, g.w, g.kw, g.sw, g.pw);
        if (kMax) {
          if (ArgMax(x + pl * g.h * g.w, g.w, r, c) == h * g.w + w) acc += grad[oh * g.wo + ow];
        } else {
          acc += grad[oh * g.wo + ow] / static_cast<T>(Divisor(r, c, exclusive));
        }
      }
    }
    dx[i] = acc;
  }
}

template <typename T, bool kMax>
cudaError_t Pool2d(T* y, const T* x, const Pool2dShape& g, bool exclusive, cudaStream_t stream) {
  const int64_t n = g.planes * g.ho * g.wo;
  if (n <= 0) return cudaSuccess;
  Pool2dKernel<T, kMax><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(y, x, g, exclusive, n);
  return cudaGetLastError();
}

template <typename T, bool kMax>
cudaError_t Pool2dGrad(T* dx, const T* x, const T* dy, const Pool2dShape& g, bool exclusive, cudaStream_t stream) {
  const int64_t n = g.planes * g.h * g.w;
  if (n <= 0) return cudaSuccess;
  Pool2dGradKernel<T, kMax><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(dx, x, dy, g, exclusive, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchMaxPool2d(float* y, const float* x, const Pool2dShape& g, cudaStream_t stream) {
  return Pool2d<float, true>(y, x, g, false, stream);
}
cudaError_t LaunchMaxPool2d(double* y, const double* x, const Pool2dShape& g, cudaStream_t stream) {
  return Pool2d<double, true>(y, x, g, false, stream);
}
cudaError_t LaunchAvgPool2d(float* y, const float* x, const Pool2dShape& g, bool exclusive, cudaStream_t stream) {
  return Pool2d<float, false>(y, x, g, exclusive, stream);
}
cudaError_t LaunchAvgPool2d(double* y, const double* x, const Pool2dShape& g, bool exclusive, cudaStream_t stream) {
  return Pool2d<double, false>(y, x, g, exclusive, stream);
}
cudaError_t LaunchMaxPool2dGrad(float* dx, const float* x, const float* dy, const Pool2dShape& g, cudaStream_t stream) {
  return Pool2dGrad<float, true>(dx, x, dy, g, false, stream);
}
cudaError_t LaunchMaxPool2dGrad(double* dx, const double* x, const double* dy, const Pool2dShape& g,
                                cudaStream_t stream) {
  return Pool2dGrad<double, true>(dx, x, dy, g, false, stream);
}
cudaError_t LaunchAvgPool2dGrad(float* dx, const float* dy, const Pool2dShape& g, bool exclusive, cudaStream_t stream) {
  return Pool2dGrad<float, false>(dx, nullptr, dy, g, exclusive, stream);
}
cudaError_t LaunchAvgPool2dGrad(double* dx, const double* dy, const Pool2dShape& g, bool exclusive,
                                cudaStream_t stream) {
  return Pool2dGrad<double, false>(dx, nullptr, dy, g, exclusive, stream);
}

}  // namespace cuda
}  // namespace strata
