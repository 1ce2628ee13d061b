#ifndef STRATA_KERNELS_CUDA_BLOCK_SUMS_H_
#define STRATA_KERNELS_CUDA_BLOCK_SUMS_H_

// sum_squares, sum_squares_grad, clip_coefficient, mse_loss and
// mse_loss_grad on the GPU, with the numbers of the CPU kernels
// (kernels/cpu/optimizers.cc, losses.cc): the sums run over the fixed blocks
// of kernels/shared_math.h, each block summed in index order in double and
// the blocks' sums added in block order, so the result equals the CPU's bit
// for bit and two runs give the same bits (no atomics). Scalar inputs (dy,
// dloss, the partial sums of clip_coefficient) are read on the device.
// Asynchronous on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata {
namespace cuda {

// The scratch doubles LaunchSumSquares needs for tensors of ns[count]
// elements (block sums of one launch's worth of tensors, plus the total).
int64_t SumSquaresScratchDoubles(const int64_t* ns, int count);

// y[0] = sum over i < count of the sum of xs[i][k]^2, k < ns[i]; xs is a host
// array of device pointers. scratch: SumSquaresScratchDoubles(ns, count).
cudaError_t LaunchSumSquares(float* y, const float* const* xs, const int64_t* ns, int count, double* scratch,
                             cudaStream_t stream);
cudaError_t LaunchSumSquares(double* y, const double* const* xs, const int64_t* ns, int count, double* scratch,
                             cudaStream_t stream);

// dx[n] = (2 * dy[0]) * x[n].
cudaError_t LaunchSumSquaresGrad(float* dx, const float* x, const float* dy, int64_t n, cudaStream_t stream);
cudaError_t LaunchSumSquaresGrad(double* dx, const double* x, const double* dy, int64_t n, cudaStream_t stream);

// coef[0] = ClipCoefficient(sums[0][0] + ... + sums[count - 1][0], max_norm)
// (kernels/shared_math.h); sums is a host array of device scalars. scratch:
// one double.
cudaError_t LaunchClipCoefficient(float* coef, const float* const* sums, int count, double max_norm, double* scratch,
                                  cudaStream_t stream);
cudaError_t LaunchClipCoefficient(double* coef, const double* const* sums, int count, double max_norm, double* scratch,
                                  cudaStream_t stream);

// The scratch doubles LaunchMseLoss needs for n elements: one per block.
int64_t MseLossScratchDoubles(int64_t n);

// loss[0] = mean over n of (pred - target)^2 (NaN for n == 0, as 0 / 0 on
// the CPU). scratch: MseLossScratchDoubles(n).
cudaError_t LaunchMseLoss(float* loss, const float* pred, const float* target, int64_t n, double* scratch,
                          cudaStream_t stream);
cudaError_t LaunchMseLoss(double* loss, const double* pred, const double* target, int64_t n, double* scratch,
                          cudaStream_t stream);

// dpred[n] = (pred - target) * MseGradScale(dloss[0], n).
cudaError_t LaunchMseLossGrad(float* dpred, const float* pred, const float* target, const float* dloss, int64_t n,
                              cudaStream_t stream);
cudaError_t LaunchMseLossGrad(double* dpred, const double* pred, const double* target, const double* dloss, int64_t n,
                              cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_BLOCK_SUMS_H_
