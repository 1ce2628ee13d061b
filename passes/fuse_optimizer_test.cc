#include "passes/fuse_optimizer.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/graph.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"

namespace strata {
namespace {

// Two linear layers (four trained parameters), the optimizer as given.
std::string Mlp(const std::string& optimizer) {
  return absl::StrCat(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w1" dtype: F32 shape: [4, 6] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b1" dtype: F32 shape: [6] kind: PARAM }
    var { name: "w2" dtype: F32 shape: [6, 3] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b2" dtype: F32 shape: [3] kind: PARAM }
    op { type: "matmul" input: ["x", "w1"] output: ["xw1"] }
    op { type: "add" input: ["xw1", "b1"] output: ["y1"] }
    op { type: "relu" input: ["y1"] output: ["h"] }
    op { type: "matmul" input: ["h", "w2"] output: ["xw2"] }
    op { type: "add" input: ["b2", "xw2"] output: ["z"] }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
    loss: "loss"
  )pb",
                      optimizer);
}

constexpr char kAdamW[] =
    R"pb(optimizer { adamw { learning_rate: 0.01 beta1: 0.8 } weight_decay: 0.01 })pb";
constexpr char kMomentumClipped[] =
    R"pb(optimizer { momentum { learning_rate: 0.1 momentum: 0.9 nesterov: true } clip_global_norm: 1.0 })pb";

Program DumpAfter(const std::string& text, const Strategy& strategy, const std::string& pass,
                  DeviceKind device = DEVICE_CUDA) {
  CompileOptions options;
  if (!strategy.has_pipeline()) options.batch_size = 8;
  options.dump_after = pass;
  options.device_kind = device;
  auto result = Compile(ParseProgramOrFail(text), strategy, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->dumped : Program();
}

// The full compile's per-rank pass before fuse-optimizer, for `strategy`.
std::string PassBefore(const Strategy& strategy) {
  const std::vector<std::string> names = CompilePassNames(strategy, DEVICE_CUDA);
  auto it = std::find(names.begin(), names.end(), "fuse-optimizer");
  return it == names.begin() || it == names.end() ? "" : *(it - 1);
}

std::vector<std::string> Names(const google::protobuf::RepeatedPtrField<std::string>& names) {
  return std::vector<std::string>(names.begin(), names.end());
}

// After every pass that touches the update ops; only the host transfers,
// which touch feeds and metrics, come after it.
TEST(FuseOptimizerTest, RunsLastOnEachRankForGpuPlansOnly) {
  Strategy dp_f16;
  dp_f16.mutable_data_parallel()->set_degree(2);
  dp_f16.mutable_mixed_precision()->set_dtype(F16);
  dp_f16.mutable_gradient_merge()->set_k_steps(2);
  for (const Strategy& s : {Strategy(), dp_f16}) {
    const std::vector<std::string> gpu = CompilePassNames(s, DEVICE_CUDA);
    ASSERT_FALSE(gpu.empty());
    ASSERT_GE(gpu.size(), 2u);
    EXPECT_EQ(gpu[gpu.size() - 2], "fuse-optimizer") << s.ShortDebugString();
    EXPECT_EQ(gpu.back(), "host-transfers") << s.ShortDebugString();
    EXPECT_EQ(std::count(gpu.begin(), gpu.end(), "fuse-optimizer"), 1);
    const std::vector<std::string> cpu = CompilePassNames(s);
    EXPECT_EQ(std::find(cpu.begin(), cpu.end(), "fuse-optimizer"), cpu.end());
  }
  // After every pass that moves update ops; under mixed precision the
  // weights' casts go after the updates just before.
  EXPECT_EQ(PassBefore(dp_f16), "hoist-param-casts");
  Strategy dp = dp_f16;
  dp.clear_mixed_precision();
  EXPECT_EQ(PassBefore(dp), "data-parallel");
}

// The four adamw updates become one adam_update_multi where the last one
// was, with their attrs, their params, grads and moments in order, and the
// shared lr and step once.
TEST(FuseOptimizerTest, GroupsTheAdamWUpdatesWhereTheLastWas) {
  const Program before = DumpAfter(Mlp(kAdamW), Strategy(), PassBefore(Strategy()));
  const Program after = DumpAfter(Mlp(kAdamW), Strategy(), "fuse-optimizer");
  const std::vector<const Op*> singles = OpsOfType(before, "adam_update");
  ASSERT_EQ(singles.size(), 4u);
  EXPECT_TRUE(OpsOfType(after, "adam_update").empty());
  const std::vector<const Op*> multi = OpsOfType(after, "adam_update_multi");
  ASSERT_EQ(multi.size(), 1u);
  const Op& op = *multi[0];
  EXPECT_EQ(Attr(op, "n").i(), 4);
  for (const char* a : {"beta1", "beta2", "epsilon", "weight_decay", "decoupled"}) {
    EXPECT_EQ(Attr(op, a).ShortDebugString(), Attr(*singles[0], a).ShortDebugString()) << a;
  }
  EXPECT_DOUBLE_EQ(Attr(op, "beta1").f(), 0.8);
  EXPECT_TRUE(Attr(op, "decoupled").b());
  ASSERT_EQ(op.input_size(), 4 * 4 + 2);
  ASSERT_EQ(op.output_size(), 3 * 4);
  for (int i = 0; i < 4; ++i) {
    for (int k = 0; k < 4; ++k) EXPECT_EQ(op.input(k * 4 + i), singles[i]->input(k)) << i << " " << k;
    for (int k = 0; k < 3; ++k) EXPECT_EQ(op.output(k * 4 + i), singles[i]->output(k)) << i << " " << k;
  }
  EXPECT_EQ(op.input(16), singles[0]->input(4));  // lr
  EXPECT_EQ(op.input(17), singles[0]->input(5));  // step
  EXPECT_EQ(op.role(), singles[3]->role());
  EXPECT_EQ(op.stage(), singles[3]->stage());
  // Every other op in its order, the multi op where the last update was.
  std::vector<std::string> want, got;
  for (const Op& o : before.op()) {
    if (&o == singles[3]) want.push_back("adam_update_multi");
    else if (o.type() != "adam_update") want.push_back(o.type());
  }
  for (const Op& o : after.op()) got.push_back(o.type());
  EXPECT_EQ(got, want);
}

// With global-norm clipping the fused momentum update reads the gradients
// and the clipping coefficient (attr grad_scale) the single ones read.
TEST(FuseOptimizerTest, KeepsClippedGradientsAndMomentumAttrs) {
  const Program before = DumpAfter(Mlp(kMomentumClipped), Strategy(), PassBefore(Strategy()));
  const Program after = DumpAfter(Mlp(kMomentumClipped), Strategy(), "fuse-optimizer");
  const std::vector<const Op*> singles = OpsOfType(before, "momentum_update");
  ASSERT_EQ(singles.size(), 4u);
  const std::vector<const Op*> multi = OpsOfType(after, "momentum_update_multi");
  ASSERT_EQ(multi.size(), 1u);
  EXPECT_TRUE(Attr(*multi[0], "nesterov").b());
  EXPECT_DOUBLE_EQ(Attr(*multi[0], "momentum").f(), 0.9);
  EXPECT_TRUE(Attr(*multi[0], "grad_scale").b());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(multi[0]->input(4 + i), singles[i]->input(1));
    EXPECT_TRUE(Attr(*singles[i], "grad_scale").b());
    EXPECT_EQ(singles[i]->input(4), "@clip_coef");
  }
  // param[4], grad[4], velocity[4], lr, the coefficient.
  ASSERT_EQ(multi[0]->input_size(), 14);
  EXPECT_EQ(multi[0]->input(13), "@clip_coef");
  EXPECT_EQ(OpsOfType(after, "clip_coefficient").size(), 1u);
}

// An update's attr copy_dtype, "" where it has none.
std::string CopyDtypeOf(const Op& op) {
  auto it = op.attr().find("copy_dtype");
  return it == op.attr().end() ? "" : it->second.s();
}

// Under loss scaling every update skips on found_inf; the multi ops do too.
// Mixed precision's weights, whose updates write their F16 copies (attr
// copy_dtype, passes/hoist_param_casts.h), make one multi op, its copies
// the last n outputs in the members' order; the biases (no copy) another.
TEST(FuseOptimizerTest, PassesLossScalingsFoundInfOnAndGroupsTheCopies) {
  Strategy f16;
  f16.mutable_mixed_precision()->set_dtype(F16);
  const Program before = DumpAfter(Mlp(kAdamW), f16, PassBefore(f16));
  const Program after = DumpAfter(Mlp(kAdamW), f16, "fuse-optimizer");
  const std::vector<const Op*> singles = OpsOfType(before, "adam_update");
  ASSERT_FALSE(singles.empty());
  ASSERT_EQ(singles[0]->input_size(), 7);
  std::vector<const Op*> copying;
  for (const Op* op : singles) {
    if (!CopyDtypeOf(*op).empty()) copying.push_back(op);
  }
  ASSERT_FALSE(copying.empty());
  ASSERT_LT(copying.size(), singles.size());
  const std::vector<const Op*> multi = OpsOfType(after, "adam_update_multi");
  ASSERT_EQ(multi.size(), 2u);
  int64_t n = 0;
  for (const Op* m : multi) {
    n += Attr(*m, "n").i();
    EXPECT_EQ(m->input(m->input_size() - 1), singles[0]->input(6));
    if (CopyDtypeOf(*m).empty()) {
      EXPECT_EQ(m->output_size(), 3 * Attr(*m, "n").i());
      continue;
    }
    EXPECT_EQ(CopyDtypeOf(*m), "F16");
    ASSERT_EQ(Attr(*m, "n").i(), static_cast<int64_t>(copying.size()));
    ASSERT_EQ(m->output_size(), 4 * Attr(*m, "n").i());
    for (size_t i = 0; i < copying.size(); ++i) {
      EXPECT_EQ(m->output(static_cast<int>(3 * copying.size() + i)), copying[i]->output(3));
      EXPECT_EQ(m->input(static_cast<int>(i)), copying[i]->input(0));
    }
  }
  EXPECT_EQ(n, static_cast<int64_t>(singles.size()));
}

TEST(FuseOptimizerTest, LeavesCpuPlansAlone) {
  for (const char* opt : {kAdamW, kMomentumClipped}) {
    CompileOptions options;
    options.batch_size = 8;
    auto result = Compile(ParseProgramOrFail(Mlp(opt)), Strategy(), options);
    ASSERT_TRUE(result.ok()) << result.status();
    for (const RankPlan& plan : result->plans) {
      for (const Op& op : plan.program().op()) EXPECT_EQ(op.type().find("_multi"), std::string::npos) << op.type();
    }
  }
}

// Update ops by hand (the validator keeps them out of programs, so the pass
// runs on a Graph made from these directly).
std::unique_ptr<Graph> UpdatesGraph(const std::string& ops) {
  Program p = ParseProgramOrFail(absl::StrCat(R"pb(
    var { name: "w0" dtype: F32 shape: [4] kind: PARAM }
    var { name: "w1" dtype: F32 shape: [2, 3] kind: PARAM }
    var { name: "w2" dtype: F32 shape: [5] kind: PARAM }
    var { name: "w3" dtype: F32 shape: [5] kind: PARAM }
    var { name: "d0" dtype: F64 shape: [5] kind: PARAM }
    var { name: "g0" dtype: F32 shape: [4] }
    var { name: "g1" dtype: F32 shape: [2, 3] }
    var { name: "g2" dtype: F32 shape: [5] }
    var { name: "g3" dtype: F32 shape: [5] }
    var { name: "e0" dtype: F64 shape: [5] }
    var { name: "lr" dtype: F32 shape: [] }
    var { name: "lr2" dtype: F32 shape: [] }
    var { name: "lr64" dtype: F64 shape: [] }
    var { name: "r" dtype: F32 shape: [5] }
  )pb",
                                              ops));
  auto graph = Graph::FromProgram(p);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return graph.ok() ? std::move(*graph) : nullptr;
}

