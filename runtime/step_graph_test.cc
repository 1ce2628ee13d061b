// When the executor may capture a training step as a CUDA graph: the
// decision made before the first step (StepGraphBlocker), and the property a
// replay depends on that only a run shows, checked here on the CPU's kernels
// for every optimizer and strategy a GPU plan may carry: every op that
// writes a persistent var (parameters, optimizer state, step counters, the
// loss scale, gradient-merge buffers) writes it in place, so a replayed
// graph, which writes the buffers it captured, leaves the next step reading
// what it wrote.

#include "runtime/step_graph.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/dataset.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

std::vector<RankPlan> CompilePlans(const std::string& model, const GenOptions& gen, const Strategy& strategy,
                                   int64_t batch) {
  auto text = GenerateProgram(model, gen);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return {};
  auto program = ParseProgramText(*text, model + ".pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  if (!program.ok()) return {};
  CompileOptions options;
  options.batch_size = batch;
  options.device_kind = DEVICE_CUDA;  // the plan a GPU runs: host transfers, fused epilogues and optimizer
  auto result = Compile(*program, strategy, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->plans : std::vector<RankPlan>{};
}

GenOptions SmallMlp(const std::string& optimizer) {
  GenOptions gen;
  gen.layers = {16, 32, 10};
  gen.optimizer = optimizer;
  return gen;
}

GenOptions SmallGpt() {
  GenOptions gen;
  gen.blocks = 1;
  gen.d_model = 16;
  gen.heads = 2;
  gen.seq = 8;
  gen.vocab = 32;
  return gen;
}

StepGraphConditions Wanted() {
  StepGraphConditions c;
  c.requested = true;
  return c;
}

TEST(StepGraphBlockerTest, ASingleDeviceStepMayBeCaptured) {
  const std::vector<RankPlan> plans = CompilePlans("mlp", SmallMlp("adam"), Strategy(), 8);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(StepGraphBlocker(plans[0], Wanted()), "");
}

TEST(StepGraphBlockerTest, SaysWhyNot) {
  const std::vector<RankPlan> plans = CompilePlans("mlp", SmallMlp("adam"), Strategy(), 8);
  ASSERT_EQ(plans.size(), 1u);
  StepGraphConditions off = Wanted();
  off.requested = false;
  EXPECT_EQ(StepGraphBlocker(plans[0], off), "--cuda_graph=false");
  StepGraphConditions host = Wanted();
  host.device_unsupported = GetCpuDevice()->GraphUnsupported();
  EXPECT_EQ(StepGraphBlocker(plans[0], host), "cpu:0 has no graphs");
  StepGraphConditions traced = Wanted();
  traced.tracing = true;
  EXPECT_TRUE(absl::StrContains(StepGraphBlocker(plans[0], traced), "--trace")) << StepGraphBlocker(plans[0], traced);
}

TEST(StepGraphBlockerTest, AStepThatCommunicatesOverGlooIsNotCaptured) {
  GenOptions gen = SmallMlp("adam");
  gen.stages = 2;
  Strategy pipeline;
  pipeline.mutable_pipeline()->set_micro_batch_size(4);
  pipeline.mutable_pipeline()->set_accumulate_steps(2);
  for (const RankPlan& plan : CompilePlans("mlp", gen, pipeline, 8)) {
    const std::string why = StepGraphBlocker(plan, Wanted());
    EXPECT_TRUE(absl::StrContains(why, "communicates")) << why;
    EXPECT_TRUE(absl::StrContains(why, "Gloo")) << why;
    EXPECT_TRUE(absl::StrContains(why, plan.rank() == 0 ? "send" : "recv")) << why;
  }
  Strategy data_parallel;
  data_parallel.mutable_data_parallel()->set_degree(2);
  for (const RankPlan& plan : CompilePlans("mlp", SmallMlp("adam"), data_parallel, 8)) {
    const std::string why = StepGraphBlocker(plan, Wanted());
    EXPECT_TRUE(absl::StrContains(why, "allreduce")) << why;
  }
}

// Trains `plan` (a GPU plan, on the CPU's kernels) for `steps` steps and
// returns the executor's moved_state() after each ("" when every persistent
// write was in place).
std::vector<std::string> MovedStatePerStep(RankPlan plan, int steps) {
  plan.set_device_kind(DEVICE_CPU);
  auto e = Executor::Create(plan, {});
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return {};
  EXPECT_TRUE((*e)->InitializeState().ok());
  std::vector<FeedSpec> specs;
  for (const Var* v : (*e)->feeds()) specs.push_back({v->name(), v->dtype(), {v->shape().begin(), v->shape().end()}});
  auto data = OpenDataset("synthetic:vocab=32", specs, 5);
  EXPECT_TRUE(data.ok()) << data.status();
  if (!data.ok()) return {};
  std::vector<std::string> moved;
  for (int step = 0; step < steps; ++step) {
    auto r = (*e)->TrainStep(
        [&](int64_t first, int64_t rows) -> absl::StatusOr<std::map<std::string, Tensor>> {
          std::vector<int64_t> idx(rows);
          for (int64_t i = 0; i < rows; ++i) idx[i] = first + i;
          std::vector<Tensor> tensors;
          if (absl::Status s = (*data)->GetBatch(idx, &tensors); !s.ok()) return s;
          std::map<std::string, Tensor> feeds;
          for (size_t i = 0; i < specs.size(); ++i) feeds[specs[i].name] = tensors[i];
          return feeds;
        },
        0);
    EXPECT_TRUE(r.ok()) << r.status();
    moved.push_back((*e)->moved_state());
  }
  return moved;
}

void ExpectEveryPersistentWriteInPlace(const std::vector<RankPlan>& plans, int steps) {
  ASSERT_FALSE(plans.empty());
  for (const RankPlan& plan : plans) {
    SCOPED_TRACE(absl::StrCat("rank ", plan.rank()));
    const std::vector<std::string> moved = MovedStatePerStep(plan, steps);
    ASSERT_EQ(moved.size(), static_cast<size_t>(steps));
    for (int step = 0; step < steps; ++step) EXPECT_EQ(moved[step], "") << "step " << step + 1;
  }
}

TEST(PersistentWritesTest, EveryOptimizerUpdatesInPlace) {
  for (const char* optimizer : {"sgd", "momentum", "adam", "adamw"}) {
    SCOPED_TRACE(optimizer);
    ExpectEveryPersistentWriteInPlace(CompilePlans("mlp", SmallMlp(optimizer), Strategy(), 8), 3);
  }
}

TEST(PersistentWritesTest, GradientMergeAndMicroBatchesAccumulateInPlace) {
  Strategy strategy;
  strategy.mutable_gradient_merge()->set_k_steps(2);
  strategy.mutable_gradient_merge()->set_average(true);
  strategy.mutable_pipeline()->set_micro_batch_size(4);
  strategy.mutable_pipeline()->set_accumulate_steps(2);
  GenOptions gen = SmallMlp("adam");
  gen.dropout = 0.25;
  ExpectEveryPersistentWriteInPlace(CompilePlans("mlp", gen, strategy, 8), 4);
}

TEST(PersistentWritesTest, MixedPrecisionAndLossScalingUpdateInPlace) {
  for (DataType dtype : {BF16, F16}) {
    SCOPED_TRACE(DataTypeName(dtype));
    Strategy strategy;
    strategy.mutable_mixed_precision()->set_dtype(dtype);  // F16: dynamic loss scaling
    ExpectEveryPersistentWriteInPlace(CompilePlans("gpt", SmallGpt(), strategy, 2), 3);
  }
}

// The check itself: an op appended to the optimizer's section that writes a
// parameter into a buffer of its own (relu allocates its output) is named.
TEST(PersistentWritesTest, AnOutOfPlaceWriteIsNamed) {
  std::vector<RankPlan> plans = CompilePlans("mlp", SmallMlp("sgd"), Strategy(), 8);
  ASSERT_EQ(plans.size(), 1u);
  RankPlan& plan = plans[0];
  std::string param;
  for (const Var& v : plan.program().var()) {
    if (v.kind() == PARAM) {
      param = v.name();
      break;
    }
  }
  ASSERT_FALSE(param.empty());
  Op* relu = plan.mutable_program()->add_op();
  relu->set_type("relu");
  relu->set_name("clamp_weights");
  relu->add_input(param);
  relu->add_output(param);
  relu->set_role(OPTIMIZE);
  const std::vector<std::string> moved = MovedStatePerStep(plan, 2);
  ASSERT_EQ(moved.size(), 2u);
  for (const std::string& m : moved) {
    EXPECT_TRUE(absl::StrContains(m, "clamp_weights")) << m;
    EXPECT_TRUE(absl::StrContains(m, absl::StrCat("'", param, "'"))) << m;
    EXPECT_TRUE(absl::StrContains(m, "not in place")) << m;
  }
}

// A device that says it has graphs but refuses every capture: the
// executor's fallback, which no host device reaches (it has no graphs) and
// a GPU reaches only when something goes wrong, on the CPU's kernels.
class RefusingAccelerator : public testing::FakeAccelerator {
 public:
  std::string GraphUnsupported() const override { return ""; }
  absl::Status BeginCapture(const DeviceGraph*) override {
    ++captures;
    return absl::InternalError("the test device refuses to capture");
  }
  int captures = 0;
};

TEST(StepGraphFallbackTest, ARefusedCaptureLeavesTheRunEagerAndSaysWhy) {
  GenOptions gen = SmallMlp("adam");
  gen.dropout = 0.25;
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(4);
  strategy.mutable_pipeline()->set_accumulate_steps(2);
  std::vector<RankPlan> plans = CompilePlans("mlp", gen, strategy, 8);
  ASSERT_EQ(plans.size(), 1u);
  plans[0].set_device_kind(DEVICE_CPU);  // the CPU's kernels on the fake device
  auto train = [&](Device* device, bool cuda_graph) {
    TrainOptions options;
    options.data = "synthetic:classes=10,size=256";
    options.steps = 5;
    options.seed = 3;
    options.progress = false;
    options.device = device;
    options.cuda_graph = cuda_graph;
    return Train(plans[0], options);
  };
  testing::FakeAccelerator plain;
  auto eager = train(&plain, false);
  ASSERT_TRUE(eager.ok()) << eager.status();
  RefusingAccelerator refusing;
  auto fallen = train(&refusing, true);
  ASSERT_TRUE(fallen.ok()) << fallen.status();
  EXPECT_EQ(refusing.captures, 1) << "a refused capture is not tried again";
  EXPECT_EQ(fallen->cuda_graphs, 0);
  EXPECT_TRUE(absl::StrContains(fallen->cuda_graph_note, "not used from step 2")) << fallen->cuda_graph_note;
  EXPECT_TRUE(absl::StrContains(fallen->cuda_graph_note, "the test device refuses to capture"))
      << fallen->cuda_graph_note;
  ASSERT_EQ(fallen->steps.size(), eager->steps.size());
  for (size_t i = 0; i < eager->steps.size(); ++i) {
    EXPECT_EQ(fallen->steps[i].loss, eager->steps[i].loss) << "step " << i + 1;
  }
  EXPECT_EQ(fallen->final_state, eager->final_state);
}

}  // namespace
}  // namespace strata
