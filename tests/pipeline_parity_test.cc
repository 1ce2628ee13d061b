// Pipelines of 2, 3 and 4 stages, under both schedules and several
// micro-batch counts, train exactly what one device trains: per-step losses
// and final weights within 1e-5 relative over 20 steps, against a real
// single-device run of the same program and the same global batches.

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "tests/hard_pipelines.h"
#include "tests/parity_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

constexpr double kTolerance = 1e-5;

Program Generate(const std::string& model, int stages, const GenOptions& base) {
  GenOptions gen = base;
  gen.stages = stages;
  auto text = GenerateProgram(model, gen);
  EXPECT_TRUE(text.ok()) << text.status();
  auto program = ParseProgramText(*text, model + ".pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  return *program;
}

Strategy Pipeline(int micro_batch_size, int micro_batches, ScheduleKind kind) {
  Strategy s;
  s.mutable_pipeline()->set_micro_batch_size(micro_batch_size);
  s.mutable_pipeline()->set_accumulate_steps(micro_batches);
  s.mutable_pipeline()->set_schedule(kind);
  return s;
}

struct Case {
  std::string model;
  int stages;
  int micro_batches;
  ScheduleKind schedule;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(c.model, "_", c.stages, "stages_", c.micro_batches, "mb_",
                      c.schedule == ONE_F_ONE_B ? "1F1B" : "FthenB");
}

class PipelineParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineParityTest, MatchesSingleDevice) {
  const Case& c = GetParam();
  GenOptions gen;
  ParityOptions options;
  int micro_batch_size = 4;
  if (c.model == "resmlp") {
    gen.layers = {24, 32, 10};
    gen.blocks = 6;
    gen.dropout = 0.1;
    gen.dtype = "F64";
    gen.optimizer = "momentum";  // unlike Adam, sensitive to the gradient's scale
    gen.learning_rate = 0.05;
    options.data = "synthetic:classes=10,size=1024";
  } else {
    gen.dtype = "F64";
    gen.optimizer = "momentum";
    gen.learning_rate = 0.01;
    options.data = "fashion_mnist";
    options.steps = 6;  // convolutions in float64 are slow; 6 steps still move every weight
    micro_batch_size = 2;
  }
  Program program = Generate(c.model, c.stages, gen);
  const int64_t batch = int64_t{micro_batch_size} * c.micro_batches;
  auto single = TrainSingleDevice(program, batch, options);
  ASSERT_TRUE(single.ok()) << single.status();
  auto parallel = TrainParallel(program, Pipeline(micro_batch_size, c.micro_batches, c.schedule), options);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  ASSERT_EQ(parallel->losses.size(), static_cast<size_t>(options.steps));
  EXPECT_LE(MaxLossDifference(*parallel, *single), kTolerance);
  std::string worst;
  EXPECT_LE(MaxWeightDifference(*parallel, *single, &worst), kTolerance) << "worst parameter: " << worst;
  // Training really moved the weights, so equal weights mean equal training.
  EXPECT_GT(MaxWeightDifference(single->weights, single->initial_weights), 100 * kTolerance);
  // The loss's stage reports one device's learning rates (a cosine: each step's its own).
  EXPECT_EQ(parallel->lrs, single->lrs);
  ASSERT_EQ(single->lrs.size(), static_cast<size_t>(options.steps));
  EXPECT_GT(single->lrs.front(), single->lrs.back());
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (int stages : {2, 3, 4}) {
    for (int mbs : {1, stages, 2 * stages + 1}) {
      for (ScheduleKind kind : {ONE_F_ONE_B, F_THEN_B}) cases.push_back({"resmlp", stages, mbs, kind});
    }
  }
  cases.push_back({"convnet", 2, 3, ONE_F_ONE_B});
  cases.push_back({"convnet", 3, 3, F_THEN_B});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineParityTest, ::testing::ValuesIn(Cases()), CaseName);

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Stage shapes that are hard to get right: h0 skips stage 1 and is read on
// stages 1 and 2; the weight `tied` is used on the first and the last stage
// (like tied input and output embeddings). Adam with clipping exercises the
// tied gradient's single count in the global norm.
constexpr char kHardShapes[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 8] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "tied" dtype: F64 shape: [8, 8] kind: PARAM init { xavier_uniform {} } }
  var { name: "w1" dtype: F64 shape: [8, 8] kind: PARAM init { xavier_uniform {} } }
  var { name: "w2" dtype: F64 shape: [8, 8] kind: PARAM init { xavier_uniform {} } }
  var { name: "head" dtype: F64 shape: [8, 10] kind: PARAM init { xavier_uniform {} } }
  op { type: "matmul" input: ["x", "tied"] output: ["h0"] device: "gpu:0" }
  op { type: "tanh" input: ["h0"] output: ["a0"] device: "gpu:0" }
  op { type: "matmul" input: ["a0", "w1"] output: ["h1"] device: "gpu:1" }
  op { type: "gelu" input: ["h1"] output: ["a1"] device: "gpu:1" }
  op { type: "add" input: ["a1", "a0"] output: ["r1"] device: "gpu:2" }
  op { type: "matmul" input: ["r1", "w2"] output: ["h2"] device: "gpu:2" }
  op { type: "add" input: ["h2", "h0"] output: ["r2"] device: "gpu:3" }
  op { type: "matmul" input: ["r2", "tied"] output: ["t"] attr { key: "transpose_b" value { b: true } } device: "gpu:3" }
  op { type: "matmul" input: ["t", "head"] output: ["logits"] device: "gpu:3" }
  op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] device: "gpu:3" }
  loss: "loss"
  optimizer { momentum { learning_rate: 0.05 momentum: 0.9 } clip_global_norm: 0.5 }
)pb";

