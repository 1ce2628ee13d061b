// reduce_sum, reduce_mean, sum_to_like and broadcast_like. Reference values
// from PyTorch 1.13 (/usr/bin/python3, float64):
//   x  = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) * 0.5 - 3.0
//   x4 = torch.arange(120, dtype=torch.float64).reshape(2, 3, 4, 5) * 0.25 - 7.0
//   x.sum(), x.sum(dim=(0, 2)), x.mean(dim=1), x.mean(dim=-1, keepdim=True), x.mean(),
//   x4.sum(dim=(0, 2)), x4.mean(dim=(1, 3)), x4.sum(dim=(0, 1, 3))
// All of them are exact in binary floating point.

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

std::string ReduceText(const std::string& type, const std::vector<int64_t>& axis, bool keepdim) {
  std::string list;
  for (int64_t a : axis) list += (list.empty() ? "" : ", ") + std::to_string(a);
  return "type: \"" + type + "\" input: \"x\" output: \"y\" attr { key: \"axis\" value { list { i: [" + list +
         "] } } } attr { key: \"keepdim\" value { b: " + (keepdim ? "true" : "false") + " } }";
}

Tensor Reduce(const std::string& type, const Tensor& x, const std::vector<int64_t>& axis, bool keepdim) {
  std::map<std::string, Tensor> env{{"x", x}};
  absl::Status s = RunOp(ParseOp(ReduceText(type, axis, keepdim)), &env);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? env.at("y") : Tensor();
}

std::vector<double> Arange(int n, double step, double start) {
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = i * step + start;
  return v;
}

class ReduceTest : public ::testing::TestWithParam<DataType> {};

TEST_P(ReduceTest, MatchesTorch) {
  const DataType dt = GetParam();
  const Tensor x = MakeTensor(dt, {2, 3, 4}, Arange(24, 0.5, -3.0));
  EXPECT_VALUES_NEAR(Reduce("reduce_sum", x, {}, false), (std::vector<int64_t>{}), (std::vector<double>{66}), 0);
  EXPECT_VALUES_NEAR(Reduce("reduce_sum", x, {}, true), (std::vector<int64_t>{1, 1, 1}), (std::vector<double>{66}), 0);
  EXPECT_VALUES_NEAR(Reduce("reduce_sum", x, {0, 2}, false), (std::vector<int64_t>{3}),
                     (std::vector<double>{6, 22, 38}), 0);
  EXPECT_VALUES_NEAR(Reduce("reduce_sum", x, {0, -1}, true), (std::vector<int64_t>{1, 3, 1}),
                     (std::vector<double>{6, 22, 38}), 0);
  EXPECT_VALUES_NEAR(Reduce("reduce_mean", x, {1}, false), (std::vector<int64_t>{2, 4}),
                     (std::vector<double>{-1, -0.5, 0, 0.5, 5, 5.5, 6, 6.5}), 0);
  EXPECT_VALUES_NEAR(Reduce("reduce_mean", x, {-1}, true), (std::vector<int64_t>{2, 3, 1}),
                     (std::vector<double>{-2.25, -0.25, 1.75, 3.75, 5.75, 7.75}), 0);
  EXPECT_VALUES_NEAR(Reduce("reduce_mean", x, {}, false), (std::vector<int64_t>{}), (std::vector<double>{2.75}), 0);

  // Non-adjacent reduced dims take several passes.
  const Tensor x4 = MakeTensor(dt, {2, 3, 4, 5}, Arange(120, 0.25, -7.0));
  EXPECT_VALUES_NEAR(Reduce("reduce_sum", x4, {0, 2}, false), (std::vector<int64_t>{3, 5}),
                     (std::vector<double>{19, 21, 23, 25, 27, 59, 61, 63, 65, 67, 99, 101, 103, 105, 107}), 0);
  EXPECT_VALUES_NEAR(Reduce("reduce_mean", x4, {1, 3}, true), (std::vector<int64_t>{2, 1, 4, 1}),
                     (std::vector<double>{-1.5, -0.25, 1, 2.25, 13.5, 14.75, 16, 17.25}), 0);
  EXPECT_VALUES_NEAR(Reduce("reduce_sum", x4, {0, 1, 3}, false), (std::vector<int64_t>{4}),
                     (std::vector<double>{180, 217.5, 255, 292.5}), 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReduceTest, ::testing::Values(F32, F64),
                         [](const ::testing::TestParamInfo<DataType>& info) { return DataTypeName(info.param); });

TEST(ReduceTest, IntegerSumAndEdgeCases) {
  EXPECT_VALUES_NEAR(Reduce("reduce_sum", MakeTensor(I64, {2, 2}, {1, 2, 3, 4000000000}), {1}, false),
                     (std::vector<int64_t>{2}), (std::vector<double>{3, 4000000003}), 0);
  // Reducing an empty dim: sum 0, mean nan (as torch).
  Tensor empty = MakeTensor(F32, {0, 3}, {});
  EXPECT_VALUES_NEAR(Reduce("reduce_sum", empty, {0}, false), (std::vector<int64_t>{3}), (std::vector<double>{0, 0, 0}), 0);
  Tensor mean = Reduce("reduce_mean", empty, {0}, false);
  for (double v : TensorValues(mean)) EXPECT_TRUE(std::isnan(v));
  // Size-1 reduced dims and a scalar input.
  EXPECT_VALUES_NEAR(Reduce("reduce_mean", MakeTensor(F64, {1, 3}, {1, 2, 3}), {0}, false), (std::vector<int64_t>{3}),
                     (std::vector<double>{1, 2, 3}), 0);
  EXPECT_VALUES_NEAR(Reduce("reduce_sum", MakeTensor(F64, {}, {4.5}), {}, false), (std::vector<int64_t>{}),
                     (std::vector<double>{4.5}), 0);
}

// Sums over `reduced` dims in plain double loops, the reference for the
// blocked and multi-threaded paths.
std::vector<double> NaiveSum(const std::vector<int64_t>& shape, const std::vector<double>& x,
                             const std::vector<bool>& reduced) {
  std::vector<int64_t> out_shape;
  for (size_t d = 0; d < shape.size(); ++d) out_shape.push_back(reduced[d] ? 1 : shape[d]);
  std::vector<double> out(NumElements(out_shape), 0.0);
  for (int64_t flat = 0; flat < static_cast<int64_t>(x.size()); ++flat) {
    int64_t rest = flat, o = 0, stride = 1;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      int64_t i = rest % shape[d];
      rest /= shape[d];
      if (!reduced[d]) o += i * stride;
      stride *= out_shape[d];
    }
    out[o] += x[flat];
  }
  return out;
}

