#ifndef STRATA_RUNTIME_PHILOX_H_
#define STRATA_RUNTIME_PHILOX_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "proto/fnv1a.h"  // Fnv1a64 and MixKey, for turning names and seeds into stream keys

namespace strata {

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), the counter-based generator of cuRAND and PyTorch. A random value is a
// pure function of (key, counter), so any layout that knows a sample's global
// index and an op's identity draws the same number as one device does.
class Philox {
 public:
  using Block = std::array<uint32_t, 4>;

  explicit Philox(uint64_t key) : key_{static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)} {}

  Block operator()(Block counter) const {
    uint32_t k0 = key_[0], k1 = key_[1];
    for (int round = 0; round < 10; ++round) {
      uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * counter[0];
      uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * counter[2];
      counter = {static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ k0, static_cast<uint32_t>(p1),
                 static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ k1, static_cast<uint32_t>(p0)};
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    return counter;
  }

  // Four uniforms in [0, 1) (24-bit resolution, exactly representable in float).
  std::array<double, 4> Uniform4(uint64_t hi, uint64_t lo) const {
    Block b = (*this)({static_cast<uint32_t>(lo), static_cast<uint32_t>(lo >> 32),
                       static_cast<uint32_t>(hi), static_cast<uint32_t>(hi >> 32)});
    std::array<double, 4> u;
    for (int i = 0; i < 4; ++i) u[i] = (b[i] >> 8) * (1.0 / 16777216.0);
    return u;
  }

 private:
  std::array<uint32_t, 2> key_;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_PHILOX_H_
