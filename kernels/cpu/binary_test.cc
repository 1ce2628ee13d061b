// add, sub, mul, div: values by hand, broadcasting against a naive index-walk
// reference, and the shape function's batch-dim handling and rejections.

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

#define EXPECT_VALUES_NEAR(actual, shape, values, tol) EXPECT_TRUE(::strata::TensorNear((actual), shape, values, (tol)))

Tensor Binary(const std::string& type, const Tensor& x, const Tensor& y) {
  std::map<std::string, Tensor> env{{"x", x}, {"y", y}};
  absl::Status s = RunOp(ParseOp("type: \"" + type + "\" input: [\"x\", \"y\"] output: \"z\""), &env);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? env.at("z") : Tensor();
}

TEST(BinaryTest, SameShapeByHand) {
  Tensor x = MakeTensor(F32, {2, 2}, {1.0, -2.0, 3.5, 4.0});
  Tensor y = MakeTensor(F32, {2, 2}, {0.5, 4.0, -1.0, 8.0});
  EXPECT_VALUES_NEAR(Binary("add", x, y), (std::vector<int64_t>{2, 2}), (std::vector<double>{1.5, 2.0, 2.5, 12.0}), 0);
  EXPECT_VALUES_NEAR(Binary("sub", x, y), (std::vector<int64_t>{2, 2}), (std::vector<double>{0.5, -6.0, 4.5, -4.0}), 0);
  EXPECT_VALUES_NEAR(Binary("mul", x, y), (std::vector<int64_t>{2, 2}), (std::vector<double>{0.5, -8.0, -3.5, 32.0}), 0);
  EXPECT_VALUES_NEAR(Binary("div", x, y), (std::vector<int64_t>{2, 2}), (std::vector<double>{2.0, -0.5, -3.5, 0.5}), 0);
}

TEST(BinaryTest, CommonBroadcastsByHand) {
  Tensor m = MakeTensor(F64, {2, 3}, {1, 2, 3, 4, 5, 6});
  // Row bias [2, 3] + [3].
  EXPECT_VALUES_NEAR(Binary("add", m, MakeTensor(F64, {3}, {10, 20, 30})), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{11, 22, 33, 14, 25, 36}), 0);
  // Scalar on either side.
  EXPECT_VALUES_NEAR(Binary("div", m, MakeTensor(F64, {}, {2})), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{0.5, 1, 1.5, 2, 2.5, 3}), 0);
  EXPECT_VALUES_NEAR(Binary("sub", MakeTensor(F64, {}, {1}), m), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{0, -1, -2, -3, -4, -5}), 0);
  // Column [2, 3] * [2, 1].
  EXPECT_VALUES_NEAR(Binary("mul", m, MakeTensor(F64, {2, 1}, {2, -1})), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{2, 4, 6, -4, -5, -6}), 0);
  // Outer [3, 1] - [1, 2].
  EXPECT_VALUES_NEAR(Binary("sub", MakeTensor(F64, {3, 1}, {1, 2, 3}), MakeTensor(F64, {1, 2}, {10, 20})),
                     (std::vector<int64_t>{3, 2}), (std::vector<double>{-9, -19, -8, -18, -7, -17}), 0);
  // Middle broadcast [2, 2, 2] + [2, 1]: y[j] added along the last dim.
  EXPECT_VALUES_NEAR(Binary("add", MakeTensor(F64, {2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7}), MakeTensor(F64, {2, 1}, {100, 200})),
                     (std::vector<int64_t>{2, 2, 2}), (std::vector<double>{100, 101, 202, 203, 104, 105, 206, 207}), 0);
}

TEST(BinaryTest, IntegerKernels) {
  Tensor x = MakeTensor(I64, {2, 2}, {1, -2, 3, 4000000000});
  Tensor y = MakeTensor(I64, {2}, {3, 5});
  EXPECT_VALUES_NEAR(Binary("add", x, y), (std::vector<int64_t>{2, 2}), (std::vector<double>{4, 3, 6, 4000000005}), 0);
  EXPECT_VALUES_NEAR(Binary("sub", x, y), (std::vector<int64_t>{2, 2}), (std::vector<double>{-2, -7, 0, 3999999995}), 0);
  EXPECT_VALUES_NEAR(Binary("mul", x, y), (std::vector<int64_t>{2, 2}), (std::vector<double>{3, -10, 9, 20000000000}), 0);
}

TEST(BinaryTest, EmptyTensors) {
  Tensor z = Binary("add", MakeTensor(F32, {0, 3}, {}), MakeTensor(F32, {3}, {1, 2, 3}));
  ASSERT_TRUE(z.defined());
  EXPECT_EQ(z.shape(), (Shape{0, 3}));
  Tensor w = Binary("mul", MakeTensor(F32, {2, 1}, {1, 2}), MakeTensor(F32, {0}, {}));
  ASSERT_TRUE(w.defined());
  EXPECT_EQ(w.shape(), (Shape{2, 0}));
}