TEST(PipelineHardShapesTest, SkipsFanOutAndTiedWeightsMatchSingleDevice) {
  auto program = ParseProgramText(kHardShapes, "hard.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.data = "synthetic:classes=10,size=512";
  options.eval_data = "synthetic:classes=10,size=300,test";  // a pipelined evaluation, batch not a multiple of anything
  for (ScheduleKind kind : {ONE_F_ONE_B, F_THEN_B}) {
    SCOPED_TRACE(ScheduleKind_Name(kind));
    auto single = TrainSingleDevice(*program, 5 * 4, options);
    ASSERT_TRUE(single.ok()) << single.status();
    auto parallel = TrainParallel(*program, Pipeline(4, 5, kind), options);
    ASSERT_TRUE(parallel.ok()) << parallel.status();
    EXPECT_LE(MaxLossDifference(*parallel, *single), kTolerance);
    std::string worst;
    EXPECT_LE(MaxWeightDifference(*parallel, *single, &worst), kTolerance) << "worst parameter: " << worst;
    EXPECT_GT(MaxWeightDifference(single->weights, single->initial_weights), 100 * kTolerance);
    EXPECT_GT(single->eval_loss, 0);
    EXPECT_NEAR(parallel->eval_loss, single->eval_loss, kTolerance * single->eval_loss);
  }
}

// A 3-stage ONE_F_ONE_B pipeline of 3 micro-batches of 4 against one device
// with the same batch of 12, 10 steps; returns the single-device run.
// The layout of ExpectThreeStagesMatchOneDevice compiles for a GPU, whose
// schedule check holds every pair of ranks' messages to one order (NCCL
// matches them by issue order).
void ExpectGpuPlansCompile(const Program& program) {
  CompileOptions gpu;
  gpu.device_kind = DEVICE_CUDA;
  auto compiled = Compile(program, Pipeline(4, 3, ONE_F_ONE_B), gpu);
  EXPECT_TRUE(compiled.ok()) << compiled.status();
}

ParityRun ExpectThreeStagesMatchOneDevice(const Program& program) {
  ParityOptions options;
  options.data = "synthetic:classes=10,size=512";
  options.steps = 10;
  auto single = TrainSingleDevice(program, 4 * 3, options);
  EXPECT_TRUE(single.ok()) << single.status();
  auto parallel = TrainParallel(program, Pipeline(4, 3, ONE_F_ONE_B), options);
  EXPECT_TRUE(parallel.ok()) << parallel.status();
  if (!single.ok() || !parallel.ok()) return ParityRun();
  EXPECT_LE(MaxLossDifference(*parallel, *single), kTolerance);
  std::string worst;
  EXPECT_LE(MaxWeightDifference(*parallel, *single, &worst), kTolerance) << "worst parameter: " << worst;
  EXPECT_GT(MaxWeightDifference(single->weights, single->initial_weights), 1e-3);
  // With clipping, the loss's stage reports the gradient norm one device
  // reports, summed over the stages (the last one training nothing).
  if (program.optimizer().clip_global_norm() > 0) {
    EXPECT_EQ(parallel->grad_norms.size(), single->grad_norms.size());
    for (size_t i = 0; i < single->grad_norms.size() && i < parallel->grad_norms.size(); ++i) {
      EXPECT_GT(single->grad_norms[i], 0) << "step " << i + 1;
      EXPECT_NEAR(parallel->grad_norms[i], single->grad_norms[i], kTolerance * single->grad_norms[i]) << i + 1;
    }
  }
  return *single;
}

// Clipping by the global norm when the last stage trains nothing (it only
// computes the loss) and the parameters mix F32 and F64: every stage joins
// the norm's allreduce (the last with zero), in F64. Both used to fail: the
// loss stage never joined and the others waited until the comm timeout, and
// the mixed dtypes did not compile.
constexpr char kNoParamsLastStage[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 8] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w32" dtype: F32 shape: [8, 8] kind: PARAM init { xavier_uniform {} } }
  var { name: "w64" dtype: F64 shape: [8, 10] kind: PARAM init { xavier_uniform {} } }
  op { type: "matmul" input: ["x", "w32"] output: ["h"] device: "gpu:0" }
  op { type: "tanh" input: ["h"] output: ["a"] device: "gpu:0" }
  op { type: "cast" input: ["a"] output: ["a64"] attr { key: "dtype" value { s: "F64" } } device: "gpu:1" }
  op { type: "matmul" input: ["a64", "w64"] output: ["logits"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] device: "gpu:2" }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.5 } clip_global_norm: 0.05 }
)pb";

