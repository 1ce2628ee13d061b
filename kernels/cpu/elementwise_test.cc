// The element-wise maps' ISA clones (elementwise.h, STRATA_ISA_CLONES): the
// loop the loader picked for this CPU (AVX-512, AVX2 or the baseline)
// computes the bits the scalar, baseline code computes.

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/unary_math.h"
#include "kernels/host_device.h"
#include "runtime/float16.h"

namespace strata {
namespace {

// a * a + b with a = 1 + 2^-12, b = -(1 + 2^-11): a * a is 1 + 2^-11 + 2^-24,
// a tie that rounds (to even) to 1 + 2^-11, so the sum is 0; an FMA keeps
// the product exact and gives 2^-24. Every element of a map longer than
// its blocks must be 0: no clone contracts.
TEST(ElementwiseTest, IsaClonesRoundAsTheBaseline) {
  SCOPED_TRACE(internal::IsaCloneName());
  constexpr int64_t n = 1000;
  const float a = 1.0f + std::ldexp(1.0f, -12), b = -(1.0f + std::ldexp(1.0f, -11));
  std::vector<float> x(n, a), y(n, b), z(n, -1.0f);
  BinaryMap(n, x.data(), y.data(), z.data(), [](float p, float q) { return p * p + q; });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(FloatBits(z[i]), FloatBits(0.0f)) << i;
  // The same through the unary map, the addend a constant.
  UnaryMap(n, x.data(), z.data(), [b](float p) { return p * p + b; });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(FloatBits(z[i]), FloatBits(0.0f)) << i;
}

// gelu's tanh form and its gradient, the map's loop against the scalar
// functor one element at a time, over values that take each side of
// kernel_math::Tanh (below 0.625, above, past 44), the boundaries, signed
// zeros, denormals, infinities and NaN; and through bf16 storage (the
// conversions in the same loop).
TEST(ElementwiseTest, TanhGeluMapsEqualTheScalarFunctorBitForBit) {
  SCOPED_TRACE(internal::IsaCloneName());
  std::vector<float> x;
  for (int i = -40000; i <= 40000; ++i) x.push_back(static_cast<float>(i) * 1.3e-3f);
  for (float v : {0.0f, -0.0f, 0.625f, std::nextafter(0.625f, 0.0f), 44.0f, std::nextafter(44.0f, 50.0f), 88.0f,
                  1e-40f, -1e-40f, 3e38f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    x.push_back(v);
    x.push_back(-v);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> dy(x.size());
  for (int64_t i = 0; i < n; ++i) dy[i] = 0.5f + static_cast<float>(i % 7) * 0.25f;

  std::vector<float> tanh(x.size()), gelu(x.size()), grad(x.size());
  UnaryMap(n, x.data(), tanh.data(), cuda::TanhFn());
  UnaryMap(n, x.data(), gelu.data(), cuda::GeluTanhFn());
  BinaryMap(n, x.data(), dy.data(), grad.data(), cuda::GeluTanhGradFn());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(FloatBits(tanh[i]), FloatBits(kernel_math::Tanh(x[i]))) << "tanh(" << x[i] << ")";
    ASSERT_EQ(FloatBits(gelu[i]), FloatBits(cuda::GeluTanhFn()(x[i]))) << "gelu(" << x[i] << ")";
    ASSERT_EQ(FloatBits(grad[i]), FloatBits(cuda::GeluTanhGradFn()(x[i], dy[i]))) << "gelu_grad(" << x[i] << ")";
  }

  std::vector<bfloat16> xh(x.size()), yh(x.size());
  for (int64_t i = 0; i < n; ++i) xh[i] = ToBfloat16(x[i]);
  const auto bf16_gelu = [](bfloat16 v) { return ToBfloat16(cuda::GeluTanhFn()(ToFloat(v))); };
  UnaryMap(n, xh.data(), yh.data(), bf16_gelu);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(yh[i].bits, bf16_gelu(xh[i]).bits) << "bf16 gelu(" << x[i] << ")";
}

}  // namespace
}  // namespace strata
