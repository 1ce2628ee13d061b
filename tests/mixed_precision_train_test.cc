// Mixed precision end to end: `strata gen mlp` (F32) trained 20 steps with
// mixed_precision { dtype: BF16 } (or F16 with dynamic loss scaling) follows
// the same program in float32 within the bars below, and the plan's
// prediction bounds the measured peak; so do the tiny GPT and `strata gen
// convnet` (its conv2d in bf16), and a BF16 convnet under a 2-stage pipeline
// or data parallelism matches the single-device BF16 run. F16's loss scaling, step by step: a
// skipped update changes no weight, optimizer state or step count, and the
// scale follows GradScaler's rule; the --metrics lines say so.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "passes/compile.h"
#include "runtime/executor.h"
#include "runtime/float16.h"
#include "runtime/trainer.h"
#include "tests/parity_util.h"

namespace strata {
namespace {

// bf16 losses beside float32 ones: the issue's bar, 2e-2 relative per step,
// and one bf16 rounding (2^-9) on the worst step; each step's difference is
// recorded as a test property (`prefix`rel_diff_step_N, `prefix`worst_rel_diff).
void ExpectFollowsWithinOneBf16Rounding(const std::vector<double>& ref, const std::vector<double>& mixed,
                                        const std::string& prefix) {
  ASSERT_EQ(mixed.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double rel = std::abs(mixed[i] - ref[i]) / std::abs(ref[i]);
    worst = std::max(worst, rel);
    ::testing::Test::RecordProperty(absl::StrCat(prefix, "rel_diff_step_", i + 1), absl::StrFormat("%.3g", rel));
    EXPECT_LE(rel, 2e-2) << "step " << i + 1 << ": f32 " << ref[i] << ", bf16 " << mixed[i];
  }
  ::testing::Test::RecordProperty(absl::StrCat(prefix, "worst_rel_diff"), absl::StrFormat("%.3g", worst));
  EXPECT_LE(worst, std::ldexp(1.0, -9));
}

TEST(MixedPrecisionTrainTest, Bf16MlpFollowsFloat32) {
  auto program = GenerateModel("mlp", GenOptions());
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.data = "synthetic:classes=10,size=2048";
  options.steps = 20;
  options.batch_size = 64;
  Strategy f32;
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);