TEST(PipelineHardShapesTest, ClippingWithAStageWithoutParametersAndMixedDtypes) {
  auto program = ParseProgramText(kNoParamsLastStage, "no_params.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  const ParityRun single = ExpectThreeStagesMatchOneDevice(*program);
  // The clipping is in effect: without it the weights end elsewhere.
  Program unclipped = *program;
  unclipped.mutable_optimizer()->clear_clip_global_norm();
  ParityOptions options;
  options.data = "synthetic:classes=10,size=512";
  options.steps = 10;
  auto free_run = TrainSingleDevice(unclipped, 4 * 3, options);
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  EXPECT_GT(MaxWeightDifference(free_run->weights, single.weights), 100 * kTolerance);
}


// The learning rate the loss's stage reports when it trains nothing (no
// update count of its own) follows the checkpoint's updates after a resume
// with another gradient merge: 4 steps of one update each, then a merge of
// k = 2, whose updates are the 5th and 6th (it reported the 3rd and 4th's),
// and whose optimizer_step says so.
TEST(PipelineHardShapesTest, ALossStageWithoutParametersReportsTheResumedRate) {
  auto program = ParseProgramText(kNoParamsLastStage, "no_params.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  program->mutable_optimizer()->mutable_lr_schedule()->mutable_step_decay()->set_step_size(1);
  program->mutable_optimizer()->mutable_lr_schedule()->mutable_step_decay()->set_gamma(0.5);
  ParityOptions options;
  options.data = "synthetic:classes=10,size=512";
  options.steps = 4;
  options.save_dir = absl::StrCat(::testing::TempDir(), "/no_params_lr");
  auto first = TrainParallel(*program, Pipeline(4, 3, ONE_F_ONE_B), options);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->lrs, (std::vector<double>{0.5, 0.25, 0.125, 0.0625}));
  Strategy merged = Pipeline(4, 3, ONE_F_ONE_B);
  merged.mutable_gradient_merge()->set_k_steps(2);
  options.load_dir = options.save_dir;
  options.save_dir.clear();
  options.steps = 8;
  auto resumed = TrainParallel(*program, merged, options);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->lrs, (std::vector<double>{-1, 0.5 / 16, -1, 0.5 / 32}));
  // The gradient norm on the update steps only.
  ASSERT_EQ(resumed->grad_norms.size(), 4u);
  EXPECT_EQ(resumed->grad_norms[0], -1);
  EXPECT_GT(resumed->grad_norms[1], 0);
  EXPECT_EQ(resumed->grad_norms[2], -1);
  EXPECT_GT(resumed->grad_norms[3], 0);
  // And numbers them so: the 5th and 6th (it said the 3rd and 4th, the
  // step's count under this run's k).
  EXPECT_EQ(resumed->optimizer_steps, (std::vector<int64_t>{0, 5, 0, 6}));
}

