// The multi-tensor optimizer fusion (passes/fuse_optimizer, last on each
// rank of a plan compiled for a GPU) trains what the per-parameter updates
// train. The fused plan runs here on the CPU's multi kernels, which run each
// member through the single op's kernel: in float32 the per-step losses and
// the final weights must equal the unfused (CPU-compiled) run's bit for bit,
// for AdamW with global-norm clipping on the tiny GPT, Adam and SGD with
// Nesterov momentum, weight decay and clipping on a residual MLP, and
// momentum under two data-parallel ranks (the fusion after data parallel's
// bucketed allreduce; with gradient merge too), and AdamW with clipping on a two-stage pipeline. The GPU plan also fuses epilogues, which keeps float32
// bit for bit (tests/fuse_epilogues_parity_test.cc).

#include <string>

#include "gtest/gtest.h"
#include "passes/compile.h"
#include "tests/parity_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

void ExpectBitIdentical(const ParityRun& fused, const ParityRun& plain) {
  ASSERT_EQ(fused.losses.size(), plain.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_EQ(fused.losses[i], plain.losses[i]) << "step " << i + 1;
  std::string worst;
  EXPECT_EQ(MaxWeightDifference(fused, plain, &worst), 0.0) << "worst parameter: " << worst;
}

// The GPU plans really fuse: every rank's updates are multi ops, and the
// CPU plans keep one update per parameter.
void ExpectFusedOnlyForTheGpu(const Program& program, const Strategy& strategy, int64_t batch_size) {
  for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
    CompileOptions options;
    options.batch_size = batch_size;
    options.device_kind = device;
    auto result = Compile(program, strategy, options);
    ASSERT_TRUE(result.ok()) << result.status();
    for (const RankPlan& plan : result->plans) {
      int single = 0, multi = 0;
      for (const Op& op : plan.program().op()) {
        const std::string& t = op.type();
        if (t == "sgd_update" || t == "momentum_update" || t == "adam_update") ++single;
        if (t == "sgd_update_multi" || t == "momentum_update_multi" || t == "adam_update_multi") ++multi;
      }
      if (device == DEVICE_CUDA) {
        EXPECT_EQ(single, 0) << "rank " << plan.rank();
        EXPECT_EQ(multi, 1) << "rank " << plan.rank();
      } else {
        EXPECT_GT(single, 1) << "rank " << plan.rank();
        EXPECT_EQ(multi, 0) << "rank " << plan.rank();
      }
    }
  }
}

absl::StatusOr<Program> ResMlp(const std::string& optimizer, double weight_decay, double clip) {
  GenOptions gen;
  gen.layers = {24, 32, 10};
  gen.blocks = 3;
  gen.dtype = "F32";
  gen.optimizer = optimizer;
  auto program = GenerateModel("resmlp", gen);
  if (program.ok()) {
    program->mutable_optimizer()->set_weight_decay(weight_decay);
    program->mutable_optimizer()->set_clip_global_norm(clip);
    if (optimizer == "momentum") program->mutable_optimizer()->mutable_momentum()->set_nesterov(true);
  }
  return program;
}

void ExpectResMlpFusedEqualsUnfused(const std::string& optimizer, double weight_decay, double clip) {
  SCOPED_TRACE(optimizer);
  auto program = ResMlp(optimizer, weight_decay, clip);
  ASSERT_TRUE(program.ok()) << program.status();
  ExpectFusedOnlyForTheGpu(*program, Strategy(), 64);
  ParityOptions options;
  options.data = "synthetic:classes=10,size=2048";
  options.steps = 12;
  auto plain = TrainSingleDevice(*program, 64, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  options.compile_for = DEVICE_CUDA;
  auto fused = TrainSingleDevice(*program, 64, options);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ExpectBitIdentical(*fused, *plain);
  EXPECT_GT(MaxWeightDifference(plain->weights, plain->initial_weights), 1e-3);  // it trained
}

TEST(FuseOptimizerParityTest, ResMlpAdamFusedEqualsUnfusedBitForBit) {
  ExpectResMlpFusedEqualsUnfused("adam", 0.01, 0.5);
}

TEST(FuseOptimizerParityTest, ResMlpSgdAndMomentumFusedEqualUnfusedBitForBit) {
  ExpectResMlpFusedEqualsUnfused("sgd", 0, 0);
  ExpectResMlpFusedEqualsUnfused("momentum", 1e-3, 0.5);
}

TEST(FuseOptimizerParityTest, GptAdamWClippedFusedEqualsUnfusedBitForBit) {
  GenOptions gen = TinyGpt("F32");
  gen.optimizer = "adamw";
  auto program = GenerateModel("gpt", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  program->mutable_optimizer()->set_clip_global_norm(0.5);
  ExpectFusedOnlyForTheGpu(*program, Strategy(), 4);
  ParityOptions options;
  options.data = "tokens:path=tests/testdata/license_tokens.u16";
  options.steps = 8;
  auto plain = TrainSingleDevice(*program, 4, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  options.compile_for = DEVICE_CUDA;
  auto fused = TrainSingleDevice(*program, 4, options);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ExpectBitIdentical(*fused, *plain);
  EXPECT_LT(plain->losses.back(), plain->losses.front());
}

// Two data-parallel ranks: the fused updates read the allreduced gradients;
// then with gradient merge over two steps as well (they read the merge
// buffers, every other step).
TEST(FuseOptimizerParityTest, DataParallelMomentumFusedEqualsUnfusedBitForBit) {
  auto program = ResMlp("momentum", 0, 0.5);
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy dp2;
  dp2.mutable_data_parallel()->set_degree(2);
  Strategy merged = dp2;
  merged.mutable_gradient_merge()->set_k_steps(2);
  for (const Strategy& strategy : {dp2, merged}) {
    SCOPED_TRACE(strategy.ShortDebugString());
    ExpectFusedOnlyForTheGpu(*program, strategy, 64);
    ParityOptions options;
    options.data = "synthetic:classes=10,size=2048";
    options.steps = 8;
    options.batch_size = 64;
    auto plain = TrainParallel(*program, strategy, options);
    ASSERT_TRUE(plain.ok()) << plain.status();
    options.compile_for = DEVICE_CUDA;
    auto fused = TrainParallel(*program, strategy, options);
    ASSERT_TRUE(fused.ok()) << fused.status();
    ExpectBitIdentical(*fused, *plain);
  }
}

// A two-stage 1F1B pipeline of three micro-batches: each stage's updates
// read its micro-batch accumulators, and clipping sums the stages' partial
// norms over the pipeline group before either stage's fused update.
TEST(FuseOptimizerParityTest, PipelinedGptAdamWClippedFusedEqualsUnfusedBitForBit) {
  GenOptions gen = TinyGpt("F32", 2);
  gen.optimizer = "adamw";
  auto program = GenerateModel("gpt", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  program->mutable_optimizer()->set_clip_global_norm(0.5);
  Strategy pp2;
  pp2.mutable_pipeline()->set_micro_batch_size(2);
  pp2.mutable_pipeline()->set_accumulate_steps(3);
  pp2.mutable_pipeline()->set_schedule(ONE_F_ONE_B);
  ExpectFusedOnlyForTheGpu(*program, pp2, 6);
  ParityOptions options;
  options.data = "tokens:path=tests/testdata/license_tokens.u16";
  options.steps = 6;
  auto plain = TrainParallel(*program, pp2, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  options.compile_for = DEVICE_CUDA;
  auto fused = TrainParallel(*program, pp2, options);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ExpectBitIdentical(*fused, *plain);
}

}  // namespace
}  // namespace strata
