// The unary ops, their gradients, scale, add_n and cast: elementwise.cuh's
// grid-stride kernels (16-byte packs where aligned) over unary_math.h's
// functors.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/unary.h"
#include "kernels/cuda/unary_math.h"

namespace strata {
namespace cuda {
namespace {

using elementwise::kThreadsPerBlock;
using elementwise::NumBlocks;

// y[i] = f(x[i]): packs of 16 bytes where aligned (elementwise.cuh), the rest one by one.
template <typename S, typename D, typename F>
cudaError_t Map(D* y, const S* x, int64_t n, F f, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int N = elementwise::PackWidth<S, D>();
  int64_t done = 0;
  if (N > 1 && elementwise::PacksAligned<N>(x, static_cast<const D*>(y))) {
    const int64_t packs = n / N;
    if (packs > 0) {
      elementwise::MapPackKernel<N, S, D, F><<<NumBlocks(packs), kThreadsPerBlock, 0, stream>>>(y, x, packs, f);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    done = packs * N;
  }
  if (done == n) return cudaSuccess;
  elementwise::MapKernel<S, D, F><<<NumBlocks(n - done), kThreadsPerBlock, 0, stream>>>(y + done, x + done,
                                                                                       n - done, f);
  return cudaGetLastError();
}

// z[i] = f(a[i], b[i]); a, b and z may be stored in different types (f converts).
template <typename A, typename B, typename Z, typename F>
cudaError_t Map2(Z* z, const A* a, const B* b, int64_t n, F f, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int N = elementwise::PackWidth<A, B, Z>();
  int64_t done = 0;
  if (N > 1 && elementwise::PacksAligned<N>(a, b, static_cast<const Z*>(z))) {
    const int64_t packs = n / N;
    if (packs > 0) {
      elementwise::Map2PackKernel<N, A, B, Z, F><<<NumBlocks(packs), kThreadsPerBlock, 0, stream>>>(z, a, b, packs,
                                                                                                   f);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    done = packs * N;
  }
  if (done == n) return cudaSuccess;
  elementwise::Map2Kernel<A, B, Z, F><<<NumBlocks(n - done), kThreadsPerBlock, 0, stream>>>(
      z + done, a + done, b + done, n - done, f);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Unary(UnaryOp op, T* y, const T* x, int64_t n, cudaStream_t stream) {
  switch (op) {
    case UnaryOp::kExp:
      return Map(y, x, n, ExpFn(), stream);
    case UnaryOp::kLog:
      return Map(y, x, n, LogFn(), stream);
    case UnaryOp::kNeg:
      return Map(y, x, n, NegFn(), stream);
    case UnaryOp::kSqrt:
      return Map(y, x, n, SqrtFn(), stream);
    case UnaryOp::kSquare:
      return Map(y, x, n, SquareFn(), stream);
    case UnaryOp::kGelu:
      return Map(y, x, n, GeluFn(), stream);
    case UnaryOp::kGeluTanh:
      return Map(y, x, n, GeluTanhFn(), stream);
    case UnaryOp::kTanh:
      return Map(y, x, n, TanhFn(), stream);
    case UnaryOp::kSigmoid:
      return Map(y, x, n, SigmoidFn(), stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t UnaryGrad(UnaryGradOp op, T* dx, const T* a, const T* dy, int64_t n, cudaStream_t stream) {
  switch (op) {
    case UnaryGradOp::kSqrtGrad:
      return Map2(dx, a, dy, n, SqrtGradFn(), stream);
    case UnaryGradOp::kGeluGrad:
      return Map2(dx, a, dy, n, GeluGradFn(), stream);
    case UnaryGradOp::kGeluTanhGrad:
      return Map2(dx, a, dy, n, GeluTanhGradFn(), stream);
    case UnaryGradOp::kTanhGrad:
      return Map2(dx, a, dy, n, TanhGradFn(), stream);
    case UnaryGradOp::kSigmoidGrad:
      return Map2(dx, a, dy, n, SigmoidGradFn(), stream);
  }
  return cudaErrorInvalidValue;
}

// f(a, dy) in float on a and dy widened from their storage (exact; a float
// passes as it is), the result stored as DX by the cast's conversion
// (passes/fold_casts' gelu_grad, and mixed precision's 16-bit gelu_grad).
template <typename DX, typename F>
struct StoredGradFn {
  F f;
  template <typename A, typename DY>
  __device__ DX operator()(A a, DY dy) const {
    return Convert<DX>(f(Convert<float>(a), Convert<float>(dy)));
  }
};

// f(x) in float on x widened from its storage (a float passes as it is), the
// result stored as Y by the cast's conversion (passes/fold_casts'
// matmul_bias_gelu fallback, and mixed precision's 16-bit gelu).
template <typename Y, typename F>
struct StoredFn {
  F f;
  template <typename X>
  __device__ Y operator()(X x) const {
    return Convert<Y>(f(Convert<float>(x)));
  }
};

// Up to kAddNPerLaunch input pointers, passed by value. With `accumulate`,
// y's own value is the first term.
template <typename T>
struct AddNInputs {
  const T* xs[kAddNPerLaunch];
  int count;
  bool accumulate;
};

template <typename T>
__global__ void AddNKernel(T* y, AddNInputs<T> in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    // The CPU's order: out = a + b, then out += c for each further input.
    int k = 0;
    T s;
    if (in.accumulate) {
      s = y[i];
    } else {
      s = in.xs[0][i];
      k = 1;
    }
    for (; k < in.count; ++k) s = s + in.xs[k][i];
    y[i] = s;
  }
}

template <typename T>
cudaError_t AddN(T* y, const T* const* xs, int count, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (count < 2) return cudaErrorInvalidValue;
  for (int first = 0; first < count; first += kAddNPerLaunch) {
    AddNInputs<T> in;
    in.accumulate = first > 0;
    in.count = std::min(kAddNPerLaunch, count - first);
    for (int k = 0; k < in.count; ++k) in.xs[k] = xs[first + k];
    AddNKernel<T><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(y, in, n);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// bf16/f16 add_n as the CPU's widened kernel: every input widened to float,
// summed in float in the CPU's order, rounded once. Past kAddNPerLaunch
// inputs the float partial sums wait in `acc` between launches.
template <typename S>
__global__ void AddNWidenedKernel(S* y, AddNInputs<S> in, const float* acc_in, float* acc_out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int k = 0;
    float s;
    if (acc_in != nullptr) {
      s = acc_in[i];
    } else {
      s = ToFloat(in.xs[0][i]);
      k = 1;
    }
    for (; k < in.count; ++k) s = s + ToFloat(in.xs[k][i]);
    if (acc_out != nullptr) {
      acc_out[i] = s;
    } else {
      y[i] = Convert<S>(s);
    }
  }
}

template <typename S>
cudaError_t AddNWidened(S* y, const S* const* xs, int count, int64_t n, float* acc, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (count < 2 || (count > kAddNPerLaunch && acc == nullptr)) return cudaErrorInvalidValue;
  for (int first = 0; first < count; first += kAddNPerLaunch) {
    AddNInputs<S> in;
    in.accumulate = first > 0;
    in.count = std::min(kAddNPerLaunch, count - first);
    for (int k = 0; k < in.count; ++k) in.xs[k] = xs[first + k];
    const bool last = first + kAddNPerLaunch >= count;
    AddNWidenedKernel<S><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(y, in, first > 0 ? acc : nullptr,
                                                                        last ? nullptr : acc, n);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchAddN(bfloat16* y, const bfloat16* const* xs, int count, int64_t n, float* acc,
                       cudaStream_t stream) {
  return AddNWidened(y, xs, count, n, acc, stream);
}
cudaError_t LaunchAddN(float16* y, const float16* const* xs, int count, int64_t n, float* acc, cudaStream_t stream) {
  return AddNWidened(y, xs, count, n, acc, stream);
}

cudaError_t LaunchUnary(UnaryOp op, float* y, const float* x, int64_t n, cudaStream_t stream) {
  return Unary(op, y, x, n, stream);
}
cudaError_t LaunchUnary(UnaryOp op, double* y, const double* x, int64_t n, cudaStream_t stream) {
  return Unary(op, y, x, n, stream);
}

cudaError_t LaunchScale(float* y, const float* x, float scale, float bias, int64_t n, cudaStream_t stream) {
  return Map(y, x, n, ScaleFn<float>{scale, bias}, stream);
}
cudaError_t LaunchScale(double* y, const double* x, double scale, double bias, int64_t n, cudaStream_t stream) {
  return Map(y, x, n, ScaleFn<double>{scale, bias}, stream);
}

cudaError_t LaunchUnaryGrad(UnaryGradOp op, float* dx, const float* a, const float* dy, int64_t n,
                            cudaStream_t stream) {
  return UnaryGrad(op, dx, a, dy, n, stream);
}
cudaError_t LaunchUnaryGrad(UnaryGradOp op, double* dx, const double* a, const double* dy, int64_t n,
                            cudaStream_t stream) {
  return UnaryGrad(op, dx, a, dy, n, stream);
}

template <typename X, typename DY, typename DX>
cudaError_t LaunchGeluGradStored(UnaryGradOp op, DX* dx, const X* a, const DY* dy, int64_t n, cudaStream_t stream) {
  switch (op) {
    case UnaryGradOp::kGeluGrad:
      return Map2(dx, a, dy, n, StoredGradFn<DX, GeluGradFn>{GeluGradFn()}, stream);
    case UnaryGradOp::kGeluTanhGrad:
      return Map2(dx, a, dy, n, StoredGradFn<DX, GeluTanhGradFn>{GeluTanhGradFn()}, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename X>
cudaError_t LaunchGeluWidened(UnaryOp op, X* y, const X* x, int64_t n, cudaStream_t stream) {
  switch (op) {
    case UnaryOp::kGelu:
      return Map(y, x, n, StoredFn<X, GeluFn>{GeluFn()}, stream);
    case UnaryOp::kGeluTanh:
      return Map(y, x, n, StoredFn<X, GeluTanhFn>{GeluTanhFn()}, stream);
    default:
      return cudaErrorInvalidValue;
  }
}
template cudaError_t LaunchGeluWidened<bfloat16>(UnaryOp, bfloat16*, const bfloat16*, int64_t, cudaStream_t);
template cudaError_t LaunchGeluWidened<float16>(UnaryOp, float16*, const float16*, int64_t, cudaStream_t);

template <typename Y>
cudaError_t LaunchGeluTanhStored(Y* y, const float* x, int64_t n, cudaStream_t stream) {
  return Map(y, x, n, StoredFn<Y, GeluTanhFn>{GeluTanhFn()}, stream);
}
template cudaError_t LaunchGeluTanhStored<bfloat16>(bfloat16*, const float*, int64_t, cudaStream_t);
template cudaError_t LaunchGeluTanhStored<float16>(float16*, const float*, int64_t, cudaStream_t);

#define STRATA_GELU_GRAD_STORED(X, DY, DX) \
  template cudaError_t LaunchGeluGradStored<X, DY, DX>(UnaryGradOp, DX*, const X*, const DY*, int64_t, cudaStream_t);
// An F32 x: dy and dx each float, bf16 or f16 (passes/fold_casts).
STRATA_GELU_GRAD_STORED(float, float, float)
STRATA_GELU_GRAD_STORED(float, float, bfloat16)
STRATA_GELU_GRAD_STORED(float, float, float16)
STRATA_GELU_GRAD_STORED(float, bfloat16, float)
STRATA_GELU_GRAD_STORED(float, bfloat16, bfloat16)
STRATA_GELU_GRAD_STORED(float, bfloat16, float16)
STRATA_GELU_GRAD_STORED(float, float16, float)
STRATA_GELU_GRAD_STORED(float, float16, bfloat16)
STRATA_GELU_GRAD_STORED(float, float16, float16)
// A 16-bit x (mixed precision): dy and dx of its type.
STRATA_GELU_GRAD_STORED(bfloat16, bfloat16, bfloat16)
STRATA_GELU_GRAD_STORED(float16, float16, float16)
// A 16-bit x and dx over a float dy: matmul_gelu_grad's fallback, whose
// GEMM product stays float (never rounded to 16 bits) until dx.
STRATA_GELU_GRAD_STORED(bfloat16, float, bfloat16)
STRATA_GELU_GRAD_STORED(float16, float, float16)
#undef STRATA_GELU_GRAD_STORED

cudaError_t LaunchAddN(float* y, const float* const* xs, int count, int64_t n, cudaStream_t stream) {
  return AddN(y, xs, count, n, stream);
}
cudaError_t LaunchAddN(double* y, const double* const* xs, int count, int64_t n, cudaStream_t stream) {
  return AddN(y, xs, count, n, stream);
}
cudaError_t LaunchAddN(int64_t* y, const int64_t* const* xs, int count, int64_t n, cudaStream_t stream) {
  return AddN(y, xs, count, n, stream);
}

template <typename S, typename D>
cudaError_t LaunchCast(D* y, const S* x, int64_t n, cudaStream_t stream) {
  return Map(y, x, n, ConvertFn<D>(), stream);
}

// Every (S, D) pair of distinct cast dtypes.
#define STRATA_CAST_TO(S)                                                                   \
  template cudaError_t LaunchCast<S, float>(float*, const S*, int64_t, cudaStream_t);       \
  template cudaError_t LaunchCast<S, double>(double*, const S*, int64_t, cudaStream_t);     \
  template cudaError_t LaunchCast<S, int64_t>(int64_t*, const S*, int64_t, cudaStream_t);   \
  template cudaError_t LaunchCast<S, int32_t>(int32_t*, const S*, int64_t, cudaStream_t);   \
  template cudaError_t LaunchCast<S, bool>(bool*, const S*, int64_t, cudaStream_t);         \
  template cudaError_t LaunchCast<S, bfloat16>(bfloat16*, const S*, int64_t, cudaStream_t); \
  template cudaError_t LaunchCast<S, float16>(float16*, const S*, int64_t, cudaStream_t);
STRATA_CAST_TO(float)
STRATA_CAST_TO(double)
STRATA_CAST_TO(int64_t)
STRATA_CAST_TO(int32_t)
STRATA_CAST_TO(bool)
STRATA_CAST_TO(bfloat16)
STRATA_CAST_TO(float16)
#undef STRATA_CAST_TO

}  // namespace cuda
}  // namespace strata
