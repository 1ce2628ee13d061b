#ifndef STRATA_KERNELS_CUDA_FLASH_ATTENTION_H_
#define STRATA_KERNELS_CUDA_FLASH_ATTENTION_H_

// scaled_dot_product_attention and its gradient for bf16 and fp16 q, k, v on
// tensor cores, FlashAttention-2's way: the [T, T] scores never reach memory.
// Layout as attention.h: q, k, v, y, dy [heads, T, D] row-major, or with a
// HeadLayout of "bthd" [B, T, H, D] (the rows of a head H * D apart, read and
// written in place: no transposes), q, k, v and their gradients possibly the
// slots of one [B, T, 3, H, D] qkv (HeadLayout's pack: rows 3 H D apart);
// lse, dlse and di [heads, T] in float.
// Head sizes 32, 64 and 128 (others keep the GEMM path). The tile bounds, mask and softmax steps are
// flash_attention_math.h's.
//
// - Forward: a block of 4 warps owns 64 query rows (16 a warp, their q held in
//   WMMA fragments) and walks 64-key tiles of k and v in shared memory, up to
//   the diagonal when causal. Per tile a warp computes S = q k^T (16x16x16
//   WMMA, float sums) into shared memory, scales and masks it in float, moves
//   each row's running max m and sum l (two lanes a row), rounds
//   P = exp(S - m) to q's type for P v, and rescales its float output rows.
//   y = acc / l is rounded once; lse = m + log(l) in float.
// - Backward, without atomics (runs repeat bit for bit): di = rowsum(dy * y)
//   - dlse (attention.h's LaunchAttentionRowDots, in double); a kernel over
//   64-key blocks (a warp owns 16 keys, walks the query tiles that see them,
//   recomputes P = exp(scale k q^T - lse) and dS = P (dP - di), accumulates
//   dv += P^T dy and dk += dS^T q in WMMA fragments); a kernel over 64-query
//   blocks for dq = scale dS k the same way. P (for dv) and dS are rounded to
//   q's type for their products, as on the GEMM path. With
//   StoredScoreGrads() (mma.sync only) the dk/dv kernel also stores dS, and
//   dq is one product over it: no second pass over the scores.
//
// Shared memory: 36 to 76 KiB forward, 73 to 137 KiB backward; above 48 KiB
// each kernel opts in once per device.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/flash_attention_math.h"
#include "kernels/env_switch.h"

