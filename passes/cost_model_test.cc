#include "passes/cost_model.h"

#include "absl/container/flat_hash_map.h"
#include "compiler/autodiff.h"
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

double CostOfOp(const Program& p, int i, int64_t batch) {
  absl::flat_hash_map<std::string, const Var*> vars;
  for (const Var& v : p.var()) vars[v.name()] = &v;
  return EstimateOpCost(p.op(i), [&](const std::string& n) -> const Var* {
    auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second;
  }, batch);
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
  ActionCosts c = EstimateActionCosts(p, 64);
  EXPECT_GT(c.forward, 0);
  // x needs no gradient: 3 gradient matmuls against 2 forward ones.
  EXPECT_GT(c.backward / c.forward, 1.3);
  EXPECT_LT(c.backward / c.forward, 2.5);
}

}  // namespace
}  // namespace strata
