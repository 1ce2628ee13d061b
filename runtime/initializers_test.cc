#include "runtime/initializers.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "runtime/philox.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

Var ParseVar(const std::string& text) {
  Var var;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &var)) << text;
  return var;
}

std::vector<double> Values(const Tensor& t) {
  std::vector<double> out(t.num_elements());
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    out[i] = t.dtype() == F32 ? t.data<float>()[i] : t.data<double>()[i];
  }
  return out;
}

std::vector<double> Init(const std::string& text, uint64_t seed = 7) {
  absl::StatusOr<Tensor> t = InitializeParam(ParseVar(text), seed);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  return Values(*t);
}

struct Moments {
  double mean = 0, std = 0, min = 0, max = 0;
};

Moments MomentsOf(const std::vector<double>& v) {
  Moments m;
  m.min = *std::min_element(v.begin(), v.end());
  m.max = *std::max_element(v.begin(), v.end());
  for (double x : v) m.mean += x;
  m.mean /= v.size();
  for (double x : v) m.std += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(m.std / (v.size() - 1));
  return m;
}

// Sample mean and std within 5 standard errors of the distribution's; the
// std's standard error uses the distribution's excess kurtosis.
void ExpectMoments(const std::vector<double>& v, double mean, double std, double excess_kurtosis) {
  ASSERT_FALSE(v.empty());
  const double n = static_cast<double>(v.size());
  Moments m = MomentsOf(v);
  EXPECT_NEAR(m.mean, mean, 5 * std / std::sqrt(n));
  EXPECT_NEAR(m.std, std, 5 * std * std::sqrt((2 + excess_kurtosis) / (4 * n)));
}

TEST(InitializeParam, SameSeedAndNameGiveIdenticalValues) {
  const std::string var = R"pb(name: "fc1.w" dtype: F32 shape: [64, 32] kind: PARAM init { normal { std: 1 } })pb";
  absl::StatusOr<Tensor> a = InitializeParam(ParseVar(var), 42);
  absl::StatusOr<Tensor> b = InitializeParam(ParseVar(var), 42);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(std::memcmp(a->raw_data(), b->raw_data(), a->bytes()), 0);
}

TEST(InitializeParam, DifferentNameOrSeedGiveDifferentValues) {
  auto var = [](const std::string& name) {
    return R"pb(name: ")pb" + name + R"pb(" dtype: F64 shape: [100] kind: PARAM init { uniform { low: -1 high: 1 } })pb";
  };
  std::vector<double> base = Init(var("w"), 1);
  std::vector<double> other_name = Init(var("w2"), 1);
  std::vector<double> other_seed = Init(var("w"), 2);
  int same_name = 0, same_seed = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    same_name += base[i] == other_name[i];
    same_seed += base[i] == other_seed[i];
  }
  EXPECT_EQ(same_name, 0);
  EXPECT_EQ(same_seed, 0);
}

TEST(InitializeParam, DependsOnlyOnSeedAndNameNotOnOtherVarsOrShape) {
  const std::string b = R"pb(name: "b" dtype: F64 shape: [2, 3] kind: PARAM init { normal { std: 1 } })pb";
  const std::string a = R"pb(name: "a" dtype: F64 shape: [1000] kind: PARAM init { normal { std: 1 } })pb";
  std::vector<double> b_alone = Init(b);
  Init(a);
  std::vector<double> b_after_a = Init(b);
  EXPECT_EQ(b_alone, b_after_a);
  // Element i is drawn from counter i whatever the shape: [6] holds the same stream as [2, 3].
  EXPECT_EQ(Init(R"pb(name: "b" dtype: F64 shape: [6] kind: PARAM init { normal { std: 1 } })pb"), b_alone);
  // F32 holds the same draws, rounded.
  std::vector<double> b32 = Init(R"pb(name: "b" dtype: F32 shape: [2, 3] kind: PARAM init { normal { std: 1 } })pb");
  ASSERT_EQ(b32.size(), b_alone.size());
  for (size_t i = 0; i < b32.size(); ++i) EXPECT_EQ(b32[i], static_cast<double>(static_cast<float>(b_alone[i])));
}

