// The schedules change memory, never numbers: with 4 stages and 8
// micro-batches, stage 0 under 1F1B holds at most 4 micro-batches of
// activations where F-then-B holds all 8. On every rank the memory plan's
// prediction bounds the measured peak (the allocator's counter) and is at
// most 10% above it.

#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "passes/compile.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "passes/testing/pass_test_util.h"
#include "tests/parity_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

// The memory rule: predicted >= measured, and predicted <= 1.1 x measured.
void ExpectPlanBoundsPeak(double measured, double predicted, const std::string& what) {
  EXPECT_LE(measured, predicted) << what << ": measured " << measured << " above predicted " << predicted;
  EXPECT_LE(predicted, 1.10 * measured) << what << ": predicted " << predicted << " over 10% above measured " << measured;
}

Program FourStageMlp() {
  GenOptions gen;
  gen.layers = {512, 512, 512, 512, 512};  // one equal layer per stage
  gen.stages = 4;
  gen.optimizer = "sgd";
  auto text = GenerateProgram("mlp", gen);
  EXPECT_TRUE(text.ok());
  auto program = ParseProgramText(*text, "mlp4.pbtxt");
  EXPECT_TRUE(program.ok());
  return *program;
}

Strategy Pipeline(ScheduleKind kind) {
  Strategy s;
  s.mutable_pipeline()->set_micro_batch_size(128);
  s.mutable_pipeline()->set_accumulate_steps(8);
  s.mutable_pipeline()->set_schedule(kind);
  return s;
}

TEST(PipelineMemoryTest, OneFOneBHoldsFewerMicroBatchesAndThePlanPredictsThePeak) {
  Program program = FourStageMlp();
  ParityOptions options;
  options.steps = 3;
  options.data = "synthetic:classes=512,size=2048";
  std::map<ScheduleKind, ParityRun> runs;
  std::map<ScheduleKind, std::vector<RankPlan>> plans;
  for (ScheduleKind kind : {ONE_F_ONE_B, F_THEN_B}) {
    auto compiled = Compile(program, Pipeline(kind), CompileOptions());
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    plans[kind] = compiled->plans;
    auto run = TrainParallel(program, Pipeline(kind), options);
    ASSERT_TRUE(run.ok()) << run.status();
    runs[kind] = *run;
    for (int rank = 0; rank < 4; ++rank) {
      const double measured = static_cast<double>(run->measured_peak_bytes.at(rank));
      const double predicted = static_cast<double>(run->predicted_peak_bytes.at(rank));
      std::cerr << ScheduleKind_Name(kind) << " rank " << rank << " measured " << measured << " predicted " << predicted << "\n";
      ExpectPlanBoundsPeak(measured, predicted, absl::StrCat(ScheduleKind_Name(kind), " rank ", rank));
    }
  }
  auto activations = [&](ScheduleKind kind) {
    const MemoryPlan& m = plans[kind][0].memory();
    return static_cast<double>(runs[kind].measured_peak_bytes.at(0) - m.param_bytes() - m.state_bytes());
  };
  const double one_f_one_b = activations(ONE_F_ONE_B), f_then_b = activations(F_THEN_B);
  EXPECT_LE(one_f_one_b, (4.0 / 8.0 + 0.10) * f_then_b) << "1F1B " << one_f_one_b << " F-then-B " << f_then_b;
}