TEST(ReduceTest, LargeTensorsMatchNaiveSums) {
  struct Case {
    std::vector<int64_t> shape, axis;
  };
  const std::vector<Case> cases = {
      {{1000, 300}, {}},        // all: K blocks with partial sums
      {{1000, 300}, {0}},       // over the batch: long K, wide N
      {{1000, 300}, {1}},       // rows
      {{200000, 3}, {0}},       // long K, narrow N
      {{20, 50, 30, 7}, {0, 2}},  // two groups
      {{20, 50, 30, 7}, {1, 3}},
  };
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (const Case& c : cases) {
    std::vector<double> x(NumElements(c.shape));
    for (double& v : x) v = dist(gen);
    std::vector<bool> reduced(c.shape.size(), c.axis.empty());
    for (int64_t a : c.axis) reduced[a] = true;
    std::vector<double> want = NaiveSum(c.shape, x, reduced);
    int64_t count = NumElements(c.shape) / static_cast<int64_t>(want.size());
    std::vector<int64_t> keep_shape;
    for (size_t d = 0; d < c.shape.size(); ++d) keep_shape.push_back(reduced[d] ? 1 : c.shape[d]);
    Tensor t = MakeTensor(F64, Shape(c.shape.begin(), c.shape.end()), x);
    // Different summation order than the naive loop: agreement to rounding.
    EXPECT_VALUES_NEAR(Reduce("reduce_sum", t, c.axis, true), keep_shape, want, 1e-12) << ShapeString(c.shape);
    std::vector<double> mean = want;
    for (double& v : mean) v /= count;
    EXPECT_VALUES_NEAR(Reduce("reduce_mean", t, c.axis, true), keep_shape, mean, 1e-12) << ShapeString(c.shape);
    // F32 accumulates in double, so it is the float rounding of the exact sum.
    std::vector<double> xf(x.size());
    for (size_t i = 0; i < x.size(); ++i) xf[i] = static_cast<float>(x[i]);
    std::vector<double> want_f = NaiveSum(c.shape, xf, reduced);
    EXPECT_VALUES_NEAR(Reduce("reduce_sum", MakeTensor(F32, Shape(c.shape.begin(), c.shape.end()), xf), c.axis, true),
                       keep_shape, want_f, 1e-7)
        << ShapeString(c.shape);
  }
}

Tensor SumToLike(const Tensor& x, const Tensor& like) {
  std::map<std::string, Tensor> env{{"x", x}, {"like", like}};
  absl::Status s = RunOp(ParseOp(R"pb(type: "sum_to_like" input: ["x", "like"] output: "y")pb"), &env);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? env.at("y") : Tensor();
}

