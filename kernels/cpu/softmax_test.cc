// softmax, log_softmax and their backward helpers against PyTorch 1.13
// (/usr/bin/python3, float64 unless noted, printed with "%.17g"):
//   s  = torch.tensor([[1., 2., 3., 4.], [-1., 0., 0.5, 2.], [0., 0., 0., 0.]], dtype=torch.float64)
//   sd = torch.tensor([[0.5, -1., 2., 0.25], [1., 1., -0.5, 0.], [-2., 0.5, 0.5, 1.5]], dtype=torch.float64)
//   torch.softmax(s, ax), torch.log_softmax(s, ax); gradients: xx.grad after f(xx, ax).backward(sd)

#include <cmath>
#include <map>
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

const std::vector<double> kS = {1, 2, 3, 4, -1, 0, 0.5, 2, 0, 0, 0, 0};
const std::vector<double> kSd = {0.5, -1, 2, 0.25, 1, 1, -0.5, 0, -2, 0.5, 0.5, 1.5};
const std::vector<int64_t> k34 = {3, 4};

std::string OpText(const std::string& type, int axis, bool grad) {
  return "type: \"" + type + "\" input: " + (grad ? "[\"y\", \"dy\"] output: \"dx\"" : "\"x\" output: \"y\"") +
         " attr { key: \"axis\" value { i: " + std::to_string(axis) + " } }";
}

Tensor Forward(const std::string& type, int axis, const Tensor& x) {
  std::map<std::string, Tensor> env{{"x", x}};
  absl::Status s = RunOp(ParseOp(OpText(type, axis, false)), &env);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? env.at("y") : Tensor();
}

Tensor Backward(const std::string& type, int axis, const Tensor& y, const Tensor& dy) {
  std::map<std::string, Tensor> env{{"y", y}, {"dy", dy}};
  absl::Status s = RunOp(ParseOp(OpText(type, axis, true)), &env);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? env.at("dx") : Tensor();
}

class SoftmaxTest : public ::testing::TestWithParam<DataType> {};

TEST_P(SoftmaxTest, ForwardAndBackwardMatchTorch) {
  const DataType dt = GetParam();
  const double tol = dt == F32 ? 1e-6 : 1e-14;
  const Tensor x = MakeTensor(dt, {3, 4}, kS), dy = MakeTensor(dt, {3, 4}, kSd);

  Tensor y = Forward("softmax", -1, x);
  EXPECT_VALUES_NEAR(y, k34,
                     (std::vector<double>{0.032058603280084988, 0.087144318742032573, 0.23688281808991016,
                                          0.64391425988797235, 0.035353793408748876, 0.096101574190097239,
                                          0.15844470951497974, 0.7100999228861743, 0.25, 0.25, 0.25, 0.25}),
                     tol);
  EXPECT_VALUES_NEAR(Backward("softmax_grad", -1, y, dy), k34,
                     (std::vector<double>{-0.0020398627684887973, -0.1362614000091821, 0.3402515667043815,
                                          -0.20195030392671065, 0.033507158263639036, 0.091081899431351337,
                                          -0.08749839930423077, -0.037090658390759632, -0.53125, 0.09375, 0.09375,
                                          0.34375}),
                     tol);

  y = Forward("softmax", 0, x);
  EXPECT_VALUES_NEAR(y, k34,
                     (std::vector<double>{0.66524095577482178, 0.7869860421615984, 0.88349207402719454,
                                          0.8668133321973347, 0.090030573170380462, 0.10650697891920073,
                                          0.072521445680747768, 0.11731042782619835, 0.24472847105479764,
                                          0.10650697891920073, 0.043986480292057845, 0.015876239976466762}),
                     tol);
  EXPECT_VALUES_NEAR(Backward("softmax_grad", 0, y, dy), k34,
                     (std::vector<double>{0.37706249270210151, -0.29336827030773716, 0.21847286619341544,
                                          0.0082193901154234209, 0.09604514583293236, 0.17331087988366872,
                                          -0.16337026928102366, -0.028215233467246546, -0.4731076385350339,
                                          0.12005739042406835, -0.055102596912391999, 0.019995843351823177}),
                     tol);

  y = Forward("log_softmax", -1, x);
  EXPECT_VALUES_NEAR(y, k34,
                     (std::vector<double>{-3.4401896985611953, -2.4401896985611953, -1.4401896985611953,
                                          -0.44018969856119533, -3.3423495823898222, -2.3423495823898222,
                                          -1.8423495823898219, -0.34234958238982199, -1.3862943611198906,
                                          -1.3862943611198906, -1.3862943611198906, -1.3862943611198906}),
                     tol);
  EXPECT_VALUES_NEAR(Backward("log_softmax_grad", -1, y, dy), k34,
                     (std::vector<double>{0.44389744425985128, -1.152502557798557, 1.5854550683426571,
                                          -0.87684995480395167, 0.94696930988687666, 0.85584763871485414,
                                          -0.73766706427246964, -1.0651498843292615, -2.125, 0.375, 0.375, 1.375}),
                     tol);

  y = Forward("log_softmax", 0, x);
  EXPECT_VALUES_NEAR(y, k34,
                     (std::vector<double>{-0.40760596444438041, -0.2395447662218847, -0.12387295836936733,
                                          -0.14293162849989968, -2.4076059644443806, -2.2395447662218846,
                                          -2.6238729583693674, -2.1429316284998996, -1.4076059644443804,
                                          -2.2395447662218846, -3.1238729583693674, -4.1429316284999}),
                     tol);
  EXPECT_VALUES_NEAR(Backward("log_softmax_grad", 0, y, dy), k34,
                     (std::vector<double>{0.83262047788741089, -1.3934930210807992, 0.23301585194561092,
                                          -1.2669233313453356, 1.0450152865851903, 0.9467465105403996,
                                          -0.64504289136149551, -0.20529324869584711, -1.8776357644726012,
                                          0.4467465105403996, 0.41202703941588431, 1.4722165800411833}),
                     tol);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SoftmaxTest, ::testing::Values(F32, F64),
                         [](const ::testing::TestParamInfo<DataType>& info) { return DataTypeName(info.param); });

