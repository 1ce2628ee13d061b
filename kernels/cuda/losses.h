#ifndef STRATA_KERNELS_CUDA_LOSSES_H_
#define STRATA_KERNELS_CUDA_LOSSES_H_

// softmax_cross_entropy, its backward, and accuracy on the GPU, over logits
// [R, C] and I64 labels [R], with the numbers of kernels/cpu/losses.cc
// (row log-sum-exp in double; the batch mean in double) for F32 and F64
// logits, within the bounds below for BF16 / F16 logits. Deterministic: one
// block per row with a fixed tree, then one block adds the R row values in a
// fixed tree; no atomics. Asynchronous on `stream`.
//
// The CPU refuses a label outside [0, C) before computing; the device cannot
// return a status, so such a row's loss (hence the mean), its dlogits row,
// and the accuracy come out NaN instead.

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "kernels/env_switch.h"
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

// Whether BF16 / F16 logits take the fast kernels described next rather than
// the widened path (each 16-bit logit widened as loaded, the F32 kernels'
// double math in their order, dlogits the float kernel's float rounded once
// to T: bit for bit the F32 kernels on the widened logits, which ran on an
// H200 on 2026-11-27). On by default since the fast kernels passed
// cuda_ops_test on an H200 on 2026-11-29 (written 2026-11-27 without one;
// emulated in losses_emulation_test); STRATA_FAST_HALF_LOSS=0 turns them
// off for a process. Both paths meet the bounds below (the widened one far
// inside them).
inline std::atomic<bool>& FastHalfLoss() {
  static std::atomic<bool> on{EnvSwitch("STRATA_FAST_HALF_LOSS", /*default_on=*/true)};
  return on;
}

// Sets FastHalfLoss() for its lifetime (tests), then restores it.
class ScopedFastHalfLoss : public ScopedSwitch {
 public:
  explicit ScopedFastHalfLoss(bool on) : ScopedSwitch(FastHalfLoss(), on) {}
};

// BF16 / F16 logits (mixed precision; the loss and dloss F32, dlogits the
// logits' type), the fast kernels: float math where the cost is (losses.cu), one read of the
// row for the loss and a read and a write for the gradient when rows are
// 16-byte aligned and C a multiple of 8. With M the row's max, S the sum of
// expf(x - M) over the classes (float terms, double sums):
//   loss = mean of (M - x_l) + log(S), in double, rounded to float;
//   dlogits_j = expf(x_j - M) * float(dloss / R / S) rounded once to T
//   (nearest even, runtime/float16.h), j != l; dlogits_l =
//   expm1((x_l - M) - log(S)) * dloss / R in double, rounded to float,
//   then to T (two roundings, within the one-spacing bound below).
// S is within eps_S = 2^-22 (expf's 2 ulps) + 3 * 2^-24 (a group of 8 terms
// added pairwise in float) + 2^-24 (ln V + 1) (x - M rounded in float,
// weighted by the terms) of the exact sum, relative: 1.1e-6 at V = 50257.
// So against the CPU's kernels (double math) the loss is within
// 1.01 eps_S + 2^-23 |loss| and each dlogits value within one spacing of T
// at its magnitude (both sides' float values agree within a few 1e-6,
// relative, far under T's 2^-8 or 2^-11, so their roundings to T differ by
// at most one step; for dlogits_l while the CPU's own rounding of 1 - p_l,
// ~2^-52 |lse|, is small beside 1 - p_l). The numbers depend on the
// classes' values only (not on C, the alignment or the path the kernels
// take), and two runs give the same bits.
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
