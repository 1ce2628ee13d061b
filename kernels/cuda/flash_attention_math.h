#ifndef STRATA_KERNELS_CUDA_FLASH_ATTENTION_MATH_H_
#define STRATA_KERNELS_CUDA_FLASH_ATTENTION_MATH_H_

// The tensor-core flash attention's (flash_attention.cu) tile bounds, causal
// mask and online-softmax steps as __host__ __device__ functions: the kernels
// call exactly these, and flash_attention_math_test.cc checks them on the CPU
// (the kernels themselves need a GPU).

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace strata {
namespace cuda {
namespace flash {

// Rows a block owns (queries in the forward and dq, keys in dk and dv) and
// rows of the shared-memory tiles it walks (keys, resp. queries). Equal, so a
// causal block's diagonal tile starts at its own first row.
inline constexpr int kBlockRows = 64;
inline constexpr int kTileRows = 64;

// Keys [0, end) the query block of `rows` rows starting at q0 sees: all T,
// or when causal up to its last row (every later tile lies above the
// diagonal and is skipped).
STRATA_HOST_DEVICE inline int64_t KeyEnd(int64_t q0, int64_t T, bool causal, int64_t rows = kBlockRows) {
  if (!causal) return T;
  return q0 + rows < T ? q0 + rows : T;
}

// The first query tile that sees any key of the key block starting at k0:
// earlier tiles lie above the diagonal when causal.
STRATA_HOST_DEVICE inline int64_t QueryBegin(int64_t k0, bool causal) {
  return causal ? k0 / kTileRows * kTileRows : 0;
}

// Whether query i sees key j: both real rows (tiles are zero-padded past T),
// and j <= i when causal. Every other score is masked.
STRATA_HOST_DEVICE inline bool Visible(int64_t i, int64_t j, int64_t T, bool causal) {
  return i < T && j < T && (!causal || j <= i);
}

// Online softmax (FlashAttention's): a row keeps its running max m and sum l
// of exp(s - m); a tile with max tile_max moves m to max(m, tile_max) and
// multiplies l and the output accumulator by Rescale(m, new_m). A row that has
// seen only masked scores keeps m = -inf and factor 1 (no -inf - -inf NaN).
STRATA_HOST_DEVICE inline float NewMax(float m, float tile_max) { return m > tile_max ? m : tile_max; }
STRATA_HOST_DEVICE inline float Rescale(float m, float new_m) {
  return new_m == -INFINITY ? 1.0f : kernel_math::Exp(m - new_m);
}
// One score's unnormalized probability under the running max (masked: 0).
STRATA_HOST_DEVICE inline float Prob(float s, float m) { return s == -INFINITY ? 0.0f : kernel_math::Exp(s - m); }
// The row's logsumexp at the end (the backward's P = exp(s - lse)).
STRATA_HOST_DEVICE inline float Lse(float m, float l) { return m + kernel_math::Log(l); }

// The backward's probability again from the forward's lse, and dS: as the
// GEMM path (attention.cu's AttentionProbs, AttentionScoreGrad) in float.
STRATA_HOST_DEVICE inline float BackwardProb(float s, float lse) { return kernel_math::Exp(s - lse); }
STRATA_HOST_DEVICE inline float ScoreGrad(float p, float dp, float di) { return p * (dp - di); }

// The score gradients the mma.sync dk/dv kernel stores for dq when
// StoredScoreGrads() is on (flash_attention.h): dS of a head in 16 x 16
// blocks (query block qb, key block kb, 16 rows each; rows past T zero),
// each 512 bytes holding the A fragments of mma.m16n8k16 (mma_m16n8k16.h)
// as a warp holds them, lane l's four words at words 4 l..; the blocks of a
// head in row order (qb, then kb), only kb <= qb when causal (the others are
// wholly above the diagonal, so zero).
inline constexpr int64_t kScoreGradBlockWords = 128;
STRATA_HOST_DEVICE inline int64_t ScoreGradRowBlocks(int64_t T) { return (T + 15) / 16; }
STRATA_HOST_DEVICE inline int64_t ScoreGradBlocks(int64_t T, bool causal) {
  const int64_t nb = ScoreGradRowBlocks(T);
  return causal ? nb * (nb + 1) / 2 : nb * nb;
}
// Whether block (qb, kb) is stored; where, among its head's blocks.
STRATA_HOST_DEVICE inline bool ScoreGradStored(int64_t qb, int64_t kb, int64_t T, bool causal) {
  const int64_t nb = ScoreGradRowBlocks(T);
  return qb < nb && kb < nb && (!causal || kb <= qb);
}
STRATA_HOST_DEVICE inline int64_t ScoreGradBlock(int64_t qb, int64_t kb, int64_t T, bool causal) {
  return causal ? qb * (qb + 1) / 2 + kb : qb * ScoreGradRowBlocks(T) + kb;
}
// 32-bit words of the store for `heads` heads.
STRATA_HOST_DEVICE inline int64_t ScoreGradWords(int64_t heads, int64_t T, bool causal) {
  return heads * ScoreGradBlocks(T, causal) * kScoreGradBlockWords;
}

// The mma.sync kernels' softmax works in base 2, FlashAttention-2's way: a
// score s becomes x = s * scale * log2(e) (one multiply), its probability
// Exp2(x - m) (a subtract and the hardware's ex2.approx), m the running max
// of x; lse = m ln(2) + log(l). Exp2 is ex2.approx.ftz.f32 on the GPU
// (at most 2 ulp off over the full range, the PTX ISA says; subnormals
// flushed to 0; -inf gives +0, NaN NaN) and std::exp2 on the host, where
// the emulation runs.
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
STRATA_HOST_DEVICE inline float Exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}
// The gradients' base-2 exponent of a score s against its row's lse:
// s scale log2(e) - lse log2(e), with Lse2 = lse log2(e) rounded once and
// the rest one fused multiply-add, spelled out so that the dk/dv kernel and
// the dq kernel, which both compute it for every (query, key), round it
// alike whatever nvcc would contract (StoredScoreGrads() relies on it).
STRATA_HOST_DEVICE inline float Lse2(float lse) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(lse, kLog2e);
#else
  return lse * kLog2e;
#endif
}
STRATA_HOST_DEVICE inline float GradExponent(float s, float scale_log2, float lse2) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(s, scale_log2, -lse2);
#else
  return std::fma(s, scale_log2, -lse2);
#endif
}
// The max a row's probabilities are taken against: m, or 0 while the row has
// seen only masked scores (m = -inf), so that Exp2(-inf - m) is 0, not NaN.
STRATA_HOST_DEVICE inline float Base2Max(float m) { return m == -INFINITY ? 0.0f : m; }

}  // namespace flash
}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_FLASH_ATTENTION_MATH_H_
