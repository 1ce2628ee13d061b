// Dynamic loss scaling's kernels (check_finite_and_unscale,
// update_loss_scaling) and the update ops' optional found_inf input, run
// through the op registry and the CPU kernels as the executor runs them.
// Expected values follow torch.cuda.amp.GradScaler's documented rule.

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor Scalar(DataType dtype, double value) { return MakeTensor(dtype, {}, {value}); }

std::vector<double> Ramp(int64_t n, double scale) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * static_cast<double>((i % 97) - 48);
  return v;
}

TEST(CheckFiniteAndUnscaleTest, DividesEveryGradientByTheScale) {
  std::map<std::string, Tensor> env;
  // 40000 elements: several chunks of the thread pool's split.
  env["a"] = MakeTensor(F32, {200, 200}, Ramp(40000, 1024.0));
  env["b"] = MakeTensor(F32, {3}, {3.0, -0.5, 6e4});
  env["s"] = Scalar(F32, 1024.0);
  Op op = ParseOp(R"pb(type: "check_finite_and_unscale" input: ["s", "a", "b"] output: ["found", "ua", "ub"])pb");
  ASSERT_TRUE(RunOp(op, &env).ok());
  EXPECT_EQ(TensorValues(env["found"]), std::vector<double>{0.0});
  EXPECT_EQ(TensorValues(env["ua"]), Ramp(40000, 1.0));  // 1/1024 is exact
  EXPECT_EQ(TensorValues(env["ub"]), (std::vector<double>{3.0 / 1024, -0.5 / 1024, 6e4 / 1024}));
}

TEST(CheckFiniteAndUnscaleTest, MultipliesByTheFloatReciprocal) {
  // As GradScaler: inv = float(1 / double(scale)), then x * inv in float.
  std::map<std::string, Tensor> env;
  env["x"] = MakeTensor(F32, {2}, {1.0, 3.0});
  env["s"] = Scalar(F32, 3.0);
  Op op = ParseOp(R"pb(type: "check_finite_and_unscale" input: ["s", "x"] output: ["found", "y"])pb");
  ASSERT_TRUE(RunOp(op, &env).ok());
  const float inv = static_cast<float>(1.0 / 3.0);
  EXPECT_EQ(TensorValues(env["y"]), (std::vector<double>{inv, 3.0f * inv}));
}

TEST(CheckFiniteAndUnscaleTest, FindsAnInfOrNanAnywhere) {
  for (double bad : {kInf, -kInf, std::nan("")}) {
    for (int64_t where : {int64_t{0}, int64_t{39999}, int64_t{20000}}) {
      std::map<std::string, Tensor> env;
      std::vector<double> values = Ramp(40000, 1.0);
      values[where] = bad;
      env["a"] = MakeTensor(F32, {3}, {1, 2, 3});
      env["b"] = MakeTensor(F32, {40000}, values);
      env["s"] = Scalar(F32, 65536.0);
      Op op = ParseOp(R"pb(type: "check_finite_and_unscale" input: ["s", "a", "b"] output: ["found", "ua", "ub"])pb");
      ASSERT_TRUE(RunOp(op, &env).ok());
      EXPECT_EQ(TensorValues(env["found"]), std::vector<double>{1.0}) << bad << " at " << where;
    }
  }
}

TEST(CheckFiniteAndUnscaleTest, TakesFloat64Gradients) {
  std::map<std::string, Tensor> env;
  env["x"] = MakeTensor(F64, {2}, {1e300, -2.0});
  env["s"] = Scalar(F32, 4.0);
  Op op = ParseOp(R"pb(type: "check_finite_and_unscale" input: ["s", "x"] output: ["found", "y"])pb");
  ASSERT_TRUE(RunOp(op, &env).ok());
  EXPECT_EQ(TensorValues(env["found"]), std::vector<double>{0.0});
  EXPECT_EQ(TensorValues(env["y"]), (std::vector<double>{0.25e300, -0.5}));
}

