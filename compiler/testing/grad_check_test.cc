// The harness itself: RunOps reports what is wrong, and CheckGradient accepts
// a right gradient and rejects a wrong one. Uses ops registered only here.

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "compiler/op_registry.h"
#include "compiler/testing/grad_check.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// y = x * x * c; its gradient emits test_square_grad (dx = factor * c * x * dy):
// factor 2 is right, test_bad_square's factor 3 is wrong.
absl::Status SquareGrad(GradBuilder& g, double factor) {
  if (!g.needs_input_grad(0)) return absl::OkStatus();
  auto attrs = g.ForwardAttrs();
  attrs["factor"] = FloatAttr(factor);
  g.Emit("test_square_grad", {g.input(0), g.output_grad(0)}, {g.input_grad(0)}, attrs);
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("test_square").Input("x").Output("y").Attr("c", 1.0)
                       .Shape(SameAsInput(0)).Grad([](GradBuilder& g) { return SquareGrad(g, 2); }));
STRATA_REGISTER_OP(OpDef("test_bad_square").Input("x").Output("y").Attr("c", 1.0)
                       .Shape(SameAsInput(0)).Grad([](GradBuilder& g) { return SquareGrad(g, 3); }));
STRATA_REGISTER_OP(OpDef("test_square_grad").Input("x").Input("dy").Output("dx").Attr("c", 1.0)
                       .Attr("factor", 2.0).Shape(SameAsInput(0)).NotDifferentiable());

class SquareKernel : public OpKernel {
 public:
  explicit SquareKernel(const KernelDef& def)
      : c_(*AttrFloat(*def.op, "c")), grad_(def.op->type() == "test_square_grad"),
        factor_(grad_ ? *AttrFloat(*def.op, "factor") : 0) {}
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    auto y = ctx.AllocateOutput(0, F64, x.shape());
    if (!y.ok()) return y.status();
    for (int64_t i = 0; i < x.num_elements(); ++i) {
      double v = x.data<double>()[i];
      (*y)->data<double>()[i] = grad_ ? factor_ * c_ * v * ctx.input(1).data<double>()[i] : c_ * v * v;
    }
    return absl::OkStatus();
  }

 private:
  double c_;
  bool grad_;
  double factor_;
};

STRATA_REGISTER_KERNEL("test_square", DEVICE_CPU, F64, MakeFactory<SquareKernel>());
STRATA_REGISTER_KERNEL("test_bad_square", DEVICE_CPU, F64, MakeFactory<SquareKernel>());
STRATA_REGISTER_KERNEL("test_square_grad", DEVICE_CPU, F64, MakeFactory<SquareKernel>());

TEST(RunOps, RunsTheKernelWithAttrDefaults) {
  std::map<std::string, Tensor> env{{"x", MakeTensor(F64, {3}, {1, -2, 0.5})}};
  ASSERT_TRUE(RunOps({ParseOp(R"pb(type: "test_square" input: "x" output: "y")pb")}, &env).ok());
  EXPECT_TRUE(TensorNear(env["y"], {3}, {1, 4, 0.25}, 0));
  ASSERT_TRUE(RunOps({ParseOp(R"pb(type: "test_square" input: "y" output: "z"
                                   attr { key: "c" value { f: 2 } })pb")}, &env).ok());
  EXPECT_TRUE(TensorNear(env["z"], {3}, {2, 32, 0.125}, 0));
}

TEST(RunOps, NamesAMissingInput) {
  std::map<std::string, Tensor> env;
  absl::Status s = RunOps({ParseOp(R"pb(type: "test_square" input: "nope" output: "y")pb")}, &env);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "'nope' is not defined")) << s.message();
}

TEST(RunOps, NamesAMissingKernelDtype) {
  std::map<std::string, Tensor> env{{"x", MakeTensor(F32, {1}, {1})}};
  absl::Status s = RunOps({ParseOp(R"pb(type: "test_square" input: "x" output: "y")pb")}, &env);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(s.message(), "no cpu kernel for dtype F32 (registered: F64)")) << s.message();
}

TEST(RunOps, RejectsAnUnknownOp) {
  std::map<std::string, Tensor> env;
  EXPECT_FALSE(RunOps({ParseOp(R"pb(type: "no_such_op")pb")}, &env).ok());
}

TEST(MakeGradOps, NamesGradientsAndFillsDefaults) {
  Op op = ParseOp(R"pb(type: "test_square" input: "x" output: "y" uid: 7)pb");
  std::vector<std::string> names;
  auto ops = MakeGradOps(op, {{"x", {F64, {3}}}, {"y", {F64, {3}}}}, {true}, &names);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 1u);
  const Op& g = (*ops)[0];
  EXPECT_EQ(g.type(), "test_square_grad");
  EXPECT_EQ(g.input(1), "y@grad");
  EXPECT_EQ(g.output(0), "x@grad");
  EXPECT_EQ(g.uid(), 7);
  EXPECT_EQ(g.role(), BACKWARD);
  EXPECT_EQ(g.attr().at("c").f(), 1.0);  // the forward op's default, filled in
  EXPECT_EQ(names, std::vector<std::string>{"x@grad"});
}

TEST(CheckGradient, AcceptsARightGradient) {
  GradCheckCase c{"square", R"pb(type: "test_square" input: "x" output: "y" attr { key: "c" value { f: 1.5 } })pb",
                  {{"x", F64, {2, 3}, -2, 2}}};
  absl::Status s = CheckGradient(c);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(CheckGradient, RejectsAWrongGradientNamingTheElement) {
  GradCheckCase c{"bad_square", R"pb(type: "test_bad_square" input: "x" output: "y")pb",
                  {{"x", F64, {2}, -1, 1, {0.5, -0.25}}}};
  absl::Status s = CheckGradient(c);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "grad check 'bad_square'")) << s.message();
  EXPECT_TRUE(absl::StrContains(s.message(), "2 gradient element(s) off")) << s.message();
  EXPECT_TRUE(absl::StrContains(s.message(), "input 'x'")) << s.message();
}

TEST(CheckGradient, RejectsACaseWithoutTheOpsInputs) {
  GradCheckCase c{"typo", R"pb(type: "test_square" input: "x" output: "y")pb", {{"z", F64, {2}}}};
  EXPECT_FALSE(CheckGradient(c).ok());
}

}  // namespace
}  // namespace strata
