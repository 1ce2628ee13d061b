#include "passes/optimizer.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "passes/compile.h"
#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "passes/testing/pass_test_util.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// w [4, 5] and b [5] are trained; `frozen` is read but never trained.
constexpr char kModel[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w" dtype: F64 shape: [4, 5] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "b" dtype: F64 shape: [5] kind: PARAM }
  var { name: "frozen" dtype: F64 shape: [5, 3] kind: PARAM frozen: true init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w"] output: ["xw"] }
  op { type: "add" input: ["xw", "b"] output: ["h"] }
  op { type: "matmul" input: ["h", "frozen"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
)pb";

// One device: the whole program on rank 0 (no micro-batching).
Program CompileOne(const std::string& optimizer) {
  auto result = Compile(ParseProgramOrFail(std::string(kModel) + optimizer, "opt.pbtxt"), Strategy(), CompileOptions());
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() && result->plans.size() == 1 ? result->plans[0].program() : Program();
}

// The update ops (role OPTIMIZE, type *_update), by the param they update.
std::vector<const Op*> Updates(const Program& p) {
  std::vector<const Op*> ops;
  for (const Op& op : p.op()) {
    const std::string& t = op.type();
    if (t.size() > 7 && t.compare(t.size() - 7, 7, "_update") == 0) ops.push_back(&op);
  }
  return ops;
}

// A state var shaped like its parameter.
void ExpectStateLike(const Program& p, const std::string& name, const std::string& param) {
  const Var* v = FindVar(p, name);
  const Var* like = FindVar(p, param);
  ASSERT_NE(v, nullptr) << name;
  ASSERT_NE(like, nullptr) << param;
  EXPECT_EQ(v->kind(), STATE) << name;
  EXPECT_EQ(v->dtype(), like->dtype()) << name;
  EXPECT_THAT(v->shape(), ::testing::ElementsAreArray(like->shape())) << name;
}

// `u` updates its param in place: reads param, grad, its state vars (each
// shaped like the param, with the given suffixes) and the lr, adam also the step.
void ExpectUpdate(const Program& p, const Op& u, const std::string& type, const std::vector<std::string>& states) {
  const std::string param = u.input(0);
  SCOPED_TRACE(param);
  EXPECT_EQ(u.type(), type);
  EXPECT_EQ(u.role(), OPTIMIZE);
  EXPECT_EQ(u.stage(), 0);
  ASSERT_EQ(p.param_grad().count(param), 1u);
  EXPECT_EQ(p.param_grad().at(param), param + "@grad");
  std::vector<std::string> inputs = {param, param + "@grad"}, outputs = {param};
  for (const auto& state : states) {
    inputs.push_back(param + state);
    outputs.push_back(param + state);
    ExpectStateLike(p, param + state, param);
  }
  inputs.push_back("@lr.F64");
  if (type == "adam_update") inputs.push_back("@step");
  EXPECT_THAT(u.input(), ::testing::ElementsAreArray(inputs));
  EXPECT_THAT(u.output(), ::testing::ElementsAreArray(outputs));
}

// Step counter, lr schedule and their order before the updates.
void ExpectStepAndLr(const Program& p, double base_lr) {
  const Var* step = FindVar(p, kStepVar);
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->kind(), STATE);
  EXPECT_EQ(step->dtype(), I64);
  EXPECT_THAT(step->shape(), IsEmpty());
  auto lr = OpsOfType(p, "lr_schedule");
  auto inc = OpsOfType(p, "increment");
  ASSERT_EQ(lr.size(), 1u);
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_THAT(lr[0]->input(), ElementsAre("@step"));
  EXPECT_THAT(lr[0]->output(), ElementsAre("@lr.F64"));
  EXPECT_EQ(lr[0]->role(), LR_SCHEDULE);
  EXPECT_DOUBLE_EQ(Attr(*lr[0], "base_lr").f(), base_lr);
  EXPECT_EQ(Attr(*lr[0], "dtype").s(), "F64");
  EXPECT_THAT(inc[0]->input(), ElementsAre("@step"));
  EXPECT_THAT(inc[0]->output(), ElementsAre("@step"));
  EXPECT_EQ(inc[0]->role(), OPTIMIZE);
  EXPECT_EQ(Attr(*inc[0], "by").i(), 1);
  // The lr reads the 0-based step; updates (adam) the incremented 1-based one.
  EXPECT_LT(IndexOf(p, lr[0]), IndexOf(p, inc[0]));
  for (const Op* u : Updates(p)) EXPECT_LT(IndexOf(p, inc[0]), IndexOf(p, u));
  ASSERT_NE(FindVar(p, "@lr.F64"), nullptr);
  EXPECT_THAT(FindVar(p, "@lr.F64")->shape(), IsEmpty());
}

void ExpectNoTrainingOfFrozen(const Program& p) {
  EXPECT_EQ(p.param_grad().count("frozen"), 0u);
  for (const Op* u : Updates(p)) EXPECT_NE(u->input(0), "frozen");
  for (const Var& v : p.var()) EXPECT_NE(v.name().rfind("frozen@", 0), 0u) << v.name();
}

TEST(OptimizerPassTest, SgdUpdatesEachTrainedParameterOnce) {
  Program p = CompileOne(R"pb(optimizer { sgd { learning_rate: 0.1 } weight_decay: 0.01 })pb");
  auto updates = Updates(p);
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[0]->input(0), "w");  // in declaration order
  EXPECT_EQ(updates[1]->input(0), "b");
  for (const Op* u : updates) {
    ExpectUpdate(p, *u, "sgd_update", {});
    EXPECT_DOUBLE_EQ(Attr(*u, "weight_decay").f(), 0.01);
  }
  ExpectStepAndLr(p, 0.1);
  EXPECT_EQ(Attr(*OpsOfType(p, "lr_schedule")[0], "kind").s(), "constant");
  EXPECT_EQ(Attr(*OpsOfType(p, "lr_schedule")[0], "warmup_steps").i(), 0);
  // SGD keeps no state besides the step counter.
  for (const Var& v : p.var()) EXPECT_TRUE(v.kind() != STATE || v.name() == "@step") << v.name();
  ExpectNoTrainingOfFrozen(p);
  // Every optimizer op comes after the whole backward pass.
  int last_backward = -1, first_optimize = p.op_size();
  for (int i = 0; i < p.op_size(); ++i) {
    if (p.op(i).role() == BACKWARD) last_backward = i;
    if (p.op(i).role() == OPTIMIZE || p.op(i).role() == LR_SCHEDULE) first_optimize = std::min(first_optimize, i);
  }
  EXPECT_LT(last_backward, first_optimize);
}

TEST(OptimizerPassTest, NesterovMomentumKeepsAVelocityPerParameter) {
  Program p = CompileOne(
      R"pb(optimizer { momentum { learning_rate: 0.05 momentum: 0.9 nesterov: true } weight_decay: 1e-4 })pb");
  auto updates = Updates(p);
  ASSERT_EQ(updates.size(), 2u);
  for (const Op* u : updates) {
    ExpectUpdate(p, *u, "momentum_update", {"@velocity"});
    EXPECT_DOUBLE_EQ(Attr(*u, "momentum").f(), 0.9);
    EXPECT_TRUE(Attr(*u, "nesterov").b());
    EXPECT_DOUBLE_EQ(Attr(*u, "weight_decay").f(), 1e-4);
  }
  EXPECT_THAT(std::set<std::string>({updates[0]->input(0), updates[1]->input(0)}), UnorderedElementsAre("w", "b"));
  ExpectStepAndLr(p, 0.05);
  ExpectNoTrainingOfFrozen(p);
}

TEST(OptimizerPassTest, AdamAndAdamWKeepTwoMomentsAndTheirHyperparameters) {
  struct Case {
    const char* optimizer;
    double beta1, beta2, epsilon, weight_decay;
    bool decoupled;
  };
  const Case cases[] = {
      // Defaults when unset.
      {R"pb(optimizer { adam { learning_rate: 0.001 } })pb", 0.9, 0.999, 1e-8, 0.0, false},
      // adamw: decoupled weight decay.
      {R"pb(optimizer { adamw { learning_rate: 0.001 } weight_decay: 0.01 })pb", 0.9, 0.999, 1e-8, 0.01, true},
      // Explicit values, an explicit 0 included (not replaced by the default); adam: L2 on the gradient.
      {R"pb(optimizer { adam { learning_rate: 0.001 beta1: 0 beta2: 0.99 epsilon: 1e-6 } weight_decay: 0.5 })pb",
       0.0, 0.99, 1e-6, 0.5, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.optimizer);
    Program p = CompileOne(c.optimizer);
    auto updates = Updates(p);
    ASSERT_EQ(updates.size(), 2u);
    for (const Op* u : updates) {
      ExpectUpdate(p, *u, "adam_update", {"@moment1", "@moment2"});
      EXPECT_DOUBLE_EQ(Attr(*u, "beta1").f(), c.beta1);
      EXPECT_DOUBLE_EQ(Attr(*u, "beta2").f(), c.beta2);
      EXPECT_DOUBLE_EQ(Attr(*u, "epsilon").f(), c.epsilon);
      EXPECT_DOUBLE_EQ(Attr(*u, "weight_decay").f(), c.weight_decay);
      EXPECT_EQ(Attr(*u, "decoupled").b(), c.decoupled);
    }
    EXPECT_THAT(std::set<std::string>({updates[0]->input(0), updates[1]->input(0)}), UnorderedElementsAre("w", "b"));
    ExpectStepAndLr(p, 0.001);
    ExpectNoTrainingOfFrozen(p);
  }
}

TEST(OptimizerPassTest, LrScheduleCarriesWarmupAndDecay) {
  Program cosine = CompileOne(R"pb(optimizer {
    sgd { learning_rate: 0.1 } lr_schedule { warmup_steps: 10 cosine { decay_steps: 100 alpha: 0.05 } }
  })pb");
  ExpectStepAndLr(cosine, 0.1);
  const Op& c = *OpsOfType(cosine, "lr_schedule").at(0);
  EXPECT_EQ(Attr(c, "kind").s(), "cosine");
  EXPECT_EQ(Attr(c, "warmup_steps").i(), 10);
  EXPECT_EQ(Attr(c, "decay_steps").i(), 100);
  EXPECT_DOUBLE_EQ(Attr(c, "alpha").f(), 0.05);

  Program step = CompileOne(
      R"pb(optimizer { adam { learning_rate: 0.01 } lr_schedule { step_decay { step_size: 30 gamma: 0.5 } } })pb");
  ExpectStepAndLr(step, 0.01);
  const Op& s = *OpsOfType(step, "lr_schedule").at(0);
  EXPECT_EQ(Attr(s, "kind").s(), "step");
  EXPECT_EQ(Attr(s, "warmup_steps").i(), 0);
  EXPECT_EQ(Attr(s, "step_size").i(), 30);
  EXPECT_DOUBLE_EQ(Attr(s, "gamma").f(), 0.5);
}