// Convolutions draw im2col scratch from the allocator while they run; the
// plan counts it (each conv kernel registers its workspace), so a conv
// pipeline's measured peak meets the prediction too. Before, the AlexNet
// example's second rank measured 70% above its plan.
TEST(PipelineMemoryTest, ConvolutionScratchIsInThePlan) {
  GenOptions gen;
  gen.stages = 2;
  auto text = GenerateProgram("alexnet", gen);
  ASSERT_TRUE(text.ok()) << text.status();
  auto program = ParseProgramText(*text, "alexnet2.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(16);
  strategy.mutable_pipeline()->set_accumulate_steps(4);
  strategy.mutable_pipeline()->set_schedule(ONE_F_ONE_B);
  ParityOptions options;
  options.steps = 2;
  options.data = "synthetic:classes=10,size=256";
  auto run = TrainParallel(*program, strategy, options);
  ASSERT_TRUE(run.ok()) << run.status();
  for (int rank = 0; rank < 2; ++rank) {
    const double measured = static_cast<double>(run->measured_peak_bytes.at(rank));
    const double predicted = static_cast<double>(run->predicted_peak_bytes.at(rank));
    ExpectPlanBoundsPeak(measured, predicted, absl::StrCat("rank ", rank));
  }
}

// examples/mlp_pp2.pbtxt: the last stage does 1% of the work, so it runs
// each of its actions in microseconds while the first stage takes the
// gradients it sent whenever its own actions reach them. The executor used to
// free a sent buffer whenever a waiter thread saw the send complete, and
// rank 1 measured 22.8 KiB after 8 steps and 30.8 KiB after a thousand (all
// four of a step's sent gradients held to its end) against 19.6 KiB
// predicted; now it waits for each send where the plan frees it.
constexpr char kMlpPp2[] = R"pb(
  name: "mlp"
  var { name: "image" dtype: F32 shape: [-1, 784] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "fc1.w" dtype: F32 shape: [784, 128] kind: PARAM init { uniform { low: -0.0357142857 high: 0.0357142857 } } }
  var { name: "fc1.b" dtype: F32 shape: [128] kind: PARAM init { uniform { low: -0.0357142857 high: 0.0357142857 } } }
  var { name: "fc2.w" dtype: F32 shape: [128, 64] kind: PARAM init { uniform { low: -0.0883883476 high: 0.0883883476 } } }
  var { name: "fc2.b" dtype: F32 shape: [64] kind: PARAM init { uniform { low: -0.0883883476 high: 0.0883883476 } } }
  var { name: "fc3.w" dtype: F32 shape: [64, 10] kind: PARAM init { uniform { low: -0.125 high: 0.125 } } }
  var { name: "fc3.b" dtype: F32 shape: [10] kind: PARAM init { uniform { low: -0.125 high: 0.125 } } }
  op { type: "matmul" input: ["image", "fc1.w"] output: ["fc1.xw"] device: "gpu:0" }
  op { type: "add" input: ["fc1.xw", "fc1.b"] output: ["fc1.y"] device: "gpu:0" }
  op { type: "relu" input: ["fc1.y"] output: ["h1"] device: "gpu:0" }
  op { type: "matmul" input: ["h1", "fc2.w"] output: ["fc2.xw"] device: "gpu:0" }
  op { type: "add" input: ["fc2.xw", "fc2.b"] output: ["fc2.y"] device: "gpu:0" }
  op { type: "relu" input: ["fc2.y"] output: ["h2"] device: "gpu:0" }
  op { type: "matmul" input: ["h2", "fc3.w"] output: ["fc3.xw"] device: "gpu:1" }
  op { type: "add" input: ["fc3.xw", "fc3.b"] output: ["fc3.y"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["fc3.y", "label"] output: ["loss"] device: "gpu:1" }
  op { type: "accuracy" input: ["fc3.y", "label"] output: ["acc"] attr { key: "k" value { i: 1 } } device: "gpu:1" }
  loss: "loss"
  fetch: "acc"
  optimizer { adam { learning_rate: 0.001 } lr_schedule { cosine {} } }
)pb";

TEST(PipelineMemoryTest, ThePlanBoundsEveryRanksPeakOverManyStepsOfUnequalStages) {
  auto program = ParseProgramText(kMlpPp2, "mlp_pp2.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.steps = 150;
  options.data = "synthetic:classes=10,size=1024";
  for (ScheduleKind kind : {ONE_F_ONE_B, F_THEN_B}) {
    Strategy strategy;
    strategy.mutable_pipeline()->set_micro_batch_size(16);
    strategy.mutable_pipeline()->set_accumulate_steps(4);
    strategy.mutable_pipeline()->set_schedule(kind);
    auto run = TrainParallel(*program, strategy, options);
    ASSERT_TRUE(run.ok()) << run.status();
    for (int rank = 0; rank < 2; ++rank) {
      const double measured = static_cast<double>(run->measured_peak_bytes.at(rank));
      const double predicted = static_cast<double>(run->predicted_peak_bytes.at(rank));
      std::cerr << ScheduleKind_Name(kind) << " rank " << rank << " measured " << measured << " predicted " << predicted << "\n";
      ExpectPlanBoundsPeak(measured, predicted, absl::StrCat(ScheduleKind_Name(kind), " rank ", rank));
    }
  }
}

// A weight read on the first and last stage. Under gradient merge stage
// 0's backward receives both the activation gradient and stage 2's part of
// the weight's gradient, and an action posts all its receives when it
// starts, so both buffers are live at once (the plan counted each recv only
// where its op sits and predicted rank 0 below its measured peak, 1288
// against 1416 bytes); without it the parts cross in the optimizer action,
// which reads the backward's own part (one micro-batch) or its buffer.
TEST(PipelineMemoryTest, ThePlanBoundsEveryRankWithATiedWeightAcrossStages) {
  auto program = ParseProgramText(kThreeStagesWithTiedWeight, "tied.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.steps = 20;
  options.data = "synthetic:classes=3,size=256";
  for (int merge_steps : {1, 2}) {
  for (ScheduleKind kind : {ONE_F_ONE_B, F_THEN_B}) {
    for (int micro_batches : {1, 2, 4}) {
      Strategy strategy;
      strategy.mutable_pipeline()->set_micro_batch_size(16);
      strategy.mutable_pipeline()->set_accumulate_steps(micro_batches);
      strategy.mutable_pipeline()->set_schedule(kind);
      if (merge_steps > 1) strategy.mutable_gradient_merge()->set_k_steps(merge_steps);
      auto run = TrainParallel(*program, strategy, options);
      ASSERT_TRUE(run.ok()) << run.status();
      for (int rank = 0; rank < 3; ++rank) {
        const double measured = static_cast<double>(run->measured_peak_bytes.at(rank));
        const double predicted = static_cast<double>(run->predicted_peak_bytes.at(rank));
        ExpectPlanBoundsPeak(measured, predicted,
                             absl::StrCat(ScheduleKind_Name(kind), " x", micro_batches, " merge ", merge_steps,
                                          " rank ", rank));
      }
    }
  }
  }
}

// Two over-predictions a memory-rule audit found past the 10% slack, both
// on one device:
// - a 16-bit matmul head (BF16 or F16, the CPU's widened kernel): the plan
//   counted the float32 copies of the inputs beside the 16-bit outputs,
//   which the kernel allocates only after freeing them (1.14x);
// - a bias gradient at one sample: sum_to_like sums over nothing there and
//   shares its input's buffer, which the plan counted as a new one (1.25x).
// Both are exact now.
TEST(PipelineMemoryTest, TheWidenedKernelsAndAOneSampleBiasGradientArePredictedExactly) {
  constexpr char kHead[] = R"pb(
    var { name: "x" dtype: F32 shape: [-1, 64] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F32 shape: [64, 4096] kind: PARAM init { xavier_uniform {} } }
    var { name: "b" dtype: F32 shape: [4096] kind: PARAM init { constant { value: 0 } } }
    op { type: "matmul" input: ["x", "w"] output: ["xw"] }
    op { type: "add" input: ["xw", "b"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.01 } }
  )pb";
  auto program = ParseProgramText(kHead, "head.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  struct Case {
    std::string name;
    DataType dtype;  // DT_INVALID: float32
    int64_t batch;
  };
  for (const Case& c : {Case{"BF16, batch 64", BF16, 64}, Case{"F16, batch 64", F16, 64},
                        Case{"float32, batch 1", DT_INVALID, 1}, Case{"BF16, batch 1", BF16, 1}}) {
    SCOPED_TRACE(c.name);
    Strategy strategy;
    if (c.dtype != DT_INVALID) strategy.mutable_mixed_precision()->set_dtype(c.dtype);
    ParityOptions options;
    options.steps = 2;
    options.data = "synthetic:classes=4096,size=256";
    options.batch_size = c.batch;
    auto run = TrainParallel(*program, strategy, options);
    ASSERT_TRUE(run.ok()) << run.status();
    ExpectPlanBoundsPeak(run->measured_peak_bytes.at(0), run->predicted_peak_bytes.at(0), c.name);
    EXPECT_EQ(run->measured_peak_bytes.at(0), run->predicted_peak_bytes.at(0));
  }
}

}  // namespace
}  // namespace strata
