#include "passes/loss_scaling.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"

namespace strata {
namespace {

// A two-layer MLP on two stages (the second holds the loss).
constexpr char kMlp[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w1" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w2" dtype: F32 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w1"] output: ["a"] device: "gpu:0" }
  op { type: "relu" input: ["a"] output: ["h"] device: "gpu:0" }
  op { type: "matmul" input: ["h", "w2"] output: ["z"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
  loss: "loss"
)pb";

constexpr char kAdamClip[] = R"pb(optimizer { adam { learning_rate: 0.01 } clip_global_norm: 1.0 })pb";

Strategy F16Strategy() {
  Strategy s;
  s.mutable_mixed_precision()->set_dtype(F16);
  return s;
}

absl::StatusOr<CompileResult> CompileWith(const Strategy& strategy, const std::string& optimizer,
                                          const std::string& dump_after = "") {
  CompileOptions options;
  options.dump_after = dump_after;
  if (!strategy.has_pipeline()) options.batch_size = 8;
  return Compile(ParseProgramOrFail(std::string(kMlp) + optimizer), strategy, options);
}

int Position(const Program& p, const std::string& type) {
  const std::vector<const Op*> ops = OpsOfType(p, type);
  return ops.empty() ? -1 : IndexOf(p, ops.front());
}

int FirstOptimizerOp(const Program& p) {
  for (int i = 0; i < p.op_size(); ++i) {
    if (p.op(i).role() == OPTIMIZE || p.op(i).role() == LR_SCHEDULE) return i;
  }
  return -1;
}

TEST(LossScalingTest, RunsAfterTheOptimizerForF16Only) {
  std::vector<std::string> names = CompilePassNames(F16Strategy());
  auto at = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  ASSERT_LT(at("loss-scaling"), static_cast<long>(names.size()));
  EXPECT_LT(at("optimizer"), at("loss-scaling"));
  EXPECT_LT(at("loss-scaling"), at("micro-batch"));
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  names = CompilePassNames(bf16);
  EXPECT_EQ(std::find(names.begin(), names.end(), "loss-scaling"), names.end());
  // BF16 scales the loss when asked to.
  bf16.mutable_mixed_precision()->mutable_loss_scaling()->set_init_scale(1024);
  EXPECT_TRUE(UsesLossScaling(bf16));
  names = CompilePassNames(bf16);
  EXPECT_NE(std::find(names.begin(), names.end(), "loss-scaling"), names.end());
}

TEST(LossScalingTest, DefaultsAreGradScalers) {
  const LossScaling ls = EffectiveLossScaling(F16Strategy());
  EXPECT_EQ(ls.init_scale(), 65536.0);
  EXPECT_EQ(ls.growth_factor(), 2.0);
  EXPECT_EQ(ls.backoff_factor(), 0.5);
  EXPECT_EQ(ls.growth_interval(), 2000);
  Strategy s = F16Strategy();
  s.mutable_mixed_precision()->mutable_loss_scaling()->set_growth_interval(3);
  EXPECT_EQ(EffectiveLossScaling(s).growth_interval(), 3);
  EXPECT_EQ(EffectiveLossScaling(s).init_scale(), 65536.0);
}

TEST(LossScalingTest, ScalesTheSeedUnscalesTheGradientsAndSkipsOnInf) {
  auto result = CompileWith(F16Strategy(), kAdamClip, "loss-scaling");
  ASSERT_TRUE(result.ok()) << result.status();
  const Program& p = result->dumped;
  // The state, under the names every layout shares.
  const Var* scale = FindVar(p, "@loss_scale");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(scale->kind(), STATE);
  EXPECT_EQ(scale->dtype(), F32);
  EXPECT_EQ(scale->init().constant().value(), 65536.0);
  for (const std::string name : {"@loss_scale.good_steps", "@loss_scale.skipped_updates"}) {
    ASSERT_TRUE(HasVar(p, name)) << name;
    EXPECT_EQ(FindVar(p, name)->kind(), STATE) << name;
    EXPECT_EQ(FindVar(p, name)->dtype(), I64) << name;
  }
  EXPECT_EQ(p.loss_scale(), "@loss_scale");
  EXPECT_EQ(p.skipped_updates(), "@loss_scale.skipped_updates");

  // The seed times the scale, and only the scaled seed flows on.
  const std::string seed = p.loss_grad();
  const std::vector<const Op*> scaled = OpsWriting(p, seed + "@scaled");
  ASSERT_EQ(scaled.size(), 1u);
  EXPECT_EQ(scaled[0]->type(), "mul");
  EXPECT_EQ(scaled[0]->role(), BACKWARD);
  EXPECT_EQ(std::vector<std::string>(scaled[0]->input().begin(), scaled[0]->input().end()),
            (std::vector<std::string>{seed, "@loss_scale"}));
  for (const Op& op : p.op()) {
    if (&op == scaled[0]) continue;
    for (const auto& in : op.input()) EXPECT_NE(in, seed) << op.type() << " reads the unscaled seed";
  }

  // The check, first in the optimizer block, over both gradients.
  const std::vector<const Op*> checks = OpsOfType(p, "check_finite_and_unscale");
  ASSERT_EQ(checks.size(), 1u);
  const Op& check = *checks[0];
  EXPECT_EQ(IndexOf(p, &check), FirstOptimizerOp(p));
  EXPECT_EQ(check.role(), OPTIMIZE);
  ASSERT_EQ(check.input_size(), 3);
  EXPECT_EQ(check.input(0), "@loss_scale");
  EXPECT_EQ(check.output(0), "@found_inf");
  std::vector<std::string> grads;
  for (int i = 1; i < check.input_size(); ++i) {
    grads.push_back(check.input(i));
    EXPECT_EQ(check.output(i), check.input(i) + "@unscaled");
  }
  EXPECT_EQ(grads, (std::vector<std::string>{p.param_grad().at("w1"), p.param_grad().at("w2")}));
  // Single device: no allreduce of the flag.
  EXPECT_TRUE(OpsOfType(p, "allreduce").empty());
  // Clipping and the updates read only the unscaled gradients.
  for (const Op& op : p.op()) {
    if (&op == &check || (op.role() != OPTIMIZE && op.role() != LR_SCHEDULE)) continue;
    for (const auto& in : op.input()) {
      EXPECT_TRUE(std::find(grads.begin(), grads.end(), in) == grads.end()) << op.type() << " reads " << in;
    }
  }
  ASSERT_EQ(OpsOfType(p, "sum_squares").size(), 1u);
  EXPECT_TRUE(absl::EndsWith(OpsOfType(p, "sum_squares")[0]->input(0), "@unscaled"));
  // Every update and the step counter take the flag as their last input;
  // the updates read clipping's coefficient just before it (attr grad_scale).
  for (const std::string type : {"adam_update", "increment"}) {
    for (const Op* op : OpsOfType(p, type)) {
      EXPECT_EQ(op->input(op->input_size() - 1), "@found_inf") << type;
      if (type == "adam_update") {
        EXPECT_EQ(op->input(op->input_size() - 2), "@clip_coef");
        EXPECT_TRUE(Attr(*op, "grad_scale").b());
      }
    }
  }
  EXPECT_EQ(OpsOfType(p, "adam_update").size(), 2u);
  // The scale's update ends the block, with GradScaler's defaults.
  const std::vector<const Op*> updates = OpsOfType(p, "update_loss_scaling");
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(IndexOf(p, updates[0]), p.op_size() - 1);
  EXPECT_EQ(updates[0]->input(0), "@found_inf");
  EXPECT_EQ(Attr(*updates[0], "growth_factor").f(), 2.0);
  EXPECT_EQ(Attr(*updates[0], "backoff_factor").f(), 0.5);
  EXPECT_EQ(Attr(*updates[0], "growth_interval").i(), 2000);
}

TEST(LossScalingTest, StagesAgreeOnTheFlagThroughAnAllreduce) {
  Strategy s = F16Strategy();
  s.mutable_pipeline()->set_micro_batch_size(2);
  s.mutable_pipeline()->set_accumulate_steps(2);
  s.mutable_mixed_precision()->mutable_loss_scaling()->set_growth_interval(5);
  auto result = CompileWith(s, kAdamClip);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->plans.size(), 2u);
  for (const RankPlan& plan : result->plans) {
    const Program& p = plan.program();
    SCOPED_TRACE(absl::StrCat("rank ", plan.rank()));
    // Each stage checks its own gradient, then the stages sum their flags,
    // before clipping sums its norm: the same collective order on each.
    const int check = Position(p, "check_finite_and_unscale");
    ASSERT_GE(check, 0);
    const std::vector<const Op*> reduces = OpsOfType(p, "allreduce");
    ASSERT_EQ(reduces.size(), 2u);
    EXPECT_EQ(reduces[0]->input(0), "@found_inf");
    EXPECT_EQ(reduces[0]->output(0), "@found_inf.all");
    EXPECT_EQ(reduces[1]->input(0), "@grad_sumsq");
    EXPECT_EQ(reduces[0]->group(), reduces[1]->group());
    EXPECT_LT(check, IndexOf(p, reduces[0]));
    for (const Op* op : OpsOfType(p, "adam_update")) EXPECT_EQ(op->input(op->input_size() - 1), "@found_inf.all");
    ASSERT_EQ(OpsOfType(p, "update_loss_scaling").size(), 1u);
    EXPECT_EQ(OpsOfType(p, "update_loss_scaling")[0]->input(0), "@found_inf.all");
    EXPECT_EQ(Attr(*OpsOfType(p, "update_loss_scaling")[0], "growth_interval").i(), 5);
    EXPECT_TRUE(HasVar(p, "@loss_scale"));
    // The check reads the micro-batches' summed gradients.
    for (int i = 1; i < OpsOfType(p, "check_finite_and_unscale")[0]->input_size(); ++i) {
      EXPECT_TRUE(absl::EndsWith(OpsOfType(p, "check_finite_and_unscale")[0]->input(i), "@acc"));
    }
  }
  // Only the loss's stage scales the seed.
  int seeds = 0;
  for (const RankPlan& plan : result->plans) {
    for (const Op& op : plan.program().op()) seeds += op.output_size() == 1 && absl::EndsWith(op.output(0), "@scaled");
  }
  EXPECT_EQ(seeds, 1);
}

// The loss alone on the last stage: no gradients there, but the seed and
// both stages' allreduces (the flag's, then clipping's) in the same order.
constexpr char kLossOnlyStage[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w1" dtype: F32 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w1"] output: ["z"] device: "gpu:0" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } clip_global_norm: 1.0 }
)pb";

