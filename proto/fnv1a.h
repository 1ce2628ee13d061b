#ifndef STRATA_PROTO_FNV1A_H_
#define STRATA_PROTO_FNV1A_H_

// Strata's one hash of bytes (convention 16): 64-bit FNV-1a. Stable across
// processes, builds and machines (unlike std::hash or absl::Hash), so plan
// fingerprints, random stream keys, data identities and store file names
// depend on its exact output: never change it. The offset basis is one digit
// short of the published one (14695981039346656037); kept for those outputs.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata {

inline constexpr uint64_t kFnv1a64Offset = 1469598103934665603ull;
inline constexpr uint64_t kFnv1a64Prime = 1099511628211ull;

// Continues a hash `h` over n more bytes: hashing in pieces equals hashing
// their concatenation, starting from kFnv1a64Offset.
inline uint64_t Fnv1a64Update(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnv1a64Prime;
  }
  return h;
}

inline uint64_t Fnv1a64(std::string_view s) { return Fnv1a64Update(kFnv1a64Offset, s.data(), s.size()); }

// Mixes two 64-bit words (splitmix64 finalizer over their combination).
inline uint64_t MixKey(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace strata

#endif  // STRATA_PROTO_FNV1A_H_