std::string Sgd(const std::string& w, const std::string& g, const std::string& lr = "lr") {
  return absl::StrCat(R"pb(op { type: "sgd_update" role: OPTIMIZE input: [")pb", w, "\", \"", g, "\", \"", lr,
                      R"pb("] output: [")pb", w, R"pb("] attr { key: "weight_decay" value { f: 0 } } })pb");
}

Program RunPass(const std::string& ops, int max_group_size = 0, bool* changed = nullptr) {
  std::unique_ptr<Graph> graph = UpdatesGraph(ops);
  if (graph == nullptr) return Program();
  FuseOptimizerPass pass(max_group_size);
  auto r = pass.Run(*graph, CompileContext());
  EXPECT_TRUE(r.ok()) << r.status();
  if (changed != nullptr) *changed = r.ok() && *r;
  return graph->ToProgram();
}

std::vector<std::string> Types(const Program& p) {
  std::vector<std::string> t;
  for (const Op& op : p.op()) t.push_back(op.type());
  return t;
}

// An op between the members reads w0, which the first member updated: the
// unfused program gives it the new w0, so the group ends before it.
TEST(FuseOptimizerTest, SplitsTheGroupBeforeAnOpReadingAMembersParam) {
  const Program p = RunPass(absl::StrCat(Sgd("w0", "g0"), Sgd("w2", "g2"),
                                         R"pb(op { type: "relu" input: ["w2"] output: ["r"] })pb",
                                         Sgd("w1", "g1"), Sgd("w3", "g3")));
  EXPECT_EQ(Types(p), (std::vector<std::string>{"sgd_update_multi", "relu", "sgd_update_multi"}));
  EXPECT_EQ(Names(p.op(0).input()), (std::vector<std::string>{"w0", "w2", "g0", "g2", "lr"}));
  EXPECT_EQ(Names(p.op(2).input()), (std::vector<std::string>{"w1", "w3", "g1", "g3", "lr"}));
  EXPECT_EQ(Names(p.op(2).output()), (std::vector<std::string>{"w1", "w3"}));
}