TEST(CheckFiniteAndUnscaleTest, ShapeFunctionRefusesWhatItCannotCheck) {
  auto r = InferTypes(R"pb(type: "check_finite_and_unscale" input: ["s", "x"] output: ["f", "y"])pb",
                      {TensorType{F64, {}}, TensorType{F32, {2}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("input 'scale' must be a F32 scalar"));
  r = InferTypes(R"pb(type: "check_finite_and_unscale" input: ["s", "x"] output: ["f", "y"])pb",
                 {TensorType{F32, {}}, TensorType{F16, {2}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("must be F32 or F64 (master gradients)"));
  r = InferTypes(R"pb(type: "check_finite_and_unscale" input: ["s", "x", "z"] output: ["f", "y"])pb",
                 {TensorType{F32, {}}, TensorType{F32, {2}}, TensorType{F32, {2}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("one output 'y' per input 'x'"));
}

// Runs update_loss_scaling over `found` flags; returns the scale after each.
std::vector<double> ScaleSequence(double init, const std::string& attrs, const std::vector<int>& found,
                                  std::vector<double>* skipped = nullptr) {
  std::map<std::string, Tensor> env;
  env["scale"] = Scalar(F32, init);
  env["good"] = Scalar(I64, 0);
  env["skipped"] = Scalar(I64, 0);
  Op op = ParseOp(absl::StrCat(R"pb(type: "update_loss_scaling"
                                    input: ["found", "scale", "good", "skipped"]
                                    output: ["scale", "good", "skipped"])pb",
                               attrs));
  std::vector<double> scales;
  for (int f : found) {
    env["found"] = Scalar(F32, f);
    absl::Status s = RunOp(op, &env);
    EXPECT_TRUE(s.ok()) << s;
    scales.push_back(TensorValues(env["scale"])[0]);
    if (skipped) skipped->push_back(TensorValues(env["skipped"])[0]);
  }
  return scales;
}

TEST(UpdateLossScalingTest, BacksOffOnInfAndGrowsAfterTheInterval) {
  std::vector<double> skipped;
  const std::vector<double> scales = ScaleSequence(
      1024, R"pb(attr { key: "growth_interval" value { i: 3 } })pb", {0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0}, &skipped);
  // Three good steps grow it; an inf halves it and restarts the count.
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 2048, 1024, 1024, 1024, 512, 256, 256, 256, 512}));
  EXPECT_EQ(skipped, (std::vector<double>{0, 0, 0, 1, 1, 1, 2, 3, 3, 3, 3}));
}

TEST(UpdateLossScalingTest, OtherFactors) {
  const std::vector<double> scales = ScaleSequence(
      100,
      R"pb(attr { key: "growth_interval" value { i: 1 } }
           attr { key: "growth_factor" value { f: 3 } }
           attr { key: "backoff_factor" value { f: 0.25 } })pb",
      {0, 0, 1, 0});
  EXPECT_EQ(scales, (std::vector<double>{300, 900, 225, 675}));
}

TEST(UpdateLossScalingTest, KeepsTheScaleWhenGrowingWouldOverflow) {
  const double big = std::numeric_limits<float>::max() / 1.5;
  const std::vector<double> scales =
      ScaleSequence(big, R"pb(attr { key: "growth_interval" value { i: 1 } })pb", {0, 0});
  EXPECT_EQ(scales, (std::vector<double>{static_cast<float>(big), static_cast<float>(big)}));
}

TEST(UpdateLossScalingTest, BacksOffNoLowerThanTheLeastNormalFloat) {
  // Whose reciprocal, the unscaling factor, float32 still holds. A back-off
  // of 1e-30 used to leave 0, then NaN weights (a fuzzing helper's run).
  const double least = std::numeric_limits<float>::min();
  const std::vector<double> scales =
      ScaleSequence(1e-20, R"pb(attr { key: "backoff_factor" value { f: 1e-30 } })pb", {1, 1, 0});
  EXPECT_EQ(scales, (std::vector<double>{least, least, least}));
  EXPECT_TRUE(std::isfinite(1.0f / static_cast<float>(scales[0])));
  // Just above it, a back-off lands where it would.
  EXPECT_EQ(ScaleSequence(4 * least, "", {1})[0], 2 * least);
}

TEST(UpdateLossScalingTest, ShapeFunctionRefusesBadAttrs) {
  const std::vector<TensorType> in = {TensorType{F32, {}}, TensorType{F32, {}}, TensorType{I64, {}},
                                      TensorType{I64, {}}};
  const std::string op = R"pb(type: "update_loss_scaling" input: ["f", "s", "g", "k"] output: ["s", "g", "k"] )pb";
  EXPECT_TRUE(InferTypes(op, in).ok());
  auto r = InferTypes(op + R"pb(attr { key: "growth_factor" value { f: 1 } })pb", in);
  EXPECT_THAT(r.status().message(), HasSubstr("attr 'growth_factor' must be a finite value > 1, got 1"));
  r = InferTypes(op + R"pb(attr { key: "backoff_factor" value { f: 1.5 } })pb", in);
  EXPECT_THAT(r.status().message(), HasSubstr("attr 'backoff_factor' must be in (0, 1), got 1.5"));
  r = InferTypes(op + R"pb(attr { key: "growth_interval" value { i: 0 } })pb", in);
  EXPECT_THAT(r.status().message(), HasSubstr("attr 'growth_interval' must be >= 1, got 0"));
}

// ---------------------------------------------------------------------------
// The update ops with found_inf: nonzero leaves every buffer as it was (even
// with inf gradients); zero updates exactly as without the input.

struct UpdateCase {
  std::string op;  // reads p, g, lr (and m, v, step / vel)
  std::vector<std::string> state;
};

std::vector<UpdateCase> UpdateCases() {
  return {
      {R"pb(type: "sgd_update" input: ["p", "g", "lr"] output: ["p"]
            attr { key: "weight_decay" value { f: 0.1 } })pb",
       {}},
      {R"pb(type: "momentum_update" input: ["p", "g", "vel", "lr"] output: ["p", "vel"])pb", {"vel"}},
      {R"pb(type: "adam_update" input: ["p", "g", "m", "v", "lr", "step"] output: ["p", "m", "v"])pb", {"m", "v"}},
  };
}

