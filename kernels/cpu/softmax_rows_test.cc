// The CPU attention's softmax rows (softmax_rows.h, STRATA_ISA_CLONES): the
// loop the loader picked for this CPU (AVX-512, AVX2 or the baseline)
// computes the bits of the same lanes worked one element at a time, over
// lengths with and without a tail, values whose exp underflows to
// denormals and to zero, signed zeros and NaN; and the rows are the
// softmax std::exp gives, within PolyExp's ulp.

#include "kernels/cpu/softmax_rows.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/host_device.h"
#include "runtime/float16.h"

namespace strata {
namespace {

using softmax_rows::kLanes;

// The rows' lanes, one element at a time: element c of the blocked part
// goes to lane c % kLanes, the tail to lane 0 (RowMax's tail to the
// total), as the kernels' loops say.
float ScalarRowMax(const std::vector<float>& row) {
  const int64_t n = static_cast<int64_t>(row.size()), blocked = n / kLanes * kLanes;
  std::vector<float> lane(kLanes, -std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < blocked; ++c) lane[c % kLanes] = lane[c % kLanes] < row[c] ? row[c] : lane[c % kLanes];
  float max = lane[0];
  for (int64_t k = 1; k < kLanes; ++k) max = max < lane[k] ? lane[k] : max;
  for (int64_t c = blocked; c < n; ++c) max = max < row[c] ? row[c] : max;
  return max;
}

double ScalarExpShiftedSum(std::vector<float>& row, float shift) {
  const int64_t n = static_cast<int64_t>(row.size()), blocked = n / kLanes * kLanes;
  std::vector<double> lane(kLanes, 0.0);
  for (int64_t c = 0; c < n; ++c) {
    row[c] = kernel_math::PolyExp(row[c] - shift);
    lane[c < blocked ? c % kLanes : 0] += row[c];
  }
  double sum = 0;
  for (int64_t k = 0; k < kLanes; ++k) sum += lane[k];
  return sum;
}

// Rows of n scores: a spread of ordinary values, then (where n allows)
// ones whose exp underflows, signed zeros and the row's largest value
// late, so a lane other than the first holds it.
std::vector<float> Row(int64_t n, int seed) {
  std::vector<float> row(n);
  for (int64_t c = 0; c < n; ++c) row[c] = std::sin(0.37f * static_cast<float>(c * (seed + 3) + seed)) * 9.0f;
  const float specials[] = {-95.0f, -104.5f, -200.0f, 0.0f, -0.0f, -87.3f};
  for (int64_t i = 0; i < 6 && 3 * i + 1 < n; ++i) row[3 * i + 1] = specials[i];
  if (n > 2) row[n - 2] = 11.5f;
  return row;
}

const int64_t kLengths[] = {1, 2, 15, 16, 17, 31, 64, 100, 129, 1024};

TEST(SoftmaxRowsTest, ForwardRowsEqualTheScalarLanesBitForBit) {
  SCOPED_TRACE(internal::IsaCloneName());
  for (int64_t n : kLengths) {
    for (int seed = 0; seed < 3; ++seed) {
      SCOPED_TRACE(testing::Message() << "n " << n << ", seed " << seed);
      std::vector<float> row = Row(n, seed), want = row;
      const float max = softmax_rows::RowMax(row.data(), n);
      ASSERT_EQ(FloatBits(max), FloatBits(ScalarRowMax(want)));
      const double sum = softmax_rows::ExpShiftedSum(row.data(), n, max);
      const double want_sum = ScalarExpShiftedSum(want, max);
      ASSERT_EQ(sum, want_sum);
      for (int64_t c = 0; c < n; ++c) ASSERT_EQ(FloatBits(row[c]), FloatBits(want[c])) << "element " << c;
    }
  }
}

TEST(SoftmaxRowsTest, ForwardRowsAreTheSoftmaxOfStdExp) {
  for (int64_t n : kLengths) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    std::vector<float> row = Row(n, 1);
    const std::vector<float> x = row;
    const float max = softmax_rows::RowMax(row.data(), n);
    float want_max = -std::numeric_limits<float>::infinity();
    for (float v : x) want_max = std::max(want_max, v);
    ASSERT_EQ(max, want_max);
    const double sum = softmax_rows::ExpShiftedSum(row.data(), n, max);
    double want_sum = 0;
    for (int64_t c = 0; c < n; ++c) {
      const double e = std::exp(static_cast<double>(x[c] - max));
      want_sum += e;
      // PolyExp is within 1 ulp of exp; 2 epsilons relative (2 to 4 ulps) of slack.
      EXPECT_NEAR(row[c], e, 2.0 * std::numeric_limits<float>::epsilon() * e + 1e-45) << "element " << c;
    }
    EXPECT_NEAR(sum, want_sum, 2e-7 * want_sum);
  }
}

TEST(SoftmaxRowsTest, BackwardRowsEqualTheScalarLoopBitForBit) {
  SCOPED_TRACE(internal::IsaCloneName());
  for (int64_t n : kLengths) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    std::vector<float> p = Row(n, 2), dp(n);
    for (int64_t c = 0; c < n; ++c) dp[c] = std::cos(0.21f * static_cast<float>(c)) * 0.5f;
    const float lse = 12.25f, di = 0.125f;
    std::vector<float> want_p = p, want_dp = dp;
    for (int64_t c = 0; c < n; ++c) {
      want_p[c] = kernel_math::PolyExp(want_p[c] - lse);
      want_dp[c] = want_p[c] * (want_dp[c] - di);
    }
    softmax_rows::ProbsAndScoreGrads(p.data(), dp.data(), n, lse, di);
    for (int64_t c = 0; c < n; ++c) {
      ASSERT_EQ(FloatBits(p[c]), FloatBits(want_p[c])) << "p " << c;
      ASSERT_EQ(FloatBits(dp[c]), FloatBits(want_dp[c])) << "dp " << c;
    }
  }
}

// A NaN score (from a NaN input) leaves the max as std::max would in the
// same lanes, and reaches the row's probabilities.
TEST(SoftmaxRowsTest, NanScoresMatchTheScalarLanes) {
  SCOPED_TRACE(internal::IsaCloneName());
  for (int64_t n : {5, 16, 40}) {
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      SCOPED_TRACE(testing::Message() << "n " << n << ", NaN at " << at);
      std::vector<float> row = Row(n, 0);
      row[at] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> want = row;
      const float max = softmax_rows::RowMax(row.data(), n);
      ASSERT_EQ(FloatBits(max), FloatBits(ScalarRowMax(want)));
      const double sum = softmax_rows::ExpShiftedSum(row.data(), n, max);
      const double want_sum = ScalarExpShiftedSum(want, max);
      EXPECT_TRUE(std::isnan(sum));
      EXPECT_TRUE(std::isnan(want_sum));
      for (int64_t c = 0; c < n; ++c) ASSERT_EQ(std::isnan(row[c]), std::isnan(want[c])) << c;
      for (int64_t c = 0; c < n; ++c) {
        if (!std::isnan(row[c])) {
          ASSERT_EQ(FloatBits(row[c]), FloatBits(want[c])) << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata
