#ifndef STRATA_KERNELS_CUDA_ATTENTION_H_
#define STRATA_KERNELS_CUDA_ATTENTION_H_

// scaled_dot_product_attention and its gradient on the GPU, flash-style: the
// [T, T] score matrix never exists. q, k, v, y, dy: [heads, T, D] row-major
// (heads = B * H); lse, dlse: [heads, T]. The numbers of
// kernels/cpu/attention.cc, computed in another order.
//
// - Forward: a block of kRows query rows, one thread per row, walks the keys
//   in tiles of kCols held in shared memory; each row keeps FlashAttention's
//   running max m, sum l and output accumulator (rescaled once per tile), so
//   y = acc / l and lse = m + log(l). Causal rows stop at their own position;
//   a block stops at its last row's.
// - Backward (FlashAttention-2's, without atomics, so runs repeat bit for
//   bit): di = rowsum(dy * y) - dlse per row (in double, as the CPU); then
//   one kernel over key rows (a thread per key, its dk and dv accumulated
//   over every query row that sees it, in row order) and one over query rows
//   (a thread per query, dq over the keys it sees, in key order). Each
//   recomputes p = exp(scale q.k - lse) the way the forward computed the score.
//
// D <= kMaxHeadDim; larger heads are refused by the registration. Shared
// memory beyond 48 KiB (D = 128 in the backward) is opted into per kernel.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata {
namespace cuda {

inline constexpr int kMaxHeadDim = 128;

// y, lse from q, k, v. scale: the scores' factor (already resolved from 0).
cudaError_t LaunchAttention(float* y, float* lse, const float* q, const float* k, const float* v, int64_t heads,
                            int64_t T, int64_t D, double scale, bool causal, cudaStream_t stream);
cudaError_t LaunchAttention(double* y, double* lse, const double* q, const double* k, const double* v, int64_t heads,
                            int64_t T, int64_t D, double scale, bool causal, cudaStream_t stream);

// Elements of the gradient's scratch (di, one per query row), in the dtype.
inline int64_t AttentionGradScratch(int64_t heads, int64_t T) { return heads * T; }

// dq, dk, dv from q, k, v, y, lse, dy and dlse (null: no gradient reaches lse).
// `di` holds AttentionGradScratch elements.
cudaError_t LaunchAttentionGrad(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v,
                                const float* y, const float* lse, const float* dy, const float* dlse, float* di,
                                int64_t heads, int64_t T, int64_t D, double scale, bool causal, cudaStream_t stream);
cudaError_t LaunchAttentionGrad(double* dq, double* dk, double* dv, const double* q, const double* k, const double* v,
                                const double* y, const double* lse, const double* dy, const double* dlse, double* di,
                                int64_t heads, int64_t T, int64_t D, double scale, bool causal, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_ATTENTION_H_