// An op between that writes a member's grad after it was read splits too;
// one that reads only grads does not.
TEST(FuseOptimizerTest, SplitsBeforeAnOpWritingAVarAMemberRead) {
  Program p = RunPass(absl::StrCat(Sgd("w2", "g2"), R"pb(op { type: "relu" input: ["g3"] output: ["g2"] })pb",
                                   Sgd("w3", "g3")));
  EXPECT_EQ(Types(p), (std::vector<std::string>{"sgd_update", "relu", "sgd_update"}));
  p = RunPass(absl::StrCat(Sgd("w2", "g2"), R"pb(op { type: "relu" input: ["g3"] output: ["r"] })pb",
                           Sgd("w3", "g3")));
  EXPECT_EQ(Types(p), (std::vector<std::string>{"relu", "sgd_update_multi"}));
}

// Different lrs, dtypes or attrs never share an op; interleaved groups fuse
// independently.
TEST(FuseOptimizerTest, GroupsOnlyUpdatesThatAgree) {
  const std::string wd = R"pb(op { type: "sgd_update" role: OPTIMIZE input: ["w3", "g3", "lr"] output: ["w3"]
                                   attr { key: "weight_decay" value { f: 0.5 } } })pb";
  bool changed = false;
  const Program p = RunPass(absl::StrCat(Sgd("w0", "g0"), Sgd("w1", "g1", "lr2"), Sgd("d0", "e0", "lr64"),
                                         Sgd("w2", "g2"), wd, Sgd("w3", "g3", "lr2")),
                            0, &changed);
  // w3 is updated twice, with weight decay, then at lr2: the second reads
  // what the first wrote, which closes the weight-decay group (one op, left
  // as it was) before lr2's group takes the second.
  EXPECT_TRUE(changed);
  EXPECT_EQ(Types(p), (std::vector<std::string>{"sgd_update", "sgd_update_multi", "sgd_update", "sgd_update_multi"}));
  EXPECT_EQ(Names(p.op(1).input()), (std::vector<std::string>{"w0", "w2", "g0", "g2", "lr"}));
  EXPECT_EQ(Names(p.op(2).input()), (std::vector<std::string>{"w3", "g3", "lr"}));
  EXPECT_EQ(Names(p.op(3).input()), (std::vector<std::string>{"w1", "w3", "g1", "g3", "lr2"}));
  EXPECT_EQ(p.op(0).type(), "sgd_update");
  EXPECT_EQ(p.op(0).input(0), "d0");
}

TEST(FuseOptimizerTest, BoundsTheGroupSize) {
  const Program p =
      RunPass(absl::StrCat(Sgd("w0", "g0"), Sgd("w1", "g1"), Sgd("w2", "g2"), Sgd("w3", "g3")), /*max_group_size=*/3);
  EXPECT_EQ(Types(p), (std::vector<std::string>{"sgd_update_multi", "sgd_update"}));
  EXPECT_EQ(p.op(0).attr().at("n").i(), 3);
  bool changed = true;
  RunPass(Sgd("w0", "g0"), 0, &changed);
  EXPECT_FALSE(changed);  // a lone update stays single
}

}  // namespace
}  // namespace strata
