#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/philox.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

std::string DropoutText(const std::string& type, double p, int64_t uid) {
  return absl::StrCat("type: \"", type, "\" input: \"x\" output: \"y\" uid: ", uid,
                      " attr { key: \"p\" value { f: ", p, " } }");
}

absl::StatusOr<Tensor> RunDropout(const Tensor& x, double p, const RunContext& run, int64_t uid = 3,
                                  const std::string& type = "dropout") {
  std::map<std::string, Tensor> env{{"x", x}};
  if (auto s = RunOp(ParseOp(DropoutText(type, p, uid)), &env, run); !s.ok()) return s;
  return env["y"];
}

Tensor Iota(DataType dtype, Shape shape) {
  std::vector<double> v(NumElements(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0 + static_cast<double>(i);
  return MakeTensor(dtype, shape, v);
}

RunContext Training(uint64_t seed, int64_t step, int64_t sample_offset = 0) {
  RunContext run;
  run.seed = seed;
  run.step = step;
  run.sample_offset = sample_offset;
  run.training = true;
  return run;
}

TEST(DropoutTest, EvaluationIsTheIdentityWithoutACopy) {
  Tensor x = Iota(F32, {4, 5});
  RunContext eval = Training(1, 0);
  eval.training = false;
  auto y = RunDropout(x, 0.5, eval);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->raw_data(), x.raw_data());
  auto dx = RunDropout(x, 0.5, eval, 3, "dropout_grad");
  ASSERT_TRUE(dx.ok()) << dx.status();
  EXPECT_EQ(dx->raw_data(), x.raw_data());
}

TEST(DropoutTest, KeepsAboutOneMinusPAndScalesTheKeptElements) {
  const double p = 0.3;
  Tensor x = MakeTensor(F32, {1000, 50}, std::vector<double>(50000, 1.0));
  auto y = RunDropout(x, p, Training(42, 5));
  ASSERT_TRUE(y.ok()) << y.status();
  int64_t kept = 0;
  for (double v : TensorValues(*y)) {
    if (v == 0) continue;
    EXPECT_FLOAT_EQ(v, 1.0 / (1.0 - p));
    ++kept;
  }
  // 50000 Bernoulli(0.7) draws: the standard deviation of the fraction is 0.002.
  EXPECT_NEAR(kept / 50000.0, 1.0 - p, 0.01);
}

// The mask is the documented stream: key MixKey(seed, uid), counter (step, L / 4), lane L % 4,
// with L = global sample * elements per sample + element.
TEST(DropoutTest, MaskIsTheDocumentedPhiloxStream) {
  const uint64_t seed = 99;
  const int64_t step = 7, uid = 11, offset = 5, per_sample = 3;
  const double p = 0.5;
  Tensor x = Iota(F64, {4, per_sample});
  auto y = RunDropout(x, p, Training(seed, step, offset), uid);
  ASSERT_TRUE(y.ok()) << y.status();
  const Philox philox(MixKey(seed, uid));
  std::vector<double> got = TensorValues(*y), xv = TensorValues(x);
  int dropped = 0;
  for (int64_t i = 0; i < 4 * per_sample; ++i) {
    const uint64_t linear = offset * per_sample + i;
    const double u = philox.Uniform4(step, linear / 4)[linear % 4];
    EXPECT_EQ(got[i], u >= p ? xv[i] / (1 - p) : 0.0) << "element " << i;
    dropped += u < p;
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, 12);
}

// Micro-batches and data-parallel shards see their samples at a sample_offset:
// the pieces must reproduce the single-device mask, even when a piece starts
// in the middle of a group of four.
TEST(DropoutTest, SplittingTheBatchWithSampleOffsetsReproducesTheMask) {
  const int64_t N = 8, per_sample = 15;  // 15 elements per sample: pieces start mid-group
  std::vector<double> xv(N * per_sample);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37 * i) + 2.0;
  Tensor x = MakeTensor(F32, {N, 3, 5}, xv);
  auto whole = RunDropout(x, 0.4, Training(2024, 3, /*sample_offset=*/16));
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<double> want = TensorValues(*whole);
  for (int64_t split : {4, 3, 1}) {
    SCOPED_TRACE(absl::StrCat("split at sample ", split));
    std::vector<double> first(xv.begin(), xv.begin() + split * per_sample),
        second(xv.begin() + split * per_sample, xv.end());
    auto a = RunDropout(MakeTensor(F32, {split, 3, 5}, first), 0.4, Training(2024, 3, 16));
    auto b = RunDropout(MakeTensor(F32, {N - split, 3, 5}, second), 0.4, Training(2024, 3, 16 + split));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    std::vector<double> joined = TensorValues(*a), rest = TensorValues(*b);
    joined.insert(joined.end(), rest.begin(), rest.end());
    EXPECT_EQ(joined, want);
  }
}

