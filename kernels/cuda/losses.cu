// softmax_cross_entropy(_grad) and accuracy.
// Blocks: one block of kThreads threads per row (grid-stride over rows);
// thread t visits the row's columns t, t + kThreads, ... in order; the row's
// max (order-free), sum of exp (double) or count is then combined by a fixed
// shared-memory tree. The batch mean is one block of kThreads threads over
// the R row values, the same way. Nothing depends on timing, so two runs give
// the same bits.
//
// The cross-entropy kernels are templates on the logits' storage type T:
// bf16 / f16 logits (mixed precision) are widened as they are loaded (exact)
// and the math is the float kernel's, in the same order; the loss is written
// F32 and each dlogits value is the float kernel's float rounded once to T
// (round to nearest even, runtime/float16.h, as the cast kernel and the
// CPU's 16-bit kernels round), so the 16-bit kernels give the float kernels'
// results cast down.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/losses.h"
#include "runtime/float16.h"

namespace strata {
namespace cuda {
namespace {

constexpr int kThreads = 256;  // a power of two: the trees halve it
constexpr int64_t kMaxBlocks = 65536;

template <typename T>
inline constexpr bool kHalf = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// A logit as double: 16-bit ones through float (both exact).
template <typename T>
__device__ double Wide(T x) {
  if constexpr (kHalf<T>) {
    return static_cast<double>(ToFloat(x));
  } else {
    return static_cast<double>(x);
  }
}

// A dlogits value as T: 16-bit ones as the float kernel's float rounded to
// nearest even (the float kernel's result, then the cast's rounding).
template <typename T>
__device__ T Narrow(double v) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return ToBfloat16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, float16>) {
    return ToFloat16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// max and log(sum(exp(x - max))) of row xr [C], as RowLogSumExp on the CPU.
template <typename T>
__device__ void RowLogSumExp(const T* xr, int64_t C, double* shared, double* max, double* log_sum) {
  double m = -__longlong_as_double(0x7ff0000000000000LL);  // -inf
  for (int64_t j = threadIdx.x; j < C; j += kThreads) m = MaxOp()(m, Wide(xr[j]));
  m = BlockReduce<kThreads>(m, shared, MaxOp());
  double s = 0;
  for (int64_t j = threadIdx.x; j < C; j += kThreads) s += exp(Wide(xr[j]) - m);
  s = BlockReduce<kThreads>(s, shared, SumOp());
  *max = m;
  *log_sum = log(s);
}

// Rows C apart, of which the first V columns are the classes (V < C: the
// padding columns of a row-aligned LM head, never read).
template <typename T>
__global__ void RowLossKernel(double* row_loss, const T* logits, const int64_t* label, int64_t R, int64_t C,
                              int64_t V) {
  __shared__ double shared[kThreads];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = logits + r * C;
    double max, log_sum;
    RowLogSumExp(xr, V, shared, &max, &log_sum);
    if (threadIdx.x == 0) {
      const int64_t l = label[r];
      row_loss[r] = l < 0 || l >= V ? QuietNaN() : max + log_sum - Wide(xr[l]);
    }
  }
}

// out[0] = T(sum of values[R] / R): one block.
template <typename T>
__global__ void MeanKernel(T* out, const double* values, int64_t R) {
  __shared__ double shared[kThreads];
  double s = 0;
  for (int64_t r = threadIdx.x; r < R; r += kThreads) s += values[r];
  s = BlockReduce<kThreads>(s, shared, SumOp());
  if (threadIdx.x == 0) out[0] = static_cast<T>(s / static_cast<double>(R));
}

// L: dloss's type (F32 for 16-bit logits, else T).
// The padding columns (j >= V) get zeros.
template <typename T, typename L>
__global__ void GradKernel(T* dlogits, const T* logits, const int64_t* label, const L* dloss, int64_t R, int64_t C,
                           int64_t V) {
  __shared__ double shared[kThreads];
  const double scale = static_cast<double>(dloss[0]) / static_cast<double>(R);
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = logits + r * C;
    T* dr = dlogits + r * C;
    double max, log_sum;
    RowLogSumExp(xr, V, shared, &max, &log_sum);
    const double lse = max + log_sum;
    const int64_t l = label[r];
    const bool bad = l < 0 || l >= V;
    for (int64_t j = threadIdx.x; j < V; j += kThreads) {
      const double p = exp(Wide(xr[j]) - lse);
      dr[j] = Narrow<T>(bad ? QuietNaN() : (j == l ? (p - 1.0) * scale : p * scale));
    }
    for (int64_t j = V + threadIdx.x; j < C; j += kThreads) dr[j] = Narrow<T>(0.0);
  }
}

// row_correct[r] = 1 if fewer than k logits of row r lie strictly above the
// label's, else 0 (NaN for a label outside [0, C)).
template <typename T>
__global__ void RowCorrectKernel(double* row_correct, const T* logits, const int64_t* label, int64_t R, int64_t C,
                                 int64_t k) {
  __shared__ double shared[kThreads];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = logits + r * C;
    const int64_t l = label[r];
    const bool bad = l < 0 || l >= C;
    const T target = bad ? T(0) : xr[l];
    double above = 0;  // counts are exact in double up to 2^53
    for (int64_t j = threadIdx.x; j < C; j += kThreads) above += xr[j] > target ? 1.0 : 0.0;
    above = BlockReduce<kThreads>(above, shared, SumOp());
    if (threadIdx.x == 0) row_correct[r] = bad ? QuietNaN() : (above < static_cast<double>(k) ? 1.0 : 0.0);
  }
}

