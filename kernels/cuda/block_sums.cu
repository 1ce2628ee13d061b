// Fixed-block sums and the elementwise gradients beside them.
// Blocks: one thread per fixed block of kFixedSumBlock elements (grid-stride
// over the blocks of up to kMaxTensors tensors at once) sums it in index
// order in double, as one CPU task does; then a single thread adds the block
// sums in block order and the tensors' totals in input order, as the CPU's
// caller does. The gradients are grid-stride loops, 256 threads a block, at
// most kMaxBlocks blocks, 64-bit indices.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/block_sums.h"
#include "kernels/shared_math.h"

namespace strata {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;
// Tensors per launch: their pointers travel as kernel arguments.
constexpr int kMaxTensors = 32;

int64_t NumBlocks(int64_t n) { return std::min(kMaxBlocks, (n + kThreads - 1) / kThreads); }
int64_t SumBlocks(int64_t n) { return (n + kFixedSumBlock - 1) / kFixedSumBlock; }

// Up to kMaxTensors tensors (x[i], and for mse y[i]) of n[i] elements.
template <typename T>
struct Tensors {
  int count = 0;
  const T* x[kMaxTensors] = {};
  const T* y[kMaxTensors] = {};
  int64_t n[kMaxTensors] = {};
  int64_t blocks[kMaxTensors] = {};  // SumBlocks(n[i])
};

// partial[g] = the sum over block g (the tensors' blocks in order) of x^2,
// or with kDifference of (x - y)^2.
template <typename T, bool kDifference>
__global__ void BlockSumsKernel(double* partial, Tensors<T> t, int64_t total_blocks) {
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < total_blocks;
       g += int64_t{gridDim.x} * blockDim.x) {
    int i = 0;
    int64_t b = g;
    while (b >= t.blocks[i]) b -= t.blocks[i++];
    const T* x = t.x[i];
    const int64_t lo = b * kFixedSumBlock, hi = t.n[i] < lo + kFixedSumBlock ? t.n[i] : lo + kFixedSumBlock;
    double s = 0;
    if constexpr (kDifference) {
      const T* y = t.y[i];
      for (int64_t k = lo; k < hi; ++k) {
        const double d = static_cast<double>(x[k]) - y[k];  // kernels/cpu/losses.cc's MseLossKernel
        s += d * d;
      }
    } else {
      for (int64_t k = lo; k < hi; ++k) s += static_cast<double>(x[k]) * static_cast<double>(x[k]);
    }
    partial[g] = s;
  }
}

// One thread: *total (0 when first) += each tensor's blocks summed in order;
// y[0] = T(*total) when last.
template <typename T>
__global__ void AddBlockSumsKernel(T* y, double* total, const double* partial, Tensors<T> t, bool first, bool last) {
  double sum = first ? 0.0 : *total;
  int64_t g = 0;
  for (int i = 0; i < t.count; ++i) {
    double s = 0;
    for (int64_t b = 0; b < t.blocks[i]; ++b) s += partial[g++];
    sum += s;
  }
  *total = sum;
  if (last) y[0] = static_cast<T>(sum);
}

// One thread: loss[0] = T(blocks summed in order / n).
template <typename T>
__global__ void MeanKernel(T* loss, const double* partial, int64_t blocks, int64_t n) {
  double sum = 0;
  for (int64_t b = 0; b < blocks; ++b) sum += partial[b];
  loss[0] = static_cast<T>(sum / static_cast<double>(n));
}

template <typename T>
struct Scalars {
  int count = 0;
  const T* p[kMaxTensors] = {};
};

// One thread: *total (0 when first) += each scalar in order as double; coef
// from the total when last.
template <typename T>
__global__ void ClipCoefficientKernel(T* coef, double* total, Scalars<T> s, bool first, bool last, double max_norm) {
  double sum = first ? 0.0 : *total;
  for (int i = 0; i < s.count; ++i) sum += static_cast<double>(*s.p[i]);
  *total = sum;
  if (last) coef[0] = static_cast<T>(ClipCoefficient(sum, max_norm));
}

template <typename T>
__global__ void SumSquaresGradKernel(T* dx, const T* x, const T* dy, int64_t n) {
  const T scale = 2 * dy[0];  // kernels/cpu/optimizers.cc's SumSquaresGradKernel
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dx[i] = scale * x[i];
  }
}

template <typename T>
__global__ void MseLossGradKernel(T* dpred, const T* pred, const T* target, const T* dloss, int64_t n) {
  const T scale = MseGradScale(dloss[0], n);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dpred[i] = (pred[i] - target[i]) * scale;
  }
}

