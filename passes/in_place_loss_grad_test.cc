#include "passes/in_place_loss_grad.h"

#include <algorithm>
#include <string>
#include <vector>

#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"

namespace strata {
namespace {

// A program as autodiff leaves it: logits, the loss, its seed and the
// loss gradient, plus `extra` ops.
std::string AfterAutodiff(const std::string& extra, const std::string& logits_from = "matmul") {
  std::string producer =
      logits_from == "matmul"    ? R"pb(op { type: "matmul" input: ["x", "w"] output: ["logits"] role: FORWARD })pb"
      : logits_from == "reshape" ? R"pb(op { type: "matmul" input: ["x", "w"] output: ["z"] role: FORWARD }
                                        op { type: "reshape" input: ["z"] output: ["logits"] role: FORWARD
                                             attr { key: "shape" value { list { i: [-1, 3] } } } })pb"
                                 : R"pb(op { type: "matmul" input: ["x", "w"] output: ["z"] role: FORWARD }
                                        op { type: "cast" input: ["z"] output: ["logits"] role: FORWARD
                                             attr { key: "dtype" value { s: "F32" } } })pb";
  return std::string(R"pb(
           var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
           var { name: "label" dtype: I64 shape: [-1] kind: FEED }
           var { name: "w" dtype: F32 shape: [4, 3] kind: PARAM }
           var { name: "z" dtype: F32 shape: [-1, 3] }
           var { name: "logits" dtype: F32 shape: [-1, 3] }
           var { name: "loss" dtype: F32 shape: [] }
           var { name: "loss@grad" dtype: F32 shape: [] }
           var { name: "logits@grad" dtype: F32 shape: [-1, 3] }
           var { name: "later" dtype: F32 shape: [-1, 3] }
         )pb") +
         producer + R"pb(
           op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] role: LOSS }
           op { type: "fill_like" input: ["loss"] output: ["loss@grad"] role: BACKWARD
                attr { key: "value" value { f: 1 } } }
           op { type: "softmax_cross_entropy_grad" input: ["logits", "label", "loss@grad"]
                output: ["logits@grad"] role: BACKWARD }
         )pb" +
         extra + R"pb( loss: "loss" )pb";
}

bool InPlace(const Program& p) {
  for (const Op& op : p.op()) {
    if (op.type() != "softmax_cross_entropy_grad") continue;
    auto it = op.attr().find("in_place");
    return it != op.attr().end() && it->second.b();
  }
  ADD_FAILURE() << "no softmax_cross_entropy_grad";
  return false;
}

bool RunPass(Program& p) {
  auto changed = RunOnProgram(InPlaceLossGradPass(), p, CompileContext());
  EXPECT_TRUE(changed.ok()) << changed.status();
  return changed.ok() && *changed;
}

TEST(InPlaceLossGradTest, MarksTheGradientWhereItIsTheLogitsLastReader) {
  Program p = ParseProgramOrFail(AfterAutodiff(""));
  EXPECT_TRUE(RunPass(p));
  EXPECT_TRUE(InPlace(p));
  EXPECT_FALSE(RunPass(p)) << "idempotent";
}

TEST(InPlaceLossGradTest, LeavesLogitsReadLaterReportedOrAViewAlone) {
  Program read_later = ParseProgramOrFail(
      AfterAutodiff(R"pb(op { type: "relu" input: ["logits"] output: ["later"] role: BACKWARD })pb"));
  EXPECT_FALSE(RunPass(read_later));
  EXPECT_FALSE(InPlace(read_later));
  Program fetched = ParseProgramOrFail(AfterAutodiff(R"pb(fetch: "logits")pb"));
  EXPECT_FALSE(RunPass(fetched));
  Program view = ParseProgramOrFail(AfterAutodiff("", "reshape"));
  EXPECT_FALSE(RunPass(view)) << "the logits share z's buffer";
  // A same-dtype cast hands its input's buffer on (so would an identity
  // dropout): neither as the logits' producer nor as an earlier reader.
  Program cast_producer = ParseProgramOrFail(AfterAutodiff("", "cast"));
  EXPECT_FALSE(RunPass(cast_producer)) << "the logits share z's buffer through the cast";
  Program cast_reader = ParseProgramOrFail(AfterAutodiff(
      R"pb(op { type: "cast" input: ["logits"] output: ["later"] role: FORWARD
                attr { key: "dtype" value { s: "F32" } } })pb"));
  EXPECT_FALSE(RunPass(cast_reader)) << "'later' may be the logits' buffer";
}

// A program may not set in_place itself: only the compiler can prove the
// overwritten input is read no more.
TEST(InPlaceLossGradTest, AProgramMayNotSetIt) {
  const std::string text = R"pb(
    var { name: "x" dtype: F32 shape: [-1, 3] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "dloss" dtype: F32 shape: [] kind: FEED }
    op { type: "softmax_cross_entropy_grad" input: ["x", "label", "dloss"] output: ["dx"]
         attr { key: "in_place" value { b: true } } }
    op { type: "reduce_sum" input: ["dx"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  auto program = ParseProgramText(text, "user.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  auto compiled = Compile(*program, Strategy(), CompileOptions());
  ASSERT_FALSE(compiled.ok());
  EXPECT_NE(std::string(compiled.status().message()).find("attr 'in_place' is written by the compiler"),
            std::string::npos)
      << compiled.status();
}

TEST(InPlaceLossGradTest, RunsAfterAutodiffAndRecomputeOnEveryPlan) {
  Strategy recompute;
  recompute.mutable_recompute()->add_checkpoints("h1");
  for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
    const std::vector<std::string> names = CompilePassNames(recompute, device);
    auto pass = std::find(names.begin(), names.end(), "in-place-loss-gradient");
    ASSERT_NE(pass, names.end());
    EXPECT_LT(std::find(names.begin(), names.end(), "recompute"), pass);
  }
}

}  // namespace
}  // namespace strata
