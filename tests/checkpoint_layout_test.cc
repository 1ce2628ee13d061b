// A checkpoint loads under any other parallel layout and continues the
// uninterrupted loss series: 6 steps under one layout, save, 6 more under
// another, equal 12 steps on one device (float64, the same global batch of
// 16 split differently, over pipelines and data-parallel replicas).
// Micro-batch gradient accumulators are scratch: a checkpoint neither holds
// nor needs them. Under gradient merge (k steps of 16 / k samples per
// update) a checkpoint taken mid-way through an update holds the merge
// buffers summed over the data-parallel group and resumes under another
// layout with the same k.

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "tests/parity_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

constexpr double kTolerance = 1e-5;
constexpr int64_t kGlobalBatch = 16;

// One layout: stages 1 is no pipeline; otherwise a pipeline of
// `micro_batches` micro-batches; `dp` replicas; gradient merge over `merge`
// steps of kGlobalBatch / merge samples each.
struct Layout {
  int stages = 1;
  int micro_batches = 1;
  ScheduleKind schedule = ONE_F_ONE_B;
  int dp = 1;
  int merge = 1;
};

struct Direction {
  std::string name;
  Layout from;
  Layout to;
};

Program Generate(int stages) {
  GenOptions gen;
  gen.layers = {24, 32, 10};
  gen.blocks = 4;
  gen.dtype = "F64";
  gen.optimizer = "adam";
  gen.dropout = 0.1;
  gen.stages = stages;
  auto text = GenerateProgram("resmlp", gen);
  EXPECT_TRUE(text.ok()) << text.status();
  auto program = ParseProgramText(*text, "resmlp.pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  // An explicit decay length: a run-length cosine would decay over whatever
  // --steps each invocation is given.
  program->mutable_optimizer()->mutable_lr_schedule()->mutable_cosine()->set_decay_steps(12);
  return *program;
}

absl::StatusOr<ParityRun> TrainUnder(const Layout& layout, ParityOptions options) {
  const Program program = Generate(layout.stages);
  const int64_t step_batch = kGlobalBatch / layout.merge;
  if (layout.stages == 1 && layout.dp == 1 && layout.merge == 1) return TrainSingleDevice(program, step_batch, options);
  Strategy s;
  if (layout.stages > 1) {
    s.mutable_pipeline()->set_micro_batch_size(step_batch / layout.micro_batches / layout.dp);
    s.mutable_pipeline()->set_accumulate_steps(layout.micro_batches);
    s.mutable_pipeline()->set_schedule(layout.schedule);
  } else {
    options.batch_size = step_batch;
  }
  if (layout.dp > 1) s.mutable_data_parallel()->set_degree(layout.dp);
  if (layout.merge > 1) {
    s.mutable_gradient_merge()->set_k_steps(layout.merge);
    s.mutable_gradient_merge()->set_average(true);
  }
  return TrainParallel(program, s, options);
}

class CheckpointLayoutTest : public ::testing::TestWithParam<Direction> {};

TEST_P(CheckpointLayoutTest, ResumedSeriesContinuesTheUninterruptedOne) {
  const Direction& d = GetParam();
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp", "/ckpt_", d.name);
  std::filesystem::remove_all(dir);
  ParityOptions base;
  base.data = "synthetic:classes=10,size=512";

  ParityOptions full = base;
  full.steps = 12;
  auto reference = TrainSingleDevice(Generate(1), kGlobalBatch, full);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->losses.size(), 12u);

  ParityOptions first = base;
  first.steps = 6;
  first.save_dir = dir;
  auto before = TrainUnder(d.from, first);
  ASSERT_TRUE(before.ok()) << before.status();
  ParityOptions second = base;
  second.steps = 12;  // the whole run's steps
  second.load_dir = dir;
  auto resumed = TrainUnder(d.to, second);
  ASSERT_TRUE(resumed.ok()) << resumed.status();

  ASSERT_EQ(before->losses.size(), 6u);
  ASSERT_EQ(resumed->losses.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(before->losses[i], reference->losses[i], kTolerance * reference->losses[i]) << "step " << 1 + i;
    EXPECT_NEAR(resumed->losses[i], reference->losses[6 + i], kTolerance * reference->losses[6 + i])
        << "step " << 7 + i;
  }
  std::string worst;
  EXPECT_LE(MaxWeightDifference(*resumed, *reference, &worst), kTolerance) << worst;
  // The weights moved after the resume: the comparison is not of initial weights.
  EXPECT_GT(MaxWeightDifference(*resumed, *before), 1e-6);
}

// Under gradient merge: 12 updates of k steps. The first run saves every 5
// steps (mid-way through its third update when k = 2) and the second resumes
// from that step; both against the uninterrupted single device with the
// same merge.
TEST_P(CheckpointLayoutTest, ResumesMidWayThroughAGradientMergeUpdate) {
  Direction d = GetParam();
  d.from.merge = d.to.merge = 2;
  const int64_t k = 2, saved_at = 5;
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp", "/ckpt_merge_", d.name);
  std::filesystem::remove_all(dir);
  ParityOptions base;
  base.data = "synthetic:classes=10,size=512";
  ParityOptions full = base;
  full.steps = 12 * k;
  Layout one;
  one.merge = k;
  auto reference = TrainUnder(one, full);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->losses.size(), 24u);

  ParityOptions first = base;
  first.steps = 6 * k;
  first.save_dir = dir;
  first.save_every = saved_at;
  first.keep_checkpoints = 0;
  auto before = TrainUnder(d.from, first);
  ASSERT_TRUE(before.ok()) << before.status();
  ParityOptions second = base;
  second.steps = 12 * k;
  second.load_dir = absl::StrCat(dir, "/step-", saved_at);
  auto resumed = TrainUnder(d.to, second);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->losses.size(), static_cast<size_t>(12 * k - saved_at));
  for (size_t i = 0; i < resumed->losses.size(); ++i) {
    const double want = reference->losses[saved_at + i];
    EXPECT_NEAR(resumed->losses[i], want, kTolerance * want) << "step " << saved_at + 1 + i;
  }
  std::string worst;
  EXPECT_LE(MaxWeightDifference(*resumed, *reference, &worst), kTolerance) << worst;
}

INSTANTIATE_TEST_SUITE_P(
    Directions, CheckpointLayoutTest,
    ::testing::Values(Direction{"one_to_pp2", {1, 1}, {2, 4}},
                      Direction{"one_to_pp3", {1, 1}, {3, 4, F_THEN_B}},
                      Direction{"pp2_to_one", {2, 4}, {1, 1}},
                      Direction{"pp3_to_one", {3, 4}, {1, 1}},
                      Direction{"pp2_to_pp3", {2, 4}, {3, 2}},
                      Direction{"pp3_to_pp2_other_micro_batches", {3, 4}, {2, 8, F_THEN_B}},
                      Direction{"pp2xdp2_to_one", {2, 4, ONE_F_ONE_B, 2}, {1, 1}},
                      Direction{"one_to_pp2xdp2", {1, 1}, {2, 2, F_THEN_B, 2}},
                      Direction{"pp2_to_dp2", {2, 2}, {1, 1, ONE_F_ONE_B, 2}},
                      Direction{"dp4_to_pp2xdp2", {1, 1, ONE_F_ONE_B, 4}, {2, 2, ONE_F_ONE_B, 2}}),
    [](const ::testing::TestParamInfo<Direction>& info) { return info.param.name; });

}  // namespace
}  // namespace strata