// The updates read the raw gradients and the coefficient (attr grad_scale,
// apex's fused optimizers' folding of clipping): no clipped copies.
TEST(OptimizerPassTest, ClipGlobalNormScalesEveryGradientInItsUpdate) {
  Program p = CompileOne(R"pb(optimizer { momentum { learning_rate: 0.1 momentum: 0.9 } clip_global_norm: 1.5 })pb");
  auto sumsq = OpsOfType(p, "sum_squares");
  auto coef = OpsOfType(p, "clip_coefficient");
  ASSERT_EQ(sumsq.size(), 1u);
  ASSERT_EQ(coef.size(), 1u);
  // Over every trained gradient (not the frozen weight), once; one device: no allreduce.
  EXPECT_THAT(sumsq[0]->input(), UnorderedElementsAre("w@grad", "b@grad"));
  EXPECT_THAT(sumsq[0]->output(), ElementsAre("@grad_sumsq"));
  EXPECT_THAT(OpsOfType(p, "allreduce"), IsEmpty());
  EXPECT_THAT(coef[0]->input(), ElementsAre("@grad_sumsq"));
  EXPECT_THAT(coef[0]->output(), ElementsAre("@clip_coef"));
  EXPECT_DOUBLE_EQ(Attr(*coef[0], "max_norm").f(), 1.5);
  EXPECT_EQ(coef[0]->role(), OPTIMIZE);
  EXPECT_LT(IndexOf(p, sumsq[0]), IndexOf(p, coef[0]));
  auto updates = Updates(p);
  ASSERT_EQ(updates.size(), 2u);
  for (const Op* u : updates) {
    const std::string param = u->input(0);
    EXPECT_THAT(u->input(), ElementsAre(param, param + "@grad", param + "@velocity", "@lr.F64", "@clip_coef"));
    EXPECT_TRUE(Attr(*u, "grad_scale").b());
    EXPECT_LT(IndexOf(p, coef[0]), IndexOf(p, u));
  }
  EXPECT_THAT(OpsOfType(p, "mul"), IsEmpty());
  ExpectNoTrainingOfFrozen(p);
}

