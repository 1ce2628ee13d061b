// The epilogue fusion (passes/fuse_epilogues, on plans compiled for a GPU)
// trains what the unfused program trains. The fused program runs here on the
// CPU's matmul_bias kernel, which adds the bias after the GEMM: in float32
// the per-step losses and the final weights must equal the unfused run's bit
// for bit (resmlp and the tiny GPT, 20 and 10 steps); under a two-stage 1F1B
// pipeline the fused GPT matches one unfused device within the pipeline
// parity bar (1e-5 relative, float64). Under BF16 mixed precision the fused
// op keeps the product in float where the unfused one rounds it to bf16, so
// there the runs differ by bf16 roundings, bounded below.
//
// The tiny GPT's MLP (matmul -> add -> gelu in the tanh form, strata gen
// gpt's default) becomes matmul_bias_gelu, whose CPU kernel computes z as
// matmul_bias does and y with the gelu kernel's function: the same bits.
// Its backward's gelu_grad and the GEMM of its dy become matmul_gelu_grad,
// whose CPU kernel keeps the product in float32 and applies gelu_grad's
// function: the same bits too (under BF16 one rounding of the product
// fewer).
//
// The same runs cover the bias gradient's fusion into the weight gradient's
// GEMM (matmul_bias_grad_b, whose CPU kernel runs the unfused GEMM and sum)
// and the residual connection's add fused into the matmul_bias before it
// (its `residual`, whose CPU kernel adds r + y in the same type: the add's
// bits): each test first checks that the GPU plans it trains have the fused
// ops.

#include <cmath>
#include <iostream>
#include <string>

#include "gtest/gtest.h"
#include "passes/compile.h"
#include "tests/parity_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

ParityOptions Tokens(int64_t steps, DeviceKind compile_for) {
  ParityOptions options;
  options.data = "tokens:path=tests/testdata/license_tokens.u16";
  options.steps = steps;
  options.compile_for = compile_for;
  return options;
}

// How many ops of the GPU plans of `program`, over every rank, `counts`.
template <typename Pred>
int CountPlanOps(const Program& program, const Strategy& strategy, int64_t batch_size, Pred counts) {
  CompileOptions options;
  options.batch_size = batch_size;
  options.device_kind = DEVICE_CUDA;
  auto compiled = Compile(program, strategy, options);
  EXPECT_TRUE(compiled.ok()) << compiled.status();
  if (!compiled.ok()) return 0;
  int count = 0;
  for (const RankPlan& plan : compiled->plans) {
    for (const Op& op : plan.program().op()) count += counts(op) ? 1 : 0;
  }
  return count;
}

// How many ops of `type` the GPU plans of `program` hold, over every rank.
int FusedOps(const Program& program, const Strategy& strategy, int64_t batch_size, const std::string& type) {
  return CountPlanOps(program, strategy, batch_size, [&](const Op& op) { return op.type() == type; });
}

// How many matmul_bias ops of the GPU plans take a residual (a fused add).
int ResidualMatmulBiases(const Program& program, const Strategy& strategy, int64_t batch_size) {
  return CountPlanOps(program, strategy, batch_size,
                      [](const Op& op) { return op.type() == "matmul_bias" && op.input_size() == 4; });
}

