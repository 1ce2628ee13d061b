#ifndef STRATA_RUNTIME_PHILOX_H_
#define STRATA_RUNTIME_PHILOX_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "proto/fnv1a.h"  // Fnv1a64 and MixKey, for turning names and seeds into stream keys

namespace strata {

#ifdef __CUDACC__
#define STRATA_PHILOX_HOST_DEVICE __host__ __device__
#else
#define STRATA_PHILOX_HOST_DEVICE
#endif

// The generator's arithmetic as plain __host__ __device__ functions over
// 32-bit words, so a CUDA kernel (nvcc includes this header) draws exactly the
// bits the class below draws on the CPU; the class is written on top of them.
struct PhiloxWords {
  uint32_t w[4];
};

// Philox4x32-10 of `counter` under the key (k0, k1).
STRATA_PHILOX_HOST_DEVICE inline PhiloxWords PhiloxRounds(PhiloxWords c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c.w[0];
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c.w[2];
    c = PhiloxWords{{static_cast<uint32_t>(p1 >> 32) ^ c.w[1] ^ k0, static_cast<uint32_t>(p1),
                     static_cast<uint32_t>(p0 >> 32) ^ c.w[3] ^ k1, static_cast<uint32_t>(p0)}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// The block Philox(key).Uniform4(hi, lo) turns into uniforms: counter (lo, hi).
STRATA_PHILOX_HOST_DEVICE inline PhiloxWords PhiloxUniformBits(uint64_t key, uint64_t hi, uint64_t lo) {
  return PhiloxRounds(PhiloxWords{{static_cast<uint32_t>(lo), static_cast<uint32_t>(lo >> 32),
                                   static_cast<uint32_t>(hi), static_cast<uint32_t>(hi >> 32)}},
                      static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

// One word of such a block as a uniform in [0, 1) (24 bits, exact in float).
STRATA_PHILOX_HOST_DEVICE inline double PhiloxUniform(uint32_t bits) { return (bits >> 8) * (1.0 / 16777216.0); }


// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), the counter-based generator of cuRAND and PyTorch. A random value is a
// pure function of (key, counter), so any layout that knows a sample's global
// index and an op's identity draws the same number as one device does.
class Philox {
 public:
  using Block = std::array<uint32_t, 4>;

  explicit Philox(uint64_t key) : key_{static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)} {}

  Block operator()(Block counter) const {
    const PhiloxWords out =
        PhiloxRounds(PhiloxWords{{counter[0], counter[1], counter[2], counter[3]}}, key_[0], key_[1]);
    return {out.w[0], out.w[1], out.w[2], out.w[3]};
  }

  // Four uniforms in [0, 1) (24-bit resolution, exactly representable in float).
  std::array<double, 4> Uniform4(uint64_t hi, uint64_t lo) const {
    const uint64_t key = static_cast<uint64_t>(key_[0]) | static_cast<uint64_t>(key_[1]) << 32;
    const PhiloxWords b = PhiloxUniformBits(key, hi, lo);
    std::array<double, 4> u;
    for (int i = 0; i < 4; ++i) u[i] = PhiloxUniform(b.w[i]);
    return u;
  }

 private:
  std::array<uint32_t, 2> key_;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_PHILOX_H_