TEST(OptimizerPassTest, PipelineStagesAllreduceTheirPartialSumsOfSquares) {
  auto plans =
      CompilePipeline(TwoStagesProgram(R"pb(optimizer { sgd { learning_rate: 0.1 } clip_global_norm: 2.0 })pb"));
  ASSERT_EQ(plans.size(), 2u);
  const std::vector<std::vector<std::string>> own_grads = {{"w@grad", "b@grad"}, {"w2@grad"}};
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    const Program& p = plans[r].program();
    // Each rank has its own step counter and lr on its stage, and updates only its parameters.
    ExpectStepAndLr(p, 0.1);
    auto sumsq = OpsOfType(p, "sum_squares");
    auto allreduce = OpsOfType(p, "allreduce");
    auto coef = OpsOfType(p, "clip_coefficient");
    ASSERT_EQ(sumsq.size(), 1u);
    ASSERT_EQ(allreduce.size(), 1u);
    ASSERT_EQ(coef.size(), 1u);
    EXPECT_THAT(sumsq[0]->input(), ::testing::UnorderedElementsAreArray(own_grads[r]));
    EXPECT_THAT(allreduce[0]->input(), ElementsAre("@grad_sumsq"));
    EXPECT_THAT(allreduce[0]->output(), ElementsAre("@grad_sumsq.all"));
    // Over the rank's pipeline group, by its id in the plan's groups.
    ASSERT_TRUE(allreduce[0]->has_group());
    bool found = false;
    for (const CommGroup& g : plans[r].topology().group()) {
      if (g.id() != allreduce[0]->group()) continue;
      found = true;
      EXPECT_THAT(g.axis(), ElementsAre("pp"));
      EXPECT_THAT(g.rank(), ElementsAre(0, 1));
    }
    EXPECT_TRUE(found) << "group " << allreduce[0]->group();
    EXPECT_EQ(Attr(*allreduce[0], "op").s(), "sum");
    EXPECT_EQ(allreduce[0]->role(), OPTIMIZE);
    EXPECT_THAT(coef[0]->input(), ElementsAre("@grad_sumsq.all"));
    EXPECT_LT(IndexOf(p, sumsq[0]), IndexOf(p, allreduce[0]));
    EXPECT_LT(IndexOf(p, allreduce[0]), IndexOf(p, coef[0]));
    auto updates = Updates(p);
    ASSERT_EQ(updates.size(), own_grads[r].size());
    for (const Op* u : updates) {
      EXPECT_EQ(u->input(1), u->input(0) + "@grad");
      EXPECT_TRUE(Attr(*u, "grad_scale").b());
      EXPECT_EQ(u->input(3), "@clip_coef");
      EXPECT_EQ(u->stage(), r);
      EXPECT_EQ(u->device(), "gpu:" + std::to_string(r));
    }
    for (const Op& op : p.op()) EXPECT_EQ(op.stage(), r) << op.type();
  }
}