namespace strata {
namespace cuda {

// Whether bf16 and fp16 attention takes these kernels where the head size
// allows; false (the default until they have run on a GPU: they were
// written without one) sends it to the GEMM path (attention.h). The tests
// run every case on both. The one switch the compiler reads too
// (kernels/attention_budget.h, STRATA_TENSOR_CORE_ATTENTION).
inline std::atomic<bool>& FlashTensorCoreAttention() { return TensorCoreAttention(); }

// Whether attention runs on mma.sync with the scores, probabilities and
// outputs in registers (FlashForward, FlashGradKVMma, FlashGradQMma;
// mma_m16n8k16.h) rather than through WMMA and shared memory
// (FlashForwardWmma, FlashGradKV, FlashGradQ). On by default since they
// passed cuda_ops_test on an H200 on 2026-11-29 (written 2026-11-27 without
// a GPU, checked in flash_attention_emulation_test under the PTX ISA's
// fragment layouts) and took GPT-2's step from 35.2 to 22.5 ms;
// STRATA_MMA_ATTENTION=0 turns it off for a process (the WMMA kernels).
inline std::atomic<bool>& MmaFlashAttention() {
  static std::atomic<bool> on{EnvSwitch("STRATA_MMA_ATTENTION", /*default_on=*/true)};
  return on;
}

// Whether the mma.sync forward's and dq's warps own 32 query rows at head
// sizes up to 64 (each B fragment read from shared memory then feeds two
// products, at about 230-255 registers: 2 blocks an SM) rather than 16 (half
// the shared-memory reads a product, more blocks an SM). On by default;
// STRATA_MMA_WIDE_WARPS=0 turns it off for a process, so a GPU run can time
// both (bench/attention_bench does).
inline std::atomic<bool>& MmaWideWarps() {
  static std::atomic<bool> on{EnvSwitch("STRATA_MMA_WIDE_WARPS", /*default_on=*/true)};
  return on;
}

// Whether the mma.sync gradient stores the score gradients dS (16 bits,
// rounded as for their products) from its dk/dv kernel, which computes them
// anyway, so that dq is one product over them (FlashGradQStored) instead of
// a second pass that recomputes the scores, P, dP and dS (FlashGradQMma):
// 5 products of a tile instead of 7, for a write and a read of dS (half of
// [T, T] a head when causal). The same bits either way: the same dS (the
// score arithmetic spelled out, flash_attention_math.h's GradExponent, so
// that nvcc cannot contract the two kernels' differently) and the same
// products in the same order. Off by default
// until a GPU has timed it (written 2026-11-30 without one, checked in
// flash_attention_emulation_test); STRATA_STORED_SCORE_GRADS=1 turns it on
// for a process.
inline std::atomic<bool>& StoredScoreGrads() {
  static std::atomic<bool> on{EnvSwitch("STRATA_STORED_SCORE_GRADS", /*default_on=*/false)};
  return on;
}

// Head sizes with a kernel instantiation.
inline bool FlashTensorCoreHeadDim(int64_t D) { return FlashEligible(true, D); }

// At most this many heads (grid.y).
inline constexpr int64_t kFlashMaxHeads = 65535;

// y, lse [heads, T] (float) from q, k, v. scale: the scores' factor.
// layout: where a head's rows lie (attention.h; "bthd" needs heads % H == 0;
// with pack 3, k = q + H * D and v = q + 2 H * D, dk and dv likewise).
cudaError_t LaunchFlashAttention(__nv_bfloat16* y, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                 const __nv_bfloat16* v, int64_t heads, int64_t T, int64_t D, float scale, bool causal,
                                 cudaStream_t stream, HeadLayout layout = {});
cudaError_t LaunchFlashAttention(__half* y, float* lse, const __half* q, const __half* k, const __half* v,
                                 int64_t heads, int64_t T, int64_t D, float scale, bool causal, cudaStream_t stream,
                                 HeadLayout layout = {});

// 32-bit words of score-gradient scratch the gradient of 16-bit attention
// with heads of D takes (LaunchFlashAttentionGrad's score_grads): 0 unless
// the mma.sync kernels run with StoredScoreGrads() on, and the store fits
// kDefaultAttentionScoreBudget (256 MiB; GPT-2 124M's layer, 96 heads of
// 1024 causal tokens, takes 97.5 MiB). One rule for the kernel's scratch and
// the memory plan's.
inline int64_t FlashScoreGradWords(int64_t heads, int64_t T, int64_t D, bool causal) {
  if (!MmaFlashAttention().load() || !StoredScoreGrads().load() || !FlashTensorCoreHeadDim(D)) return 0;
  const int64_t words = flash::ScoreGradWords(heads, T, causal);
  return words * 4 <= kDefaultAttentionScoreBudget ? words : 0;
}

// dq, dk, dv from q, k, v, y, lse, dy and dlse (null: no gradient reaches
// lse). `di`: scratch of attention.h's AttentionGradScratch(heads, T) floats.
// `score_grads`: null, or FlashScoreGradWords(heads, T, D, causal) words of
// scratch (16-byte aligned), which then hold the score gradients on the way
// to dq (StoredScoreGrads()).
cudaError_t LaunchFlashAttentionGrad(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, const __nv_bfloat16* q,
                                     const __nv_bfloat16* k, const __nv_bfloat16* v, const __nv_bfloat16* y,
                                     const float* lse, const __nv_bfloat16* dy, const float* dlse, float* di,
                                     int64_t heads, int64_t T, int64_t D, float scale, bool causal, cudaStream_t stream,
                                     HeadLayout layout = {}, uint32_t* score_grads = nullptr);
cudaError_t LaunchFlashAttentionGrad(__half* dq, __half* dk, __half* dv, const __half* q, const __half* k,
                                     const __half* v, const __half* y, const float* lse, const __half* dy,
                                     const float* dlse, float* di, int64_t heads, int64_t T, int64_t D, float scale,
                                     bool causal, cudaStream_t stream, HeadLayout layout = {},
                                     uint32_t* score_grads = nullptr);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_FLASH_ATTENTION_H_
