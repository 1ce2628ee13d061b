#ifndef STRATA_KERNELS_CUDA_LOSSES_H_
#define STRATA_KERNELS_CUDA_LOSSES_H_

// softmax_cross_entropy, its backward, and accuracy on the GPU, over logits
// [R, C] and I64 labels [R], with the numbers of kernels/cpu/losses.cc
// (row log-sum-exp in double; the batch mean in double). Deterministic: one
// block per row with a fixed tree, then one block adds the R row values in a
// fixed tree; no atomics. Asynchronous on `stream`.
//
// The CPU refuses a label outside [0, C) before computing; the device cannot
// return a status, so such a row's loss (hence the mean), its dlogits row,
// and the accuracy come out NaN instead.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/float16.h"

namespace strata {
namespace cuda {

// loss[0] = mean over rows of logsumexp(logits[r]) - logits[r][label[r]].
// Rows are C apart; the first `classes` (1..C) columns of each are the
// classes, the rest padding that is never read (softmax_cross_entropy's
// `classes` attr; dlogits' padding columns are written 0). A bad `classes`
// is cudaErrorInvalidValue. row_scratch: R doubles of device memory the
// call may overwrite.
cudaError_t LaunchSoftmaxCrossEntropy(float* loss, const float* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream);
cudaError_t LaunchSoftmaxCrossEntropy(double* loss, const double* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream);

// dlogits [R, C] = (softmax(logits) - onehot(label)) * dloss[0] / R.
// dlogits may be logits (in place): each value is read before it is
// written, after the row's sums, by the thread that writes it.
cudaError_t LaunchSoftmaxCrossEntropyGrad(float* dlogits, const float* logits, const int64_t* label, const float* dloss,
                                          int64_t R, int64_t C, int64_t classes, cudaStream_t stream);
cudaError_t LaunchSoftmaxCrossEntropyGrad(double* dlogits, const double* logits, const int64_t* label,
                                          const double* dloss, int64_t R, int64_t C, int64_t classes,
                                          cudaStream_t stream);

// BF16 / F16 logits (mixed precision): loaded widened, the math the float
// overloads' in their order; the loss and dloss are F32 and each dlogits
// value is the float overload's float rounded once to the logits' type
// (round to nearest even, runtime/float16.h, as the cast kernel rounds).
cudaError_t LaunchSoftmaxCrossEntropy(float* loss, const bfloat16* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream);
cudaError_t LaunchSoftmaxCrossEntropy(float* loss, const float16* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream);
cudaError_t LaunchSoftmaxCrossEntropyGrad(bfloat16* dlogits, const bfloat16* logits, const int64_t* label,
                                          const float* dloss, int64_t R, int64_t C, int64_t classes,
                                          cudaStream_t stream);
cudaError_t LaunchSoftmaxCrossEntropyGrad(float16* dlogits, const float16* logits, const int64_t* label,
                                          const float* dloss, int64_t R, int64_t C, int64_t classes,
                                          cudaStream_t stream);

// accuracy[0] = fraction of rows whose label has fewer than k logits strictly
// above it. row_scratch: R doubles.
cudaError_t LaunchAccuracy(float* accuracy, const float* logits, const int64_t* label, int64_t R, int64_t C, int64_t k,
                           double* row_scratch, cudaStream_t stream);
cudaError_t LaunchAccuracy(double* accuracy, const double* logits, const int64_t* label, int64_t R, int64_t C,
                           int64_t k, double* row_scratch, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_LOSSES_H_