// grad_norm (--metrics, like Megatron-LM's grad norm) is the norm of the
// update's gradients before clipping, as torch's clip_grad_norm_ returns
// it: one F64 device, SGD with a max_norm the gradients never reach, so
// the first update moved the weights by lr times the gradient, and the
// reported norm is |w0 - w1| / lr within float64's rounding. Without
// clipping there is none.
TEST(PipelineHardShapesTest, ReportsTheGradientNormItClipsBy) {
  const std::string f64 = R"pb(
    var { name: "x" dtype: F64 shape: [-1, 8] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F64 shape: [8, 10] kind: PARAM init { xavier_uniform {} } }
    var { name: "b" dtype: F64 shape: [10] kind: PARAM init { uniform { low: -0.1 high: 0.1 } } }
    op { type: "matmul" input: ["x", "w"] output: ["xw"] }
    op { type: "add" input: ["xw", "b"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
    loss: "loss"
  )pb";
  ParityOptions options;
  options.data = "synthetic:classes=10,size=512";
  options.steps = 1;
  auto clipped = ParseProgramText(f64 + "optimizer { sgd { learning_rate: 0.5 } clip_global_norm: 1e6 }", "n.pbtxt");
  ASSERT_TRUE(clipped.ok()) << clipped.status();
  auto run = TrainSingleDevice(*clipped, 12, options);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->grad_norms.size(), 1u);
  double moved = 0;
  for (const auto& [name, after] : run->weights) {
    const std::vector<double>& before = run->initial_weights.at(name);
    for (size_t i = 0; i < after.size(); ++i) moved += (before[i] - after[i]) * (before[i] - after[i]);
  }
  const double norm = std::sqrt(moved) / 0.5;
  EXPECT_GT(norm, 0.01);
  EXPECT_NEAR(run->grad_norms[0], norm, 1e-12 * norm);
  auto plain = ParseProgramText(f64 + "optimizer { sgd { learning_rate: 0.5 } }", "n.pbtxt");
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto unclipped = TrainSingleDevice(*plain, 12, options);
  ASSERT_TRUE(unclipped.ok()) << unclipped.status();
  EXPECT_EQ(unclipped->grad_norms, std::vector<double>{-1});
  // Every parameter frozen: none on one device, and none on a pipeline
  // whose stages still sum their (zero) norms.
  auto frozen = ParseProgramText(R"pb(
    var { name: "x" dtype: F64 shape: [-1, 8] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F64 shape: [8, 10] kind: PARAM init { xavier_uniform {} } frozen: true }
    op { type: "matmul" input: ["x", "w"] output: ["h"] device: "gpu:0" }
    op { type: "tanh" input: ["h"] output: ["logits"] device: "gpu:1" }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.5 } clip_global_norm: 1 }
  )pb",
                                 "frozen.pbtxt");
  ASSERT_TRUE(frozen.ok()) << frozen.status();
  auto pipelined = TrainParallel(*frozen, Pipeline(2, 2, ONE_F_ONE_B), options);
  ASSERT_TRUE(pipelined.ok()) << pipelined.status();
  EXPECT_EQ(pipelined->grad_norms, std::vector<double>{-1});
}