std::map<std::string, Tensor> UpdateEnv(const std::vector<std::string>& state, const std::vector<double>& grad) {
  std::map<std::string, Tensor> env;
  env["p"] = MakeTensor(F32, {3}, {0.5, -1.0, 2.0});
  env["g"] = MakeTensor(F32, {3}, grad);
  env["lr"] = Scalar(F32, 0.1);
  env["step"] = Scalar(I64, 1);
  for (const auto& s : state) env[s] = MakeTensor(F32, {3}, {0.25, 0.5, 0.125});
  return env;
}

TEST(SkipUpdateTest, UpdateOpsChangeNothingWhenFoundInf) {
  for (const UpdateCase& c : UpdateCases()) {
    Op op = ParseOp(c.op);
    op.add_input("found");
    std::map<std::string, Tensor> env = UpdateEnv(c.state, {kInf, 1.0, std::nan("")});
    env["found"] = Scalar(F32, 1.0);
    const std::map<std::string, std::vector<double>> before = {
        {"p", TensorValues(env["p"])}};
    std::map<std::string, std::vector<double>> state_before;
    for (const auto& s : c.state) state_before[s] = TensorValues(env[s]);
    absl::Status s = RunOp(op, &env);
    ASSERT_TRUE(s.ok()) << op.type() << ": " << s;
    EXPECT_EQ(TensorValues(env["p"]), before.at("p")) << op.type();
    for (const auto& name : c.state) EXPECT_EQ(TensorValues(env[name]), state_before[name]) << op.type() << " " << name;
  }
}

TEST(SkipUpdateTest, UpdateOpsUpdateAsWithoutTheInputWhenFinite) {
  for (const UpdateCase& c : UpdateCases()) {
    Op plain = ParseOp(c.op);
    Op flagged = plain;
    flagged.add_input("found");
    std::map<std::string, Tensor> a = UpdateEnv(c.state, {0.3, -0.7, 1.1});
    std::map<std::string, Tensor> b = UpdateEnv(c.state, {0.3, -0.7, 1.1});
    b["found"] = Scalar(F32, 0.0);
    ASSERT_TRUE(RunOp(plain, &a).ok());
    ASSERT_TRUE(RunOp(flagged, &b).ok());
    EXPECT_EQ(TensorValues(a["p"]), TensorValues(b["p"])) << plain.type();
    EXPECT_NE(TensorValues(a["p"]), (std::vector<double>{0.5, -1.0, 2.0})) << plain.type() << " did not move";
    for (const auto& name : c.state) EXPECT_EQ(TensorValues(a[name]), TensorValues(b[name])) << plain.type();
  }
}

TEST(SkipUpdateTest, AdamSkipsBeforeItsFirstCountedStep) {
  // A first step skipped leaves the counter at 0; Adam must not refuse it.
  Op op = ParseOp(UpdateCases()[2].op);
  op.add_input("found");
  std::map<std::string, Tensor> env = UpdateEnv({"m", "v"}, {kInf, 0, 0});
  env["step"] = Scalar(I64, 0);
  env["found"] = Scalar(F32, 1.0);
  EXPECT_TRUE(RunOp(op, &env).ok());
  env["found"] = Scalar(F32, 0.0);
  EXPECT_THAT(RunOp(op, &env).message(), HasSubstr("must be >= 1"));
}

TEST(SkipUpdateTest, IncrementCountsOnlyUpdatesMade) {
  std::map<std::string, Tensor> env;
  env["step"] = Scalar(I64, 4);
  Op op = ParseOp(R"pb(type: "increment" input: ["step", "found"] output: ["step"])pb");
  env["found"] = Scalar(F32, 1.0);
  ASSERT_TRUE(RunOp(op, &env).ok());
  EXPECT_EQ(TensorValues(env["step"]), std::vector<double>{4});
  env["found"] = Scalar(F32, 0.0);
  ASSERT_TRUE(RunOp(op, &env).ok());
  EXPECT_EQ(TensorValues(env["step"]), std::vector<double>{5});
}

TEST(SkipUpdateTest, FoundInfMustBeAFloat32Scalar) {
  auto r = InferTypes(R"pb(type: "sgd_update" input: ["p", "g", "lr", "f"] output: ["p"])pb",
                      {TensorType{F32, {3}}, TensorType{F32, {3}}, TensorType{F32, {}}, TensorType{BOOL, {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("input 'found_inf' must be a F32 scalar"));
  // Without it, and with one too many inputs.
  EXPECT_TRUE(InferTypes(R"pb(type: "sgd_update" input: ["p", "g", "lr"] output: ["p"])pb",
                         {TensorType{F32, {3}}, TensorType{F32, {3}}, TensorType{F32, {}}})
                  .ok());
  r = InferTypes(R"pb(type: "increment" input: ["c", "f", "x"] output: ["c"])pb",
                 {TensorType{I64, {}}, TensorType{F32, {}}, TensorType{F32, {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("expects 1 or 2 inputs (counter, found_inf?), got 3"));
}

}  // namespace
}  // namespace strata
