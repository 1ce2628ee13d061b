// F16 mixed precision with dynamic loss scaling under a pipeline, data
// parallelism and gradient merge trains what one device trains: per-step
// losses and final weights within 1e-5 relative over 20 steps, the same loss
// scale every step, and every rank skipping the same updates as the single
// device, against a real single-device run in the same test.
//
// The single device runs the same micro-batches (a pipeline section on one
// stage, accumulate_steps = micro-batches x dp degree, and the same gradient
// merge): an F16 matmul rounds its output once, so a weight gradient summed
// over 16 rows and one summed over two halves of 8 differ by an F16
// rounding (2^-11), and the halves overflow later. Partitioned alike, every
// F16 rounding and every overflow is the same; only the float32 order in
// which the parts are added differs.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
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
  gen.cosine = false;
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

}  // namespace
}  // namespace strata
