#ifndef STRATA_KERNELS_CUDA_UNARY_H_
#define STRATA_KERNELS_CUDA_UNARY_H_

// The elementwise unary ops, their backward helpers, scale, add_n and cast
// on the GPU: one grid-stride launcher over a functor of unary_math.h per op,
// so every element computes what the CPU kernel computes. Plain C++ API over
// device pointers; every launcher is asynchronous on `stream` and returns the
// launch error (cudaSuccess and no launch when n == 0). An output may alias
// an input of its own type: each element is read, then written, by one
// thread.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/float16.h"

namespace strata {
namespace cuda {

// kGelu: the erf form; kGeluTanh: gelu's approximate "tanh".
enum class UnaryOp { kExp, kLog, kNeg, kSqrt, kSquare, kGelu, kGeluTanh, kTanh, kSigmoid };

// y[n] = f(x[n]).
cudaError_t LaunchUnary(UnaryOp op, float* y, const float* x, int64_t n, cudaStream_t stream);
cudaError_t LaunchUnary(UnaryOp op, double* y, const double* x, int64_t n, cudaStream_t stream);

// y[n] = scale * x[n] + bias.
cudaError_t LaunchScale(float* y, const float* x, float scale, float bias, int64_t n, cudaStream_t stream);
cudaError_t LaunchScale(double* y, const double* x, double scale, double bias, int64_t n, cudaStream_t stream);

// dx[n] = f(a[n], dy[n]); a is the forward op's input for gelu, its output
// for the others.
enum class UnaryGradOp { kSqrtGrad, kGeluGrad, kGeluTanhGrad, kTanhGrad, kSigmoidGrad };
cudaError_t LaunchUnaryGrad(UnaryGradOp op, float* dx, const float* a, const float* dy, int64_t n, cudaStream_t stream);
cudaError_t LaunchUnaryGrad(UnaryGradOp op, double* dx, const double* a, const double* dy, int64_t n,
                            cudaStream_t stream);
// gelu_grad (op kGeluGrad or kGeluTanhGrad) of an a stored as X, dy as DY
// and dx as DX: a and dy widened as loaded (exact), the float functor, dx
// rounded once by the cast's conversion. Instantiated for an F32 a with DY,
// DX in {float, bfloat16, float16} (passes/fold_casts), for a bfloat16 or
// float16 a (mixed precision's gelu_grad in 16 bits) with DY and DX of X's
// type (the schema's rule), and for a bfloat16 or float16 a and dx over a
// float dy (matmul_gelu_grad's fallback: the float GEMM product, not
// rounded to 16 bits, times gelu' of the widened z, rounded once).
template <typename X, typename DY, typename DX>
cudaError_t LaunchGeluGradStored(UnaryGradOp op, DX* dx, const X* a, const DY* dy, int64_t n, cudaStream_t stream);

// gelu (op kGelu or kGeluTanh) of a bfloat16 or float16 x into a y of x's
// type (mixed precision's gelu, as torch autocast runs it): each element
// widened to float (exact), the float functor, rounded once by the cast's
// conversion. Other ops: cudaErrorInvalidValue.
template <typename X>
cudaError_t LaunchGeluWidened(UnaryOp op, X* y, const X* x, int64_t n, cudaStream_t stream);

// y = gelu(x) in the tanh form of a float x, stored as Y (bfloat16 or
// float16) by the cast's conversion: gelu then cast in one pass
// (matmul_bias_gelu with out_dtype, where cuBLASLt has no such epilogue).
template <typename Y>
cudaError_t LaunchGeluTanhStored(Y* y, const float* x, int64_t n, cudaStream_t stream);

// y[n] = ((xs[0][n] + xs[1][n]) + xs[2][n]) + ..., the CPU's order: at most
// kAddNPerLaunch inputs a launch, later launches adding the next ones to y.
// `xs` (count >= 2 device pointers) is a host array.
inline constexpr int kAddNPerLaunch = 16;
cudaError_t LaunchAddN(float* y, const float* const* xs, int count, int64_t n, cudaStream_t stream);
cudaError_t LaunchAddN(double* y, const double* const* xs, int count, int64_t n, cudaStream_t stream);
cudaError_t LaunchAddN(int64_t* y, const int64_t* const* xs, int count, int64_t n, cudaStream_t stream);
// bf16 and fp16 as the CPU's widened kernel: the inputs summed in float, rounded once.
// More than kAddNPerLaunch inputs keep float partial sums in `acc` (n floats;
// may be null up to kAddNPerLaunch inputs).
cudaError_t LaunchAddN(bfloat16* y, const bfloat16* const* xs, int count, int64_t n, float* acc,
                       cudaStream_t stream);
cudaError_t LaunchAddN(float16* y, const float16* const* xs, int count, int64_t n, float* acc, cudaStream_t stream);

// y[n] = x[n] converted to D, as kernels/cpu/cast.cc converts it. Defined
// (explicitly instantiated in unary.cu) for every S and D among float,
// double, int64_t, int32_t, bool, bfloat16 and float16; y must not alias x.
template <typename S, typename D>
cudaError_t LaunchCast(D* y, const S* x, int64_t n, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_UNARY_H_
