// Unary math and activation kernels (and their backward helpers) against
// PyTorch 1.13, run through the op registry and the CPU kernels the way the
// executor runs them. Reference numbers come from /usr/bin/python3 with
//   x  = torch.tensor([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0], dtype=torch.float64)
//   xp = torch.tensor([0.25, 0.5, 1.0, 2.0, 4.0, 10.0], dtype=torch.float64)
//   dy = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.5, 0.75], dtype=torch.float64)
// printed with "%.17g"; gradients are xx.grad after f(xx).backward(dy).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/host_device.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

#define EXPECT_VALUES_NEAR(actual, shape, values, tol) EXPECT_TRUE(::strata::TensorNear((actual), shape, values, (tol)))

const std::vector<double> kX = {-2.0, -0.5, 0.0, 0.25, 1.0, 3.0};
const std::vector<double> kPositiveX = {0.25, 0.5, 1.0, 2.0, 4.0, 10.0};
const std::vector<double> kDy = {1.0, -2.0, 0.5, 3.0, -1.5, 0.75};

// Runs `op_text` with the named inputs and returns its output "y" (or "dx").
Tensor RunNamed(const std::string& op_text, std::map<std::string, Tensor> env, const std::string& out = "y") {
  absl::Status s = RunOp(ParseOp(op_text), &env);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? env.at(out) : Tensor();
}

Tensor Unary(const std::string& type, DataType dtype, const std::vector<double>& x) {
  return RunNamed("type: \"" + type + "\" input: \"x\" output: \"y\"",
             {{"x", MakeTensor(dtype, {2, 3}, x)}});
}

// Float32 holds about 7 significant digits; float64 agrees with torch to rounding.
double Tolerance(DataType dtype) { return dtype == F32 ? 1e-6 : 1e-14; }

class ActivationTest : public ::testing::TestWithParam<DataType> {};

TEST_P(ActivationTest, ForwardMatchesTorch) {
  const DataType dt = GetParam();
  const double tol = Tolerance(dt);
  // torch.relu(x), F.gelu(x), torch.tanh(x), torch.sigmoid(x), torch.exp(x), torch.square(x)
  EXPECT_VALUES_NEAR(Unary("relu", dt, kX), (std::vector<int64_t>{2, 3}), (std::vector<double>{0, 0, 0, 0.25, 1, 3}), tol);
  EXPECT_VALUES_NEAR(Unary("gelu", dt, kX), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{-0.045500263896358417, -0.15426876936299344, 0, 0.14967658142073093,
                                          0.84134474606854304, 2.9959503059051098}),
                     tol);
  // F.gelu(x, approximate='tanh')
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "gelu" input: "x" output: "y"
                                  attr { key: "approximate" value { s: "tanh" } })pb",
                              {{"x", MakeTensor(dt, {2, 3}, kX)}}),
                     (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{-0.04540230591222494, -0.15428599017485606, 0, 0.149675350701685,
                                          0.8411919906082768, 2.996362607918227}),
                     tol);
  EXPECT_VALUES_NEAR(Unary("tanh", dt, kX), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{-0.9640275800758169, -0.46211715726000974, 0, 0.24491866240370913,
                                          0.76159415595576485, 0.99505475368673046}),
                     tol);
  EXPECT_VALUES_NEAR(Unary("sigmoid", dt, kX), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{0.11920292202211755, 0.37754066879814541, 0.5, 0.56217650088579807,
                                          0.7310585786300049, 0.95257412682243336}),
                     tol);
  EXPECT_VALUES_NEAR(Unary("exp", dt, kX), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{0.1353352832366127, 0.60653065971263342, 1, 1.2840254166877414,
                                          2.7182818284590451, 20.085536923187668}),
                     tol);
  EXPECT_VALUES_NEAR(Unary("square", dt, kX), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{4, 0.25, 0, 0.0625, 1, 9}), tol);
  EXPECT_VALUES_NEAR(Unary("neg", dt, kX), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{2.0, 0.5, 0.0, -0.25, -1.0, -3.0}), tol);
  // torch.log(xp), torch.sqrt(xp)
  EXPECT_VALUES_NEAR(Unary("log", dt, kPositiveX), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{-1.3862943611198906, -0.69314718055994529, 0, 0.69314718055994529,
                                          1.3862943611198906, 2.3025850929940459}),
                     tol);
  EXPECT_VALUES_NEAR(Unary("sqrt", dt, kPositiveX), (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{0.5, 0.70710678118654757, 1, 1.4142135623730951, 2,
                                          3.1622776601683795}),
                     tol);
}

