#include "analysis/cost_model.h"

#include <memory>
#include <string>
#include <vector>

#include "compiler/autodiff.h"
#include "compiler/graph.h"
#include "compiler/op_registry.h"
#include "compiler/validate.h"
#include "gtest/gtest.h"
#include "passes/testing/pass_test_util.h"

namespace strata {
namespace {

// Parsed, validated and with its types inferred.
Program Parse(const std::string& text) {
  Program program = ParseProgramOrFail(text, "cost.pbtxt");
  absl::Status valid = ValidateAndInferProgram(&program);
  EXPECT_TRUE(valid.ok()) << valid;
  return program;
}

std::unique_ptr<Graph> ToGraph(const Program& p) {
  auto graph = Graph::FromProgram(p);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return graph.ok() ? *std::move(graph) : std::make_unique<Graph>();
}

// The cost of the op at program position i.
double CostOfOp(const Program& p, int i, int64_t batch) {
  std::unique_ptr<Graph> graph = ToGraph(p);
  return EstimateOpCost(*graph, graph->ops().at(i), batch);
}

TEST(CostModelTest, MatmulCountsMultiplyAddsAndBytes) {
  Program p = Parse(R"pb(
    var { name: "x" dtype: F64 shape: [-1, 3] kind: FEED }
    var { name: "w" dtype: F64 shape: [3, 4] kind: PARAM }
    op { type: "matmul" input: ["x", "w"] output: ["y"] }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
  // 2 x 5 x 3 x 4 FLOPs; (15 + 12 + 20) doubles moved.
  EXPECT_DOUBLE_EQ(CostOfOp(p, 0, 5), 120 + kBytesWeight * 47 * 8);
}

TEST(CostModelTest, ConvolutionCountsEachOutputsWindow) {
  Program p = Parse(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 2, 5, 5] kind: FEED }
    var { name: "w" dtype: F32 shape: [4, 2, 3, 3] kind: PARAM }
    op { type: "conv2d" input: ["x", "w"] output: ["y"] }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
  // y is [1, 4, 3, 3]: 36 outputs x 18 multiply-adds; 50 + 72 + 36 floats moved.
  EXPECT_DOUBLE_EQ(CostOfOp(p, 0, 1), 2 * 36 * 18 + kBytesWeight * (50 + 72 + 36) * 4);
}

// An op whose cost function counts 7 FLOPs per element of its input: the
// model takes the schema's count, whatever the op is called.
STRATA_REGISTER_OP(OpDef("cost_model_test_op")
                       .Input("x")
                       .Output("y")
                       .Shape(SameAsInput(0))
                       .Cost([](const CostContext& c) { return 7 * ElementCount(c.input(0)); })
                       .NotDifferentiable());

TEST(CostModelTest, AnOpIsCostedByItsSchemasCostFunction) {
  Program p = Parse(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 3] kind: FEED }
    op { type: "cost_model_test_op" input: ["x"] output: ["h"] }
    op { type: "relu" input: ["h"] output: ["y"] }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] }
    loss: "loss"
  )pb");
  // The batch dim is resolved before the cost function sees the type: 7 x 2 x 3.
  EXPECT_DOUBLE_EQ(CostOfOp(p, 0, 2), 7 * 6 + kBytesWeight * (6 + 6) * 4);
  // relu has no cost function: only its bytes count.
  EXPECT_DOUBLE_EQ(CostOfOp(p, 1, 2), kBytesWeight * (6 + 6) * 4);
}

// The FLOPs of op `type` on these types, from its schema alone.
double Flops(const std::string& type, std::vector<TensorType> ins, std::vector<TensorType> outs) {
  const OpSchema* schema = OpRegistry::Global().Find(type);
  EXPECT_NE(schema, nullptr) << type;
  if (schema == nullptr || !schema->cost_fn) {
    ADD_FAILURE() << type << " has no cost function";
    return -1;
  }
  Op op;
  op.set_type(type);
  return schema->cost_fn(CostContext(op, std::move(ins), std::move(outs)));
}