TEST(OptimizerPassTest, ATiedReplicaCountsZeroTowardsTheGlobalNorm) {
  auto plans = CompilePipeline(R"pb(
    var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "matmul" input: ["x", "w"] output: ["h"] device: "gpu:0" }
    op { type: "matmul" input: ["h", "w"] output: ["z"] device: "gpu:1" }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } clip_global_norm: 1.0 }
  )pb");
  ASSERT_EQ(plans.size(), 2u);
  const Program& home = plans[0].program();
  const Program& replica = plans[1].program();
  ASSERT_THAT(replica.tied_replica(), ElementsAre("w"));
  // Home counts w's (summed) gradient.
  auto home_sumsq = OpsOfType(home, "sum_squares");
  ASSERT_EQ(home_sumsq.size(), 1u);
  EXPECT_THAT(home_sumsq[0]->input(), ElementsAre("w@grad"));
  EXPECT_THAT(home_sumsq[0]->output(), ElementsAre("@grad_sumsq"));
  EXPECT_THAT(OpsOfType(home, "scale"), IsEmpty());
  // The replica joins the allreduce with zero.
  EXPECT_THAT(OpsOfType(replica, "sum_squares"), IsEmpty());
  auto zero = OpsOfType(replica, "fill_scalar");
  ASSERT_EQ(zero.size(), 1u);
  EXPECT_THAT(zero[0]->output(), ElementsAre("@grad_sumsq"));
  EXPECT_DOUBLE_EQ(Attr(*zero[0], "value").f(), 0.0);
  EXPECT_EQ(Attr(*zero[0], "dtype").s(), "F64");
  for (const Program* p : {&home, &replica}) {
    ASSERT_EQ(OpsOfType(*p, "allreduce").size(), 1u);
    EXPECT_THAT(OpsOfType(*p, "allreduce")[0]->input(), ElementsAre("@grad_sumsq"));
    auto updates = Updates(*p);
    ASSERT_EQ(updates.size(), 1u);
    EXPECT_THAT(updates[0]->input(), ElementsAre("w", "w@grad", "@lr.F64", "@clip_coef"));
  }
}