TEST(SumToLikeTest, SumsBroadcastDims) {
  const Tensor x = MakeTensor(F64, {2, 3, 4}, Arange(24, 0.5, -3.0));
  // Leading dim and the trailing size-1 dim of like [3, 1]: x.sum(dim=(0, 2)) = [6, 22, 38].
  EXPECT_VALUES_NEAR(SumToLike(x, MakeTensor(F64, {3, 1}, {0, 0, 0})), (std::vector<int64_t>{3, 1}),
                     (std::vector<double>{6, 22, 38}), 0);
  // Row bias [4]: x.sum(dim=(0, 1))[j] = sum_{r<6} ((4r + j) / 2 - 3) = 12 + 3j.
  EXPECT_VALUES_NEAR(SumToLike(x, MakeTensor(F64, {4}, {0, 0, 0, 0})), (std::vector<int64_t>{4}),
                     (std::vector<double>{12, 15, 18, 21}), 0);
  // A scalar like.
  EXPECT_VALUES_NEAR(SumToLike(x, MakeTensor(F64, {}, {0})), (std::vector<int64_t>{}), (std::vector<double>{66}), 0);
  EXPECT_VALUES_NEAR(SumToLike(MakeTensor(I64, {2, 2}, {1, 2, 3, 4}), MakeTensor(I64, {1, 2}, {0, 0})),
                     (std::vector<int64_t>{1, 2}), (std::vector<double>{4, 6}), 0);
}