TEST(CostModelTest, MatmulGradientsCostTheForwardsMultiplyAdds) {
  // y [B=2, M=5, N=4] = a [2, 5, K=3] @ b [3, 4] shared over a's batch.
  const TensorType a{F32, {2, 5, 3}}, b{F32, {3, 4}}, y{F32, {2, 5, 4}};
  const double forward = 2 * 2 * 5 * 3 * 4;
  EXPECT_DOUBLE_EQ(Flops("matmul", {a, b}, {y}), forward);
  EXPECT_DOUBLE_EQ(Flops("matmul_shared_b_grad_a", {y, b}, {a}), forward);
  EXPECT_DOUBLE_EQ(Flops("matmul_shared_b_grad_b", {a, y}, {b}), forward);
  // The weight gradient's GEMM and the bias's sum over dy (one add per element).
  EXPECT_DOUBLE_EQ(Flops("matmul_bias_grad_b", {a, y}, {b, TensorType{F32, {4}}}), forward + 2 * 5 * 4);
  const TensorType a2{F32, {5, 3}}, y2{F32, {5, 4}};
  EXPECT_DOUBLE_EQ(Flops("matmul_accumulate", {a2, b, y2}, {y2}), 2 * 5 * 3 * 4);
}

TEST(CostModelTest, ConvolutionGradientsCostTheForwardsMultiplyAdds) {
  // x [2, 2, 5, 5] with w [4, 2, 3, 3]: y [2, 4, 3, 3], 72 outputs x 18 multiply-adds.
  const TensorType x{F32, {2, 2, 5, 5}}, w{F32, {4, 2, 3, 3}}, y{F32, {2, 4, 3, 3}};
  const double forward = 2 * 72 * 18;
  EXPECT_DOUBLE_EQ(Flops("conv2d", {x, w}, {y}), forward);
  EXPECT_DOUBLE_EQ(Flops("conv2d_grad_input", {y, w}, {x}), forward);
  EXPECT_DOUBLE_EQ(Flops("conv2d_grad_filter", {x, y}, {w}), forward);
}

// B = 2, H = 3, T = 5, D = 4 in either layout: the same pairs (causal: 15 of
// 25) and the same products, 2 GEMMs forward and 5 backward.
TEST(CostModelTest, AttentionCostsTheSameInBothLayouts) {
  for (const char* layout : {"bhtd", "bthd"}) {
    SCOPED_TRACE(layout);
    const bool bthd = std::string(layout) == "bthd";
    const TensorType q{F32, bthd ? Shape{2, 5, 3, 4} : Shape{2, 3, 5, 4}};
    const TensorType lse{F32, {2, 3, 5}};
    for (const char* type : {"scaled_dot_product_attention", "scaled_dot_product_attention_grad"}) {
      const bool grad = std::string(type) == "scaled_dot_product_attention_grad";
      const OpSchema* schema = OpRegistry::Global().Find(type);
      ASSERT_NE(schema, nullptr);
      Op op;
      op.set_type(type);
      (*op.mutable_attr())["causal"].set_b(true);
      (*op.mutable_attr())["layout"].set_s(layout);
      std::vector<TensorType> ins = {q, q, q};
      if (grad) ins = {q, q, q, q, lse, q};
      const std::vector<TensorType> outs = grad ? std::vector<TensorType>{q, q, q} : std::vector<TensorType>{q, lse};
      EXPECT_DOUBLE_EQ(schema->cost_fn(CostContext(op, ins, outs)), (grad ? 5 : 2) * 2 * 2 * 3 * 15 * 4) << type;
    }
  }
}

TEST(CostModelTest, BackwardOfAMatmulChainCostsAboutTwiceItsForward) {
  Program p = Parse(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 256] kind: FEED }
    var { name: "w0" dtype: F32 shape: [256, 256] kind: PARAM }
    var { name: "w1" dtype: F32 shape: [256, 256] kind: PARAM }
    op { type: "matmul" input: ["x", "w0"] output: ["h"] }
    op { type: "matmul" input: ["h", "w1"] output: ["y"] }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
  ASSERT_TRUE(AppendBackward(&p).ok());
  ActionCosts c = EstimateActionCosts(*ToGraph(p), 64);
  EXPECT_GT(c.forward, 0);
  // x needs no gradient: 3 gradient matmuls against 2 forward ones.
  EXPECT_GT(c.backward / c.forward, 1.3);
  EXPECT_LT(c.backward / c.forward, 2.5);
}

}  // namespace
}  // namespace strata