TEST(PipelineHardShapesTest, GradientsPassedThroughAnAddOnAnotherStage) {
  auto program = ParseProgramText(kPassThroughAcrossStages, "pass_through.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  ExpectThreeStagesMatchOneDevice(*program);
  // Stage 1's backward sends stage 0 three gradients, made in one order and
  // read there in another: a GPU plan's receives are posted in channel
  // order, the order they are sent in (NCCL matches a pair's messages by
  // issue order; the schedule check refused this plan before).
  ExpectGpuPlansCompile(*program);
}


TEST(PipelineHardShapesTest, ThreeTiedWeightsExchangeTheirGradientsInOneOrder) {
  auto program = ParseProgramText(kThreeTiedWeights, "three_tied.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  ExpectThreeStagesMatchOneDevice(*program);
  // A GPU plan's schedule check holds every pair's messages to one order
  // (analysis/verify_schedule.cc): the plans compile for a GPU too.
  ExpectGpuPlansCompile(*program);
}

// A tied weight whose gradient has one path crosses once an update, from a
// copy of the micro-batches' sum, whichever way it goes: back the way the
// activations' gradients go (made on stage 1) or the way the activations go
// (made on stage 0); under gradient merge too, against one device merging
// the same steps. The replicas stay identical (TrainParallel fails where
// they part).
TEST(PipelineHardShapesTest, ATiedWeightWithOneGradientPath) {
  for (const char* text : {kOnePathTiedWeight, kOnePathTiedWeightOnTheFirstStage, kTwoTiedWeightsSharingOneGradient}) {
    SCOPED_TRACE(text == kOnePathTiedWeight                  ? "made on stage 1"
                 : text == kOnePathTiedWeightOnTheFirstStage ? "made on stage 0"
                                                              : "two weights sharing one gradient");
    auto program = ParseProgramText(text, "one_path_tied.pbtxt");
    ASSERT_TRUE(program.ok()) << program.status();
    ExpectThreeStagesMatchOneDevice(*program);  // two stages here; the same layout
    ExpectGpuPlansCompile(*program);

    ParityOptions options;
    options.data = "synthetic:classes=10,size=512";
    options.steps = 10;
    Strategy one;
    one.mutable_gradient_merge()->set_k_steps(2);
    ParityOptions one_options = options;
    one_options.batch_size = 4 * 3;
    auto single = TrainParallel(*program, one, one_options);
    ASSERT_TRUE(single.ok()) << single.status();
    Strategy merged = Pipeline(4, 3, ONE_F_ONE_B);
    merged.mutable_gradient_merge()->set_k_steps(2);
    auto parallel = TrainParallel(*program, merged, options);
    ASSERT_TRUE(parallel.ok()) << parallel.status();
    constexpr double kFloat64Reassociation = 1e-10;
    EXPECT_LE(MaxLossDifference(*parallel, *single), kFloat64Reassociation);
    std::string worst;
    EXPECT_LE(MaxWeightDifference(*parallel, *single, &worst), kFloat64Reassociation) << "worst parameter: " << worst;
  }
}

TEST(PipelineHardShapesTest, CrossedTiedWeightsExchangeWithoutWaitingOnEachOther) {
  auto program = ParseProgramText(kCrossedTiedWeights, "crossed_tied.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  ExpectThreeStagesMatchOneDevice(*program);  // two stages here; the same layout
  ExpectGpuPlansCompile(*program);
}

}  // namespace
}  // namespace strata
