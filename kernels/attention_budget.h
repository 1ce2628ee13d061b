#ifndef STRATA_KERNELS_ATTENTION_BUDGET_H_
#define STRATA_KERNELS_ATTENTION_BUDGET_H_

// How much [T, T] score memory the GPU's attention kernels take on their
// GEMM path (kernels/cuda/attention.h), in plain C++ so the compiler can ask
// too: mixed precision keeps attention in float32 on a GPU where a 16-bit
// head would not fit (the 16-bit kernels have no flash-style fallback).

#include <cstdint>

namespace strata {

// Bytes of score buffers the GEMM path holds at once; a head needing more
// than kAttentionHeadBudgets of them takes the flash kernels.
inline constexpr int64_t kDefaultAttentionScoreBudget = int64_t{256} << 20;
inline constexpr int64_t kAttentionHeadBudgets = 4;

// Bytes per score element of one head's GEMM-path buffers: the scores (P in
// place) and, for the gradient, dP; for 16-bit q both in float plus one in
// q's type (P, then dS, for their products).
inline int64_t AttentionScoreBytes(bool half, int64_t elem_bytes, bool grad) {
  if (half) return grad ? 10 : 6;
  return elem_bytes * (grad ? 2 : 1);
}

// Whether 16-bit attention over T tokens runs on a GPU at the default budget
// (forward and gradient both on the GEMM path).
inline bool HalfAttentionFitsOnGpu(int64_t T) {
  return AttentionScoreBytes(true, 2, true) * T * T <= kAttentionHeadBudgets * kDefaultAttentionScoreBudget;
}

}  // namespace strata

#endif  // STRATA_KERNELS_ATTENTION_BUDGET_H_