template <typename T>
cudaError_t SumSquares(T* y, const T* const* xs, const int64_t* ns, int count, double* scratch, cudaStream_t stream) {
  double* total = scratch;
  double* partial = scratch + 1;
  int begin = 0;
  do {  // once at least: no tensors give y = 0
    Tensors<T> t;
    t.count = std::min(kMaxTensors, count - begin);
    int64_t blocks = 0;
    for (int i = 0; i < t.count; ++i) {
      t.x[i] = xs[begin + i];
      t.n[i] = ns[begin + i];
      t.blocks[i] = SumBlocks(t.n[i]);
      blocks += t.blocks[i];
    }
    if (blocks > 0) BlockSumsKernel<T, false><<<NumBlocks(blocks), kThreads, 0, stream>>>(partial, t, blocks);
    const bool first = begin == 0;
    begin += t.count;
    AddBlockSumsKernel<T><<<1, 1, 0, stream>>>(y, total, partial, t, first, begin >= count);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  } while (begin < count);
  return cudaSuccess;
}

template <typename T>
cudaError_t Clip(T* coef, const T* const* sums, int count, double max_norm, double* scratch, cudaStream_t stream) {
  int begin = 0;
  do {
    Scalars<T> s;
    s.count = std::min(kMaxTensors, count - begin);
    for (int i = 0; i < s.count; ++i) s.p[i] = sums[begin + i];
    const bool first = begin == 0;
    begin += s.count;
    ClipCoefficientKernel<T><<<1, 1, 0, stream>>>(coef, scratch, s, first, begin >= count, max_norm);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  } while (begin < count);
  return cudaSuccess;
}

template <typename T>
cudaError_t MseLoss(T* loss, const T* pred, const T* target, int64_t n, double* scratch, cudaStream_t stream) {
  Tensors<T> t;
  t.count = 1;
  t.x[0] = pred;
  t.y[0] = target;
  t.n[0] = n;
  t.blocks[0] = SumBlocks(n);
  if (t.blocks[0] > 0) {
    BlockSumsKernel<T, true><<<NumBlocks(t.blocks[0]), kThreads, 0, stream>>>(scratch, t, t.blocks[0]);
  }
  MeanKernel<T><<<1, 1, 0, stream>>>(loss, scratch, t.blocks[0], n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t SumSquaresGrad(T* dx, const T* x, const T* dy, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  SumSquaresGradKernel<T><<<NumBlocks(n), kThreads, 0, stream>>>(dx, x, dy, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t MseLossGrad(T* dpred, const T* pred, const T* target, const T* dloss, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  MseLossGradKernel<T><<<NumBlocks(n), kThreads, 0, stream>>>(dpred, pred, target, dloss, n);
  return cudaGetLastError();
}

}  // namespace

int64_t SumSquaresScratchDoubles(const int64_t* ns, int count) {
  int64_t most = 0;
  for (int begin = 0; begin < count; begin += kMaxTensors) {
    int64_t blocks = 0;
    for (int i = begin; i < std::min(count, begin + kMaxTensors); ++i) blocks += SumBlocks(ns[i]);
    most = std::max(most, blocks);
  }
  return 1 + most;
}

int64_t MseLossScratchDoubles(int64_t n) { return SumBlocks(n); }

cudaError_t LaunchSumSquares(float* y, const float* const* xs, const int64_t* ns, int count, double* scratch,
                             cudaStream_t stream) {
  return SumSquares(y, xs, ns, count, scratch, stream);
}
cudaError_t LaunchSumSquares(double* y, const double* const* xs, const int64_t* ns, int count, double* scratch,
                             cudaStream_t stream) {
  return SumSquares(y, xs, ns, count, scratch, stream);
}

cudaError_t LaunchSumSquaresGrad(float* dx, const float* x, const float* dy, int64_t n, cudaStream_t stream) {
  return SumSquaresGrad(dx, x, dy, n, stream);
}
cudaError_t LaunchSumSquaresGrad(double* dx, const double* x, const double* dy, int64_t n, cudaStream_t stream) {
  return SumSquaresGrad(dx, x, dy, n, stream);
}

cudaError_t LaunchClipCoefficient(float* coef, const float* const* sums, int count, double max_norm, double* scratch,
                                  cudaStream_t stream) {
  return Clip(coef, sums, count, max_norm, scratch, stream);
}
cudaError_t LaunchClipCoefficient(double* coef, const double* const* sums, int count, double max_norm, double* scratch,
                                  cudaStream_t stream) {
  return Clip(coef, sums, count, max_norm, scratch, stream);
}

cudaError_t LaunchMseLoss(float* loss, const float* pred, const float* target, int64_t n, double* scratch,
                          cudaStream_t stream) {
  return MseLoss(loss, pred, target, n, scratch, stream);
}
cudaError_t LaunchMseLoss(double* loss, const double* pred, const double* target, int64_t n, double* scratch,
                          cudaStream_t stream) {
  return MseLoss(loss, pred, target, n, scratch, stream);
}

cudaError_t LaunchMseLossGrad(float* dpred, const float* pred, const float* target, const float* dloss, int64_t n,
                              cudaStream_t stream) {
  return MseLossGrad(dpred, pred, target, dloss, n, stream);
}
cudaError_t LaunchMseLossGrad(double* dpred, const double* pred, const double* target, const double* dloss, int64_t n,
                              cudaStream_t stream) {
  return MseLossGrad(dpred, pred, target, dloss, n, stream);
}

}  // namespace cuda
}  // namespace strata