TEST(SumToLikeTest, SameShapeSharesTheBuffer) {
  const Tensor x = MakeTensor(F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor y = SumToLike(x, MakeTensor(F32, {2, 3}, {0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(y.raw_data(), x.raw_data());
  // x [1, 3] to like [3]: only a leading size-1 dim goes.
  Tensor z = SumToLike(MakeTensor(F32, {1, 3}, {1, 2, 3}), MakeTensor(F32, {3}, {0, 0, 0}));
  EXPECT_VALUES_NEAR(z, (std::vector<int64_t>{3}), (std::vector<double>{1, 2, 3}), 0);
}

Tensor BroadcastLike(const Tensor& dy, const Tensor& x, const std::vector<int64_t>& axis, bool keepdim, bool mean) {
  std::string list;
  for (int64_t a : axis) list += (list.empty() ? "" : ", ") + std::to_string(a);
  std::map<std::string, Tensor> env{{"dy", dy}, {"x", x}};
  absl::Status s = RunOp(
      ParseOp("type: \"broadcast_like\" input: [\"dy\", \"x\"] output: \"dx\" attr { key: \"axis\" value { list { i: [" +
              list + "] } } } attr { key: \"keepdim\" value { b: " + (keepdim ? "true" : "false") +
              " } } attr { key: \"mean\" value { b: " + (mean ? "true" : "false") + " } }"),
      &env);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? env.at("dx") : Tensor();
}

TEST(BroadcastLikeTest, RepeatsOverReducedDims) {
  const Tensor x = MakeTensor(F64, {2, 3, 2}, std::vector<double>(12, 0.0));
  // reduce over (0, 2) gave [3]; the gradient repeats dy[j] over i and k.
  const Tensor dy = MakeTensor(F64, {3}, {1, 2, 4});
  EXPECT_VALUES_NEAR(BroadcastLike(dy, x, {0, 2}, false, false), (std::vector<int64_t>{2, 3, 2}),
                     (std::vector<double>{1, 1, 2, 2, 4, 4, 1, 1, 2, 2, 4, 4}), 0);
  // The mean divides by the 4 reduced elements; keepdim's [1, 3, 1] is accepted too.
  EXPECT_VALUES_NEAR(BroadcastLike(MakeTensor(F64, {1, 3, 1}, {1, 2, 4}), x, {0, -1}, true, true),
                     (std::vector<int64_t>{2, 3, 2}),
                     (std::vector<double>{0.25, 0.25, 0.5, 0.5, 1, 1, 0.25, 0.25, 0.5, 0.5, 1, 1}), 0);
  // All dims: a scalar dy spread over x.
  EXPECT_VALUES_NEAR(BroadcastLike(MakeTensor(F32, {}, {3}), MakeTensor(F32, {2, 2}, {0, 0, 0, 0}), {}, false, true),
                     (std::vector<int64_t>{2, 2}), (std::vector<double>{0.75, 0.75, 0.75, 0.75}), 0);
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

TEST(ReduceShapeTest, BatchDimBecomesConcreteWhenReduced) {
  auto out = Infer(ReduceText("reduce_mean", {0}, false), {{F32, {-1, 4}}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0], (TensorType{F32, {4}}));
  out = Infer(ReduceText("reduce_sum", {0}, true), {{F32, {-1, 4}}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0], (TensorType{F32, {1, 4}}));
  out = Infer(ReduceText("reduce_mean", {}, false), {{F32, {-1, 4}}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0], (TensorType{F32, {}}));
  // Reducing other dims keeps the batch dim.
  out = Infer(ReduceText("reduce_sum", {-1}, false), {{F64, {-1, 4}}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0], (TensorType{F64, {-1}}));
  // Defaults: all dims, no keepdim.
  out = Infer(R"pb(type: "reduce_sum" input: "x" output: "y")pb", {{I64, {-1, 3}}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0], (TensorType{I64, {}}));
}

TEST(ReduceShapeTest, RejectsBadAxesAndDtypes) {
  auto s = Infer(ReduceText("reduce_sum", {2}, false), {{F32, {-1, 4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("attr 'axis' has 2, out of range for input 'x' of rank 2 (expected -2..1)"));
  s = Infer(ReduceText("reduce_sum", {0, -2}, false), {{F32, {-1, 4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("attr 'axis' names dim 0 twice"));
  s = Infer(ReduceText("reduce_mean", {}, false), {{I64, {4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("input 'x' must be F32 or F64, got I64"));
  s = Infer(R"pb(type: "reduce_sum" input: "x" output: "y" attr { key: "axis" value { i: 0 } })pb", {{F32, {4}}});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("attr 'axis' must be list of ints"));
}

TEST(ReduceShapeTest, HelperOpsCheckTheirOperands) {
  auto ok = Infer(R"pb(type: "sum_to_like" input: ["x", "like"] output: "y")pb", {{F32, {-1, 4}}, {F32, {4}}});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ((*ok)[0], (TensorType{F32, {4}}));
  ok = Infer(R"pb(type: "sum_to_like" input: ["x", "like"] output: "y")pb", {{F32, {-1, 4}}, {F32, {1, 4}}});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ((*ok)[0], (TensorType{F32, {1, 4}}));

  auto bad = Infer(R"pb(type: "sum_to_like" input: ["x", "like"] output: "y")pb", {{F32, {-1, 4}}, {F32, {5}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("input 'like' [5] does not broadcast to input 'x' [-1, 4]"));
  bad = Infer(R"pb(type: "sum_to_like" input: ["x", "like"] output: "y")pb", {{F32, {4}}, {F32, {2, 4}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("does not broadcast"));

  ok = Infer(R"pb(type: "broadcast_like" input: ["dy", "x"] output: "dx"
                  attr { key: "axis" value { list { i: [0] } } })pb",
             {{F32, {4}}, {F32, {-1, 4}}});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ((*ok)[0], (TensorType{F32, {-1, 4}}));
  bad = Infer(R"pb(type: "broadcast_like" input: ["dy", "x"] output: "dx"
                   attr { key: "axis" value { list { i: [0] } } } attr { key: "keepdim" value { b: true } })pb",
              {{F32, {4}}, {F32, {-1, 4}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("input 'dy' has shape [4] but reducing x [-1, 4] with these axis/keepdim attrs gives [1, 4]"));
}

// The kernel resolves axes with the schema's rule (proto/shape_rules.h), so a
// plan that skipped the shape function is refused in the same words.
TEST(ReduceShapeTest, KernelRefusesBadAxesWithTheSchemasWords) {
  const std::map<std::string, Tensor> env{{"x", MakeTensor(F32, {2, 4}, std::vector<double>(8, 1.0))}};
  absl::Status s = RunKernelOnly(ParseOp(ReduceText("reduce_sum", {2}, false)), env);
  EXPECT_EQ(s.message(), "attr 'axis' has 2, out of range for input 'x' of rank 2 (expected -2..1)");
  s = RunKernelOnly(ParseOp(ReduceText("reduce_mean", {0, -2}, false)), env);
  EXPECT_EQ(s.message(), "attr 'axis' names dim 0 twice");
  const std::map<std::string, Tensor> grad_env{{"dy", MakeTensor(F32, {4}, {1, 2, 3, 4})}, {"x", env.at("x")}};
  s = RunKernelOnly(ParseOp(R"pb(type: "broadcast_like" input: ["dy", "x"] output: "dx"
                                 attr { key: "axis" value { list { i: [0, 0] } } })pb"),
                    grad_env);
  EXPECT_EQ(s.message(), "attr 'axis' names dim 0 twice");
}

}  // namespace
}  // namespace strata