TEST(LossScalingTest, AStageWithoutGradientsJoinsTheFlagsAllreduce) {
  Strategy s = F16Strategy();
  s.mutable_pipeline()->set_micro_batch_size(2);
  s.mutable_pipeline()->set_accumulate_steps(2);
  auto result = Compile(ParseProgramOrFail(kLossOnlyStage), s, CompileOptions());
  ASSERT_TRUE(result.ok()) << result.status();  // the schedule verifier matched the collectives
  ASSERT_EQ(result->plans.size(), 2u);
  const Program& last = result->plans[1].program();
  EXPECT_TRUE(OpsOfType(last, "check_finite_and_unscale").empty());
  ASSERT_EQ(OpsWriting(last, "@found_inf").size(), 1u);
  EXPECT_EQ(OpsWriting(last, "@found_inf")[0]->type(), "fill_scalar");
  const std::vector<const Op*> reduces = OpsOfType(last, "allreduce");
  ASSERT_EQ(reduces.size(), 2u);
  EXPECT_EQ(reduces[0]->input(0), "@found_inf");
  EXPECT_EQ(reduces[1]->input(0), "@grad_sumsq");
  ASSERT_EQ(OpsOfType(last, "update_loss_scaling").size(), 1u);
  EXPECT_FALSE(OpsWriting(last, last.loss_grad() + "@scaled").empty());
  EXPECT_FALSE(OpsOfType(result->plans[0].program(), "check_finite_and_unscale").empty());
}

