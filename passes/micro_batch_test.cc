#include "passes/micro_batch.h"

#include <string>
#include <vector>

#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "gtest/gtest.h"
#include "passes/testing/pass_test_util.h"

namespace strata {
namespace {

TEST(MicroBatchPassTest, WeightGradientsAccumulateInTheGemm) {
  auto plans = CompilePipeline(TwoStagesProgram(), 3);
  ASSERT_EQ(plans.size(), 2u);
  const Program& stage0 = plans[0].program();
  // w's gradient is x^T @ dxw, added into its buffer by the GEMM: one op in
  // backward, the buffer zeroed after the update, no gradient tensor.
  std::vector<const Op*> w = OpsWriting(stage0, "w@grad@acc");
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0]->type(), "matmul_accumulate");
  EXPECT_EQ(w[0]->role(), BACKWARD);
  ASSERT_EQ(w[0]->input_size(), 3);
  EXPECT_EQ(w[0]->input(0), "x");
  EXPECT_EQ(w[0]->input(2), "w@grad@acc");
  EXPECT_TRUE(w[0]->attr().at("transpose_a").b());
  EXPECT_EQ(w[1]->type(), "fill_zero");
  EXPECT_EQ(w[1]->role(), OPTIMIZE);
  EXPECT_FALSE(HasVar(stage0, "w@grad"));
  // The update reads the buffer.
  bool update_reads_buffer = false;
  for (const Op& op : stage0.op()) {
    if (op.type() == "sgd_update" && op.input(0) == "w") update_reads_buffer = op.input(1) == "w@grad@acc";
  }
  EXPECT_TRUE(update_reads_buffer);
  // b's gradient (a sum over the batch, not a GEMM) still accumulates apart.
  std::vector<const Op*> b = OpsWriting(stage0, "b@grad@acc");
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0]->type(), "accumulate");
  EXPECT_TRUE(HasVar(stage0, "b@grad"));
  // The buffers are scratch (zero at every step boundary, never
  // checkpointed); the optimizer's state stays STATE.
  for (const Var& v : stage0.var()) {
    if (v.name() == "w@grad@acc" || v.name() == "b@grad@acc") {
      EXPECT_EQ(v.kind(), SCRATCH) << v.name();
    }
  }
  // The head's weight on stage 1 too.
  std::vector<const Op*> w2 = OpsWriting(plans[1].program(), "w2@grad@acc");
  ASSERT_FALSE(w2.empty());
  EXPECT_EQ(w2[0]->type(), "matmul_accumulate");
}

TEST(MicroBatchPassTest, OneMicroBatchKeepsTheGradients) {
  auto plans = CompilePipeline(TwoStagesProgram(), 1);
  ASSERT_EQ(plans.size(), 2u);
  for (const RankPlan& plan : plans) {
    for (const Op& op : plan.program().op()) {
      EXPECT_NE(op.type(), "matmul_accumulate");
      EXPECT_NE(op.type(), "accumulate");
    }
  }
  EXPECT_TRUE(HasVar(plans[0].program(), "w@grad"));
}

TEST(MicroBatchPassTest, BatchedWeightGradientsStayUnfused) {
  // x [-1, 2, 4] @ w: w's gradient sums over two batch dims
  // (matmul_shared_b_grad_b), which matmul_accumulate does not do.
  const std::string text = R"pb(
    var { name: "x" dtype: F64 shape: [-1, 2, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F64 shape: [4, 5] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "w2" dtype: F64 shape: [10, 3] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "matmul" input: ["x", "w"] output: ["h"] device: "gpu:0" }
    op { type: "flatten" input: ["h"] output: ["hf"] device: "gpu:1" }
    op { type: "matmul" input: ["hf", "w2"] output: ["z"] device: "gpu:1" }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  auto plans = CompilePipeline(text, 3);
  ASSERT_EQ(plans.size(), 2u);
  std::vector<const Op*> w = OpsWriting(plans[0].program(), "w@grad@acc");
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0]->type(), "accumulate");
  EXPECT_EQ(OpsWriting(plans[0].program(), "w@grad")[0]->type(), "matmul_shared_b_grad_b");
}

// Built by hand: a gradient that a backward op reads as well keeps its tensor.
TEST(MicroBatchPassTest, AGradientReadInBackwardIsNotFused) {
  for (bool read_in_backward : {false, true}) {
    SCOPED_TRACE(read_in_backward ? "read in backward" : "read by the update only");
    std::string text = R"pb(
      var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
      var { name: "w" dtype: F64 shape: [4, 3] kind: PARAM }
      var { name: "@lr" dtype: F64 shape: [] kind: STATE }
      var { name: "y" dtype: F64 shape: [-1, 3] kind: ACTIVATION }
      var { name: "dy" dtype: F64 shape: [-1, 3] kind: ACTIVATION }
      var { name: "w@grad" dtype: F64 shape: [4, 3] kind: ACTIVATION }
      op { type: "matmul" input: ["x", "w"] output: ["y"] role: FORWARD
           attr { key: "transpose_a" value { b: false } } attr { key: "transpose_b" value { b: false } } }
      op { type: "scale" input: ["y"] output: ["dy"] role: BACKWARD
           attr { key: "scale" value { f: 2 } } attr { key: "bias" value { f: 0 } } }
      op { type: "matmul" input: ["x", "dy"] output: ["w@grad"] role: BACKWARD
           attr { key: "transpose_a" value { b: true } } attr { key: "transpose_b" value { b: false } } }
      op { type: "sgd_update" input: ["w", "w@grad", "@lr"] output: ["w"] role: OPTIMIZE
           attr { key: "weight_decay" value { f: 0 } } }
    )pb";
    if (read_in_backward) {
      text += R"pb(
        var { name: "w@grad@sq" dtype: F64 shape: [4, 3] kind: ACTIVATION }
        op { type: "mul" input: ["w@grad", "w@grad"] output: ["w@grad@sq"] role: BACKWARD }
      )pb";
    }
    auto program = ParseProgramText(text, "hand.pbtxt");
    ASSERT_TRUE(program.ok()) << program.status();
    CompileContext ctx;
    ctx.micro_batches = 2;
    auto changed = RunOnProgram(MicroBatchPass(), *program, ctx);
    ASSERT_TRUE(changed.ok()) << changed.status();
    EXPECT_TRUE(*changed);
    ASSERT_TRUE(VerifyProgram(*program).ok()) << VerifyProgram(*program);
    std::vector<const Op*> writers = OpsWriting(*program, "w@grad@acc");
    ASSERT_EQ(writers.size(), 2u);
    EXPECT_EQ(writers[0]->type(), read_in_backward ? "accumulate" : "matmul_accumulate");
    EXPECT_EQ(HasVar(*program, "w@grad"), read_in_backward);
  }
}

}  // namespace
}  // namespace strata