  auto ref = TrainParallel(*program, f32, options);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto mixed = TrainParallel(*program, bf16, options);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  ASSERT_EQ(mixed->losses.size(), ref->losses.size());
  ASSERT_EQ(mixed->losses.size(), 20u);
  // bf16 keeps 8 mantissa bits: one rounding is at most 2^-9 ~ 1.95e-3
  // relative. The matmuls round their inputs and outputs once each and sum
  // in float32, so the logits carry errors of about that size, mostly
  // cancelling in the mean loss. Measured (batch 64, synthetic, seed's
  // default): steps 1-3 differ by 7e-6, 3e-5, 7e-6 relative; over 20 steps
  // the worst was 3.9e-4 (step 17), growing slowly as the weights drift
  // apart. The issue's bar, 2e-2 per step, holds with 50x room; the tighter
  // check below, one bf16 rounding (2^-9) on the worst step, is what the
  // measurements justify (5x the worst seen) and would catch a matmul left
  // in float32 no more than a cast lost.
  ExpectFollowsWithinOneBf16Rounding(ref->losses, mixed->losses, "");
  // Not bit-identical: the casts do run.
  EXPECT_NE(mixed->losses, ref->losses);
  // Memory rule: measured <= predicted (the widened kernels' float32 scratch included).
  EXPECT_LE(mixed->measured_peak_bytes.at(0), mixed->predicted_peak_bytes.at(0));
  EXPECT_LE(ref->measured_peak_bytes.at(0), ref->predicted_peak_bytes.at(0));
}

// The tiny GPT under BF16: matmuls and attention in bf16 (lse in float32),
// 10 steps on the license tokens beside the same program in float32. The
// plan's prediction bounds the measured peak (the widened attention kernels'
// float32 copies and blocks included), both runs train, and the losses stay
// within the issue's bar, 2e-2 per step. Measured (batch 4): 6.9e-7 relative
// on step 1, the worst 7.6e-5 (step 10); the MLP test's tighter bar, one
// bf16 rounding (2^-9) on the worst step, holds with 25x room.
TEST(MixedPrecisionTrainTest, Bf16GptFollowsFloat32) {
  auto program = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.data = "tokens:path=tests/testdata/license_tokens.u16";
  options.steps = 10;
  options.batch_size = 4;
  Strategy f32;
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  auto ref = TrainParallel(*program, f32, options);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto mixed = TrainParallel(*program, bf16, options);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  ASSERT_EQ(mixed->losses.size(), 10u);
  ExpectFollowsWithinOneBf16Rounding(ref->losses, mixed->losses, "gpt_");
  EXPECT_NE(mixed->losses, ref->losses);
  EXPECT_LT(mixed->losses.back(), mixed->losses.front());
  EXPECT_LE(mixed->measured_peak_bytes.at(0), mixed->predicted_peak_bytes.at(0));
}

// `program` trained as `options` say (its disabled_passes off in both runs)
// without and then with the optional pass `pass`; both runs of
// options.steps steps.
void TrainWithoutAndWith(const Program& program, const Strategy& strategy, ParityOptions options,
                         const std::string& pass, std::optional<ParityRun>* without, std::optional<ParityRun>* with) {
  const std::vector<std::string> disabled = options.disabled_passes;
  options.disabled_passes.push_back(pass);
  auto plain = TrainParallel(program, strategy, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  options.disabled_passes = disabled;
  auto passed = TrainParallel(program, strategy, options);
  ASSERT_TRUE(passed.ok()) << passed.status();
  ASSERT_EQ(passed->losses.size(), static_cast<size_t>(options.steps));
  *without = *std::move(plain);
  *with = *std::move(passed);
}

// The tiny GPT's tokens, 6 steps of 4 sequences, plans compiled for `device`.
ParityOptions TokenRun(DeviceKind device) {
  ParityOptions options;
  options.data = "tokens:path=tests/testdata/license_tokens.u16";
  options.steps = 6;
  options.batch_size = 4;
  options.compile_for = device;
  return options;
}

// The tiny GPT's program under BF16, compiled for `compile_for` (run on the
// CPU's kernels) with and without the optional pass `pass`, trains the same
// bits for 6 steps, and trains.
void ExpectTheSameBitsWithoutPass(const Program& program, DeviceKind compile_for, const std::string& pass) {
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  std::optional<ParityRun> plain, with;
  TrainWithoutAndWith(program, bf16, TokenRun(compile_for), pass, &plain, &with);
  ASSERT_TRUE(plain && with);
  EXPECT_EQ(with->losses, plain->losses);
  std::string worst;
  EXPECT_EQ(MaxWeightDifference(*with, *plain, &worst), 0.0) << worst;
  EXPECT_LT(with->losses.back(), with->losses.front());
}

// How many ops of `type` the first rank's plan of `program` compiled for a
// GPU (batch 4) holds with the optional passes `disabled` left out.
int GpuPlanOps(const Program& program, const Strategy& strategy, const std::vector<std::string>& disabled,
               const std::string& type) {
  CompileOptions copts;
  copts.batch_size = 4;
  copts.device_kind = DEVICE_CUDA;
  copts.disabled_passes = disabled;
  auto compiled = Compile(program, strategy, copts);
  EXPECT_TRUE(compiled.ok()) << compiled.status();
  int n = 0;
  if (compiled.ok()) {
    for (const Op& op : compiled->plans[0].program().op()) n += op.type() == type;
  }
  return n;
}

// passes/commute_casts moves the casts of q, k and v above their split and
// transposes, and cancels the attention output's cast up and down around
// its transpose: the same roundings of the same values, so the tiny GPT
// under BF16 trains to the same bits with and without it (and the plan
// with it has fewer casts).
TEST(MixedPrecisionTrainTest, CommutedCastsTrainTheSameBits) {
  auto program = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(program.ok()) << program.status();
  ExpectTheSameBitsWithoutPass(*program, DEVICE_CPU, "commute-casts");
}

// On a GPU plan commute-casts runs again after the epilogue fusion
// ("commute-casts-backward"): the bias adds' gradients no longer need the
// float copies of the qkv projection's and the MLP's first projection's
// bf16 gradients (the latter gelu_grad's output, the gelu running in bf16),
// so each one's cast up and the matmul gradient's cast down cancel. The GPU
// plan, run on the CPU's kernels, trains the same bits with and without it,
// with four casts fewer a block.
TEST(MixedPrecisionTrainTest, BackwardCastsCommutedAfterFusionTrainTheSameBits) {
  auto program = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  EXPECT_EQ(GpuPlanOps(*program, bf16, {"commute-casts-backward"}, "cast") - GpuPlanOps(*program, bf16, {}, "cast"),
            4 * TinyGpt("F32").blocks);
  ExpectTheSameBitsWithoutPass(*program, DEVICE_CUDA, "commute-casts-backward");
}

// passes/pack_qkv has the flash kernels read the qkv projection in place:
// on a GPU plan of a GPT with heads of 32 (the tensor-core kernels' size;
// the tiny GPT's 16 keeps its split), each block's split, reshapes and
// concat go and scaled_dot_product_attention_qkv and its gradient come.
// The plan, run on the CPU's kernels, trains the same bits with and without
// the pass; so does a CPU plan, which packs any head size.
TEST(MixedPrecisionTrainTest, PackedQkvTrainsTheSameBits) {
  GenOptions gen = TinyGpt("F32");
  gen.heads = 2;  // D = 32
  auto program = GenerateModel("gpt", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  const auto count = [&](const std::vector<std::string>& disabled, const std::string& type) {
    return GpuPlanOps(*program, bf16, disabled, type);
  };
  EXPECT_EQ(count({}, "scaled_dot_product_attention_qkv"), gen.blocks);
  EXPECT_EQ(count({}, "scaled_dot_product_attention_qkv_grad"), gen.blocks);
  EXPECT_EQ(count({}, "split"), 0);
  EXPECT_EQ(count({}, "concat"), 0);
  EXPECT_EQ(count({"pack-qkv"}, "split"), gen.blocks);
  EXPECT_EQ(count({"pack-qkv"}, "scaled_dot_product_attention_qkv"), 0);
  ExpectTheSameBitsWithoutPass(*program, DEVICE_CUDA, "pack-qkv");
  // A CPU plan packs the tiny GPT's 16-wide heads too: the same bits.
  auto tiny = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  ExpectTheSameBitsWithoutPass(*tiny, DEVICE_CPU, "pack-qkv");
}

// The same on two pipeline stages (1F1B, 2 micro-batches; the packed
// attention of each block on its stage) with the second block recomputed
// in the backward (its packed attention redone from the checkpoint h1):
// the same bits with and without the pass.
TEST(MixedPrecisionTrainTest, PackedQkvTrainsTheSameBitsOnAPipelineWithRecompute) {
  GenOptions gen = TinyGpt("F32", /*stages=*/2);
  gen.heads = 2;  // D = 32
  auto program = GenerateModel("gpt", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy strategy;
  strategy.mutable_mixed_precision()->set_dtype(BF16);
  strategy.mutable_pipeline()->set_micro_batch_size(2);
  strategy.mutable_pipeline()->set_accumulate_steps(2);
  strategy.mutable_recompute()->add_checkpoints("h1");
  CompileOptions copts;
  copts.batch_size = 4;
  copts.device_kind = DEVICE_CUDA;
  auto compiled = Compile(*program, strategy, copts);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  int packed = 0, grads = 0;
  for (const RankPlan& plan : compiled->plans) {
    for (const Op& op : plan.program().op()) {
      packed += op.type() == "scaled_dot_product_attention_qkv";
      grads += op.type() == "scaled_dot_product_attention_qkv_grad";
    }
  }
  // Each block's forward (the plans run it once a micro-batch), the second
  // block's again (recomputed) before its gradient.
  EXPECT_EQ(packed, gen.blocks + 1);
  EXPECT_EQ(grads, gen.blocks);
  std::optional<ParityRun> plain, with;
  TrainWithoutAndWith(*program, strategy, TokenRun(DEVICE_CUDA), "pack-qkv", &plain, &with);
  ASSERT_TRUE(plain && with);
  EXPECT_EQ(with->losses, plain->losses);
  std::string worst;
  EXPECT_EQ(MaxWeightDifference(*with, *plain, &worst), 0.0) << worst;
  EXPECT_LT(with->losses.back(), with->losses.front());
}

// passes/pad_vocab pads a GPU plan's LM head whose logits' rows are not a
// multiple of 16 bytes (vocab 16411 here, as GPT-2's 50257) to 16448
// columns, the loss reading the first 16411 (its `classes`): the other
// columns are the same dot products and the loss the same sums, but the
// GEMMs of the wider shape may take other kernels at the edges (OpenBLAS's
// remainder kernels, the pool's panels), so the plans agree to rounding:
// in F64 on two pipeline stages (the tied embedding's last-stage replica
// padded) within 1e-12 of the loss and 1e-9 of every weight, and under BF16
// within the bound a bf16 rounding flip allows (as BF16 against F32 above).
TEST(MixedPrecisionTrainTest, PaddedVocabTrainsWhatTheUnpaddedHeadTrains) {
  GenOptions gen = TinyGpt("F64", /*stages=*/2);
  gen.vocab = 16411;  // 2^20 weights and more: a head the pass pads
  auto program = GenerateModel("gpt", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  CompileOptions copts;
  copts.device_kind = DEVICE_CUDA;
  Strategy pipeline;
  pipeline.mutable_pipeline()->set_micro_batch_size(2);
  pipeline.mutable_pipeline()->set_accumulate_steps(2);
  auto compiled = Compile(*program, pipeline, copts);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  int pads = 0;
  for (const RankPlan& plan : compiled->plans) {
    for (const Op& op : plan.program().op()) {
      if (op.type() != "pad") continue;
      ++pads;
      EXPECT_EQ(plan.topology().stage(), 1) << "the last stage's replica";
      EXPECT_EQ(op.attr().at("after").i(), 16448 - 16411);
    }
  }
  EXPECT_EQ(pads, 1);

  ParityOptions options = TokenRun(DEVICE_CUDA);
  options.steps = 4;
  options.batch_size = 0;  // the pipeline's
  std::optional<ParityRun> plain, padded;
  TrainWithoutAndWith(*program, pipeline, options, "pad-vocab", &plain, &padded);
  ASSERT_TRUE(plain && padded);
  for (size_t i = 0; i < padded->losses.size(); ++i) {
    EXPECT_NEAR(padded->losses[i], plain->losses[i], 1e-12 * std::abs(plain->losses[i])) << "step " << i + 1;
  }
  std::string worst;
  EXPECT_LE(MaxWeightDifference(*padded, *plain, &worst), 1e-9) << worst;

  GenOptions one_stage = TinyGpt("F32");
  one_stage.vocab = 16411;
  auto bf16_program = GenerateModel("gpt", one_stage);
  ASSERT_TRUE(bf16_program.ok()) << bf16_program.status();
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  CompileOptions bf16_copts;
  bf16_copts.batch_size = 4;
  bf16_copts.device_kind = DEVICE_CUDA;
  auto bf16_compiled = Compile(*bf16_program, bf16, bf16_copts);
  ASSERT_TRUE(bf16_compiled.ok()) << bf16_compiled.status();
  int bf16_pads = 0;
  for (const Op& op : bf16_compiled->plans[0].program().op()) bf16_pads += op.type() == "pad";
  EXPECT_EQ(bf16_pads, 1);
  std::optional<ParityRun> bf16_plain, bf16_padded;
  TrainWithoutAndWith(*bf16_program, bf16, TokenRun(DEVICE_CUDA), "pad-vocab", &bf16_plain, &bf16_padded);
  ASSERT_TRUE(bf16_plain && bf16_padded);
  ExpectFollowsWithinOneBf16Rounding(bf16_plain->losses, bf16_padded->losses, "pad_vocab_");
  EXPECT_LT(bf16_padded->losses.back(), bf16_padded->losses.front());
}

// passes/in_place_loss_grad writes the loss gradient over the logits (their
// last reader): the kernels read each value before writing it, so the tiny
// GPT trains the same bits with and without the pass, on CPU and GPU plans;
// and GPT-2 124M's GPU plan, whose peak is the loss gradient's (logits and
// their gradient both alive), predicts the logits' bytes less.
TEST(MixedPrecisionTrainTest, InPlaceLossGradientTrainsTheSameBitsInLessMemory) {
  GenOptions gen = TinyGpt("F32");
  gen.vocab = 16411;
  auto program = GenerateModel("gpt", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  // The pass marks the gradient on every plan trained below.
  for (const Strategy& strategy : {Strategy(), bf16}) {
    for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
      CompileOptions copts;
      copts.batch_size = 4;
      copts.device_kind = device;
      auto compiled = Compile(*program, strategy, copts);
      ASSERT_TRUE(compiled.ok()) << compiled.status();
      int marked = 0;
      for (const Op& op : compiled->plans[0].program().op()) {
        auto it = op.attr().find("in_place");
        marked += op.type() == "softmax_cross_entropy_grad" && it != op.attr().end() && it->second.b();
      }
      EXPECT_EQ(marked, 1) << DeviceKind_Name(device) << (strategy.has_mixed_precision() ? " BF16" : " F32");
    }
  }
  ExpectTheSameBitsWithoutPass(*program, DEVICE_CPU, "in-place-loss-gradient");
  std::optional<ParityRun> f32_apart, f32_in_place;
  TrainWithoutAndWith(*program, Strategy(), TokenRun(DEVICE_CPU), "in-place-loss-gradient", &f32_apart,
                      &f32_in_place);
  ASSERT_TRUE(f32_apart && f32_in_place);
  EXPECT_EQ(f32_in_place->losses, f32_apart->losses);
  std::optional<ParityRun> apart, in_place;
  TrainWithoutAndWith(*program, bf16, TokenRun(DEVICE_CUDA), "in-place-loss-gradient", &apart, &in_place);
  ASSERT_TRUE(apart && in_place);
  EXPECT_EQ(in_place->losses, apart->losses);
  std::string worst;
  EXPECT_EQ(MaxWeightDifference(*in_place, *apart, &worst), 0.0) << worst;
  EXPECT_LE(in_place->predicted_peak_bytes.at(0), apart->predicted_peak_bytes.at(0));

  auto gpt2 = GenerateModel("gpt", GenOptions());  // 124M, vocab 50257 (padded to 50304 on a GPU)
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  auto peak = [&](const std::vector<std::string>& disabled) -> int64_t {
    CompileOptions copts;
    copts.batch_size = 8;
    copts.device_kind = DEVICE_CUDA;
    copts.disabled_passes = disabled;
    auto compiled = Compile(*gpt2, bf16, copts);
    EXPECT_TRUE(compiled.ok()) << compiled.status();
    return compiled.ok() ? compiled->plans[0].memory().peak_bytes() : 0;
  };
  const int64_t logits_bytes = int64_t{8} * 1024 * 50304 * 2;
  const int64_t with = peak({}), without = peak({"in-place-loss-gradient"});
  RecordProperty("gpt2_predicted_peak_in_place", static_cast<int>(with >> 20));
  RecordProperty("gpt2_predicted_peak_apart", static_cast<int>(without >> 20));
  EXPECT_LE(with, without - logits_bytes * 9 / 10) << with << " vs " << without;
}

// passes/fold_casts folds mixed precision's casts into the float32 ops
// beside them: layer_norm writes its 16-bit output, layer_norm_grad reads
// its 16-bit dy widened, and on GPU plans the qkv projection's GEMM stores
// its 16-bit output and layer_norm_grad writes the 16-bit copy of dx the
// GEMMs read. The kernels compute in float32 as before and round through
// the cast kernel's conversion, so the tiny GPT, compiled for the CPU and
// for a GPU (run on the CPU's kernels), trains the same bits with and
// without the pass, in BF16 and in F16 with dynamic loss scaling, with four
// (CPU) or five (GPU) casts fewer a block (passes/fold_casts_test counts
// them). (GPU plans without cast-bias, which rounds the biases of the GEMMs
// this pass makes store 16 bits: CastBiasRoundsTheBiasesAsAutocastDoes.)
TEST(MixedPrecisionTrainTest, FoldedCastsTrainTheSameBits) {
  auto program = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(program.ok()) << program.status();
  for (DataType low : {BF16, F16}) {
    for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(low), " ", DeviceKind_Name(device)));
      Strategy strategy;
      strategy.mutable_mixed_precision()->set_dtype(low);
      // With the second block recomputed in backward (BF16): its recomputed
      // layer norms fold as the first block's originals do.
      if (low == BF16) strategy.mutable_recompute()->add_checkpoints("h1");
      std::optional<ParityRun> casts, folded;
      ParityOptions run = TokenRun(device);
      if (device == DEVICE_CUDA) run.disabled_passes = {"cast-bias"};
      TrainWithoutAndWith(*program, strategy, run, "fold-casts", &casts, &folded);
      ASSERT_TRUE(casts && folded);
      EXPECT_EQ(folded->losses, casts->losses);
      std::string worst;
      EXPECT_EQ(MaxWeightDifference(*folded, *casts, &worst), 0.0) << worst;
      EXPECT_FALSE(folded->weights.empty());
      EXPECT_LT(folded->losses.back(), folded->losses.front());
      if (low == F16) {
        EXPECT_EQ(folded->loss_scales, casts->loss_scales);
        EXPECT_EQ(folded->skipped_updates, casts->skipped_updates);
      }
      // The memory rule holds for the CPU plan; a GPU plan's prediction is
      // for the CUDA kernels' scratch, not the CPU's, and never grows with
      // the folds. (Since the gelu runs in the low dtype, its float32
      // pre-activation and gradient are gone with or without the pass, and
      // the float32 copies the pass still removes are not alive at the tiny
      // GPT's peak: 2297864 bytes either way for its BF16 plan, 2363400
      // folded and 2478088 not when the gelu ran in float32.)
      if (device == DEVICE_CPU) {
        EXPECT_LE(folded->measured_peak_bytes.at(0), folded->predicted_peak_bytes.at(0));
      } else {
        EXPECT_LE(folded->predicted_peak_bytes.at(0), casts->predicted_peak_bytes.at(0));
      }
      RecordProperty(absl::StrCat(DataTypeName(low), "_", DeviceKind_Name(device), "_predicted_peak_casts"),
                     casts->predicted_peak_bytes.at(0));
      RecordProperty(absl::StrCat(DataTypeName(low), "_", DeviceKind_Name(device), "_predicted_peak_folded"),
                     folded->predicted_peak_bytes.at(0));
    }
  }
}

// passes/cast_bias rounds the float bias of each GEMM that stores 16 bits
// (the qkv projection's, the MLP's) to 16 bits, as torch autocast does, on
// GPU plans (run here on the CPU's kernels). The numbers change by that
// rounding and no more: the first step equals the plan without the pass
// bit for bit (the generated biases start at 0, exact in 16 bits); later
// steps differ (the updated biases are no longer 16-bit values: the
// master weights stay float, their gradients float sums), and both follow
// the float32 run within one bf16 rounding, the bar of the other GPT
// tests. F16 with dynamic loss scaling skips the same steps either way.
// Measured (10 steps, batch 4): the bias rounding moves the loss by 2.6e-5
// relative at most in BF16 (2.4e-6 in F16), where BF16 itself is 1.3e-4
// from float32 (F16 1.7e-5).
TEST(MixedPrecisionTrainTest, CastBiasRoundsTheBiasesAsAutocastDoes) {
  auto program = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options = TokenRun(DEVICE_CUDA);
  options.steps = 10;
  auto ref = TrainParallel(*program, Strategy(), options);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (DataType low : {BF16, F16}) {
    SCOPED_TRACE(DataTypeName(low));
    Strategy strategy;
    strategy.mutable_mixed_precision()->set_dtype(low);
    std::optional<ParityRun> float_bias, low_bias;
    TrainWithoutAndWith(*program, strategy, options, "cast-bias", &float_bias, &low_bias);
    ASSERT_TRUE(float_bias && low_bias);
    EXPECT_EQ(low_bias->losses.front(), float_bias->losses.front());
    EXPECT_NE(low_bias->losses, float_bias->losses);
    double worst = 0;
    for (size_t i = 0; i < low_bias->losses.size(); ++i) {
      worst = std::max(worst, std::abs(low_bias->losses[i] - float_bias->losses[i]) / std::abs(float_bias->losses[i]));
    }
    RecordProperty(absl::StrCat(DataTypeName(low), "_worst_rel_diff_cast_bias"), absl::StrFormat("%.3g", worst));
    ExpectFollowsWithinOneBf16Rounding(ref->losses, low_bias->losses, absl::StrCat(DataTypeName(low), "_cast_bias_"));
    ExpectFollowsWithinOneBf16Rounding(ref->losses, float_bias->losses,
                                       absl::StrCat(DataTypeName(low), "_float_bias_"));
    EXPECT_LT(low_bias->losses.back(), low_bias->losses.front());
    // The master biases are float: trained, they hold values no 16-bit type does.
    const std::vector<double>& qkv_bias = low_bias->weights.at("block0.attn.qkv.b");
    const int off_grid = static_cast<int>(std::count_if(qkv_bias.begin(), qkv_bias.end(), [&](double v) {
      const float f = static_cast<float>(v);
      return static_cast<double>(low == BF16 ? ToFloat(ToBfloat16(f)) : ToFloat(ToFloat16(f))) != v;
    }));
    EXPECT_GT(off_grid, 0);
    if (low == F16) {
      EXPECT_EQ(low_bias->skipped_updates, float_bias->skipped_updates);
    }
  }
}

// Under a GPU plan's pipeline (run on the CPU's kernels) each stage casts
// its biases once an update after the optimizer (hoist-param-casts, where
// one device's plan of 4 micro-batches does the same), and 2 stages of
// 1F1B over 4 micro-batches train the bits one device trains on the same
// micro-batches, as the CPU plans' pipelines do (gpt_pipeline_parity_test).
TEST(MixedPrecisionTrainTest, CastBiasPipelineTrainsOneDevicesBits) {
  auto program = GenerateModel("gpt", TinyGpt("F32", 2));
  ASSERT_TRUE(program.ok()) << program.status();
  auto one_stage = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(one_stage.ok()) << one_stage.status();
  Strategy strategy;
  strategy.mutable_mixed_precision()->set_dtype(BF16);
  strategy.mutable_pipeline()->set_micro_batch_size(2);
  strategy.mutable_pipeline()->set_accumulate_steps(4);
  strategy.mutable_pipeline()->set_schedule(ONE_F_ONE_B);
  ParityOptions options = TokenRun(DEVICE_CUDA);
  options.batch_size = 0;  // the pipeline's
  auto single = TrainParallel(*one_stage, strategy, options);
  ASSERT_TRUE(single.ok()) << single.status();
  auto parallel = TrainParallel(*program, strategy, options);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  ASSERT_EQ(parallel->losses.size(), static_cast<size_t>(options.steps));
  EXPECT_EQ(parallel->losses, single->losses);
  std::string worst;
  EXPECT_EQ(MaxWeightDifference(*parallel, *single, &worst), 0.0) << worst;
  EXPECT_LT(single->losses.back(), single->losses.front());
  // And the bias casts were there, hoisted: each stage's plan holds 16-bit copies of its biases.
  CompileOptions copts;
  copts.device_kind = DEVICE_CUDA;
  auto compiled = Compile(*program, strategy, copts);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  int bias_copies = 0;
  for (const RankPlan& plan : compiled->plans) {
    for (const Var& v : plan.program().var()) {
      bias_copies += v.kind() == PARAM_COPY && v.name().size() > 7 && v.name().rfind(".b@bf16") == v.name().size() - 7;
    }
  }
  EXPECT_EQ(bias_copies, 2 * TinyGpt("F32").blocks);
}

// The generated convnet (two 3x3 conv2d layers of 32 and 64 channels with
// bias, relu and max pooling, then fc 128 and the 10-way head) under BF16:
// the convolutions and their gradients run in bf16 as the matmuls do
// (widened float32 kernels on the CPU), beside the same program in float32.
GenOptions ConvnetGen(int stages = 1) {
  GenOptions gen;
  gen.stages = stages;
  gen.optimizer = "momentum";
  gen.learning_rate = 0.05;
  gen.cosine = false;
  return gen;
}

TEST(MixedPrecisionTrainTest, Bf16ConvnetFollowsFloat32) {
  GenOptions gen = ConvnetGen();
  gen.optimizer = "adam";  // Adam's default lr
  gen.learning_rate = 0;
  auto program = GenerateModel("convnet", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.data = "synthetic:classes=10,size=64";
  options.steps = 10;
  options.batch_size = 16;
  Strategy f32;
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  auto ref = TrainParallel(*program, f32, options);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto mixed = TrainParallel(*program, bf16, options);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  ASSERT_EQ(mixed->losses.size(), 10u);
  for (size_t i = 0; i < ref->losses.size(); ++i) {
    RecordProperty(absl::StrCat("convnet_f32_loss_", i + 1), absl::StrFormat("%.6g", ref->losses[i]));
    RecordProperty(absl::StrCat("convnet_bf16_loss_", i + 1), absl::StrFormat("%.6g", mixed->losses[i]));
  }
  // Bars. The first step runs the same initial weights on the same batch,
  // so its difference is the forward's roundings alone: each conv and matmul
  // rounds its inputs and its output once (2^-9 relative) and sums in float.
  // Measured (batch 16, synthetic size 64, Adam): 1.5e-4 relative on step 1;
  // then training drifts the weights apart, and the worst over 10 steps was
  // 1.7e-3 (step 5), about one bf16 rounding. (An earlier variant, momentum
  // on 512 samples, measured 3.8e-5 and 2.5e-3.) That is 4x the MLP's and 20x
  // the GPT's worst: the convnet's pre-activations are sums of 9-288 bf16
  // products over 28x28 maps, and a relu/max-pool flips where a rounded value
  // crosses a boundary, so the drift is larger than the MLP's; the MLP's
  // one-rounding bar would hold with no room. So the bars are the issue's,
  // 2e-2 per step (12x the measurement), 1e-3 on the first step (7x), and
  // four bf16 roundings (2^-7 = 7.8e-3) on the worst step (4.7x), which a
  // conv left in float32 would not trip but a cast to the wrong var or a
  // kernel reading garbage would.
  double worst = 0;
  for (size_t i = 0; i < ref->losses.size(); ++i) {
    const double rel = std::abs(mixed->losses[i] - ref->losses[i]) / std::abs(ref->losses[i]);
    worst = std::max(worst, rel);
    RecordProperty(absl::StrCat("convnet_rel_diff_step_", i + 1), absl::StrFormat("%.3g", rel));
    EXPECT_LE(rel, 2e-2) << "step " << i + 1 << ": f32 " << ref->losses[i] << ", bf16 " << mixed->losses[i];
  }
  RecordProperty("convnet_worst_rel_diff", absl::StrFormat("%.3g", worst));
  EXPECT_LE(std::abs(mixed->losses[0] - ref->losses[0]), 1e-3 * std::abs(ref->losses[0]));
  EXPECT_LE(worst, std::ldexp(1.0, -7));
  EXPECT_NE(mixed->losses, ref->losses);  // the casts do run
  EXPECT_LT(mixed->losses.back(), mixed->losses.front());  // and it trains
  EXPECT_LT(ref->losses.back(), ref->losses.front());
  // Memory rule: measured <= predicted, the widened conv kernels' float32
  // copies and columns included.
  EXPECT_LE(mixed->measured_peak_bytes.at(0), mixed->predicted_peak_bytes.at(0));
  EXPECT_LE(ref->measured_peak_bytes.at(0), ref->predicted_peak_bytes.at(0));
}

// A BF16 convnet under a 2-stage pipeline, and under data parallelism, trains
// what one device trains in BF16: per-step losses and final weights within
// 1e-5 relative over 6 steps. The single device runs the same micro-batches
// (a pipeline section on one stage with accumulate_steps = micro-batches x
// dp): a bf16 conv2d_grad_filter rounds its sum over the micro-batch's
// images once, so a gradient summed over 8 images and one summed over two
// halves of 4 differ by a bf16 rounding (2^-9); partitioned alike, every
// bf16 rounding is the same and only the float32 order in which the parts
// are added differs (as in loss_scaling_parity_test).
struct ConvLayout {
  std::string name;
  int stages;
  int dp;
  int micro_batches;  // per rank
};

class Bf16ConvnetParityTest : public ::testing::TestWithParam<ConvLayout> {};

TEST_P(Bf16ConvnetParityTest, MatchesSingleDeviceBf16) {
  const ConvLayout& c = GetParam();
  constexpr int kMicroBatchSize = 4;
  auto single_program = GenerateModel("convnet", ConvnetGen());
  ASSERT_TRUE(single_program.ok()) << single_program.status();
  auto program = GenerateModel("convnet", ConvnetGen(c.stages));
  ASSERT_TRUE(program.ok()) << program.status();
  auto layout = [&](bool single) {
    Strategy s;
    s.mutable_mixed_precision()->set_dtype(BF16);
    s.mutable_pipeline()->set_micro_batch_size(kMicroBatchSize);
    s.mutable_pipeline()->set_accumulate_steps(single ? c.micro_batches * c.dp : c.micro_batches);
    if (!single && c.dp > 1) s.mutable_data_parallel()->set_degree(c.dp);
    return s;
  };
  ParityOptions options;
  // One global batch's worth of samples, seen again and again: the loss falls.
  options.data = absl::StrCat("synthetic:classes=10,size=", kMicroBatchSize * c.micro_batches * c.dp);
  options.steps = 6;
  auto single = TrainParallel(*single_program, layout(true), options);
  ASSERT_TRUE(single.ok()) << single.status();
  auto parallel = TrainParallel(*program, layout(false), options);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  ASSERT_EQ(parallel->losses.size(), 6u);
  const double loss_diff = MaxLossDifference(*parallel, *single);
  std::string worst;
  const double weight_diff = MaxWeightDifference(*parallel, *single, &worst);
  RecordProperty("max_loss_diff", absl::StrFormat("%.3g", loss_diff));
  RecordProperty("max_weight_diff", absl::StrFormat("%.3g", weight_diff));
  EXPECT_LE(loss_diff, 1e-5);
  EXPECT_LE(weight_diff, 1e-5) << "worst parameter: " << worst;
  for (size_t i = 0; i < single->losses.size(); ++i) {
    RecordProperty(absl::StrCat("loss_", i + 1), absl::StrFormat("%.6g", single->losses[i]));
  }
  // It trains (momentum at lr 0.05 oscillates on so few samples; the lowest
  // loss measured 1.56 and 1.69 from 2.26 and 2.28), so equal weights mean
  // equal training.
  EXPECT_LT(*std::min_element(single->losses.begin(), single->losses.end()), 0.9 * single->losses.front());
}

INSTANTIATE_TEST_SUITE_P(Layouts, Bf16ConvnetParityTest,
                         ::testing::Values(ConvLayout{"pp2", 2, 1, 2}, ConvLayout{"dp2", 1, 2, 2}),
                         [](const ::testing::TestParamInfo<ConvLayout>& info) { return info.param.name; });

// The loss reading the LM head's 16-bit logits (no F32 logits, no casts
// around the loss) trains bit for bit as the form before it: the same
// program compiled with the fold off (the loss reading F32 logits cast up,
// its F32 gradient cast down) and on, 10 steps each on the license tokens:
// every step's loss and every final weight equal, for BF16 and for F16 with
// dynamic loss scaling (the scaled F32 seed flows into the 16-bit gradient
// as it flowed into the F32 one). Widening is exact and the gradient is
// rounded once either way. The fold saves the F32 logits and their gradient,
// which the predicted peak shows where it sits at them: a GPU plan's drops
// (this tiny GPT's: 2984972 -> 2968328 bytes for BF16; GPT-2 124M at batch
// 8x1024: 9.09 -> 7.57 GiB), a CPU plan's never rises (the tiny GPT's CPU
// peak, 3050252 bytes, is elsewhere: the widened attention's scratch).
TEST(MixedPrecisionTrainTest, LossOn16BitLogitsTrainsBitForBitAsWithTheCasts) {
  auto program = GenerateModel("gpt", TinyGpt("F32"));
  ASSERT_TRUE(program.ok()) << program.status();
  for (DataType low : {BF16, F16}) {
    SCOPED_TRACE(DataTypeName(low));
    Strategy strategy;
    strategy.mutable_mixed_precision()->set_dtype(low);
    // The two compiles differ where they should: the folded plan has no F32
    // logits; on a GPU plan its predicted peak drops by at least their bytes.
    for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
      int64_t peak[2] = {0, 0};
      for (bool fold : {false, true}) {
        CompileOptions copts;
        copts.batch_size = 4;
        copts.device_kind = device;
        copts.mixed_precision_fold_losses = fold;
        auto compiled = Compile(*program, strategy, copts);
        ASSERT_TRUE(compiled.ok()) << compiled.status();
        bool f32_logits = false;
        for (const Var& v : compiled->plans[0].program().var()) f32_logits |= v.name() == "logits";
        EXPECT_EQ(f32_logits, !fold);
        peak[fold] = compiled->plans[0].memory().peak_bytes();
      }
      RecordProperty(absl::StrCat(DataTypeName(low), "_", DeviceKind_Name(device), "_predicted_peak_casts"), peak[0]);
      RecordProperty(absl::StrCat(DataTypeName(low), "_", DeviceKind_Name(device), "_predicted_peak_folded"), peak[1]);
      EXPECT_LE(peak[1], peak[0]);
      if (device == DEVICE_CUDA) {
        EXPECT_LT(peak[1], peak[0]);
      }
    }
    ParityOptions options;
    options.data = "tokens:path=tests/testdata/license_tokens.u16";
    options.steps = 10;
    options.batch_size = 4;
    options.mixed_precision_fold_losses = false;
    auto casts = TrainParallel(*program, strategy, options);
    ASSERT_TRUE(casts.ok()) << casts.status();
    options.mixed_precision_fold_losses = true;
    auto folded = TrainParallel(*program, strategy, options);
    ASSERT_TRUE(folded.ok()) << folded.status();
    ASSERT_EQ(folded->losses.size(), 10u);
    EXPECT_EQ(folded->losses, casts->losses);
    EXPECT_EQ(folded->weights, casts->weights);
    EXPECT_FALSE(folded->weights.empty());
    EXPECT_LT(folded->losses.back(), folded->losses.front());
    if (low == F16) {
      EXPECT_EQ(folded->loss_scales, casts->loss_scales);
      EXPECT_EQ(folded->skipped_updates, casts->skipped_updates);
    }
    EXPECT_LE(folded->measured_peak_bytes.at(0), folded->predicted_peak_bytes.at(0));
  }
}

// A factorized layer (image @ u, then @ v: a matmul reading a matmul's
// output) compiles under mixed precision, and the second matmul reads the
// first's 16-bit output itself: the same bits as with an identity between
// them, where the float output is cast down again (widening is exact, so the
// round trip is too), and no cast back writes a float output nothing reads.
// Before, the pass stopped at "var 'fc.u@bf16' exists already".
TEST(MixedPrecisionTrainTest, AMatmulReadingAMatmulReadsIts16BitOutput) {
  const auto program_with = [](bool identity) {
    return absl::StrCat(R"pb(
      var { name: "image" dtype: F32 shape: [-1, 784] kind: FEED }
      var { name: "label" dtype: I64 shape: [-1] kind: FEED }
      var { name: "u" dtype: F32 shape: [784, 16] kind: PARAM init { normal { std: 0.05 } } }
      var { name: "v" dtype: F32 shape: [16, 10] kind: PARAM init { normal { std: 0.2 } } }
      op { type: "matmul" input: ["image", "u"] output: ["fc.u"] }
    )pb",
                        identity ? R"pb(op { type: "identity" input: ["fc.u"] output: ["fc.u2"] }
                                        op { type: "matmul" input: ["fc.u2", "v"] output: ["logits"] })pb"
                                 : R"pb(op { type: "matmul" input: ["fc.u", "v"] output: ["logits"] })pb",
                        R"pb(
      op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
      loss: "loss"
      optimizer { sgd { learning_rate: 0.1 } }
    )pb");
  };
  for (DataType low : {BF16, F16}) {
    SCOPED_TRACE(DataTypeName(low));
    Strategy strategy;
    strategy.mutable_mixed_precision()->set_dtype(low);
    const std::string suffix = low == BF16 ? "@bf16" : "@f16";
    absl::StatusOr<Program> direct = ParseProgramText(program_with(false), "factorized.pbtxt");
    absl::StatusOr<Program> via_identity = ParseProgramText(program_with(true), "factorized_identity.pbtxt");
    ASSERT_TRUE(direct.ok()) << direct.status();
    ASSERT_TRUE(via_identity.ok()) << via_identity.status();
    CompileOptions copts;
    copts.batch_size = 8;
    copts.dump_after = "mixed-precision";
    auto compiled = Compile(*direct, strategy, copts);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    bool reads_low = false, casts_down = false, float_fc_u = false;
    for (const Op& op : compiled->dumped.op()) {
      if (op.type() == "matmul" && op.output(0) == absl::StrCat("logits", suffix)) {
        reads_low = op.input(0) == absl::StrCat("fc.u", suffix);
      }
      casts_down |= op.type() == "cast" && op.input(0) == "fc.u";
    }
    for (const Var& v : compiled->dumped.var()) float_fc_u |= v.name() == "fc.u";
    EXPECT_TRUE(reads_low);
    EXPECT_FALSE(casts_down);
    EXPECT_FALSE(float_fc_u);  // nothing reads a float fc.u: no cast back writes one
    // A recompute checkpoint keeps its float var (the cast back stays), and
    // the plan compiles.
    Strategy checkpointed = strategy;
    checkpointed.mutable_recompute()->add_checkpoints("fc.u");
    auto with_checkpoint = Compile(*direct, checkpointed, copts);
    ASSERT_TRUE(with_checkpoint.ok()) << with_checkpoint.status();
    bool kept = false;
    for (const Var& v : with_checkpoint->dumped.var()) kept |= v.name() == "fc.u";
    EXPECT_TRUE(kept);

    ParityOptions options;
    options.data = "synthetic:classes=10,size=512";
    options.steps = 5;
    options.batch_size = 32;
    auto a = TrainParallel(*direct, strategy, options);
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = TrainParallel(*via_identity, strategy, options);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->losses.size(), 5u);
    EXPECT_EQ(a->losses, b->losses);
    EXPECT_EQ(a->weights, b->weights);
    EXPECT_FALSE(a->weights.empty());
  }
}

