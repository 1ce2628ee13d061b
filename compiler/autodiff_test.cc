#include "compiler/autodiff.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// Stages are resolved from "gpu:N" devices as the placement pass (passes/)
// would (a program may not set them itself).
Program Differentiate(const std::string& text) {
  auto program = ParseProgramText(text, "test.pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  auto s = ValidateAndInferProgram(&*program);
  EXPECT_TRUE(s.ok()) << s;
  for (Op& op : *program->mutable_op()) {
    int stage = 0;
    if (absl::StartsWith(op.device(), "gpu:")) EXPECT_TRUE(absl::SimpleAtoi(op.device().substr(4), &stage));
    op.set_stage(stage);
  }
  s = AppendBackward(&*program);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(VerifyProgram(*program).ok()) << VerifyProgram(*program);
  return *program;
}

int CountOps(const Program& p, const std::string& type, OpRole role) {
  int n = 0;
  for (const Op& op : p.op()) n += op.type() == type && op.role() == role;
  return n;
}

TEST(AutodiffTest, SumsGradientsOfAVarUsedTwice) {
  Program p = Differentiate(R"pb(
    var { name: "x" dtype: F64 shape: [-1, 3] kind: FEED }
    var { name: "w" dtype: F64 shape: [3, 3] kind: PARAM }
    op { type: "matmul" input: ["x", "w"] output: ["h"] }
    op { type: "matmul" input: ["h", "w"] output: ["y"] }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
  EXPECT_EQ(CountOps(p, "add_n", BACKWARD), 1);
  ASSERT_EQ(p.param_grad().size(), 1u);
  EXPECT_EQ(p.param_grad().at("w"), "w@grad");
}

// A residual cut: h, made on stage 0, is read twice on stage 1. Its gradient
// parts are both made on stage 1 and are summed there, so a pipeline sends
// one gradient back across the cut, not each part.
TEST(AutodiffTest, SumsGradientPartsOnTheStageThatMakesThem) {
  Program p = Differentiate(R"pb(
    var { name: "x" dtype: F64 shape: [-1, 3] kind: FEED }
    var { name: "w0" dtype: F64 shape: [3, 3] kind: PARAM }
    var { name: "w1" dtype: F64 shape: [3, 3] kind: PARAM }
    op { type: "matmul" input: ["x", "w0"] output: ["h"] device: "gpu:0" }
    op { type: "matmul" input: ["h", "w1"] output: ["a"] device: "gpu:1" }
    op { type: "add" input: ["h", "a"] output: ["y"] device: "gpu:1" }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
  int sums = 0;
  for (const Op& op : p.op()) {
    if (op.type() != "add_n" || op.output(0) != "h@grad") continue;
    ++sums;
    EXPECT_EQ(op.stage(), 1);
    EXPECT_EQ(op.device(), "gpu:1");
    EXPECT_EQ(op.role(), BACKWARD);
  }
  EXPECT_EQ(sums, 1);
}

TEST(AutodiffTest, ComputesOnlyWhatParametersNeed) {
  // No gradient for the feed x and none through the frozen parameter's branch.
  Program p = Differentiate(R"pb(
    var { name: "x" dtype: F64 shape: [-1, 3] kind: FEED }
    var { name: "w" dtype: F64 shape: [3, 3] kind: PARAM }
    var { name: "frozen" dtype: F64 shape: [3, 3] kind: PARAM frozen: true }
    op { type: "matmul" input: ["x", "frozen"] output: ["a"] }
    op { type: "matmul" input: ["a", "w"] output: ["y"] }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
  for (const Var& v : p.var()) {
    EXPECT_NE(v.name(), "x@grad");
    EXPECT_NE(v.name(), "a@grad");
    EXPECT_NE(v.name(), "frozen@grad");
  }
  EXPECT_EQ(p.param_grad().count("frozen"), 0u);
  EXPECT_EQ(p.param_grad().count("w"), 1u);
  // The first matmul feeds no trainable parameter: it is not differentiated.
  int backward_matmuls = CountOps(p, "matmul", BACKWARD);
  EXPECT_EQ(backward_matmuls, 1);
}

TEST(AutodiffTest, BackwardOpsKeepTheForwardStageAndUid) {
  Program p = Differentiate(R"pb(
    var { name: "x" dtype: F64 shape: [-1, 3] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w0" dtype: F64 shape: [3, 3] kind: PARAM }
    var { name: "w1" dtype: F64 shape: [3, 2] kind: PARAM }
    op { type: "matmul" input: ["x", "w0"] output: ["h"] device: "gpu:0" }
    op { type: "matmul" input: ["h", "w1"] output: ["logits"] device: "gpu:1" }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
  for (const Op& op : p.op()) {
    if (op.role() != BACKWARD) continue;
    if (op.uid() == 0) {
      EXPECT_EQ(op.stage(), 0) << op.type();
    }
    if (op.uid() >= 1) {
      EXPECT_EQ(op.stage(), 1) << op.type();
    }
  }
}

TEST(AutodiffTest, StopsAtNonDifferentiableOps) {
  Program p = Differentiate(R"pb(
    var { name: "x" dtype: F64 shape: [-1, 3] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F64 shape: [3, 3] kind: PARAM }
    op { type: "matmul" input: ["x", "w"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
    op { type: "accuracy" input: ["logits", "label"] output: ["acc"] }
    loss: "loss"
    fetch: "acc"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
  EXPECT_EQ(p.param_grad().at("w"), "w@grad");
  for (const Var& v : p.var()) EXPECT_NE(v.name(), "label@grad");
}

// A value cast to BF16 and back (mixed precision's round trip) passes the
// gradient on: w is trained through it. Before, only F32/F64 outputs were
// marked as needing a gradient, so w silently got none.
TEST(AutodiffTest, GradientsFlowThroughHalfPrecisionCasts) {
  for (const char* half : {"BF16", "F16"}) {
    Program p = Differentiate(absl::StrCat(R"pb(
      var { name: "x" dtype: F32 shape: [-1, 3] kind: FEED }
      var { name: "w" dtype: F32 shape: [3, 3] kind: PARAM }
      op { type: "matmul" input: ["x", "w"] output: ["h"] }
      op { type: "cast" input: ["h"] output: ["h16"] attr { key: "dtype" value { s: ")pb", half, R"pb(" } } }
      op { type: "cast" input: ["h16"] output: ["h32"] attr { key: "dtype" value { s: "F32" } } }
      op { type: "reduce_mean" input: ["h32"] output: ["loss"] }
      loss: "loss"
      optimizer { sgd { learning_rate: 0.1 } }
    )pb"));
    ASSERT_TRUE(p.param_grad().contains("w")) << half;
    EXPECT_EQ(CountOps(p, "cast", BACKWARD), 2) << half;  // F32 -> half -> F32 on the way back
  }
}

}  // namespace
}  // namespace strata