int64_t RowBlocks(int64_t R) { return std::min(kMaxBlocks, R); }

// L: the loss's type (F32 for 16-bit logits, else T).
template <typename T, typename L>
cudaError_t SoftmaxCrossEntropy(L* loss, const T* logits, const int64_t* label, int64_t R, int64_t C, int64_t V,
                                double* row_scratch, cudaStream_t stream) {
  if (C > 0 && (V < 1 || V > C)) return cudaErrorInvalidValue;
  if (R > 0) {
    RowLossKernel<T><<<RowBlocks(R), kThreads, 0, stream>>>(row_scratch, logits, label, R, C, V);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  MeanKernel<L><<<1, kThreads, 0, stream>>>(loss, row_scratch, R);  // R == 0: 0 / 0, NaN as on the CPU
  return cudaGetLastError();
}

template <typename T, typename L>
cudaError_t SoftmaxCrossEntropyGrad(T* dlogits, const T* logits, const int64_t* label, const L* dloss, int64_t R,
                                    int64_t C, int64_t V, cudaStream_t stream) {
  if (R <= 0 || C <= 0) return cudaSuccess;
  if (C > 0 && (V < 1 || V > C)) return cudaErrorInvalidValue;
  GradKernel<T, L><<<RowBlocks(R), kThreads, 0, stream>>>(dlogits, logits, label, dloss, R, C, V);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Accuracy(T* accuracy, const T* logits, const int64_t* label, int64_t R, int64_t C, int64_t k,
                     double* row_scratch, cudaStream_t stream) {
  if (R > 0) {
    RowCorrectKernel<T><<<RowBlocks(R), kThreads, 0, stream>>>(row_scratch, logits, label, R, C, k);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  MeanKernel<T><<<1, kThreads, 0, stream>>>(accuracy, row_scratch, R);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSoftmaxCrossEntropy(float* loss, const float* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream) {
  return SoftmaxCrossEntropy(loss, logits, label, R, C, classes, row_scratch, stream);
}
cudaError_t LaunchSoftmaxCrossEntropy(double* loss, const double* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream) {
  return SoftmaxCrossEntropy(loss, logits, label, R, C, classes, row_scratch, stream);
}

cudaError_t LaunchSoftmaxCrossEntropy(float* loss, const bfloat16* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream) {
  return SoftmaxCrossEntropy(loss, logits, label, R, C, classes, row_scratch, stream);
}
cudaError_t LaunchSoftmaxCrossEntropy(float* loss, const float16* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream) {
  return SoftmaxCrossEntropy(loss, logits, label, R, C, classes, row_scratch, stream);
}

cudaError_t LaunchSoftmaxCrossEntropyGrad(float* dlogits, const float* logits, const int64_t* label, const float* dloss,
                                          int64_t R, int64_t C, int64_t classes, cudaStream_t stream) {
  return SoftmaxCrossEntropyGrad(dlogits, logits, label, dloss, R, C, classes, stream);
}
cudaError_t LaunchSoftmaxCrossEntropyGrad(double* dlogits, const double* logits, const int64_t* label,
                                          const double* dloss, int64_t R, int64_t C, int64_t classes,
                                          cudaStream_t stream) {
  return SoftmaxCrossEntropyGrad(dlogits, logits, label, dloss, R, C, classes, stream);
}

cudaError_t LaunchSoftmaxCrossEntropyGrad(bfloat16* dlogits, const bfloat16* logits, const int64_t* label,
                                          const float* dloss, int64_t R, int64_t C, int64_t classes,
                                          cudaStream_t stream) {
  return SoftmaxCrossEntropyGrad(dlogits, logits, label, dloss, R, C, classes, stream);
}
cudaError_t LaunchSoftmaxCrossEntropyGrad(float16* dlogits, const float16* logits, const int64_t* label,
                                          const float* dloss, int64_t R, int64_t C, int64_t classes,
                                          cudaStream_t stream) {
  return SoftmaxCrossEntropyGrad(dlogits, logits, label, dloss, R, C, classes, stream);
}

cudaError_t LaunchAccuracy(float* accuracy, const float* logits, const int64_t* label, int64_t R, int64_t C, int64_t k,
                           double* row_scratch, cudaStream_t stream) {
  return Accuracy(accuracy, logits, label, R, C, k, row_scratch, stream);
}
cudaError_t LaunchAccuracy(double* accuracy, const double* logits, const int64_t* label, int64_t R, int64_t C,
                           int64_t k, double* row_scratch, cudaStream_t stream) {
  return Accuracy(accuracy, logits, label, R, C, k, row_scratch, stream);
}

}  // namespace cuda
}  // namespace strata