// A stage that trains nothing (only the loss) still joins the global norm's
// allreduce, with zero: otherwise the other stages wait for it forever.
TEST(OptimizerPassTest, AStageWithoutParametersJoinsTheNormAllreduce) {
  constexpr char kLossOnlyStage1[] = R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F32 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "matmul" input: ["x", "w"] output: ["z"] device: "gpu:0" }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
  )pb";
  auto plans = CompilePipeline(std::string(kLossOnlyStage1) +
                               R"pb(optimizer { sgd { learning_rate: 0.1 } clip_global_norm: 1.0 })pb");
  ASSERT_EQ(plans.size(), 2u);
  const Program& loss_stage = plans[1].program();
  EXPECT_THAT(Updates(loss_stage), IsEmpty());
  auto zero = OpsOfType(loss_stage, "fill_scalar");
  ASSERT_EQ(zero.size(), 1u);
  EXPECT_EQ(Attr(*zero[0], "dtype").s(), "F32");  // the dtype the other stage sums in
  for (const Program* p : {&plans[0].program(), &loss_stage}) {
    auto allreduce = OpsOfType(*p, "allreduce");
    ASSERT_EQ(allreduce.size(), 1u);
    EXPECT_THAT(allreduce[0]->input(), ElementsAre("@grad_sumsq"));
    EXPECT_EQ(allreduce[0]->role(), OPTIMIZE);
  }
  // Without clipping it has no optimizer ops at all.
  auto plain = CompilePipeline(std::string(kLossOnlyStage1) + kSgdOptimizer);
  ASSERT_EQ(plain.size(), 2u);
  for (const Op& op : plain[1].program().op()) EXPECT_NE(op.role(), OPTIMIZE) << op.type();
}

// F32 and F64 parameters: one sum of squares per dtype, both in F64, and the
// coefficient cast back for the F32 gradients.
TEST(OptimizerPassTest, ClippingMixedDtypesSumsPerDtypeInF64) {
  auto plans = CompilePipeline(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w32" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "w64" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "matmul" input: ["x", "w32"] output: ["h"] }
    op { type: "cast" input: ["h"] output: ["h64"] attr { key: "dtype" value { s: "F64" } } }
    op { type: "matmul" input: ["h64", "w64"] output: ["z"] }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } clip_global_norm: 1.0 }
  )pb");
  ASSERT_EQ(plans.size(), 1u);
  const Program& p = plans[0].program();
  auto sums = OpsOfType(p, "sum_squares");
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_THAT(sums[0]->input(), ElementsAre("w32@grad"));
  EXPECT_THAT(sums[0]->output(), ElementsAre("@grad_sumsq.F32"));
  EXPECT_THAT(sums[1]->input(), ElementsAre("w64@grad"));
  EXPECT_THAT(sums[1]->output(), ElementsAre("@grad_sumsq.F64"));
  auto add = OpsOfType(p, "add_n");
  const Op* total = nullptr;
  for (const Op* a : add) {
    if (a->output(0) == "@grad_sumsq") total = a;
  }
  ASSERT_NE(total, nullptr);
  EXPECT_THAT(total->input(), ElementsAre("@grad_sumsq.F32.F64", "@grad_sumsq.F64"));
  const Op* coef32 = nullptr;
  for (const Op* c : OpsOfType(p, "cast")) {
    if (c->input(0) == "@clip_coef") coef32 = c;
  }
  ASSERT_NE(coef32, nullptr);
  EXPECT_THAT(coef32->output(), ElementsAre("@clip_coef.F32"));
  for (const Op* m : OpsOfType(p, "mul")) {
    if (m->input(0) == "w32@grad") {
      EXPECT_EQ(m->input(1), "@clip_coef.F32");
    }
    if (m->input(0) == "w64@grad") {
      EXPECT_EQ(m->input(1), "@clip_coef");
    }
  }
}