TEST_P(ActivationTest, BackwardHelpersMatchTorchAutograd) {
  const DataType dt = GetParam();
  const double tol = Tolerance(dt);
  const Tensor x = MakeTensor(dt, {2, 3}, kX);
  const Tensor dy = MakeTensor(dt, {2, 3}, kDy);
  // relu_grad takes relu's output: gradient dy where y > 0 (torch also gives 0 at x == 0).
  Tensor relu_y = Unary("relu", dt, kX);
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "relu_grad" input: ["y", "dy"] output: "dx")pb", {{"y", relu_y}, {"dy", dy}}, "dx"),
                     (std::vector<int64_t>{2, 3}), (std::vector<double>{0, 0, 0, 3.0, -1.5, 0.75}), tol);
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "gelu_grad" input: ["x", "dy"] output: "dx")pb", {{"x", x}, {"dy", dy}}, "dx"),
                     (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{-0.085231801078196917, -0.26500975068767424, 0.25, 2.0861200646509079,
                                          -1.6249732058815296, 0.75895923540313792}),
                     tol);
  // torch autograd through F.gelu(x, approximate='tanh')
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "gelu_grad" input: ["x", "dy"] output: "dx"
                                  attr { key: "approximate" value { s: "tanh" } })pb",
                              {{"x", x}, {"dy", dy}}, "dx"),
                     (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{-0.0860992566236183, -0.2652601929307153, 0.25, 2.086062285453181,
                                          -1.624446125768674, 0.7586881249732271}),
                     tol);
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "tanh_grad" input: ["y", "dy"] output: "dx")pb",
                         {{"y", Unary("tanh", dt, kX)}, {"dy", dy}}, "dx"),
                     (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{0.070650824853164429, -1.5728954659318548, 0.5, 2.8200445464191342,
                                          -0.62996151242103915, 0.0073995278740801246}),
                     tol);
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "sigmoid_grad" input: ["y", "dy"] output: "dx")pb",
                         {{"y", Unary("sigmoid", dt, kX)}, {"dy", dy}}, "dx"),
                     (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{0.10499358540350651, -0.47000742440318899, 0.125, 0.7384022482127951,
                                          -0.29491789986222278, 0.033882494798184004}),
                     tol);
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "sqrt_grad" input: ["y", "dy"] output: "dx")pb",
                         {{"y", Unary("sqrt", dt, kPositiveX)}, {"dy", dy}}, "dx"),
                     (std::vector<int64_t>{2, 3}),
                     (std::vector<double>{1, -1.4142135623730949, 0.25, 1.0606601717798212, -0.375,
                                          0.11858541225631422}),
                     tol);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ActivationTest, ::testing::Values(F32, F64),
                         [](const ::testing::TestParamInfo<DataType>& info) { return DataTypeName(info.param); });

