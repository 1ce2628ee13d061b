#include "kernels/gemm_staging.h"

#include "gtest/gtest.h"

namespace strata {
namespace cuda {
namespace {

constexpr int64_t kM = 8192, kVocab = 50257, kD = 768;

// GPT-2's tied LM head at batch 8 x 1024 in bf16: the logits' rows (and
// their gradient's) are 100514 bytes, padded to 50264 elements.
TEST(GemmStagingTest, TheLmHeadsThreeGemmsStageTheLogitsOnly) {
  // Forward: logits [M, V] = x [M, D] @ wte^T (wte stored [V, D]).
  GemmStaging fwd = PlanGemmStaging(kM, kVocab, kD, false, true, 2, 2);
  EXPECT_FALSE(fwd.stage_a);
  EXPECT_FALSE(fwd.stage_b);
  EXPECT_TRUE(fwd.stage_c);
  EXPECT_EQ(fwd.c_pitch, 50264);
  EXPECT_EQ(fwd.a_pitch, kD);
  EXPECT_EQ(fwd.b_pitch, kD);
  EXPECT_EQ(fwd.scratch_bytes, RoundUp(kM * 50264 * 2, kStagingOffsetAlign));
  // dx [M, D] = dlogits [M, V] @ wte [V, D]: a's rows staged.
  GemmStaging dx = PlanGemmStaging(kM, kD, kVocab, false, false, 2, 2);
  EXPECT_TRUE(dx.stage_a);
  EXPECT_FALSE(dx.stage_b);
  EXPECT_FALSE(dx.stage_c);
  EXPECT_EQ(dx.a_pitch, 50264);
  // dW [V, D] = dlogits^T @ x, dlogits stored [M, V] (transpose_a).
  GemmStaging dw = PlanGemmStaging(kVocab, kD, kM, true, false, 2, 2);
  EXPECT_TRUE(dw.stage_a);
  EXPECT_FALSE(dw.stage_b);
  EXPECT_FALSE(dw.stage_c);
  EXPECT_EQ(dw.a_pitch, 50264);
  EXPECT_EQ(dw.scratch_bytes, RoundUp(kM * 50264 * 2, kStagingOffsetAlign));
}

TEST(GemmStagingTest, PitchesAreWhole16ByteUnitsForEveryElementSize) {
  for (int64_t bytes : {2, 4, 8}) {
    SCOPED_TRACE(bytes);
    GemmStaging s = PlanGemmStaging(kM, kVocab, kD, false, true, bytes, bytes);
    ASSERT_TRUE(s.stage_c);
    EXPECT_EQ(s.c_pitch * bytes % kPitchAlignBytes, 0);
    EXPECT_GE(s.c_pitch, kVocab);
    EXPECT_LT(s.c_pitch - kVocab, kPitchAlignBytes / bytes);
  }
  // A float c of 16-bit operands (matmul_bias under mixed precision) is
  // padded by its own element size.
  GemmStaging mixed = PlanGemmStaging(kM, kVocab, kD, false, true, 2, 4);
  EXPECT_EQ(mixed.c_pitch, 50260);
}

TEST(GemmStagingTest, AlignedOrSmallGemmsAreNotStaged) {
  // The blocks' GEMMs: every row a multiple of 16 bytes.
  EXPECT_FALSE(PlanGemmStaging(kM, 3 * kD, kD, false, false, 2, 2).any());
  EXPECT_FALSE(PlanGemmStaging(kM, kD, 4 * kD, false, false, 2, 4).any());
  // Misaligned but below the threshold: the copies would cost more than they save.
  EXPECT_FALSE(PlanGemmStaging(64, 257, 33, false, false, 2, 2).any());
  EXPECT_TRUE(PlanGemmStaging(64, 257, 33, false, false, 2, 2, /*min_flops=*/0).any());
  // Empty GEMMs never.
  EXPECT_FALSE(PlanGemmStaging(0, kVocab, kD, false, true, 2, 2, 0).any());
  EXPECT_FALSE(PlanGemmStaging(kM, kVocab, 0, false, true, 2, 2, 0).any());
}

TEST(GemmStagingTest, EachStagedOperandTakesItsOwnAlignedSlot) {
  // All three misaligned: a [33, 17], b [17, 9], c [33, 9] in bf16.
  GemmStaging s = PlanGemmStaging(33, 9, 17, false, false, 2, 2, 0);
  ASSERT_TRUE(s.stage_a && s.stage_b && s.stage_c);
  EXPECT_EQ(s.a_pitch, 24);
  EXPECT_EQ(s.b_pitch, 16);
  EXPECT_EQ(s.c_pitch, 16);
  EXPECT_EQ(s.scratch_bytes, RoundUp(33 * 24 * 2, kStagingOffsetAlign) + RoundUp(17 * 16 * 2, kStagingOffsetAlign) +
                                 RoundUp(33 * 16 * 2, kStagingOffsetAlign));
}

}  // namespace
}  // namespace cuda
}  // namespace strata