TEST(MixedPrecisionTrainTest, F16MlpFollowsFloat32) {
  auto program = GenerateModel("mlp", GenOptions());
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.data = "synthetic:classes=10,size=2048";
  options.steps = 20;
  options.batch_size = 64;
  Strategy f32;
  Strategy f16;
  f16.mutable_mixed_precision()->set_dtype(F16);  // GradScaler's defaults: 65536, 2000

  auto ref = TrainParallel(*program, f32, options);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto mixed = TrainParallel(*program, f16, options);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  ASSERT_EQ(mixed->losses.size(), 20u);
  // 65536 overflows nothing here: no update skipped, the scale constant.
  EXPECT_EQ(mixed->loss_scales, std::vector<double>(20, 65536.0));
  EXPECT_EQ(mixed->skipped_updates, std::vector<bool>(20, false));
  // F16 keeps 11 significant bits, 8x finer than bf16's 8: the first step
  // (the initial weights' forward) differs by 5.2e-7 relative, against
  // bf16's 7e-6. Training then amplifies the roundings as the weights drift
  // apart (Adam normalises every gradient element, the tiny ones too):
  // measured (batch 64, synthetic) 4.7e-5 at step 2, 3.5e-4 at step 7, the
  // worst 6.9e-4 at step 15, and the same 7.0e-4 with the scale set to 1,
  // so the drift is F16's rounding, not the scaling. Bars: the issue's 2e-2
  // per step; 1e-5 on the first step (20x the measurement); and bf16's
  // bar, one bf16 rounding (2^-9), on the worst step (2.8x the measurement).
  double worst = 0;
  for (size_t i = 0; i < ref->losses.size(); ++i) {
    const double rel = std::abs(mixed->losses[i] - ref->losses[i]) / std::abs(ref->losses[i]);
    worst = std::max(worst, rel);
    RecordProperty(absl::StrCat("f16_rel_diff_step_", i + 1), absl::StrFormat("%.3g", rel));
  }
  RecordProperty("worst_rel_diff", absl::StrFormat("%.3g", worst));
  for (size_t i = 0; i < ref->losses.size(); ++i) {
    EXPECT_LE(std::abs(mixed->losses[i] - ref->losses[i]), 2e-2 * std::abs(ref->losses[i])) << "step " << i + 1;
  }
  EXPECT_LE(std::abs(mixed->losses[0] - ref->losses[0]), 1e-5 * std::abs(ref->losses[0]));
  EXPECT_LE(worst, std::ldexp(1.0, -9));
  EXPECT_NE(mixed->losses, ref->losses);
  EXPECT_LE(mixed->measured_peak_bytes.at(0), mixed->predicted_peak_bytes.at(0));
}

