// F16 mixed precision with dynamic loss scaling under a pipeline, data
// parallelism and gradient merge trains what one device trains: per-step
// losses and final weights within 1e-5 relative over 20 steps, the same loss
// scale every step, and every rank skipping the same updates as the single
// device, against a real single-device run in the same test. The scale and
// its run of good steps are state: a checkpoint saved under one layout
// resumes under another and continues the uninterrupted series.
//
// The single device runs the same micro-batches (a pipeline section on one
// stage, accumulate_steps = micro-batches x dp degree, and the same gradient
// merge): an F16 matmul rounds its output once, so a weight gradient summed
// over 16 rows and one summed over two halves of 8 differ by an F16
// rounding (2^-11), and the halves overflow later. Partitioned alike, every
// F16 rounding and every overflow is the same; only the float32 order in
// which the parts are added differs.

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "runtime/checkpoint.h"
#include "tests/parity_util.h"

namespace strata {
namespace {

constexpr double kTolerance = 1e-5;
constexpr int kMicroBatchSize = 8;

struct Case {
  std::string name;
  int stages;
  int dp;
  int micro_batches;  // per rank
  int merge_steps;    // 1: no gradient merge
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

void AddLossScaling(Strategy* s) {
  s->mutable_mixed_precision()->set_dtype(F16);
  // 2^24 overflows F16 in backward at first: the opening updates are
  // skipped while the scale backs off; growth every 3 good steps makes it
  // overflow again later.
  s->mutable_mixed_precision()->mutable_loss_scaling()->set_init_scale(16777216);
  s->mutable_mixed_precision()->mutable_loss_scaling()->set_growth_interval(3);
}

Strategy Layout(const Case& c, bool single_device) {
  Strategy s;
  s.mutable_pipeline()->set_micro_batch_size(kMicroBatchSize);
  s.mutable_pipeline()->set_accumulate_steps(single_device ? c.micro_batches * c.dp : c.micro_batches);
  if (!single_device && c.dp > 1) s.mutable_data_parallel()->set_degree(c.dp);
  if (c.merge_steps > 1) {
    s.mutable_gradient_merge()->set_k_steps(c.merge_steps);
    s.mutable_gradient_merge()->set_average(true);
  }
  AddLossScaling(&s);
  return s;
}

class LossScalingParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(LossScalingParityTest, MatchesSingleDeviceAndSkipsTheSameSteps) {
  const Case& c = GetParam();
  GenOptions gen;
  gen.layers = {784, 64, 32, 10};
  gen.optimizer = "momentum";
  gen.learning_rate = 0.05;
  gen.cosine = true;  // a rate per update made: the skipped ones must not count
  auto single_program = GenerateModel("mlp", gen);
  ASSERT_TRUE(single_program.ok()) << single_program.status();
  gen.stages = c.stages;
  auto program = GenerateModel("mlp", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.steps = 20;

  auto single = TrainParallel(*single_program, Layout(c, true), options);
  ASSERT_TRUE(single.ok()) << single.status();
  auto parallel = TrainParallel(*program, Layout(c, false), options);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  ASSERT_EQ(parallel->losses.size(), 20u);

  // The scale and the skips, step for step, on every rank.
  ASSERT_EQ(single->loss_scales.size(), 20u);
  EXPECT_EQ(parallel->loss_scales, single->loss_scales);
  EXPECT_EQ(parallel->skipped_updates, single->skipped_updates);
  EXPECT_EQ(parallel->lrs, single->lrs);
  ASSERT_EQ(parallel->skipped_updates_by_rank.size(), static_cast<size_t>(c.stages * c.dp));
  for (const auto& [rank, skipped] : parallel->skipped_updates_by_rank) {
    EXPECT_EQ(skipped, single->skipped_updates) << "rank " << rank;
  }
  // The case exercises what it claims: updates skipped and made, the scale grown.
  int skipped = 0, made = 0;
  bool grew = false;
  for (size_t i = 0; i < single->skipped_updates.size(); ++i) {
    const bool update_step = (i + 1) % c.merge_steps == 0;
    if (update_step) (single->skipped_updates[i] ? skipped : made) += 1;
    if (i > 0) grew |= single->loss_scales[i] > single->loss_scales[i - 1];
  }
  RecordProperty("skipped_updates", skipped);
  EXPECT_GE(skipped, 2);
  EXPECT_GE(made, 2);
  EXPECT_TRUE(grew);

  const double loss_diff = MaxLossDifference(*parallel, *single);
  std::string worst;
  const double weight_diff = MaxWeightDifference(*parallel, *single, &worst);
  RecordProperty("max_loss_diff", absl::StrFormat("%.3g", loss_diff));
  RecordProperty("max_weight_diff", absl::StrFormat("%.3g", weight_diff));
  EXPECT_LE(loss_diff, kTolerance);
  EXPECT_LE(weight_diff, kTolerance) << "worst parameter: " << worst;
}

INSTANTIATE_TEST_SUITE_P(Layouts, LossScalingParityTest,
                         ::testing::Values(Case{"pp2", 2, 1, 2, 1}, Case{"pp2_dp2", 2, 2, 2, 1},
                                           Case{"pp2_merge2", 2, 1, 2, 2}, Case{"pp2_dp2_merge2", 2, 2, 2, 2}),
                         CaseName);

// Global batch 32 as 4 micro-batches of 8 under every layout here.
Strategy CheckpointLayout(int dp) {
  Strategy s;
  s.mutable_pipeline()->set_micro_batch_size(kMicroBatchSize);
  s.mutable_pipeline()->set_accumulate_steps(4 / dp);
  if (dp > 1) s.mutable_data_parallel()->set_degree(dp);
  AddLossScaling(&s);
  return s;
}

Program CheckpointProgram(int stages) {
  GenOptions gen;
  gen.layers = {784, 64, 32, 10};
  gen.optimizer = "adam";  // its moments and step count are state too
  gen.learning_rate = 0.002;
  gen.cosine = false;
  gen.stages = stages;
  auto program = GenerateModel("mlp", gen);
  EXPECT_TRUE(program.ok()) << program.status();
  return program.ok() ? *program : Program();
}

struct Direction {
  std::string name;
  int from_stages, from_dp, to_stages, to_dp;
};

class LossScalingCheckpointTest : public ::testing::TestWithParam<Direction> {};

TEST_P(LossScalingCheckpointTest, ResumesTheScaleUnderAnotherLayout) {
  const Direction& d = GetParam();
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp",
                                       "/loss_scaling_ckpt_", d.name);
  std::filesystem::remove_all(dir);
  ParityOptions full;
  full.steps = 12;
  auto reference = TrainParallel(CheckpointProgram(1), CheckpointLayout(1), full);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->loss_scales.size(), 12u);

