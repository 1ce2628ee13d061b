// optimizers.cu, launchers included, on the CPU: the genrule
// optimizers_emulated_src rewrites the file's <<<>>> launches into calls of
// testing/cuda_stand_in/'s Launch, and g++ compiles it against the stand-ins
// (blocks one after another, a block's CUDA threads as fibers). The
// multi-tensor updates (adam_update_multi, sgd_update_multi,
// momentum_update_multi: apex's multi_tensor_apply, a table of up to 64
// tensors a launch, a block per 16384-element chunk; not yet run on a GPU)
// against the single-tensor kernels, emulated too, bit for bit: tensors of
// 1, 0, 100 and more than one chunk of elements, 70 tensors (two launches),
// found_inf 0 (updated) and 1 (nothing changes), adam with step 0 (every param
// NaN). No FMA (-ffp-contract=off), as nvcc's --fmad=false.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/optimizers.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "kernels/cuda/testing/emulation_test_util.h"

namespace strata {
namespace {

// Tensor sizes: two chunks and a bit, empty, one element, small ones; 70 in all.
std::vector<int64_t> Sizes() {
  std::vector<int64_t> n = {16384 * 2 + 7, 0, 1, 100, 16384};
  for (int i = 0; n.size() < 70; ++i) n.push_back(1 + (i * 37) % 300);
  return n;
}

template <typename T>
struct Tensors {
  std::vector<std::vector<T>> data;
  std::vector<T*> ptrs;
  std::vector<const T*> cptrs;
  Tensors(const Tensors&) = delete;  // the pointers would be the original's
  Tensors(const std::vector<int64_t>& n, uint32_t seed, double lo, double hi) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t k : n) {
      data.emplace_back(k);
      for (T& x : data.back()) x = static_cast<T>(u(rng));
    }
    for (auto& d : data) {
      ptrs.push_back(d.data());
      cptrs.push_back(d.data());
    }
  }
};

template <typename T>
::testing::AssertionResult SameBits(const Tensors<T>& a, const Tensors<T>& b, const char* what) {
  for (size_t i = 0; i < a.data.size(); ++i) {
    if (a.data[i].size() != b.data[i].size() ||
        std::memcmp(a.data[i].data(), b.data[i].data(), a.data[i].size() * sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << what << ": tensor " << i << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
void CheckAdam(int64_t step, float found_inf, bool decoupled) {
  SCOPED_TRACE(testing::Message() << "adam step " << step << " found_inf " << found_inf
                                  << (decoupled ? " decoupled" : ""));
  const std::vector<int64_t> n = Sizes();
  Tensors<T> p1(n, 1, -1, 1), m1(n, 2, -0.1, 0.1), v1(n, 3, 0, 0.01), g(n, 4, -1, 1);
  Tensors<T> p2(n, 1, -1, 1), m2(n, 2, -0.1, 0.1), v2(n, 3, 0, 0.01);  // the same values
  const Tensors<T> p0(n, 1, -1, 1);
  kernel_math::AdamAttrs attrs;
  attrs.weight_decay = 0.01;
  attrs.decoupled = decoupled;
  const T lr = static_cast<T>(0.003);
  for (size_t i = 0; i < n.size(); ++i) {
    ASSERT_EQ(cuda::LaunchAdamUpdate(p1.ptrs[i], m1.ptrs[i], v1.ptrs[i], g.cptrs[i], &lr, &step, attrs, n[i],
                                     &found_inf, nullptr),
              cudaSuccess);
  }
  const int64_t launches = cuda_stand_in::launches;
  ASSERT_EQ(cuda::LaunchAdamUpdateMulti(p2.ptrs.data(), m2.ptrs.data(), v2.ptrs.data(), g.cptrs.data(), n.data(),
                                        static_cast<int>(n.size()), &lr, &step, attrs, &found_inf, nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_EQ(cuda_stand_in::launches - launches, 2);  // 70 tensors: 64, then 6
  EXPECT_TRUE(SameBits(p1, p2, "param"));
  EXPECT_TRUE(SameBits(m1, m2, "m"));
  EXPECT_TRUE(SameBits(v1, v2, "v"));
  if (found_inf != 0) {
    EXPECT_TRUE(SameBits(p2, p0, "param left as it was"));
  } else if (step >= 1) {
    EXPECT_FALSE(SameBits(p2, p0, "param updated"));
  } else {
    EXPECT_TRUE(std::isnan(p2.data[0][0]));
  }
}

TEST(OptimizersEmulation, AdamMultiIsTheSingleKernel) {
  for (float found_inf : {0.0f, 1.0f}) {
    CheckAdam<float>(3, found_inf, false);
    CheckAdam<double>(3, found_inf, true);
  }
  CheckAdam<float>(0, 0.0f, false);  // step < 1: NaN params
}

template <typename T>
void CheckSgdAndMomentum(float found_inf, bool nesterov) {
  SCOPED_TRACE(testing::Message() << "found_inf " << found_inf << (nesterov ? " nesterov" : ""));
  const std::vector<int64_t> n = Sizes();
  const Tensors<T> g(n, 5, -1, 1), p0(n, 6, -1, 1);
  Tensors<T> p1(n, 6, -1, 1), p2(n, 6, -1, 1), q1(n, 6, -1, 1), q2(n, 6, -1, 1), w1(n, 7, -0.1, 0.1),
      w2(n, 7, -0.1, 0.1);
  const T lr = static_cast<T>(0.05), wd = static_cast<T>(0.001), mom = static_cast<T>(0.9);
  for (size_t i = 0; i < n.size(); ++i) {
    ASSERT_EQ(cuda::LaunchSgdUpdate(p1.ptrs[i], g.cptrs[i], &lr, wd, n[i], &found_inf, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchMomentumUpdate(q1.ptrs[i], w1.ptrs[i], g.cptrs[i], &lr, mom, wd, nesterov, n[i], &found_inf,
                                         nullptr),
              cudaSuccess);
  }
  const int count = static_cast<int>(n.size());
  ASSERT_EQ(cuda::LaunchSgdUpdateMulti(p2.ptrs.data(), g.cptrs.data(), n.data(), count, &lr, wd, &found_inf, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchMomentumUpdateMulti(q2.ptrs.data(), w2.ptrs.data(), g.cptrs.data(), n.data(), count, &lr, mom,
                                            wd, nesterov, &found_inf, nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_TRUE(SameBits(p1, p2, "sgd param"));
  EXPECT_TRUE(SameBits(q1, q2, "momentum param"));
  EXPECT_TRUE(SameBits(w1, w2, "velocity"));
  if (found_inf != 0) {
    EXPECT_TRUE(SameBits(p2, p0, "sgd param left as it was"));
    EXPECT_TRUE(SameBits(q2, p0, "momentum param left as it was"));
  } else {
    EXPECT_FALSE(SameBits(p2, p0, "sgd param updated"));
  }
}

TEST(OptimizersEmulation, SgdAndMomentumMultiAreTheSingleKernels) {
  for (float found_inf : {0.0f, 1.0f}) {
    CheckSgdAndMomentum<float>(found_inf, false);
    CheckSgdAndMomentum<double>(found_inf, true);
  }
}

}  // namespace
}  // namespace strata
