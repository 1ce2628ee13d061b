#ifndef STRATA_KERNELS_ENV_SWITCH_H_
#define STRATA_KERNELS_ENV_SWITCH_H_

// Process-wide switches of kernel paths, read once from the environment
// (TensorCoreAttention, cuda::MmaFlashAttention, cuda::MmaWideWarps,
// cuda::FastHalfLoss, cuda::FusedBiasGrad), and a scope that sets one for
// tests.

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace strata {

// A switch's first value: `name` set to "1" turns an off-by-default switch
// on; set to "0" it turns an on-by-default one off; anything else leaves the
// default.
inline bool EnvSwitch(const char* name, bool default_on) {
  const char* env = std::getenv(name);
  if (env == nullptr) return default_on;
  return default_on ? std::strcmp(env, "0") != 0 : std::strcmp(env, "1") == 0;
}

// Sets a switch for its lifetime (tests), then restores it.
class ScopedSwitch {
 public:
  ScopedSwitch(std::atomic<bool>& on, bool value) : on_(on), before_(on.exchange(value)) {}
  ~ScopedSwitch() { on_.store(before_); }
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

 private:
  std::atomic<bool>& on_;
  const bool before_;
};

}  // namespace strata

#endif  // STRATA_KERNELS_ENV_SWITCH_H_