  ParityOptions first;
  first.steps = 6;
  first.save_dir = dir;
  auto before = TrainParallel(CheckpointProgram(d.from_stages), CheckpointLayout(d.from_dp), first);
  ASSERT_TRUE(before.ok()) << before.status();
  // The checkpoint holds the scale the 7th step uses, once for all ranks
  // (LoadCheckpoint refuses shards that disagree).
  auto ckpt = LoadCheckpoint(absl::StrCat(dir, "/step-6"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_TRUE(ckpt->tensors.count("@loss_scale"));
  EXPECT_EQ(ckpt->tensors.at("@loss_scale").ValueAt(0), reference->loss_scales[6]);
  EXPECT_TRUE(ckpt->tensors.count("@loss_scale.good_steps"));
  EXPECT_TRUE(ckpt->tensors.count("@loss_scale.skipped_updates"));

  ParityOptions second;
  second.steps = 12;
  second.load_dir = dir;
  auto resumed = TrainParallel(CheckpointProgram(d.to_stages), CheckpointLayout(d.to_dp), second);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->losses.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(before->losses[i], reference->losses[i], kTolerance * reference->losses[i]) << "step " << 1 + i;
    EXPECT_NEAR(resumed->losses[i], reference->losses[6 + i], kTolerance * reference->losses[6 + i])
        << "step " << 7 + i;
    EXPECT_EQ(before->loss_scales[i], reference->loss_scales[i]) << "step " << 1 + i;
    EXPECT_EQ(resumed->loss_scales[i], reference->loss_scales[6 + i]) << "step " << 7 + i;
    EXPECT_EQ(resumed->skipped_updates[i], reference->skipped_updates[6 + i]) << "step " << 7 + i;
  }
  // The series holds skips on both sides of the save and a growth after it.
  int skipped_before = 0, skipped_after = 0;
  for (int i = 0; i < 12; ++i) (i < 6 ? skipped_before : skipped_after) += reference->skipped_updates[i];
  EXPECT_GE(skipped_before, 1);
  EXPECT_GE(skipped_after, 1);
  std::string worst;
  EXPECT_LE(MaxWeightDifference(*resumed, *reference, &worst), kTolerance) << worst;
}

INSTANTIATE_TEST_SUITE_P(Directions, LossScalingCheckpointTest,
                         ::testing::Values(Direction{"pp2_to_single", 2, 1, 1, 1},
                                           Direction{"single_to_pp2_dp2", 1, 1, 2, 2}),
                         [](const ::testing::TestParamInfo<Direction>& info) { return info.param.name; });

}  // namespace
}  // namespace strata
