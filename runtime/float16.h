#ifndef STRATA_RUNTIME_FLOAT16_H_
#define STRATA_RUNTIME_FLOAT16_H_

// 16-bit floating storage types for the BF16 and F16 dtypes: bfloat16 (the
// top half of an IEEE float32: 8 exponent bits, 7 mantissa bits) and IEEE
// binary16 (5 exponent bits, 10 mantissa bits, subnormals). On the CPU they
// are storage only: kernels compute in float32 and convert at the edges, as
// PyTorch's CPU kernels do. Conversions from float round to nearest, ties to
// even (PyTorch's and CUDA's __float2bfloat16_rn / __float2half_rn); a NaN
// stays a (quiet) NaN with its sign; finite values too large become
// infinities. A double converts through float.
//
// The conversions are __host__ __device__ under nvcc, so the CUDA kernels
// (kernels/cuda/unary_math.h's cast) round with the same code as the CPU.

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define STRATA_FLOAT16_HD __host__ __device__
#else
#define STRATA_FLOAT16_HD
#endif

namespace strata {

struct bfloat16 {
  uint16_t bits = 0;
};
struct float16 {
  uint16_t bits = 0;
};

STRATA_FLOAT16_HD inline uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

STRATA_FLOAT16_HD inline float FloatFromBits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

STRATA_FLOAT16_HD inline bfloat16 ToBfloat16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x0040u)};  // NaN, quieted
  // Round to nearest even on the 16 bits dropped; a carry into the exponent
  // is the right answer (up to infinity).
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>((u + rounding) >> 16)};
}

STRATA_FLOAT16_HD inline float ToFloat(bfloat16 b) { return FloatFromBits(static_cast<uint32_t>(b.bits) << 16); }

STRATA_FLOAT16_HD inline float16 ToFloat16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu))};  // NaN
  if (abs >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // rounds past 65504: infinity
  if (abs < 0x38800000u) {
    // Below the smallest normal (2^-14): a subnormal, a multiple of 2^-24.
    // Adding 0.5 in float puts the rounded multiple in the low mantissa bits
    // with float's own round-to-nearest-even.
    const float scaled = FloatFromBits(abs) + 0.5f;
    return {static_cast<uint16_t>(sign | (FloatBits(scaled) - FloatBits(0.5f)))};
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits.
  const uint32_t rebased = abs - ((127u - 15u) << 23);
  const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return {static_cast<uint16_t>(sign | ((rebased + rounding) >> 13))};
}

STRATA_FLOAT16_HD inline float ToFloat(float16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1fu;
  const uint32_t mantissa = h.bits & 0x3ffu;
  if (exponent == 0x1fu) return FloatFromBits(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {
    // Zero or a subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * FloatFromBits(0x33800000u);
    return FloatFromBits(sign | FloatBits(magnitude));
  }
  return FloatFromBits(sign | ((exponent + 127u - 15u) << 23) | (mantissa << 13));
}

}  // namespace strata

#endif  // STRATA_RUNTIME_FLOAT16_H_