// The host's float tanh (kernel_math::Tanh, Cephes' form through expf, in
// place of glibc's slower tanhf): within 1.5 ulp of tanh in double over
// [-20, 20] in steps of 1e-4 and down to 1e-30, exactly odd, +-1 at the
// infinities and past 44, NaN for NaN, -0 for -0.
TEST(TanhTest, HostFloatTanhIsWithinOneAndAHalfUlp) {
  const auto ulps = [](float got, double x) {
    const float want = static_cast<float>(std::tanh(x));
    const double ulp = std::nextafter(std::fabs(want), 2.0f) - std::fabs(want);
    return std::fabs(got - std::tanh(x)) / ulp;
  };
  double worst = 0;
  for (int i = -200000; i <= 200000; ++i) {
    const float x = static_cast<float>(i) * 1e-4f;
    const float t = kernel_math::Tanh(x);
    worst = std::max(worst, ulps(t, x));
    ASSERT_EQ(kernel_math::Tanh(-x), -t) << x;
  }
  for (float x = 1e-30f; x < 1.0f; x *= 1.01f) worst = std::max(worst, ulps(kernel_math::Tanh(x), x));
  EXPECT_LE(worst, 1.5);
  EXPECT_EQ(kernel_math::Tanh(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(kernel_math::Tanh(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_EQ(kernel_math::Tanh(50.0f), 1.0f);
  EXPECT_TRUE(std::isnan(kernel_math::Tanh(std::nanf(""))));
  EXPECT_TRUE(std::signbit(kernel_math::Tanh(-0.0f)));
  EXPECT_EQ(kernel_math::Tanh(-0.0f), 0.0f);
}

// The host's float exp without branches (kernel_math::PolyExp, the CPU
// attention's softmax and Tanh's large side): within 1 ulp of exp in double
// over every 61st float in [-104, 89] (denormal results in units of the
// smallest denormal), overflow to inf, underflow to 0, NaN for NaN.
TEST(PolyExpTest, WithinOneUlpOverTheRangeAndItsLimits) {
  const auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  const auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  double worst = 0;
  const auto check = [&](float x) {
    const double want = std::exp(static_cast<double>(x));
    const float got = kernel_math::PolyExp(x);
    const float rounded = static_cast<float>(want);
    if (rounded == 0.0f || std::isinf(rounded)) {
      ASSERT_EQ(got, rounded) << x;
      return;
    }
    const double ulp = rounded < std::numeric_limits<float>::min()
                           ? std::numeric_limits<float>::denorm_min()
                           : std::nextafter(rounded, std::numeric_limits<float>::infinity()) - rounded;
    worst = std::max(worst, std::fabs(got - want) / ulp);
  };
  for (uint32_t u = 0; u <= bits(89.0f); u += 61) check(from_bits(u));
  for (uint32_t u = bits(-0.0f); u <= bits(-104.0f); u += 61) check(from_bits(u));
  EXPECT_LE(worst, 1.0);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(kernel_math::PolyExp(0.0f), 1.0f);
  EXPECT_EQ(kernel_math::PolyExp(88.8f), inf);
  EXPECT_EQ(kernel_math::PolyExp(1000.0f), inf);
  EXPECT_EQ(kernel_math::PolyExp(inf), inf);
  EXPECT_EQ(kernel_math::PolyExp(-104.0f), 0.0f);
  EXPECT_EQ(kernel_math::PolyExp(-inf), 0.0f);
  EXPECT_GT(kernel_math::PolyExp(-100.0f), 0.0f);  // a denormal, not flushed
  EXPECT_TRUE(std::isnan(kernel_math::PolyExp(std::nanf(""))));
}

TEST(SigmoidTest, ExtremeInputsDoNotOverflow) {
  // torch.sigmoid(torch.tensor([-100.0, -20.0, 20.0, 100.0], dtype=torch.float32))
  Tensor y = RunNamed(R"pb(type: "sigmoid" input: "x" output: "y")pb",
                 {{"x", MakeTensor(F32, {4}, {-100.0, -20.0, 20.0, 100.0})}});
  EXPECT_VALUES_NEAR(y, (std::vector<int64_t>{4}), (std::vector<double>{0, 2.0611536921677498e-09, 1, 1}), 1e-6);
  EXPECT_NEAR(TensorValues(y)[1], 2.0611536921677498e-09, 2.0611536921677498e-09 * 1e-6);
}

TEST(ReluTest, PropagatesNan) {
  // torch.relu(torch.tensor([nan])) is nan.
  Tensor y = RunNamed(R"pb(type: "relu" input: "x" output: "y")pb",
                 {{"x", MakeTensor(F32, {1}, {std::numeric_limits<double>::quiet_NaN()})}});
  EXPECT_TRUE(std::isnan(TensorValues(y)[0]));
}

TEST(ScaleTest, AppliesScaleAndBias) {
  // 2.5 * x - 0.5 by hand.
  Tensor y = RunNamed(R"pb(type: "scale" input: "x" output: "y"
                      attr { key: "scale" value { f: 2.5 } } attr { key: "bias" value { f: -0.5 } })pb",
                 {{"x", MakeTensor(F32, {2, 3}, kX)}});
  EXPECT_VALUES_NEAR(y, (std::vector<int64_t>{2, 3}), (std::vector<double>{-5.5, -1.75, -0.5, 0.125, 2.0, 7.0}), 0);
  // Defaults: scale 1, bias 0; an int written for a float attr is accepted.
  Tensor same = RunNamed(R"pb(type: "scale" input: "x" output: "y" attr { key: "scale" value { i: 3 } })pb",
                    {{"x", MakeTensor(F64, {3}, {1.0, -2.0, 0.5})}});
  EXPECT_VALUES_NEAR(same, (std::vector<int64_t>{3}), (std::vector<double>{3.0, -6.0, 1.5}), 0);
}

TEST(UnaryTest, LargeTensorRunsAcrossThreads) {
  // 100k elements: several ParallelFor chunks; each element checked by hand formula.
  std::vector<double> x(100003);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.001 * i) * 4.0;
  std::map<std::string, Tensor> env{{"x", MakeTensor(F64, {static_cast<int64_t>(x.size())}, x)}};
  ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "gelu" input: "x" output: "y")pb"), &env).ok());
  std::vector<double> got = TensorValues(env.at("y"));
  for (size_t i = 0; i < x.size(); ++i) {
    double want = 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
    ASSERT_NEAR(got[i], want, 1e-15 * std::max(1.0, std::abs(want))) << i;
  }
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

TEST(UnaryTest, GeluTanhFormMatchesItsFormulaInDouble) {
  std::vector<double> x(1001);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -6.0 + 0.012 * i;
  Tensor y = RunNamed(R"pb(type: "gelu" input: "x" output: "y" attr { key: "approximate" value { s: "tanh" } })pb",
                      {{"x", MakeTensor(F64, {static_cast<int64_t>(x.size())}, x)}});
  std::vector<double> got = TensorValues(y);
  for (size_t i = 0; i < x.size(); ++i) {
    double want = 0.5 * x[i] * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
    ASSERT_NEAR(got[i], want, 1e-15 * std::max(1.0, std::abs(want))) << i;
  }
}

TEST(ActivationShapeTest, GeluRefusesAnUnknownApproximation) {
  for (const char* op : {"gelu", "gelu_grad"}) {
    SCOPED_TRACE(op);
    const std::string inputs = std::string(op) == "gelu" ? "\"x\"" : "\"x\", \"dy\"";
    const std::string text = absl::StrCat("type: \"", op, "\" input: [", inputs,
                                          "] output: \"y\" attr { key: \"approximate\" value { s: \"sigmoid\" } }");
    std::vector<TensorType> in(std::string(op) == "gelu" ? 1 : 2, TensorType{F32, {2, 3}});
    auto bad = Infer(text, in);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.status().message(), HasSubstr("attr 'approximate' must be \"none\" or \"tanh\", got \"sigmoid\""));
    // Run as the executor's callers run it: the message names the op.
    std::map<std::string, Tensor> env{{"x", MakeTensor(F32, {2, 3}, kX)}, {"dy", MakeTensor(F32, {2, 3}, kDy)}};
    absl::Status run = RunOp(ParseOp(text), &env);
    ASSERT_FALSE(run.ok());
    EXPECT_EQ(run.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(run.message(), HasSubstr(op));
    EXPECT_THAT(run.message(), HasSubstr("attr 'approximate' must be"));
  }
  auto ok = Infer(R"pb(type: "gelu" input: "x" output: "y" attr { key: "approximate" value { s: "none" } })pb",
                  {{F32, {-1, 16}}});
  EXPECT_TRUE(ok.ok()) << ok.status().message();
}

// gelu and gelu_grad on BF16 / F16 (mixed precision runs gelu in the low
// dtype): the float32 kernels on the widened values, rounded once, so each
// equals cast up, the F32 kernel, cast down bit for bit, in both forms.
TEST(UnaryTest, SixteenBitGeluIsTheCastsAroundTheFloatKernel) {
  std::vector<double> x(257), dy(257);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = -7.0 + 0.055 * i;
    dy[i] = std::cos(0.37 * i) * 3.0;
  }
  const int64_t n = static_cast<int64_t>(x.size());
  for (DataType low : {BF16, F16}) {
    for (const char* form : {"none", "tanh"}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(low), " ", form));
      const std::string attr = absl::StrCat(" attr { key: \"approximate\" value { s: \"", form, "\" } }");
      const std::string down = absl::StrCat(" attr { key: \"dtype\" value { s: \"", DataTypeName(low), "\" } }");
      const std::string up = R"( attr { key: "dtype" value { s: "F32" } })";
      std::map<std::string, Tensor> env{{"x", MakeTensor(low, {n}, x)}, {"dy", MakeTensor(low, {n}, dy)}};
      for (const std::string& text :
           {absl::StrCat(R"(type: "gelu" input: "x" output: "y")", attr),
            absl::StrCat(R"(type: "gelu_grad" input: ["x", "dy"] output: "dx")", attr),
            absl::StrCat(R"(type: "cast" input: "x" output: "xf")", up),
            absl::StrCat(R"(type: "cast" input: "dy" output: "dyf")", up),
            absl::StrCat(R"(type: "gelu" input: "xf" output: "yf")", attr),
            absl::StrCat(R"(type: "gelu_grad" input: ["xf", "dyf"] output: "dxf")", attr),
            absl::StrCat(R"(type: "cast" input: "yf" output: "y_ref")", down),
            absl::StrCat(R"(type: "cast" input: "dxf" output: "dx_ref")", down)}) {
        const absl::Status s = RunOp(ParseOp(text), &env);
        ASSERT_TRUE(s.ok()) << text << ": " << s;
      }
      EXPECT_EQ(env["y"].dtype(), low);
      EXPECT_EQ(env["dx"].dtype(), low);
      EXPECT_EQ(TensorValues(env["y"]), TensorValues(env["y_ref"]));
      EXPECT_EQ(TensorValues(env["dx"]), TensorValues(env["dx_ref"]));
    }
  }
  // A 16-bit x takes a dy of its type and no out_dtype.
  auto f32_dy = Infer(R"pb(type: "gelu_grad" input: ["x", "dy"] output: "dx")pb", {{BF16, {4}}, {F32, {4}}});
  ASSERT_FALSE(f32_dy.ok());
  EXPECT_THAT(f32_dy.status().message(), HasSubstr("input 'dy'"));
  auto stored = Infer(R"pb(type: "gelu_grad" input: ["x", "dy"] output: "dx"
                           attr { key: "out_dtype" value { s: "BF16" } })pb",
                      {{BF16, {4}}, {BF16, {4}}});
  ASSERT_FALSE(stored.ok());
  EXPECT_THAT(stored.status().message(), HasSubstr("attr 'out_dtype' BF16 needs an F32 'x'"));
  auto half = Infer(R"pb(type: "gelu_grad" input: ["x", "dy"] output: "dx")pb", {{F16, {4}}, {F16, {4}}});
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ((*half)[0], (TensorType{F16, {4}}));
}