// W = P + Q: both parameters' gradient is dW itself (shared, not copied).
// The norm counts it once per parameter; it is clipped once, both updates read it.
TEST(OptimizerPassTest, ParametersSharingAGradientAreClippedOnce) {
  auto plans = CompilePipeline(R"pb(
    var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "P" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "Q" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "add" input: ["P", "Q"] output: ["W"] }
    op { type: "matmul" input: ["x", "W"] output: ["z"] }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } clip_global_norm: 1.0 }
  )pb");
  ASSERT_EQ(plans.size(), 1u);
  const Program& p = plans[0].program();
  EXPECT_EQ(p.param_grad().at("P"), "W@grad");
  EXPECT_EQ(p.param_grad().at("Q"), "W@grad");
  auto sums = OpsOfType(p, "sum_squares");
  ASSERT_EQ(sums.size(), 1u);
  EXPECT_THAT(sums[0]->input(), ElementsAre("W@grad", "W@grad"));
  EXPECT_THAT(OpsOfType(p, "mul"), IsEmpty());
  auto updates = Updates(p);
  ASSERT_EQ(updates.size(), 2u);
  for (const Op* u : updates) EXPECT_THAT(u->input(), ElementsAre(u->input(0), "W@grad", "@lr.F64", "@clip_coef"));
}

// Run by hand on the program after autodiff.
TEST(OptimizerPassTest, RunsOnlyWithAnOptimizerAndLeavesAValidProgram) {
  CompileOptions options;
  options.dump_after = "autodiff";
  auto result = Compile(ParseProgramOrFail(std::string(kModel) + kSgdOptimizer, "opt.pbtxt"), Strategy(), options);
  ASSERT_TRUE(result.ok()) << result.status();
  const Program backward = result->dumped;
  ASSERT_THAT(Updates(backward), IsEmpty());

  Program without = backward;
  without.clear_optimizer();
  const Program before = without;
  auto unchanged = RunOnProgram(OptimizerPass(), without, CompileContext());
  ASSERT_TRUE(unchanged.ok()) << unchanged.status();
  EXPECT_FALSE(*unchanged);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(without, before));

  Program with = backward;
  auto changed = RunOnProgram(OptimizerPass(), with, CompileContext());
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_TRUE(VerifyProgram(with).ok()) << VerifyProgram(with);
  EXPECT_EQ(Updates(with).size(), 2u);
  for (int i = 0; i < backward.op_size(); ++i) {  // only appended
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(with.op(i), backward.op(i))) << i;
  }
  ExpectStepAndLr(with, 0.1);
}

// param_grad comes from autodiff; entries that name no parameter, or a
// parameter nothing reads, are a compiler bug the pass reports, not a crash.
TEST(OptimizerPassTest, GradientsOfNoParameterAreAnInternalError) {
  CompileOptions options;
  options.dump_after = "autodiff";
  auto result = Compile(ParseProgramOrFail(std::string(kModel) + kSgdOptimizer, "opt.pbtxt"), Strategy(), options);
  ASSERT_TRUE(result.ok()) << result.status();

  Program feed_only = result->dumped;
  feed_only.clear_param_grad();
  (*feed_only.mutable_param_grad())["x"] = "xw";  // a feed, not a parameter
  auto s = RunOnProgram(OptimizerPass(), feed_only, CompileContext());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("param_grad names no parameter"));

  Program unread = result->dumped;
  for (Op& op : *unread.mutable_op()) {
    for (auto& in : *op.mutable_input()) {
      if (in == "b") in = "x";  // b's gradient stays, its reader is gone
    }
  }
  s = RunOnProgram(OptimizerPass(), unread, CompileContext());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("parameter 'b' has a gradient but no reader"));
}

}  // namespace
}  // namespace strata