// Naive numpy broadcasting: every output element computed from its own
// multi-index, the reference the strided fast paths are compared against.
std::vector<double> NaiveBroadcast(const std::vector<int64_t>& xs, const std::vector<double>& x,
                                   const std::vector<int64_t>& ys, const std::vector<double>& y,
                                   const std::vector<int64_t>& zs, double (*f)(double, double)) {
  const int rank = static_cast<int>(zs.size());
  std::vector<double> z(NumElements(zs));
  for (int64_t flat = 0; flat < static_cast<int64_t>(z.size()); ++flat) {
    std::vector<int64_t> idx(rank);
    int64_t rest = flat;
    for (int d = rank - 1; d >= 0; --d) {
      idx[d] = rest % zs[d];
      rest /= zs[d];
    }
    auto offset = [&](const std::vector<int64_t>& s) {
      int64_t off = 0;
      for (size_t d = 0; d < s.size(); ++d) {
        int64_t i = idx[rank - s.size() + d];
        off = off * s[d] + (s[d] == 1 ? 0 : i);
      }
      return off;
    };
    z[flat] = f(x[offset(xs)], y[offset(ys)]);
  }
  return z;
}

std::vector<double> RandomFloats(int64_t n, std::mt19937_64& gen) {
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<double> v(n);
  for (auto& e : v) e = dist(gen);
  return v;
}

TEST(BinaryTest, BroadcastingMatchesNaiveReferenceOnLargeTensors) {
  struct Case {
    std::vector<int64_t> x, y, z;
  };
  // Big enough for several threads; covers same shape, scalar, row, column,
  // middle and both-sides broadcasts.
  const std::vector<Case> cases = {
      {{300, 257}, {300, 257}, {300, 257}}, {{300, 257}, {}, {300, 257}},
      {{1}, {300, 257}, {300, 257}},       {{600, 130}, {130}, {600, 130}},
      {{600, 130}, {600, 1}, {600, 130}},  {{40, 1, 33}, {50, 1}, {40, 50, 33}},
      {{7, 1, 9, 1}, {1, 300, 1, 11}, {7, 300, 9, 11}}, {{2, 3, 4, 5}, {3, 1, 5}, {2, 3, 4, 5}},
  };
  std::mt19937_64 gen(7);
  struct Fn {
    const char* type;
    double (*f)(double, double);
  };
  const std::vector<Fn> fns = {{"add", [](double a, double b) { return a + b; }},
                               {"sub", [](double a, double b) { return a - b; }},
                               {"mul", [](double a, double b) { return a * b; }},
                               {"div", [](double a, double b) { return a / b; }}};
  for (const Case& c : cases) {
    std::vector<double> x = RandomFloats(NumElements(c.x), gen), y = RandomFloats(NumElements(c.y), gen);
    for (const Fn& fn : fns) {
      // F32 results round the exact double result once, as the float op does.
      std::vector<double> want = NaiveBroadcast(c.x, x, c.y, y, c.z, fn.f);
      for (double& w : want) w = static_cast<float>(w);
      Tensor z = Binary(fn.type, MakeTensor(F32, Shape(c.x.begin(), c.x.end()), x),
                        MakeTensor(F32, Shape(c.y.begin(), c.y.end()), y));
      EXPECT_VALUES_NEAR(z, c.z, want, 0) << fn.type << " " << ShapeString(c.x) << " " << ShapeString(c.y);
    }
  }
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

constexpr char kAdd[] = R"pb(type: "add" input: ["x", "y"] output: "z")pb";

TEST(BinaryShapeTest, PropagatesBatchDim) {
  auto out = Infer(kAdd, {{F32, {-1, 4}}, {F32, {4}}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0], (TensorType{F32, {-1, 4}}));
  out = Infer(kAdd, {{F32, {-1, 1}}, {F32, {1, 5}}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0], (TensorType{F32, {-1, 5}}));
  out = Infer(kAdd, {{F64, {1}}, {F64, {-1, 3}}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0], (TensorType{F64, {-1, 3}}));
}

TEST(BinaryShapeTest, RejectsBadShapesAndDtypes) {
  auto s = Infer(kAdd, {{F32, {-1, 4}}, {F32, {3, 4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("x [-1, 4] and y [3, 4] do not broadcast"));

  s = Infer(kAdd, {{F32, {2, 3}}, {F32, {4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("do not broadcast"));

  s = Infer(kAdd, {{F32, {4}}, {F64, {4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("input 'x' is F32 but 'y' is F64"));

  s = Infer(R"pb(type: "div" input: ["x", "y"] output: "z")pb", {{I64, {4}}, {I64, {4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("inputs 'x' and 'y' must be F32 or F64, got I64"));

  s = Infer(R"pb(type: "mul" input: ["x", "y"] output: "z")pb", {{BOOL, {4}}, {BOOL, {4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("got BOOL"));

  s = Infer(R"pb(type: "add" input: ["x"] output: "z")pb", {{F32, {4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("expects 2 inputs (x, y), got 1"));
}

}  // namespace
}  // namespace strata