TEST(InitializeParam, FollowsTheDocumentedStreamLayout) {
  // key = MixKey(seed, Fnv1a64(name)); element i = lane i % 4 of counter i / 4.
  const Philox philox(MixKey(7, Fnv1a64("layer.w")));
  std::vector<double> u = Init(R"pb(name: "layer.w" dtype: F64 shape: [9] init { uniform { low: 2 high: 6 } })pb");
  ASSERT_EQ(u.size(), 9u);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(u[i], 2 + 4 * philox.Uniform4(0, i / 4)[i % 4]) << i;
  // Normals: Box-Muller on lanes (0, 1) and (2, 3).
  std::vector<double> z = Init(R"pb(name: "layer.w" dtype: F64 shape: [4] init { normal { mean: 1 std: 3 } })pb");
  std::array<double, 4> lanes = philox.Uniform4(0, 0);
  const double radius = std::sqrt(-2 * std::log(1 - lanes[0]));
  const double theta = 2 * M_PI * lanes[1];
  EXPECT_DOUBLE_EQ(z[0], 1 + 3 * radius * std::cos(theta));
  EXPECT_DOUBLE_EQ(z[1], 1 + 3 * radius * std::sin(theta));
}

TEST(InitializeParam, UniformStatisticsAndRange) {
  std::vector<double> v =
      Init(R"pb(name: "u" dtype: F32 shape: [400, 500] kind: PARAM init { uniform { low: -1 high: 3 } })pb");
  Moments m = MomentsOf(v);
  EXPECT_GE(m.min, -1);
  EXPECT_LT(m.max, 3);
  EXPECT_LT(m.min, -0.999);
  EXPECT_GT(m.max, 2.999);
  ExpectMoments(v, 1.0, 4 / std::sqrt(12.0), -1.2);
}

TEST(InitializeParam, NormalStatistics) {
  std::vector<double> v =
      Init(R"pb(name: "n" dtype: F64 shape: [200000] kind: PARAM init { normal { mean: 0.5 std: 2 } })pb");
  ExpectMoments(v, 0.5, 2.0, 0.0);
  // Shape, not just moments: P(|z| < 1) = 0.682689.
  const double n = static_cast<double>(v.size());
  double inside = 0;
  for (double x : v) inside += std::abs(x - 0.5) < 2.0;
  EXPECT_NEAR(inside / n, 0.682689, 5 * std::sqrt(0.682689 * 0.317311 / n));
}

TEST(InitializeParam, TruncatedNormalStaysWithinTwoStd) {
  for (DataType dtype : {F32, F64}) {
    Var var = ParseVar(R"pb(name: "t" shape: [300, 400] kind: PARAM init { truncated_normal { mean: -1 std: 0.5 } })pb");
    var.set_dtype(dtype);
    absl::StatusOr<Tensor> t = InitializeParam(var, 3);
    ASSERT_TRUE(t.ok()) << t.status();
    std::vector<double> v = Values(*t);
    Moments m = MomentsOf(v);
    EXPECT_GE(m.min, -2.0);
    EXPECT_LE(m.max, 0.0);
    // A standard normal cut at +-2 has variance 1 - 4 phi(2) / (Phi(2) - Phi(-2)) = 0.773741
    // (std 0.879625) and excess kurtosis -0.6345.
    ExpectMoments(v, -1.0, 0.5 * 0.879625, -0.6345);
  }
}

TEST(InitializeParam, XavierUniformRespectsItsBound) {
  // [in, out] = [784, 256]: bound = sqrt(6 / (784 + 256)).
  std::vector<double> v = Init(R"pb(name: "fc1.w" dtype: F32 shape: [784, 256] kind: PARAM init { xavier_uniform {} })pb");
  const double bound = std::sqrt(6.0 / 1040.0);
  Moments m = MomentsOf(v);
  EXPECT_GE(m.min, -bound);
  EXPECT_LT(m.max, bound);
  EXPECT_GT(m.max, 0.999 * bound);
  ExpectMoments(v, 0.0, bound / std::sqrt(3.0), -1.2);
}

TEST(InitializeParam, XavierNormalUsesGain) {
  std::vector<double> v =
      Init(R"pb(name: "x" dtype: F64 shape: [300, 500] kind: PARAM init { xavier_normal { gain: 2 } })pb");
  ExpectMoments(v, 0.0, 2 * std::sqrt(2.0 / 800.0), 0.0);
}

TEST(InitializeParam, KaimingNormalUsesConvFans) {
  // [O, C, kh, kw] = [64, 16, 5, 5]: fan_in = 16 * 25, fan_out = 64 * 25; relu gain sqrt(2).
  const std::string conv = R"pb(name: "conv1.w" dtype: F32 shape: [64, 16, 5, 5] kind: PARAM )pb";
  ExpectMoments(Init(conv + "init { kaiming_normal {} }"), 0.0, std::sqrt(2.0 / 400.0), 0.0);
  ExpectMoments(Init(conv + "init { kaiming_normal { fan_out: true } }"), 0.0, std::sqrt(2.0 / 1600.0), 0.0);
}