TEST(LossScalingTest, DataParallelReplicasCheckTheSummedGradients) {
  Strategy s = F16Strategy();
  s.mutable_data_parallel()->set_degree(2);
  auto result = CompileWith(s, R"pb(optimizer { sgd { learning_rate: 0.1 } })pb");
  ASSERT_TRUE(result.ok()) << result.status();
  for (const RankPlan& plan : result->plans) {
    const Program& p = plan.program();
    const int check = Position(p, "check_finite_and_unscale");
    ASSERT_GE(check, 0);
    // Every bucket is waited for before the check, which reads the sums.
    for (const Op* wait : OpsOfType(p, "bucket_wait")) EXPECT_LT(IndexOf(p, wait), check);
    const Op& op = p.op(check);
    for (int i = 1; i < op.input_size(); ++i) EXPECT_TRUE(absl::EndsWith(op.input(i), "@dp")) << op.input(i);
    // No pipeline: no allreduce of the flag.
    EXPECT_TRUE(OpsOfType(p, "allreduce").empty());
  }
}

TEST(LossScalingTest, GradientMergeChecksTheMergedBuffers) {
  Strategy s = F16Strategy();
  s.mutable_gradient_merge()->set_k_steps(2);
  s.mutable_gradient_merge()->set_average(true);
  auto result = CompileWith(s, R"pb(optimizer { momentum { learning_rate: 0.1 momentum: 0.9 } })pb");
  ASSERT_TRUE(result.ok()) << result.status();
  const Program& p = result->plans[0].program();
  std::vector<std::string> merged(p.merge_buffer().begin(), p.merge_buffer().end());
  const Op& check = p.op(Position(p, "check_finite_and_unscale"));
  std::vector<std::string> read(check.input().begin() + 1, check.input().end());
  std::sort(read.begin(), read.end());
  EXPECT_EQ(read, merged);
  for (const Op* op : OpsOfType(p, "momentum_update")) EXPECT_EQ(op->input(op->input_size() - 1), "@found_inf");
}

