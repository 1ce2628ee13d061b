#ifndef STRATA_KERNELS_CUDA_TESTING_EMULATION_TEST_UTIL_H_
#define STRATA_KERNELS_CUDA_TESTING_EMULATION_TEST_UTIL_H_

// What the CUDA emulation tests (kernels/cuda/*_emulation_test.cc) share:
// inputs, poisoned outputs, bit comparison against the CPU kernel's tensor,
// and the check that every emulated launch was one CUDA would accept.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "runtime/tensor.h"

namespace strata {
namespace emulation {

// n doubles uniform in [-range, range), from `seed`.
inline std::vector<double> UniformValues(int64_t n, uint32_t seed, double range) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-range, range);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

// n elements of bytes 0x7f, what no kernel would write: an output element
// a kernel skips shows up.
template <typename T>
std::vector<T> Poisoned(int64_t n) {
  std::vector<T> v(n);
  std::memset(static_cast<void*>(v.data()), 0x7f, n * sizeof(T));
  return v;
}

// got[0, n) has the bits of `want` (the CPU kernel's output), element by element.
template <typename T>
::testing::AssertionResult SameBits(const T* got, int64_t n, const Tensor& want, const char* what) {
  if (n != want.num_elements()) {
    return ::testing::AssertionFailure() << what << ": " << n << " elements, want " << want.num_elements();
  }
  const T* w = want.data<T>();
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[i], &w[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << what << ": element " << i << " of " << n << " differs from the CPU's";
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
::testing::AssertionResult SameBits(const std::vector<T>& got, const Tensor& want, const char* what) {
  return SameBits(got.data(), static_cast<int64_t>(got.size()), want, what);
}

// No launch CUDA would have refused, and no access the stand-in caught.
inline void ExpectCleanLaunches() {
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cuda_stand_in::errors.load(), 0);
}

}  // namespace emulation
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_TESTING_EMULATION_TEST_UTIL_H_