TEST(SoftmaxTest, MiddleAxis) {
  // s3 = torch.arange(24.).reshape(2, 3, 4) * 0.25 - 2: along axis 1 the
  // entries step by 1, so every lane is softmax([a, a + 1, a + 2]).
  std::vector<double> x(24);
  for (int i = 0; i < 24; ++i) x[i] = i * 0.25 - 2.0;
  const std::vector<double> p = {0.090030573170380462, 0.24472847105479764, 0.66524095577482178};
  const std::vector<double> lp = {-2.4076059644443806, -1.4076059644443804, -0.40760596444438041};
  std::vector<double> want(24), want_log(24);
  for (int i = 0; i < 24; ++i) {
    want[i] = p[(i / 4) % 3];
    want_log[i] = lp[(i / 4) % 3];
  }
  Tensor t = MakeTensor(F64, {2, 3, 4}, x);
  EXPECT_VALUES_NEAR(Forward("softmax", 1, t), (std::vector<int64_t>{2, 3, 4}), want, 1e-14);
  EXPECT_VALUES_NEAR(Forward("log_softmax", -2, t), (std::vector<int64_t>{2, 3, 4}), want_log, 1e-14);
}

TEST(SoftmaxTest, LargeLogitsStayFinite) {
  // torch.softmax / torch.log_softmax of torch.tensor([1000., 1001., 1002.], dtype=torch.float32)
  Tensor x = MakeTensor(F32, {1, 3}, {1000, 1001, 1002});
  EXPECT_VALUES_NEAR(Forward("softmax", -1, x), (std::vector<int64_t>{1, 3}),
                     (std::vector<double>{0.090030573308467865, 0.24472847580909729, 0.66524094343185425}), 1e-6);
  EXPECT_VALUES_NEAR(Forward("log_softmax", -1, x), (std::vector<int64_t>{1, 3}),
                     (std::vector<double>{-2.4076058864593506, -1.4076058864593506, -0.40760594606399536}), 1e-6);
}