TEST(InitializeParam, KaimingUniformUsesFanInOfAnInOutMatrix) {
  // [in, out] = [300, 100], a = sqrt(5) (torch.nn.Linear's choice): gain = sqrt(2 / 6),
  // bound = gain * sqrt(3 / fan_in) = sqrt(1 / 300).
  std::vector<double> v = Init(
      R"pb(name: "fc.w" dtype: F64 shape: [300, 100] kind: PARAM init { kaiming_uniform { a: 2.2360679774997898 } })pb");
  const double bound = std::sqrt(1.0 / 300.0);
  Moments m = MomentsOf(v);
  EXPECT_GE(m.min, -bound);
  EXPECT_LT(m.max, bound);
  EXPECT_GT(m.max, 0.999 * bound);
  ExpectMoments(v, 0.0, bound / std::sqrt(3.0), -1.2);
  // 1-D: fan_in = shape[0].
  ExpectMoments(Init(R"pb(name: "b" dtype: F64 shape: [100000] init { kaiming_normal {} })pb"), 0.0,
                std::sqrt(2.0 / 100000.0), 0.0);
}

TEST(InitializeParam, NoneIsZerosAndConstantFills) {
  EXPECT_EQ(Init(R"pb(name: "z" dtype: F32 shape: [2, 2] kind: PARAM)pb"), std::vector<double>(4, 0.0));
  EXPECT_EQ(Init(R"pb(name: "c" dtype: F64 shape: [3] kind: PARAM init { constant { value: 0.25 } })pb"),
            std::vector<double>(3, 0.25));
  absl::StatusOr<Tensor> step = InitializeParam(ParseVar(R"pb(name: "step" dtype: I64 kind: STATE)pb"), 1);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->rank(), 0);
  EXPECT_EQ(step->data<int64_t>()[0], 0);
  absl::StatusOr<Tensor> three =
      InitializeParam(ParseVar(R"pb(name: "k" dtype: I64 shape: [2] init { constant { value: 3 } })pb"), 1);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->data<int64_t>()[1], 3);
}

TEST(InitializeParam, EmptyTensorsNeedNoDraws) {
  absl::StatusOr<Tensor> t =
      InitializeParam(ParseVar(R"pb(name: "e" dtype: F32 shape: [0, 5] init { xavier_uniform {} })pb"), 1);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_elements(), 0);
}

TEST(InitializeParam, RejectsBadValuesNamingTheVar) {
  struct Bad {
    std::string var;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {R"pb(name: "w" dtype: F32 shape: [2] init { normal { std: -1 } })pb", "std"},
      {R"pb(name: "w" dtype: F32 shape: [2] init { truncated_normal { std: -0.5 } })pb", "std"},
      {R"pb(name: "w" dtype: F32 shape: [2] init { uniform { low: 1 high: 0 } })pb", "low"},
      {R"pb(name: "w" dtype: F32 shape: [-1, 4] kind: PARAM init { normal { std: 1 } })pb", "-1"},
      {R"pb(name: "w" dtype: F32 shape: [-1, 4] kind: PARAM)pb", "-1"},
      {R"pb(name: "w" dtype: F32 init { xavier_uniform {} })pb", "scalar"},
      {R"pb(name: "w" dtype: I64 shape: [3] init { uniform { high: 1 } })pb", "F32 or F64"},
      {R"pb(name: "w" dtype: F32 shape: [3, 3] init { xavier_normal { gain: -1 } })pb", "gain"},
      {R"pb(name: "w" dtype: F64 shape: [3] init { normal { mean: nan std: 1 } })pb", "finite"},
      {R"pb(name: "w" dtype: F64 shape: [3] init { uniform { low: 0 high: inf } })pb", "finite"},
      {R"pb(name: "w" dtype: I64 shape: [3] init { constant { value: 2.5 } })pb", "whole"},
      {R"pb(name: "w" shape: [3])pb", "dtype"},
  };
  for (const Bad& bad : cases) {
    absl::StatusOr<Tensor> t = InitializeParam(ParseVar(bad.var), 1);
    ASSERT_FALSE(t.ok()) << bad.var;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad.var;
    EXPECT_THAT(t.status().message(), HasSubstr("'w'")) << bad.var;
    EXPECT_THAT(t.status().message(), HasSubstr(bad.message)) << bad.var;
  }
}

}  // namespace
}  // namespace strata
