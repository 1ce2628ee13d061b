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
//
// Those kernels run a thread per row on CUDA cores, so where a chunk of
// heads' [T, T] scores fits a workspace the op kernels
// (cuda_attention_ops.cc) take the GEMM path instead, as PyTorch's math
// backend does: per chunk, cuBLASLt strided batches for S = scale q k^T and
// y = P v (backward: dv = P^T dy, dP = dy v^T, dq = scale dS k,
// dk = scale dS^T q), and the row-wise launchers below in between.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/attention_budget.h"
#include "kernels/host_device.h"

namespace strata {
namespace cuda {

inline constexpr int kMaxHeadDim = 128;

// Where head `head` (b * H + h) of q, k, v, y and their gradients starts and
// the stride between its rows: [B, H, T, D] (the default; H = 1 reads as the
// [heads, T, D] above) or, for the op's layout "bthd", [B, T, H, D], a head's
// rows H * D apart. lse, dlse and di are [B, H, T] ([heads, T]) in both.
//
// `pack` ("bthd" only): q, k, v (and dq, dk, dv) are slots of one
// [B, T, pack, H, D] buffer, scaled_dot_product_attention_qkv's qkv (pack 3,
// slot 0 q, 1 k, 2 v): the caller passes k = q + H * D, v = q + 2 H * D, and
// a head's rows lie pack * H * D apart (QkvOffset, QkvRowStride). y and dy
// keep [B, T, H, D] (Offset, RowStride), so the qkv form writes its y and
// reads its dy as the "bthd" op does. pack 1: the two pairs agree.
struct HeadLayout {
  int64_t H = 1;
  bool bthd = false;
  int64_t pack = 1;
  // Of y and dy (and of q, k, v and their gradients when pack is 1).
  STRATA_HOST_DEVICE int64_t Offset(int64_t head, int64_t T, int64_t D) const {
    return bthd ? (head / H) * T * H * D + (head % H) * D : head * T * D;
  }
  STRATA_HOST_DEVICE int64_t RowStride(int64_t D) const { return bthd ? H * D : D; }
  // Of q, k, v, dq, dk and dv, each from its own slot's pointer.
  STRATA_HOST_DEVICE int64_t QkvOffset(int64_t head, int64_t T, int64_t D) const {
    return bthd ? (head / H) * T * pack * H * D + (head % H) * D : head * T * D;
  }
  STRATA_HOST_DEVICE int64_t QkvRowStride(int64_t D) const { return bthd ? pack * H * D : D; }
  // Whether the fields describe a layout: "bthd" with H >= 1 and pack >= 1, or pack 1.
  STRATA_HOST_DEVICE bool Valid() const { return bthd ? H >= 1 && pack >= 1 : pack == 1; }
  // Row `row` of [heads, T] (lse's order) in units of rows of D.
  STRATA_HOST_DEVICE int64_t Row(int64_t row, int64_t T) const {
    return bthd ? ((row / T / H) * T + row % T) * H + (row / T) % H : row;
  }
};

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

// Bytes of [T, T] score buffers the GEMM path holds at once:
// kDefaultAttentionScoreBudget (kernels/attention_budget.h) unless a test
// sets less (0 sends every shape to the flash kernels).
inline std::atomic<int64_t>& AttentionScoreBudget() {
  static std::atomic<int64_t> bytes{kDefaultAttentionScoreBudget};
  return bytes;
}

// Heads per chunk of the GEMM path when each head needs `buffers` [T, T]
// matrices of `elem` bytes: as many as the budget holds, at least one; 0
// (the flash kernels) when one head needs more than kAttentionHeadBudgets.
inline int64_t AttentionChunkHeads(int64_t heads, int64_t T, int64_t elem, int buffers) {
  const int64_t per_head = T * T * elem * buffers;
  const int64_t budget = AttentionScoreBudget().load();
  if (heads <= 0 || per_head <= 0 || per_head > kAttentionHeadBudgets * budget) return 0;
  return std::clamp<int64_t>(budget / per_head, 1, heads);
}

// The GEMM path's row-wise steps on `heads` [T, T] score matrices p.
// Softmax: p holds scale q k^T and becomes the probabilities (0 above the
// diagonal when causal); lse [heads, T] gets each row's logsumexp.
cudaError_t LaunchAttentionSoftmax(float* p, float* lse, int64_t heads, int64_t T, bool causal, cudaStream_t stream);
cudaError_t LaunchAttentionSoftmax(double* p, double* lse, int64_t heads, int64_t T, bool causal,
                                   cudaStream_t stream);
// Probs: p holds scale q k^T and becomes exp(p - lse) (0 above the diagonal
// when causal), the forward's probabilities again.
cudaError_t LaunchAttentionProbs(float* p, const float* lse, int64_t heads, int64_t T, bool causal,
                                 cudaStream_t stream);
cudaError_t LaunchAttentionProbs(double* p, const double* lse, int64_t heads, int64_t T, bool causal,
                                 cudaStream_t stream);
// di [rows] = rowsum(dy * y) - dlse (dlse may be null), y and dy [rows, D].
cudaError_t LaunchAttentionRowDots(float* di, const float* y, const float* dy, const float* dlse, int64_t rows,
                                   int64_t D, cudaStream_t stream);
cudaError_t LaunchAttentionRowDots(double* di, const double* y, const double* dy, const double* dlse, int64_t rows,
                                   int64_t D, cudaStream_t stream);
// ScoreGrad: ds holds dP = dy v^T and becomes p * (dP - di) per row.
cudaError_t LaunchAttentionScoreGrad(float* ds, const float* p, const float* di, int64_t heads, int64_t T,
                                     cudaStream_t stream);
cudaError_t LaunchAttentionScoreGrad(double* ds, const double* p, const double* di, int64_t heads, int64_t T,
                                     cudaStream_t stream);

// 16-bit q, k, v (the GEMM path only): the scores, lse, di and the dP
// buffer in float; the probabilities for P v and P^T dy, and dS for its two
// products, in q's type.
cudaError_t LaunchAttentionSoftmax(const float* s, __nv_bfloat16* p, float* lse, int64_t heads, int64_t T, bool causal,
                                   cudaStream_t stream);
cudaError_t LaunchAttentionSoftmax(const float* s, __half* p, float* lse, int64_t heads, int64_t T, bool causal,
                                   cudaStream_t stream);
cudaError_t LaunchAttentionProbs(float* p, __nv_bfloat16* copy, const float* lse, int64_t heads, int64_t T,
                                 bool causal, cudaStream_t stream);
cudaError_t LaunchAttentionProbs(float* p, __half* copy, const float* lse, int64_t heads, int64_t T, bool causal,
                                 cudaStream_t stream);
// (`layout`: y and dy's; the flash kernels pass "bthd" through, di stays
// [heads, T] with rows = heads * T.)
cudaError_t LaunchAttentionRowDots(float* di, const __nv_bfloat16* y, const __nv_bfloat16* dy, const float* dlse,
                                   int64_t rows, int64_t D, cudaStream_t stream, int64_t T = 1,
                                   HeadLayout layout = {});
cudaError_t LaunchAttentionRowDots(float* di, const __half* y, const __half* dy, const float* dlse, int64_t rows,
                                   int64_t D, cudaStream_t stream, int64_t T = 1, HeadLayout layout = {});
cudaError_t LaunchAttentionScoreGrad(__nv_bfloat16* ds, const float* dp, const float* p, const float* di,
                                     int64_t heads, int64_t T, cudaStream_t stream);
cudaError_t LaunchAttentionScoreGrad(__half* ds, const float* dp, const float* p, const float* di, int64_t heads,
                                     int64_t T, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_ATTENTION_H_
