#ifndef STRATA_KERNELS_HOST_DEVICE_H_
#define STRATA_KERNELS_HOST_DEVICE_H_

// STRATA_HOST_DEVICE marks a function that nvcc compiles for the host and the
// device and g++ for the host: the math a CPU kernel and a CUDA kernel share.
// Sqrt, Exp, Log, Erf, Pow and Cos call the device's or the host's
// library; Tanh too, but for float on the host (below).

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata {
namespace kernel_math {

// The C library's functions under one name on both sides: CUDA's on the
// device (sqrtf, expf, ... for float), the host's std:: ones on the host.
// CUDA's sqrt is IEEE (correctly rounded: nvcc's default -prec-sqrt=true);
// exp, log, tanh, erf, pow and cos are within a few ulp of glibc's, as each
// kernel test that uses them says.
#ifdef __CUDA_ARCH__
#define STRATA_LIBM_1(Name, f, d)                                           \
  STRATA_HOST_DEVICE inline float Name(float x) { return f(x); }            \
  STRATA_HOST_DEVICE inline double Name(double x) { return d(x); }
#else
#define STRATA_LIBM_1(Name, f, d)                                           \
  STRATA_HOST_DEVICE inline float Name(float x) { return std::d(x); }       \
  STRATA_HOST_DEVICE inline double Name(double x) { return std::d(x); }
#endif
STRATA_LIBM_1(Sqrt, sqrtf, sqrt)
STRATA_LIBM_1(Exp, expf, exp)
STRATA_LIBM_1(Log, logf, log)
STRATA_LIBM_1(Erf, erff, erf)
#undef STRATA_LIBM_1

#ifndef __CUDA_ARCH__
inline uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// exp(x) in float on the host without a branch or a call, so loops of it
// vectorize (Tanh below; the CPU attention's softmax): x is capped to
// [-104, 89] (a NaN stays NaN) and split as n ln 2 + r, n rounded by the
// 1.5 * 2^23 shifter (no float-to-int conversion, which would be undefined
// for a NaN) and ln 2 in two parts (Cody and Waite: n * 0.693359375 is
// exact), then Cephes' degree-7 polynomial for exp(r) on |r| <= ln 2 / 2
// (S. L. Moshier's expf) times 2^n as two powers of two built in the
// exponent bits (so a result below 2^-126 rounds once, into a denormal).
// Within 0.99 ulp of exp over every float in [-104, 89] (glibc's expf:
// 0.5), +inf past 88.72, 0 below -103.97 and for -inf. Pure IEEE
// arithmetic and bit operations: the vectorized and scalar loops give the
// same bits (no FMA contraction: .bazelrc).
inline float PolyExp(float x) {
  const uint32_t low = 0u - static_cast<uint32_t>(x < -104.0f);  // all ones where it holds
  const uint32_t high = 0u - static_cast<uint32_t>(x > 89.0f);
  const float y =
      BitsToFloat((FloatToBits(x) & ~(low | high)) | (FloatToBits(-104.0f) & low) | (FloatToBits(89.0f) & high));
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23
  const float t = y * 1.44269504088896341f + kShifter;
  const float n = t - kShifter;
  // In [-150, 128]; any value for a NaN x, whose result is NaN whatever it is.
  const int32_t n_int = static_cast<int32_t>(FloatToBits(t) - FloatToBits(kShifter));
  const float r = (y - n * 0.693359375f) - n * -2.12194440e-4f;
  const float p = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
                    1.6666665459e-1f) * r + 5.0000001201e-1f) * (r * r) + r + 1.0f;
  const int32_t n1 = n_int / 2, n2 = n_int - n1;  // each in [-75, 64]: normal powers of two
  return p * BitsToFloat(static_cast<uint32_t>(n1 + 127) << 23) * BitsToFloat(static_cast<uint32_t>(n2 + 127) << 23);
}
#endif

// tanh: CUDA's tanhf on the device. On the host, glibc's tanhf goes
// through expm1f and costs about 11 ns an element here (a GPT's tanh-form
// gelu and gelu_grad were 40% of its CPU training step); float instead
// takes Cephes' tanhf (S. L. Moshier): an odd minimax polynomial below
// 0.625, else 1 - 2 / (exp(2|x|) + 1), the sign copied back, with exp from
// Cephes' expf polynomial (PolyExp above) rather than the library's, and
// both sides computed and one picked by bit masks: no branch and no call,
// so the element loops vectorize (kernels/cpu/elementwise.h; 0.3 ns an
// element with AVX-512 against 3 ns for the branchy form through glibc's
// expf). Within 1.33 ulp of tanh over every float in [0, 10] (the worst at
// 0.628; glibc's tanhf: 2.2), exactly odd, +-1 past 44 (|x| is capped
// there, so exp cannot overflow), NaN for NaN, denormals as they are.
// Pure IEEE arithmetic and bit operations, so the CPU kernels and the CUDA
// files run on the CPU (the *_emulation_tests) compute the same bits, and
// so do the vectorized and scalar loops (no FMA contraction: .bazelrc).
// double stays the library's (the float64 cross-checks against PyTorch
// hold to 1e-10).
#ifdef __CUDA_ARCH__
STRATA_HOST_DEVICE inline float Tanh(float x) { return tanhf(x); }
STRATA_HOST_DEVICE inline double Tanh(double x) { return tanh(x); }
#else
inline float Tanh(float x) {
  const float a = std::fabs(x);
  const float s = a * a;
  const float small =
      ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s + 1.33314422036e-1f) * s -
       3.33332819422e-1f) *
          s * a +
      a;
  // All-ones where the condition holds (a NaN a: neither, so it stays NaN).
  const uint32_t past_44 = 0u - static_cast<uint32_t>(a > 44.0f);
  const float capped = BitsToFloat((FloatToBits(a) & ~past_44) | (FloatToBits(44.0f) & past_44));
  const float large = 1.0f - 2.0f / (PolyExp(2.0f * capped) + 1.0f);
  const uint32_t below = 0u - static_cast<uint32_t>(a < 0.625f);
  const uint32_t r = (FloatToBits(small) & below) | (FloatToBits(large) & ~below);
  return BitsToFloat(r | (FloatToBits(x) & 0x80000000u));
}
inline double Tanh(double x) { return std::tanh(x); }
#endif

STRATA_HOST_DEVICE inline double Pow(double x, double y) {
#ifdef __CUDA_ARCH__
  return pow(x, y);
#else
  return std::pow(x, y);
#endif
}
STRATA_HOST_DEVICE inline double Cos(double x) {
#ifdef __CUDA_ARCH__
  return cos(x);
#else
  return std::cos(x);
#endif
}

}  // namespace kernel_math
}  // namespace strata

#endif  // STRATA_KERNELS_HOST_DEVICE_H_
