#include "runtime/float16.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

// The nearest of a monotonic table of non-negative 16-bit patterns to |x|,
// ties to the even pattern, found by bisection with distances in double: a
// reference independent of the bit tricks under test.
template <typename Half>
uint16_t NearestBySearch(float x, uint16_t largest_finite, uint16_t infinity) {
  const double target = std::fabs(static_cast<double>(x));
  uint16_t lo = 0, hi = largest_finite;  // ToFloat(lo) <= target within range
  if (target >= ToFloat(Half{largest_finite})) {
    lo = largest_finite;
    hi = infinity;
  } else {
    while (hi - lo > 1) {
      const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
      (ToFloat(Half{mid}) <= target ? lo : hi) = mid;
    }
  }
  // Past the largest finite value the "next" one is where the exponent would
  // continue: 2^(emax+1), at which IEEE rounding goes to infinity.
  const double low = ToFloat(Half{lo});
  const double up = hi == infinity ? std::ldexp(1.0, std::ilogb(low) + 1) : static_cast<double>(ToFloat(Half{hi}));
  const double below = target - low, above = up - target;
  uint16_t pick = below < above ? lo : above < below ? hi : ((lo & 1) == 0 ? lo : hi);
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  return static_cast<uint16_t>(pick | sign);
}

TEST(Float16Test, EveryPatternSurvivesARoundTripThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float b = ToFloat(bfloat16{static_cast<uint16_t>(bits)});
    const float h = ToFloat(float16{static_cast<uint16_t>(bits)});
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(ToFloat(ToBfloat16(b)))) << bits;
    } else {
      EXPECT_EQ(ToBfloat16(b).bits, bits) << std::hex << bits;
    }
    if (std::isnan(h)) {
      EXPECT_TRUE(std::isnan(ToFloat(ToFloat16(h)))) << bits;
      EXPECT_EQ(ToFloat16(h).bits & 0x8000u, bits & 0x8000u);
    } else {
      EXPECT_EQ(ToFloat16(h).bits, bits) << std::hex << bits;
    }
  }
}

TEST(Float16Test, KnownValuesAndTiesToEven) {
  EXPECT_EQ(ToFloat16(1.0f).bits, 0x3c00);
  EXPECT_EQ(ToFloat16(-2.0f).bits, 0xc000);
  EXPECT_EQ(ToFloat16(65504.0f).bits, 0x7bff);          // largest finite
  EXPECT_EQ(ToFloat16(65519.99f).bits, 0x7bff);         // below the halfway point
  EXPECT_EQ(ToFloat16(65520.0f).bits, 0x7c00);          // halfway: ties to even = infinity
  EXPECT_EQ(ToFloat16(std::ldexp(1.0f, -24)).bits, 0x0001);   // smallest subnormal
  EXPECT_EQ(ToFloat16(std::ldexp(1.0f, -25)).bits, 0x0000);   // halfway to it: even = 0
  EXPECT_EQ(ToFloat16(std::ldexp(3.0f, -25)).bits, 0x0002);   // 1.5 ulp: ties to even = 2
  EXPECT_EQ(ToFloat16(std::ldexp(1.0f, -14)).bits, 0x0400);   // smallest normal
  EXPECT_EQ(ToFloat16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);  // tie: even mantissa
  EXPECT_EQ(ToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
  EXPECT_EQ(ToBfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(ToBfloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);      // tie: even
  EXPECT_EQ(ToBfloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_EQ(ToBfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds up to infinity
  EXPECT_EQ(ToBfloat16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
}

TEST(Float16Test, RandomFloatsRoundToTheNearestPattern) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> any;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    float x = FloatFromBits(any(gen));
    if (!std::isfinite(x)) continue;
    // Mostly values in float16's range, where rounding is interesting.
    if (i % 2 == 0) x = std::ldexp(std::fmod(x, 1.0f) + 1.0f, static_cast<int>(any(gen) % 44) - 28);
    ASSERT_EQ(ToFloat16(x).bits, (NearestBySearch<float16>(x, 0x7bff, 0x7c00))) << x;
    ASSERT_EQ(ToBfloat16(x).bits, (NearestBySearch<bfloat16>(x, 0x7f7f, 0x7f80))) << x;
    ++checked;
  }
  EXPECT_GT(checked, 150000);
}

TEST(Float16Test, TensorsOfHalfDtypesFillAndRead) {
  Tensor b = Tensor::Empty(BF16, {3});
  Tensor h = Tensor::Empty(F16, {3});
  ASSERT_EQ(b.bytes(), 6u);
  b.Fill(0.1);
  h.Fill(0.1);
  EXPECT_EQ(b.ValueAt(2), ToFloat(ToBfloat16(0.1f)));
  EXPECT_NEAR(h.ValueAt(0), 0.1, 1e-4);
  EXPECT_TRUE(IsHalfFloating(BF16) && IsHalfFloating(F16) && !IsFloating(BF16));
}

}  // namespace
}  // namespace strata
