#include "passes/hoist_param_casts.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"
#include "proto/types.h"

namespace strata {
namespace {

// The tiny GPT over `stages` pipeline stages.
std::string Gpt(int stages) { return TinyGptText(16, stages); }

// bf16 mixed precision over a 1F1B pipeline of `micro_batches`.
Strategy Bf16Pipeline(int micro_batches) {
  Strategy s = PipelineStrategy(micro_batches);
  s.mutable_mixed_precision()->set_dtype(BF16);
  return s;
}

std::vector<RankPlan> Plans(const std::string& text, const Strategy& strategy, std::vector<std::string> disabled = {},
                            DeviceKind device = DEVICE_CPU) {
  CompileOptions options;
  if (!strategy.has_pipeline()) options.batch_size = 4;
  options.disabled_passes = std::move(disabled);
  options.device_kind = device;
  auto result = Compile(ParseProgramOrFail(text), strategy, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? std::move(result->plans) : std::vector<RankPlan>{};
}

VarKind KindOf(const Program& p, const std::string& name) {
  const Var* v = FindVar(p, name);
  return v == nullptr ? ACTIVATION : v->kind();
}

// The casts that read a PARAM into another dtype, by role.
std::map<OpRole, int> ParamCastsByRole(const Program& p) {
  std::map<OpRole, int> n;
  for (const Op* op : OpsOfType(p, "cast")) {
    const Var* in = FindVar(p, op->input(0));
    const Var* out = FindVar(p, op->output(0));
    if (in != nullptr && out != nullptr && in->kind() == PARAM && in->dtype() != out->dtype()) ++n[op->role()];
  }
  return n;
}

// Each copy is written by its weight's update (attr copy_dtype, its last
// output), and refreshed by the cast the forward had (role REFRESH, after
// the update: no action runs it, the executor does before the first step
// and after a load); no cast of a weight is left in the step.
TEST(HoistParamCastsTest, EachCopyIsWrittenByItsUpdateAndRefreshedByItsCast) {
  for (const RankPlan& plan : Plans(Gpt(2), Bf16Pipeline(4))) {
    SCOPED_TRACE(plan.rank());
    const Program& p = plan.program();
    int copies = 0;
    int64_t copy_bytes = 0;
    for (const Var& v : p.var()) {
      if (v.kind() != PARAM_COPY) continue;
      ++copies;
      copy_bytes += NumElements(v.shape()) * static_cast<int64_t>(DataTypeSize(v.dtype()));
      EXPECT_EQ(v.dtype(), BF16) << v.name();
      const std::vector<const Op*> writers = OpsWriting(p, v.name());
      ASSERT_EQ(writers.size(), 2u) << v.name();
      const Op& update = *writers[0];
      const Op& cast = *writers[1];
      EXPECT_EQ(update.type(), "adam_update") << v.name();
      EXPECT_EQ(update.role(), OPTIMIZE) << v.name();
      EXPECT_EQ(Attr(update, "copy_dtype").s(), "BF16") << v.name();
      EXPECT_EQ(update.output(update.output_size() - 1), v.name());
      EXPECT_EQ(cast.type(), "cast");
      EXPECT_EQ(cast.role(), REFRESH) << v.name();
      ASSERT_EQ(KindOf(p, cast.input(0)), PARAM) << v.name();
      EXPECT_EQ(update.input(0), cast.input(0)) << v.name();
      EXPECT_EQ(OpsWriting(p, cast.input(0)).size(), 1u) << cast.input(0) << ": one update";
      EXPECT_LT(IndexOf(p, &update), IndexOf(p, &cast)) << v.name();
    }
    EXPECT_GT(copies, 0);
    const std::map<OpRole, int> left = ParamCastsByRole(p);
    EXPECT_EQ(left.count(FORWARD) + left.count(BACKWARD) + left.count(LOSS) + left.count(OPTIMIZE), 0u);
    EXPECT_EQ(left.at(REFRESH), copies);
    EXPECT_EQ(plan.memory().param_copy_bytes(), copy_bytes);
  }
}

TEST(HoistParamCastsTest, OneCopyPerWeightWhereTheForwardCastEachOnce) {
  const std::vector<RankPlan> on = Plans(Gpt(2), Bf16Pipeline(4));
  const std::vector<RankPlan> off = Plans(Gpt(2), Bf16Pipeline(4), {"hoist-param-casts"});
  ASSERT_EQ(on.size(), 2u);
  ASSERT_EQ(off.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    const std::map<OpRole, int> before = ParamCastsByRole(off[r].program());
    EXPECT_EQ(before.count(REFRESH), 0u);
    EXPECT_EQ(ParamCastsByRole(on[r].program()).at(REFRESH), before.at(FORWARD));
    EXPECT_EQ(on[r].program().op_size(), off[r].program().op_size());
    // The copies are counted once, beside the parameters, and leave the activations.
    EXPECT_EQ(off[r].memory().param_copy_bytes(), 0);
    EXPECT_LT(on[r].memory().activation_peak_bytes(), off[r].memory().activation_peak_bytes());
    EXPECT_EQ(on[r].memory().peak_bytes(), on[r].memory().param_bytes() + on[r].memory().param_copy_bytes() +
                                               on[r].memory().state_bytes() +
                                               on[r].memory().activation_peak_bytes());
  }
  // The first stage holds two micro-batches in flight under 1F1B: its
  // per-micro-batch copies were held twice, so its peak falls.
  EXPECT_LT(on[0].memory().peak_bytes(), off[0].memory().peak_bytes());
}

// Recompute casts block 1's weights again in the backward: with the pass
// those casts read the forward's copy, which every weight's update writes
// (with one micro-batch an update too, since its update writes it).
TEST(HoistParamCastsTest, RecomputedCastsReadTheForwardsCopy) {
  for (int micro_batches : {1, 2}) {
    SCOPED_TRACE(micro_batches);
    Strategy strategy = micro_batches > 1 ? Bf16Pipeline(micro_batches) : Bf16();
    strategy.mutable_recompute()->add_checkpoints("h1");
    const std::vector<RankPlan> on = Plans(Gpt(1), strategy);
    const std::vector<RankPlan> off = Plans(Gpt(1), strategy, {"hoist-param-casts"});
    ASSERT_EQ(on.size(), 1u);
    ASSERT_EQ(off.size(), 1u);
    const std::map<OpRole, int> before = ParamCastsByRole(off[0].program());
    ASSERT_GT(before.count(BACKWARD), 0u);
    const std::map<OpRole, int> after = ParamCastsByRole(on[0].program());
    EXPECT_EQ(after.count(BACKWARD) + after.count(FORWARD) + after.count(OPTIMIZE), 0u);
    EXPECT_EQ(after.at(REFRESH), before.at(FORWARD));
    EXPECT_EQ(on[0].program().op_size(), off[0].program().op_size() - before.at(BACKWARD));
    std::set<std::string> cast_params;
    for (const Op* op : OpsOfType(on[0].program(), "cast")) {
      if (op->role() == REFRESH) {
        EXPECT_TRUE(cast_params.insert(op->input(0)).second) << op->input(0) << " cast twice";
      }
    }
  }
}

TEST(HoistParamCastsTest, RunsWithMixedPrecisionAfterTheUpdatesAreRewiredAndBeforeTheirFusion) {
  Strategy strategy = Bf16();
  strategy.mutable_gradient_merge()->set_k_steps(2);
  strategy.mutable_data_parallel()->set_degree(2);
  for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
    const std::vector<std::string> names = CompilePassNames(strategy, device);
    auto at = [&](const std::string& pass) { return std::find(names.begin(), names.end(), pass) - names.begin(); };
    ASSERT_LT(at("hoist-param-casts"), names.size());
    EXPECT_LT(at("gradient-merge"), at("hoist-param-casts"));
    EXPECT_LT(at("data-parallel"), at("hoist-param-casts"));
    if (device == DEVICE_CUDA) {
      EXPECT_LT(at("hoist-param-casts"), at("fuse-optimizer"));
    }
    const std::vector<std::string> optional = OptionalPassNames(strategy, device);
    EXPECT_NE(std::find(optional.begin(), optional.end(), "hoist-param-casts"), optional.end());
  }
  const std::vector<std::string> f32 = CompilePassNames(Strategy(), DEVICE_CPU);
  EXPECT_EQ(std::find(f32.begin(), f32.end(), "hoist-param-casts"), f32.end());
}

// A plan that casts each weight once an update anyway (one micro-batch, no
// gradient merge, no recompute: GPT-2's single-GPU step) moves the casts of
// the weights it trains into their updates, which write the copies (on GPU
// plans the multi-tensor update, fuse-optimizer's): the step casts no
// weight. A frozen weight (no update) keeps its
// cast where it is, its copy an activation freed after its last use.
TEST(HoistParamCastsTest, OneMicroBatchAnUpdateHasTheUpdatesWriteTheCopies) {
  std::string text = Gpt(1);
  const std::string frozen = "name: \"block0.attn.qkv.w\"";
  const size_t at = text.find(frozen);
  ASSERT_NE(at, std::string::npos);
  text.insert(at + frozen.size(), " frozen: true");
  for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
    SCOPED_TRACE(device);
    const std::vector<RankPlan> on = Plans(text, Bf16(), {}, device);
    const std::vector<RankPlan> off = Plans(text, Bf16(), {"hoist-param-casts"}, device);
    ASSERT_EQ(on.size(), 1u);
    ASSERT_EQ(off.size(), 1u);
    const Program& p = on[0].program();
    const std::map<OpRole, int> before = ParamCastsByRole(off[0].program());
    const std::map<OpRole, int> after = ParamCastsByRole(p);
    EXPECT_EQ(after.at(FORWARD), 1);  // the frozen weight's
    EXPECT_EQ(after.at(REFRESH), before.at(FORWARD) - 1);
    // The same ops; on a GPU plan the updates that write copies make a multi op of their own.
    EXPECT_EQ(p.op_size(), off[0].program().op_size() + (device == DEVICE_CUDA ? 1 : 0));
    EXPECT_GT(on[0].memory().param_copy_bytes(), 0);
    EXPECT_EQ(KindOf(p, "block0.attn.qkv.w@bf16"), ACTIVATION);
    EXPECT_EQ(KindOf(p, "block0.attn.proj.w@bf16"), PARAM_COPY);
    int copies_written = 0;
    for (const Op& op : p.op()) {
      auto copy = op.attr().find("copy_dtype");
      if (copy == op.attr().end() || copy->second.s().empty()) continue;
      EXPECT_EQ(op.type(), device == DEVICE_CUDA ? "adam_update_multi" : "adam_update");
      const int64_t n = device == DEVICE_CUDA ? Attr(op, "n").i() : 1;
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(KindOf(p, op.output(static_cast<int>(op.output_size() - n + i))), PARAM_COPY);
      }
      copies_written += static_cast<int>(n);
    }
    EXPECT_EQ(copies_written, after.at(REFRESH));
  }
}

TEST(HoistParamCastsTest, ProgramsMayNotDeclareParamCopies) {
  const std::string text = R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "w" dtype: BF16 shape: [4, 4] kind: PARAM_COPY }
    op { type: "cast" input: ["x"] output: ["y"] attr { key: "dtype" value { s: "BF16" } } }
    op { type: "matmul" input: ["y", "w"] output: ["z"] }
    fetch: "z"
  )pb";
  CompileOptions options;
  options.batch_size = 4;
  auto result = Compile(ParseProgramOrFail(text), Strategy(), options);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("'w'"), std::string::npos) << result.status();
  EXPECT_NE(result.status().message().find("PARAM_COPY is written by the compiler"), std::string::npos)
      << result.status();
}

}  // namespace
}  // namespace strata