TEST(LossScalingTest, RefusesBadFieldsNamingThem) {
  const Program program = ParseProgramOrFail(std::string(kMlp) + kAdamClip);
  auto refusal = [&](void (*set)(LossScaling*)) {
    Strategy s = F16Strategy();
    set(s.mutable_mixed_precision()->mutable_loss_scaling());
    return std::string(ValidateStrategy(s, program, 0, "s.pbtxt").message());
  };
  EXPECT_EQ(refusal([](LossScaling* l) { l->set_init_scale(-1); }),
            "s.pbtxt: mixed_precision.loss_scaling.init_scale: must be a float32 in [2^-126, its largest] (or 0 "
            "for the default 65536), whose reciprocal float32 holds, got -1");
  EXPECT_TRUE(absl::StrContains(refusal([](LossScaling* l) { l->set_init_scale(1e39); }),
                                "mixed_precision.loss_scaling.init_scale: must be a float32 in [2^-126"));
  // Its reciprocal, the gradients' unscaling factor, would be inf.
  EXPECT_TRUE(absl::StrContains(refusal([](LossScaling* l) { l->set_init_scale(1e-39); }),
                                "mixed_precision.loss_scaling.init_scale: must be a float32 in [2^-126"));
  EXPECT_EQ(refusal([](LossScaling* l) { l->set_init_scale(std::numeric_limits<float>::min()); }), "");
  EXPECT_EQ(refusal([](LossScaling* l) { l->set_growth_factor(1); }),
            "s.pbtxt: mixed_precision.loss_scaling.growth_factor: must be a finite value > 1 (or 0 for the "
            "default 2), got 1");
  EXPECT_EQ(refusal([](LossScaling* l) { l->set_backoff_factor(1); }),
            "s.pbtxt: mixed_precision.loss_scaling.backoff_factor: must be in (0, 1) (or 0 for the default 0.5), "
            "got 1");
  EXPECT_TRUE(absl::StrContains(refusal([](LossScaling* l) { l->set_backoff_factor(-0.5); }),
                                "backoff_factor: must be in (0, 1)"));
  EXPECT_EQ(refusal([](LossScaling* l) { l->set_growth_interval(-3); }),
            "s.pbtxt: mixed_precision.loss_scaling.growth_interval: must be >= 1 (or 0 for the default 2000), "
            "got -3");
  EXPECT_EQ(refusal([](LossScaling* l) { l->set_init_scale(1024); }), "");
}

TEST(LossScalingTest, NoneWithoutMixedPrecision) {
  auto result = CompileWith(Strategy(), kAdamClip);
  ASSERT_TRUE(result.ok()) << result.status();
  const Program& p = result->plans[0].program();
  EXPECT_FALSE(HasVar(p, "@loss_scale"));
  EXPECT_TRUE(OpsOfType(p, "check_finite_and_unscale").empty());
  EXPECT_TRUE(p.loss_scale().empty());
}

}  // namespace
}  // namespace strata