void ExpectBitIdentical(const ParityRun& fused, const ParityRun& plain) {
  ASSERT_EQ(fused.losses.size(), plain.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_EQ(fused.losses[i], plain.losses[i]) << "step " << i + 1;
  std::string worst;
  EXPECT_EQ(MaxWeightDifference(fused, plain, &worst), 0.0) << "worst parameter: " << worst;
  EXPECT_GT(MaxWeightDifference(plain.weights, plain.initial_weights), 1e-3);  // it trained
}

TEST(FuseEpiloguesParityTest, ResMlpFusedEqualsUnfusedBitForBit) {
  GenOptions gen;
  gen.layers = {24, 32, 10};
  gen.blocks = 3;
  gen.dtype = "F32";
  auto program = GenerateModel("resmlp", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_GT(FusedOps(*program, Strategy(), 64, "matmul_bias_grad_b"), 0);
  EXPECT_EQ(ResidualMatmulBiases(*program, Strategy(), 64), 3);  // each block's fc2 and its residual add
  ParityOptions options;
  options.data = "synthetic:classes=10,size=2048";
  options.steps = 20;
  auto plain = TrainSingleDevice(*program, 64, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  options.compile_for = DEVICE_CUDA;
  auto fused = TrainSingleDevice(*program, 64, options);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ExpectBitIdentical(*fused, *plain);
}

TEST(FuseEpiloguesParityTest, GptFusedEqualsUnfusedBitForBit) {
  auto program = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(program.ok()) << program.status();
  // Every linear layer of every block: qkv, the attention's projection, fc and proj;
  // fc with its tanh-form gelu (strata gen gpt's default) as matmul_bias_gelu.
  EXPECT_GE(FusedOps(*program, Strategy(), 4, "matmul_bias_grad_b"), 4);
  EXPECT_EQ(FusedOps(*program, Strategy(), 4, "matmul_bias_gelu"), 2);
  EXPECT_EQ(FusedOps(*program, Strategy(), 4, "gelu"), 0);
  EXPECT_EQ(FusedOps(*program, Strategy(), 4, "matmul_gelu_grad"), 2);
  EXPECT_EQ(FusedOps(*program, Strategy(), 4, "gelu_grad"), 0);
  // Each block's two residual adds, into the attention's and the MLP's projections.
  EXPECT_EQ(ResidualMatmulBiases(*program, Strategy(), 4), 4);
  EXPECT_EQ(FusedOps(*program, Strategy(), 4, "matmul_bias_grad_b"),
            FusedOps(*program, Strategy(), 4, "matmul_bias") + FusedOps(*program, Strategy(), 4, "matmul_bias_gelu"));
  auto plain = TrainSingleDevice(*program, 4, Tokens(10, DEVICE_CPU));
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto fused = TrainSingleDevice(*program, 4, Tokens(10, DEVICE_CUDA));
  ASSERT_TRUE(fused.ok()) << fused.status();
  ExpectBitIdentical(*fused, *plain);
  EXPECT_LT(plain->losses.back(), plain->losses.front());
}

// The erf form is not cuBLASLt's GELU: its matmul -> add still fuses to
// matmul_bias, the gelu stays, and the run is the unfused one's bit for bit.
TEST(FuseEpiloguesParityTest, GptWithErfGeluKeepsItsGeluAndTrainsBitForBit) {
  GenOptions gen = TinyGpt("F32");
  gen.gelu = "erf";
  auto program = GenerateModel("gpt", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_EQ(FusedOps(*program, Strategy(), 4, "matmul_bias_gelu"), 0);
  EXPECT_EQ(FusedOps(*program, Strategy(), 4, "gelu"), 2);
  EXPECT_EQ(FusedOps(*program, Strategy(), 4, "matmul_gelu_grad"), 0);
  EXPECT_EQ(ResidualMatmulBiases(*program, Strategy(), 4), 4);
  auto plain = TrainSingleDevice(*program, 4, Tokens(5, DEVICE_CPU));
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto fused = TrainSingleDevice(*program, 4, Tokens(5, DEVICE_CUDA));
  ASSERT_TRUE(fused.ok()) << fused.status();
  ExpectBitIdentical(*fused, *plain);
}

// Under recompute the MLP's pre-activation is recomputed after the GEMM of
// its gradient's dy, and matmul_gelu_grad takes the gelu_grad's place: the
// fused, recomputed run trains the plain one's bits.
TEST(FuseEpiloguesParityTest, RecomputedGptFusedEqualsUnfusedBitForBit) {
  auto program = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy recompute;
  recompute.mutable_recompute()->add_checkpoints("h0");
  recompute.mutable_recompute()->add_checkpoints("h1");
  EXPECT_EQ(FusedOps(*program, recompute, 4, "matmul_gelu_grad"), 2);
  EXPECT_EQ(FusedOps(*program, recompute, 4, "gelu_grad"), 0);
  auto plain = TrainSingleDevice(*program, 4, Tokens(5, DEVICE_CPU));
  ASSERT_TRUE(plain.ok()) << plain.status();
  ParityOptions options = Tokens(5, DEVICE_CUDA);
  options.batch_size = 4;
  auto fused = TrainParallel(*program, recompute, options);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ExpectBitIdentical(*fused, *plain);
}

// The fused ops are placed on their stages like the adds they replace.
TEST(FuseEpiloguesParityTest, FusedGptPipelineMatchesOneUnfusedDevice) {
  constexpr double kTolerance = 1e-5;
  auto program = GenerateModel("gpt", TinyGpt("F64", 2));
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(2);
  strategy.mutable_pipeline()->set_accumulate_steps(3);
  strategy.mutable_pipeline()->set_schedule(ONE_F_ONE_B);
  EXPECT_GT(FusedOps(*program, strategy, 6, "matmul_bias_grad_b"), 0);
  EXPECT_EQ(FusedOps(*program, strategy, 6, "matmul_bias_gelu"), 2);  // F64, one per stage's block
  EXPECT_EQ(FusedOps(*program, strategy, 6, "matmul_gelu_grad"), 2);  // and its backward
  EXPECT_EQ(ResidualMatmulBiases(*program, strategy, 6), 4);          // each block's two, on its stage
  auto single = TrainSingleDevice(*program, 6, Tokens(10, DEVICE_CPU));
  ASSERT_TRUE(single.ok()) << single.status();
  auto fused = TrainParallel(*program, strategy, Tokens(10, DEVICE_CUDA));
  ASSERT_TRUE(fused.ok()) << fused.status();
  std::string worst;
  EXPECT_LE(MaxLossDifference(*fused, *single), kTolerance);
  EXPECT_LE(MaxWeightDifference(*fused, *single, &worst), kTolerance) << "worst parameter: " << worst;
  EXPECT_GT(MaxWeightDifference(single->weights, single->initial_weights), 100 * kTolerance);
}

// BF16 mixed precision: the unfused program rounds each linear layer's
// product to bf16 (relative error up to 2^-9) before adding the bias; the
// fused one does not, and its MLP's gelu reads the float pre-activation
// where the unfused gelu reads its bf16 rounding (the fused z is that
// rounding, for the backward). The first step's loss comes from the same weights, so
// it differs only through those roundings: with the logits of the tied
// layer (not fused: it has no bias) the same on both sides up to the blocks'
// differences, its relative difference stays within a few bf16 ulps, 2^-7.
// Both runs train (the loss falls over the 10 steps).
TEST(FuseEpiloguesParityTest, Bf16FusedStaysWithinBf16RoundingOfUnfused) {
  auto program = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  EXPECT_GT(FusedOps(*program, bf16, 4, "matmul_bias_grad_b"), 0);
  // The BF16 product goes to the F32 pre-activation, whose bf16 cast the bf16 gelu reads: fused too
  // (matmul_bias_gelu with z_dtype).
  EXPECT_EQ(FusedOps(*program, bf16, 4, "matmul_bias_gelu"), 2);
  // Its bf16 gelu_grad with the bf16 GEMM of its dy (the product kept in float).
  EXPECT_EQ(FusedOps(*program, bf16, 4, "matmul_gelu_grad"), 2);
  EXPECT_EQ(ResidualMatmulBiases(*program, bf16, 4), 4);  // the F32 y of BF16 operands
  ParityOptions plain_options = Tokens(10, DEVICE_CPU), fused_options = Tokens(10, DEVICE_CUDA);
  plain_options.batch_size = fused_options.batch_size = 4;
  auto plain = TrainParallel(*program, bf16, plain_options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto fused = TrainParallel(*program, bf16, fused_options);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_EQ(fused->losses.size(), 10u);
  const double first = std::abs(fused->losses[0] - plain->losses[0]) / std::abs(plain->losses[0]);
  std::cout << "first loss " << plain->losses[0] << " unfused, " << fused->losses[0] << " fused (relative "
            << first << "); last " << plain->losses.back() << " and " << fused->losses.back() << "\n";
  EXPECT_LE(first, std::ldexp(1.0, -7));
  EXPECT_NE(fused->losses[0], plain->losses[0]);  // the fused product really skips the bf16 rounding
  EXPECT_LT(fused->losses.back(), fused->losses.front());
  EXPECT_LT(plain->losses.back(), plain->losses.front());
}

}  // namespace
}  // namespace strata