TEST(DropoutTest, GradientRegeneratesTheForwardMask) {
  Tensor ones = MakeTensor(F64, {6, 7}, std::vector<double>(42, 1.0));
  const RunContext run = Training(5, 2, 10);
  auto y = RunDropout(ones, 0.3, run, /*uid=*/4);
  auto dx = RunDropout(ones, 0.3, run, /*uid=*/4, "dropout_grad");
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(dx.ok()) << dx.status();
  EXPECT_EQ(TensorValues(*dx), TensorValues(*y));
  // And the gradient maker keeps the forward op's uid and p on the emitted op.
  std::map<std::string, TensorType> types{{"x", {F64, {-1, 7}}}, {"y", {F64, {-1, 7}}}};
  std::vector<std::string> names;
  auto ops = MakeGradOps(ParseOp(DropoutText("dropout", 0.3, 4)), types, {true}, &names);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 1u);
  EXPECT_EQ((*ops)[0].type(), "dropout_grad");
  EXPECT_EQ((*ops)[0].uid(), 4);
  EXPECT_DOUBLE_EQ((*ops)[0].attr().at("p").f(), 0.3);
}

TEST(DropoutTest, SeedStepAndOpChangeTheMask) {
  Tensor x = MakeTensor(F32, {8, 16}, std::vector<double>(128, 1.0));
  auto base = RunDropout(x, 0.5, Training(1, 0), 1);
  auto other_step = RunDropout(x, 0.5, Training(1, 1), 1);
  auto other_seed = RunDropout(x, 0.5, Training(2, 0), 1);
  auto other_op = RunDropout(x, 0.5, Training(1, 0), 2);
  auto again = RunDropout(x, 0.5, Training(1, 0), 1);
  for (auto* r : {&base, &other_step, &other_seed, &other_op, &again}) ASSERT_TRUE(r->ok()) << r->status();
  EXPECT_EQ(TensorValues(*again), TensorValues(*base));
  EXPECT_NE(TensorValues(*other_step), TensorValues(*base));
  EXPECT_NE(TensorValues(*other_seed), TensorValues(*base));
  EXPECT_NE(TensorValues(*other_op), TensorValues(*base));
}

TEST(DropoutTest, ZeroProbabilityAndScalarsWork) {
  Tensor x = Iota(F32, {3, 2});
  auto y = RunDropout(x, 0.0, Training(1, 0));
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(TensorValues(*y), TensorValues(x));
  auto scalar = RunDropout(MakeTensor(F64, {}, {2.0}), 0.5, Training(1, 0));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  const double v = TensorValues(*scalar)[0];
  EXPECT_TRUE(v == 0.0 || v == 4.0) << v;
}

TEST(DropoutShapeTest, RejectsProbabilitiesOutsideZeroToOne) {
  const OpSchema* schema = OpRegistry::Global().Find("dropout");
  ASSERT_NE(schema, nullptr);
  for (double p : {1.0, -0.1, 1.5}) {
    Op op = ParseOp(DropoutText("dropout", p, 0));
    ASSERT_TRUE(CanonicalizeOp(*schema, &op).ok());
    auto t = InferOutputTypes(*schema, op, {{F32, {-1, 4}}});
    ASSERT_FALSE(t.ok()) << p;
    EXPECT_THAT(t.status().message(), HasSubstr("attr 'p' must be in [0, 1)"));
  }
  Op op = ParseOp(DropoutText("dropout", 0.5, 0));
  ASSERT_TRUE(CanonicalizeOp(*schema, &op).ok());
  auto ints = InferOutputTypes(*schema, op, {{I64, {-1, 4}}});
  EXPECT_FALSE(ints.ok());
}

}  // namespace
}  // namespace strata