TEST(SoftmaxTest, ManyRowsAcrossThreadsSumToOne) {
  // 4000 rows of 37: several ParallelFor chunks; every row must sum to 1.
  std::vector<double> x(4000 * 37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>((i * 7919) % 101) / 10.0 - 5.0;
  Tensor y = Forward("softmax", -1, MakeTensor(F64, {4000, 37}, x));
  std::vector<double> v = TensorValues(y);
  for (int r = 0; r < 4000; ++r) {
    double sum = 0;
    for (int c = 0; c < 37; ++c) sum += v[r * 37 + c];
    ASSERT_NEAR(sum, 1.0, 1e-14) << "row " << r;
  }
}

TEST(SoftmaxTest, LeadingAxisOverManyColumnsMatchesNaiveFormula) {
  // [3, 50, 130] over axis 1: several 64-wide column blocks, one partial.
  const int64_t M = 3, K = 50, N = 130;
  std::vector<double> x(M * K * N), dy(M * K * N);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.37 * i) * 3.0;
    dy[i] = std::cos(0.11 * i);
  }
  std::vector<double> want(x.size()), want_log(x.size()), want_grad(x.size());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      auto at = [&](int64_t k) { return (m * K + k) * N + n; };
      double max = -INFINITY, sum = 0, dot = 0;
      for (int64_t k = 0; k < K; ++k) max = std::max(max, x[at(k)]);
      for (int64_t k = 0; k < K; ++k) sum += std::exp(x[at(k)] - max);
      for (int64_t k = 0; k < K; ++k) {
        want[at(k)] = std::exp(x[at(k)] - max) / sum;
        want_log[at(k)] = x[at(k)] - max - std::log(sum);
        dot += want[at(k)] * dy[at(k)];
      }
      for (int64_t k = 0; k < K; ++k) want_grad[at(k)] = want[at(k)] * (dy[at(k)] - dot);
    }
  }
  const std::vector<int64_t> shape = {M, K, N};
  Tensor y = Forward("softmax", 1, MakeTensor(F64, {M, K, N}, x));
  EXPECT_VALUES_NEAR(y, shape, want, 1e-13);
  EXPECT_VALUES_NEAR(Forward("log_softmax", -2, MakeTensor(F64, {M, K, N}, x)), shape, want_log, 1e-13);
  EXPECT_VALUES_NEAR(Backward("softmax_grad", 1, y, MakeTensor(F64, {M, K, N}, dy)), shape, want_grad, 1e-13);
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

TEST(SoftmaxShapeTest, AxisIsCheckedAgainstRank) {
  auto ok = Infer(OpText("softmax", 0, false), {{F32, {-1, 10}}});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ((*ok)[0], (TensorType{F32, {-1, 10}}));

  auto bad = Infer(OpText("softmax", 2, false), {{F32, {-1, 10}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("attr 'axis' is 2, out of range for input 'x' of rank 2 (expected -2..1)"));

  bad = Infer(OpText("log_softmax", -3, false), {{F64, {4, 10}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("out of range"));

  bad = Infer(R"pb(type: "softmax" input: "x" output: "y")pb", {{F32, {}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("input 'x' must have rank >= 1"));

  bad = Infer(R"pb(type: "softmax" input: "x" output: "y")pb", {{I32, {3}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("input 'x' must be F32 or F64, got I32"));

  bad = Infer(OpText("softmax_grad", -1, true), {{F32, {-1, 10}}, {F32, {-1, 9}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("must have the same shape"));
}

// The kernel normalizes its axis with the schema's rule (proto/shape_rules.h).
TEST(SoftmaxShapeTest, KernelRefusesABadAxisWithTheSchemasWords) {
  const Tensor x = MakeTensor(F32, {3, 4}, kS);
  absl::Status s = RunKernelOnly(ParseOp(OpText("softmax", 2, false)), {{"x", x}});
  EXPECT_EQ(s.message(), "attr 'axis' is 2, out of range for input 'x' of rank 2 (expected -2..1)");
  s = RunKernelOnly(ParseOp(OpText("log_softmax_grad", -3, true)), {{"y", x}, {"dy", x}});
  EXPECT_EQ(s.message(), "attr 'axis' is -3, out of range for input 'y' of rank 2 (expected -2..1)");
  s = RunKernelOnly(ParseOp(OpText("softmax", 0, false)), {{"x", MakeTensor(F32, {}, {1})}});
  EXPECT_EQ(s.message(), "input 'x' must have rank >= 1, got a scalar");
}

}  // namespace
}  // namespace strata