TEST(ActivationShapeTest, KeepsBatchDimAndRejectsIntegers) {
  auto out = Infer(R"pb(type: "gelu" input: "x" output: "y")pb", {{F32, {-1, 16}}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0], (TensorType{F32, {-1, 16}}));

  auto bad = Infer(R"pb(type: "relu" input: "x" output: "y")pb", {{I64, {-1, 16}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("input 'x' must be F32 or F64, got I64"));

  auto mismatch = Infer(R"pb(type: "tanh_grad" input: ["y", "dy"] output: "dx")pb", {{F32, {-1, 4}}, {F32, {-1, 5}}});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_THAT(mismatch.status().message(), HasSubstr("must have the same shape"));

  auto dtype = Infer(R"pb(type: "relu_grad" input: ["y", "dy"] output: "dx")pb", {{F32, {4}}, {F64, {4}}});
  ASSERT_FALSE(dtype.ok());
  EXPECT_THAT(dtype.status().message(), HasSubstr("'y' is F32 but 'dy' is F64"));

  auto attr = Infer(R"pb(type: "scale" input: "x" output: "y" attr { key: "scale" value { s: "two" } })pb",
                    {{F32, {3}}});
  ASSERT_FALSE(attr.ok());
  EXPECT_THAT(attr.status().message(), HasSubstr("attr 'scale' must be float"));
}

}  // namespace
}  // namespace strata