// A small MLP with Adam (whose moments and step count a skipped update must
// leave alone) and clipping.
constexpr char kAdamMlp[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 16] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w1" dtype: F32 shape: [16, 32] kind: PARAM init { xavier_uniform {} } }
  var { name: "b1" dtype: F32 shape: [32] kind: PARAM }
  var { name: "w2" dtype: F32 shape: [32, 4] kind: PARAM init { xavier_uniform {} } }
  op { type: "matmul" input: ["x", "w1"] output: ["xw"] }
  op { type: "add" input: ["xw", "b1"] output: ["a"] }
  op { type: "relu" input: ["a"] output: ["h"] }
  op { type: "matmul" input: ["h", "w2"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { adam { learning_rate: 0.01 } clip_global_norm: 5.0 }
)pb";

std::map<std::string, std::vector<double>> Values(const std::map<std::string, Tensor>& state) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : state) {
    for (int64_t i = 0; i < t.num_elements(); ++i) out[name].push_back(t.ValueAt(i));
  }
  return out;
}

TEST(MixedPrecisionTrainTest, F16SkippedUpdatesChangeNothingAndTheScaleFollowsGradScaler) {
  auto program = ParseProgramText(kAdamMlp, "adam_mlp.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  // A rate that falls with every update made, so the reported one shows
  // whether skipped updates were counted.
  program->mutable_optimizer()->mutable_lr_schedule()->mutable_step_decay()->set_step_size(1);
  program->mutable_optimizer()->mutable_lr_schedule()->mutable_step_decay()->set_gamma(0.9);
  Strategy strategy;
  strategy.mutable_mixed_precision()->set_dtype(F16);
  // 2^40 overflows F16 in backward: the first updates are skipped while the
  // scale walks down; growth after 3 good steps overflows again now and then.
  strategy.mutable_mixed_precision()->mutable_loss_scaling()->set_init_scale(std::ldexp(1.0, 40));
  strategy.mutable_mixed_precision()->mutable_loss_scaling()->set_growth_interval(3);
  constexpr int64_t kBatch = 32;
  CompileOptions copts;
  copts.batch_size = kBatch;
  auto compiled = Compile(*program, strategy, copts);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ExecutorOptions eopts;
  eopts.seed = 7;
  auto executor = Executor::Create(compiled->plans[0], eopts);
  ASSERT_TRUE(executor.ok()) << executor.status();
  ASSERT_TRUE((*executor)->InitializeState().ok());

  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  double scale = std::ldexp(1.0, 40);  // GradScaler's rule, run beside
  int good = 0, skipped = 0, made = 0, grown = 0;
  for (int step = 0; step < 40; ++step) {
    std::map<std::string, Tensor> feeds;
    feeds["x"] = Tensor::Empty(F32, {kBatch, 16});
    feeds["label"] = Tensor::Empty(I64, {kBatch});
    for (int64_t i = 0; i < kBatch * 16; ++i) feeds["x"].data<float>()[i] = normal(rng);
    for (int64_t i = 0; i < kBatch; ++i) feeds["label"].data<int64_t>()[i] = (i * 7 + step) % 4;
    const auto before = Values((*executor)->PersistentState());
    auto r = (*executor)->TrainStep(feeds, step * kBatch);
    ASSERT_TRUE(r.ok()) << "step " << step + 1 << ": " << r.status();
    const auto after = Values((*executor)->PersistentState());
    SCOPED_TRACE(absl::StrCat("step ", step + 1));
    EXPECT_TRUE(std::isfinite(r->loss));  // the reported loss is the unscaled forward loss
    ASSERT_TRUE(r->has_loss_scale);
    EXPECT_EQ(r->loss_scale, scale);
    for (const auto& [name, values] : before) {
      if (name == "@loss_scale" || name == "@loss_scale.good_steps" || name == "@loss_scale.skipped_updates") continue;
      if (r->skipped_update) {
        EXPECT_EQ(after.at(name), values) << name << " changed on a skipped update";
      } else if (name == "w1" || name == "w2" || name == "@step") {
        EXPECT_NE(after.at(name), values) << name << " did not change on an update";
      }
    }
    EXPECT_EQ(after.at("@step")[0], static_cast<double>(made + !r->skipped_update));
    ASSERT_TRUE(r->has_lr);
    EXPECT_DOUBLE_EQ(r->lr, 0.01 * std::pow(0.9, made));  // the updates made before this one
    if (r->skipped_update) {
      scale *= 0.5;
      good = 0;
      ++skipped;
    } else {
      ++made;
      if (++good == 3) {
        scale *= 2;
        good = 0;
        ++grown;
      }
    }
    EXPECT_EQ(after.at("@loss_scale")[0], scale);
    EXPECT_EQ(after.at("@loss_scale.skipped_updates")[0], skipped);
    if (step == 0) {
      EXPECT_TRUE(r->skipped_update) << "2^40 must overflow F16";
    }
  }
  RecordProperty("skipped", skipped);
  RecordProperty("final_scale", absl::StrFormat("%.17g", scale));
  EXPECT_GE(skipped, 10);  // the walk down from 2^40
  EXPECT_GE(made, 10);
  EXPECT_GE(grown, 2);
}

// With clipping, a line's grad_norm is null on a skipped update (its
// gradients held an inf) and a positive number on the others.
TEST(MixedPrecisionTrainTest, F16MetricsLinesCarryTheScaleAndTheSkips) {
  auto program = GenerateModel("mlp", GenOptions());
  ASSERT_TRUE(program.ok()) << program.status();
  program->mutable_optimizer()->set_clip_global_norm(1000);
  Strategy strategy;
  strategy.mutable_mixed_precision()->set_dtype(F16);
  strategy.mutable_mixed_precision()->mutable_loss_scaling()->set_init_scale(std::ldexp(1.0, 30));
  CompileOptions copts;
  copts.batch_size = 32;
  auto compiled = Compile(*program, strategy, copts);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp ? tmp : "/tmp", "/f16_metrics.jsonl");
  TrainOptions topts;
  topts.data = "synthetic:classes=10,size=512";
  topts.steps = 12;
  topts.seed = 1;
  topts.progress = false;
  topts.metrics_path = path;
  auto report = Train(compiled->plans[0], topts);
  ASSERT_TRUE(report.ok()) << report.status();
  std::ifstream in(path);
  std::string line;
  int steps = 0, skipped = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("step") || j.contains("eval") || j.contains("summary")) continue;
    const StepMetrics& m = report->steps.at(steps++);
    ASSERT_TRUE(j.contains("loss_scale")) << line;
    EXPECT_EQ(j["loss_scale"].get<double>(), m.loss_scale) << line;
    EXPECT_TRUE(j["loss"].is_number()) << line;  // finite: a skipped step is no divergence
    ASSERT_TRUE(j.contains("grad_norm")) << line;
    if (m.skipped_update) {
      ++skipped;
      EXPECT_EQ(j["skipped_update"], true) << line;
      EXPECT_TRUE(j["grad_norm"].is_null()) << line;
    } else {
      EXPECT_FALSE(j.contains("skipped_update")) << line;
      EXPECT_GT(j["grad_norm"].get<double>(), 0) << line;
    }
  }
  EXPECT_EQ(steps, 12);
  EXPECT_GE(skipped, 1);  // 2^30 overflows at first
  EXPECT_EQ(report->steps.front().loss_scale, std::ldexp(1.0, 30));
}

}  // namespace
}  // namespace strata
