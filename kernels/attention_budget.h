#ifndef STRATA_KERNELS_ATTENTION_BUDGET_H_
#define STRATA_KERNELS_ATTENTION_BUDGET_H_

// How much [T, T] score memory the GPU's attention kernels take on their
// GEMM path (kernels/cuda/attention.h), in plain C++ so the compiler can ask
// too: mixed precision keeps attention in float32 on a GPU where a 16-bit
// head would not fit (the 16-bit kernels have no flash-style fallback).

#include <atomic>
#include <cstdint>

#include "kernels/env_switch.h"

namespace strata {

// Whether this process sends 16-bit attention on a GPU to the tensor-core
// flash kernels (kernels/cuda/flash_attention.h) rather than the GEMM path:
// on (they passed cuda_ops_test on an H200 on 2026-11-27 and made a GPT-2
// step 49.0 -> 40.1 ms); STRATA_TENSOR_CORE_ATTENTION=0 in the environment
// turns it off. In
// plain C++ because the compiler asks too: attention's [B, T, H, D] layout
// (passes/attention_layout) saves memory traffic only on the flash kernels,
// while the GEMM path copies such operands through [B, H, T, D] scratch, so
// GPU plans take that pass only where this is on.
inline std::atomic<bool>& TensorCoreAttention() {
  static std::atomic<bool> on{EnvSwitch("STRATA_TENSOR_CORE_ATTENTION", /*default_on=*/true)};
  return on;
}

// Whether attention of 16-bit (`half`) q with heads of D takes the
// tensor-core flash kernels when TensorCoreAttention() is on (the kernels'
// instantiations; kernels/cuda/flash_attention.h asks the same).
inline bool FlashEligible(bool half, int64_t D) { return half && (D == 32 || D == 64 || D == 128); }

// Sets TensorCoreAttention() for its lifetime (tests), then restores it.
class ScopedTensorCoreAttention : public ScopedSwitch {
 public:
  explicit ScopedTensorCoreAttention(bool on) : ScopedSwitch(TensorCoreAttention(), on) {}
};

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
