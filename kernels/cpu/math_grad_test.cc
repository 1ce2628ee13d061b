// The math family's gradient makers with static batch dims (-1): which ops
// they emit, and that those ops compute the right gradient once the batch
// size is known at run time. (Finite-difference checks on concrete shapes
// live in compiler/ops/math_gradcheck.cc.)

#include <map>
#include <string>
#include <vector>

#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

#define EXPECT_VALUES_NEAR(actual, shape, values, tol) EXPECT_TRUE(::strata::TensorNear((actual), shape, values, (tol)))

std::vector<std::string> Types(const std::vector<Op>& ops) {
  std::vector<std::string> types;
  for (const Op& op : ops) types.push_back(op.type());
  return types;
}

TEST(MathGradTest, AddSumsTheBroadcastBiasOverTheBatch) {
  Op op = ParseOp(R"pb(type: "add" input: ["x", "b"] output: "z")pb");
  std::vector<std::string> names;
  auto ops = MakeGradOps(op, {{"x", {F32, {-1, 3}}}, {"b", {F32, {3}}}, {"z", {F32, {-1, 3}}}}, {true, true}, &names);
  ASSERT_TRUE(ops.ok()) << ops.status().message();
  // x has z's shape: its gradient is dz itself, shared without an op; b was
  // broadcast: summed.
  EXPECT_EQ(Types(*ops), (std::vector<std::string>{"sum_to_like"}));
  EXPECT_EQ(names[0], "z@grad");

  // Batch of 2 at run time.
  std::map<std::string, Tensor> env{{"x", MakeTensor(F32, {2, 3}, {0, 0, 0, 0, 0, 0})},
                                    {"b", MakeTensor(F32, {3}, {0, 0, 0})},
                                    {"z@grad", MakeTensor(F32, {2, 3}, {1, 2, 3, 10, 20, 30})}};
  ASSERT_TRUE(RunOps(*ops, &env).ok());
  EXPECT_VALUES_NEAR(env.at(names[0]), (std::vector<int64_t>{2, 3}), (std::vector<double>{1, 2, 3, 10, 20, 30}), 0);
  EXPECT_VALUES_NEAR(env.at(names[1]), (std::vector<int64_t>{3}), (std::vector<double>{11, 22, 33}), 0);
}

TEST(MathGradTest, MulByPerSampleScaleSumsOverFeatures) {
  Op op = ParseOp(R"pb(type: "mul" input: ["x", "s"] output: "z")pb");
  std::vector<std::string> names;
  auto ops = MakeGradOps(op, {{"x", {F64, {-1, 2}}}, {"s", {F64, {-1, 1}}}, {"z", {F64, {-1, 2}}}}, {true, true}, &names);
  ASSERT_TRUE(ops.ok()) << ops.status().message();
  EXPECT_EQ(Types(*ops), (std::vector<std::string>{"mul", "mul", "sum_to_like"}));
  std::map<std::string, Tensor> env{{"x", MakeTensor(F64, {3, 2}, {1, 2, 3, 4, 5, 6})},
                                    {"s", MakeTensor(F64, {3, 1}, {2, -1, 0.5})},
                                    {"z@grad", MakeTensor(F64, {3, 2}, {1, 1, 1, -1, 2, 0})}};
  ASSERT_TRUE(RunOps(*ops, &env).ok());
  // dx = dz * s; ds = sum_j dz * x.
  EXPECT_VALUES_NEAR(env.at(names[0]), (std::vector<int64_t>{3, 2}), (std::vector<double>{2, 2, -1, 1, 1, 0}), 0);
  EXPECT_VALUES_NEAR(env.at(names[1]), (std::vector<int64_t>{3, 1}), (std::vector<double>{3, -1, 10}), 0);
}

TEST(MathGradTest, MeanOverTheBatchDividesByTheRuntimeBatchSize) {
  Op op = ParseOp(R"pb(type: "reduce_mean" input: "x" output: "y" attr { key: "axis" value { list { i: [0] } } })pb");
  std::vector<std::string> names;
  auto ops = MakeGradOps(op, {{"x", {F32, {-1, 2}}}, {"y", {F32, {2}}}}, {true}, &names);
  ASSERT_TRUE(ops.ok()) << ops.status().message();
  EXPECT_EQ(Types(*ops), (std::vector<std::string>{"broadcast_like"}));
  std::map<std::string, Tensor> env{{"x", MakeTensor(F32, {4, 2}, std::vector<double>(8, 0.0))},
                                    {"y@grad", MakeTensor(F32, {2}, {1, -2})}};
  ASSERT_TRUE(RunOps(*ops, &env).ok());
  EXPECT_VALUES_NEAR(env.at(names[0]), (std::vector<int64_t>{4, 2}),
                     (std::vector<double>{0.25, -0.5, 0.25, -0.5, 0.25, -0.5, 0.25, -0.5}), 0);
}

TEST(MathGradTest, CastGradientOnlyBetweenFloatingTypes) {
  std::vector<std::string> names;
  auto back = MakeGradOps(ParseOp(R"pb(type: "cast" input: "x" output: "y" attr { key: "dtype" value { s: "F64" } })pb"),
                          {{"x", {F32, {-1, 2}}}, {"y", {F64, {-1, 2}}}}, {true}, &names);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(Types(*back), (std::vector<std::string>{"cast"}));
  EXPECT_EQ((*back)[0].attr().at("dtype").s(), "F32");

  auto none = MakeGradOps(ParseOp(R"pb(type: "cast" input: "x" output: "y" attr { key: "dtype" value { s: "I64" } })pb"),
                          {{"x", {F32, {-1, 2}}}, {"y", {I64, {-1, 2}}}}, {true}, &names, {true});
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_TRUE(none->empty());
}

TEST(MathGradTest, NoIncomingGradientEmitsNothing) {
  std::vector<std::string> names;
  auto ops = MakeGradOps(ParseOp(R"pb(type: "tanh" input: "x" output: "y")pb"), {{"x", {F32, {3}}}, {"y", {F32, {3}}}},
                         {true}, &names, {false});
  ASSERT_TRUE(ops.ok()) << ops.status().message();
  EXPECT_TRUE(ops->empty());
}

}  // namespace
}  // namespace strata
