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
// NaN); every launcher with a grad_scale against the gradients scaled
// first; and every launcher with a 16-bit copy (attr copy_dtype) against
// cuda::Convert of the param the launcher without it updates. No FMA
// (-ffp-contract=off), as nvcc's --fmad=false.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/optimizers.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "kernels/cuda/testing/emulation_test_util.h"
#include "kernels/cuda/unary_math.h"
#include "runtime/float16.h"

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

// grad_scale (attr grad_scale: clipping's coefficient folded into the
// update): every launcher, single and multi, with the scale's device scalar
// leaves each param and state bit for bit as the launcher without it does on
// the gradients multiplied by the scale first (in T, as the mul kernel the
// optimizer pass used before).
template <typename T>
void CheckGradScale(float found_inf) {
  SCOPED_TRACE(testing::Message() << (sizeof(T) == 4 ? "float" : "double") << " found_inf " << found_inf);
  const std::vector<int64_t> n = Sizes();
  const int count = static_cast<int>(n.size());
  const T scale = static_cast<T>(0.3719);
  const Tensors<T> g(n, 8, -1, 1);
  Tensors<T> gs(n, 8, -1, 1);
  for (auto& d : gs.data) {
    for (T& x : d) x = x * scale;
  }
  const T lr = static_cast<T>(0.003), wd = static_cast<T>(0.01), mom = static_cast<T>(0.9);
  const int64_t step = 2;
  kernel_math::AdamAttrs attrs;
  attrs.weight_decay = 0.01;
  attrs.decoupled = true;
  // [0]: the reference on gs; [1]: single launches with the scale; [2]: multi with it.
  std::vector<std::unique_ptr<Tensors<T>>> p, m, v, q, w;
  for (int k = 0; k < 3; ++k) {
    p.push_back(std::make_unique<Tensors<T>>(n, 1, -1, 1));
    m.push_back(std::make_unique<Tensors<T>>(n, 2, -0.1, 0.1));
    v.push_back(std::make_unique<Tensors<T>>(n, 3, 0, 0.01));
    q.push_back(std::make_unique<Tensors<T>>(n, 6, -1, 1));
    w.push_back(std::make_unique<Tensors<T>>(n, 7, -0.1, 0.1));
  }
  Tensors<T> sgd0(n, 9, -1, 1), sgd1(n, 9, -1, 1), sgd2(n, 9, -1, 1);
  for (size_t i = 0; i < n.size(); ++i) {
    ASSERT_EQ(cuda::LaunchAdamUpdate(p[0]->ptrs[i], m[0]->ptrs[i], v[0]->ptrs[i], gs.cptrs[i], &lr, &step, attrs, n[i],
                                     &found_inf, nullptr),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchAdamUpdate(p[1]->ptrs[i], m[1]->ptrs[i], v[1]->ptrs[i], g.cptrs[i], &lr, &step, attrs, n[i],
                                     &found_inf, nullptr, &scale),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchMomentumUpdate(q[0]->ptrs[i], w[0]->ptrs[i], gs.cptrs[i], &lr, mom, wd, true, n[i],
                                         &found_inf, nullptr),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchMomentumUpdate(q[1]->ptrs[i], w[1]->ptrs[i], g.cptrs[i], &lr, mom, wd, true, n[i], &found_inf,
                                         nullptr, &scale),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchSgdUpdate(sgd0.ptrs[i], gs.cptrs[i], &lr, wd, n[i], &found_inf, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchSgdUpdate(sgd1.ptrs[i], g.cptrs[i], &lr, wd, n[i], &found_inf, nullptr, &scale), cudaSuccess);
  }
  ASSERT_EQ(cuda::LaunchAdamUpdateMulti(p[2]->ptrs.data(), m[2]->ptrs.data(), v[2]->ptrs.data(), g.cptrs.data(),
                                        n.data(), count, &lr, &step, attrs, &found_inf, nullptr, &scale),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchMomentumUpdateMulti(q[2]->ptrs.data(), w[2]->ptrs.data(), g.cptrs.data(), n.data(), count, &lr,
                                            mom, wd, true, &found_inf, nullptr, &scale),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchSgdUpdateMulti(sgd2.ptrs.data(), g.cptrs.data(), n.data(), count, &lr, wd, &found_inf, nullptr,
                                       &scale),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  for (int k = 1; k < 3; ++k) {
    SCOPED_TRACE(k == 1 ? "single" : "multi");
    EXPECT_TRUE(SameBits(*p[0], *p[k], "adam param"));
    EXPECT_TRUE(SameBits(*m[0], *m[k], "m"));
    EXPECT_TRUE(SameBits(*v[0], *v[k], "v"));
    EXPECT_TRUE(SameBits(*q[0], *q[k], "momentum param"));
    EXPECT_TRUE(SameBits(*w[0], *w[k], "velocity"));
  }
  EXPECT_TRUE(SameBits(sgd0, sgd1, "sgd param, single"));
  EXPECT_TRUE(SameBits(sgd0, sgd2, "sgd param, multi"));
  // The scale was applied: the unscaled gradients give other params.
  Tensors<T> unscaled(n, 9, -1, 1);
  for (size_t i = 0; i < n.size(); ++i) {
    ASSERT_EQ(cuda::LaunchSgdUpdate(unscaled.ptrs[i], g.cptrs[i], &lr, wd, n[i], &found_inf, nullptr), cudaSuccess);
  }
  // The scale was applied (or, skipped, nothing was).
  EXPECT_EQ(static_cast<bool>(SameBits(sgd1, unscaled, "sgd param, scaled or not")), found_inf != 0);
  const Tensors<T> p0(n, 1, -1, 1);
  EXPECT_EQ(static_cast<bool>(SameBits(*p[2], p0, "adam param, multi")), found_inf != 0);
}

TEST(OptimizersEmulation, GradScaleIsTheGradientMultipliedFirst) {
  for (float found_inf : {0.0f, 1.0f}) {
    CheckGradScale<float>(found_inf);
    CheckGradScale<double>(found_inf);
  }
}

// ---------------------------------------------------------------------------
// attr copy_dtype: the update also writes param's 16-bit copy.

template <typename C>
constexpr cuda::UpdateCopy kCopyKind = std::is_same_v<C, bfloat16> ? cuda::UpdateCopy::kBf16 : cuda::UpdateCopy::kF16;

// One copy buffer of C per tensor, poisoned (emulation::Poisoned): an
// element no launch wrote keeps the poison's bits.
template <typename C>
struct Copies {
  std::vector<std::vector<C>> data;
  std::vector<void*> ptrs;
  Copies(const Copies&) = delete;  // the pointers would be the original's
  explicit Copies(const std::vector<int64_t>& n) {
    for (int64_t k : n) data.push_back(emulation::Poisoned<C>(k));
    for (auto& d : data) ptrs.push_back(d.data());
  }
};

// Each element of `copy` has the bits of cuda::Convert<C> (the cast
// kernel's conversion) of `param`'s element where `written`, else the
// poison's.
template <typename C, typename T>
::testing::AssertionResult CopyOf(const Copies<C>& copy, const Tensors<T>& param, bool written, const char* what) {
  const uint16_t poison = emulation::Poisoned<C>(1)[0].bits;
  for (size_t i = 0; i < param.data.size(); ++i) {
    for (size_t j = 0; j < param.data[i].size(); ++j) {
      const uint16_t want = written ? cuda::Convert<C>(param.data[i][j]).bits : poison;
      if (copy.data[i][j].bits != want) {
        return ::testing::AssertionFailure()
               << what << ": tensor " << i << " element " << j << " (param " << param.data[i][j] << ") has bits "
               << copy.data[i][j].bits << ", want " << want << (written ? "" : " (the poison: nothing written)");
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Params whose 16-bit copies round interestingly, kept as they are by an
// update whose gradient, states and weight decay are 0 (p - lr * 0): BF16
// ties (1 + 2^-8 rounds down to even, 1 + 3 * 2^-8 up), F16 ties (1 + 2^-11,
// 1 + 3 * 2^-11), F16's largest finite and past it (65519 rounds to 65504,
// 65520 and 70000 to inf), float's largest (BF16 inf), F16 subnormal ties
// (2^-25 to 0, 3 * 2^-25 up), a float subnormal, NaNs, infinities and -0;
// in double also past float's range (inf), under it (0), and a double
// rounding (1 + 2^-8 + 2^-40 becomes float's BF16 tie first, then 1).
template <typename T>
std::vector<T> Specials() {
  std::vector<T> v = {T(1 + 0x1p-8),
                      T(1 + 3 * 0x1p-8),
                      T(1 + 0x1p-11),
                      T(1 + 3 * 0x1p-11),
                      T(65504),
                      T(65519),
                      T(65520),
                      T(70000),
                      T(-70000),
                      T(std::numeric_limits<float>::max()),
                      T(0x1p-25),
                      T(3 * 0x1p-25),
                      T(0x1p-140),
                      std::numeric_limits<T>::quiet_NaN(),
                      -std::numeric_limits<T>::quiet_NaN(),
                      std::numeric_limits<T>::infinity(),
                      -std::numeric_limits<T>::infinity(),
                      T(-0.0)};
  if constexpr (std::is_same_v<T, double>) {
    for (double x : {1e300, -1e300, 1e-50, 1 + 0x1p-8 + 0x1p-40}) v.push_back(x);
  }
  return v;
}

// values at the start of tensor 3 and the end of tensor 0 (its third chunk).
template <typename T>
void Place(const std::vector<T>& values, Tensors<T>* t) {
  for (size_t j = 0; j < values.size(); ++j) {
    t->data[3][j] = values[j];
    t->data[0][t->data[0].size() - 1 - j] = values[j];
  }
}

// Every launcher, single and multi, with a copy of C leaves each param and
// state bit for bit as the launcher without one does, and the copy holds
// cuda::Convert<C> of each updated param element; on a skipped update
// (found_inf 1) nothing is written, the copy included (its poison stays).
template <typename T, typename C>
void CheckCopies(float found_inf, bool scaled) {
  SCOPED_TRACE(testing::Message() << (sizeof(T) == 4 ? "float" : "double")
                                  << (std::is_same_v<C, bfloat16> ? " BF16" : " F16") << " found_inf " << found_inf
                                  << (scaled ? " grad_scale" : ""));
  const std::vector<int64_t> n = Sizes();
  const int count = static_cast<int>(n.size());
  const std::vector<T> specials = Specials<T>(), zeros(specials.size(), T(0));
  const T scale = static_cast<T>(0.3719);
  const T* grad_scale = scaled ? &scale : nullptr;
  const T lr = static_cast<T>(0.003), wd = 0, mom = static_cast<T>(0.9);  // weight decay 0: the specials stay
  const int64_t step = 2;
  const kernel_math::AdamAttrs attrs;
  Tensors<T> g(n, 8, -1, 1);
  Place(zeros, &g);
  // [0]: the launchers without a copy; [1]: single launches with one; [2]: multi with them.
  std::vector<std::unique_ptr<Tensors<T>>> p, m, v, q, w, sgd;
  for (int k = 0; k < 3; ++k) {
    p.push_back(std::make_unique<Tensors<T>>(n, 1, -1, 1));
    m.push_back(std::make_unique<Tensors<T>>(n, 2, -0.1, 0.1));
    v.push_back(std::make_unique<Tensors<T>>(n, 3, 0, 0.01));
    q.push_back(std::make_unique<Tensors<T>>(n, 6, -1, 1));
    w.push_back(std::make_unique<Tensors<T>>(n, 7, -0.1, 0.1));
    sgd.push_back(std::make_unique<Tensors<T>>(n, 9, -1, 1));
    for (Tensors<T>* param : {p.back().get(), q.back().get(), sgd.back().get()}) Place(specials, param);
    for (Tensors<T>* state : {m.back().get(), v.back().get(), w.back().get()}) Place(zeros, state);
  }
  Copies<C> p1(n), p2(n), q1(n), q2(n), sgd1(n), sgd2(n);
  constexpr cuda::UpdateCopy kind = kCopyKind<C>;
  for (size_t i = 0; i < n.size(); ++i) {
    ASSERT_EQ(cuda::LaunchAdamUpdate(p[0]->ptrs[i], m[0]->ptrs[i], v[0]->ptrs[i], g.cptrs[i], &lr, &step, attrs, n[i],
                                     &found_inf, nullptr, grad_scale),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchAdamUpdate(p[1]->ptrs[i], m[1]->ptrs[i], v[1]->ptrs[i], g.cptrs[i], &lr, &step, attrs, n[i],
                                     &found_inf, nullptr, grad_scale, kind, p1.ptrs[i]),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchMomentumUpdate(q[0]->ptrs[i], w[0]->ptrs[i], g.cptrs[i], &lr, mom, wd, true, n[i], &found_inf,
                                         nullptr, grad_scale),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchMomentumUpdate(q[1]->ptrs[i], w[1]->ptrs[i], g.cptrs[i], &lr, mom, wd, true, n[i], &found_inf,
                                         nullptr, grad_scale, kind, q1.ptrs[i]),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchSgdUpdate(sgd[0]->ptrs[i], g.cptrs[i], &lr, wd, n[i], &found_inf, nullptr, grad_scale),
              cudaSuccess);
    ASSERT_EQ(cuda::LaunchSgdUpdate(sgd[1]->ptrs[i], g.cptrs[i], &lr, wd, n[i], &found_inf, nullptr, grad_scale, kind,
                                    sgd1.ptrs[i]),
              cudaSuccess);
  }
  const int64_t launches = cuda_stand_in::launches;
  ASSERT_EQ(
      cuda::LaunchAdamUpdateMulti(p[2]->ptrs.data(), m[2]->ptrs.data(), v[2]->ptrs.data(), g.cptrs.data(), n.data(),
                                  count, &lr, &step, attrs, &found_inf, nullptr, grad_scale, kind, p2.ptrs.data()),
      cudaSuccess);
  EXPECT_EQ(cuda_stand_in::launches - launches, 2);  // 70 tensors and their copies: 64, then 6
  ASSERT_EQ(cuda::LaunchMomentumUpdateMulti(q[2]->ptrs.data(), w[2]->ptrs.data(), g.cptrs.data(), n.data(), count, &lr,
                                            mom, wd, true, &found_inf, nullptr, grad_scale, kind, q2.ptrs.data()),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchSgdUpdateMulti(sgd[2]->ptrs.data(), g.cptrs.data(), n.data(), count, &lr, wd, &found_inf,
                                       nullptr, grad_scale, kind, sgd2.ptrs.data()),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  const bool written = found_inf == 0;
  for (int k = 1; k < 3; ++k) {
    SCOPED_TRACE(k == 1 ? "single" : "multi");
    EXPECT_TRUE(SameBits(*p[0], *p[k], "adam param"));
    EXPECT_TRUE(SameBits(*m[0], *m[k], "m"));
    EXPECT_TRUE(SameBits(*v[0], *v[k], "v"));
    EXPECT_TRUE(SameBits(*q[0], *q[k], "momentum param"));
    EXPECT_TRUE(SameBits(*w[0], *w[k], "velocity"));
    EXPECT_TRUE(SameBits(*sgd[0], *sgd[k], "sgd param"));
    EXPECT_TRUE(CopyOf(k == 1 ? p1 : p2, *p[0], written, "adam copy"));
    EXPECT_TRUE(CopyOf(k == 1 ? q1 : q2, *q[0], written, "momentum copy"));
    EXPECT_TRUE(CopyOf(k == 1 ? sgd1 : sgd2, *sgd[0], written, "sgd copy"));
  }
  // The specials came through the updates as they were, so the copies
  // above are their roundings; the other elements were updated.
  for (const Tensors<T>* param : {p[0].get(), q[0].get(), sgd[0].get()}) {
    for (size_t j = 0; j < specials.size(); ++j) {
      EXPECT_EQ(std::memcmp(&param->data[3][j], &specials[j], sizeof(T)), 0) << specials[j];
      EXPECT_EQ(std::memcmp(&param->data[0][n[0] - 1 - j], &specials[j], sizeof(T)), 0) << specials[j];
    }
  }
  const Tensors<T> p0(n, 1, -1, 1);
  EXPECT_EQ(p[0]->data[3][specials.size()] != p0.data[3][specials.size()], written);
}

TEST(OptimizersEmulation, CopyIsTheConvertedUpdatedParam) {
  for (float found_inf : {0.0f, 1.0f}) {
    for (bool scaled : {false, true}) {
      CheckCopies<float, bfloat16>(found_inf, scaled);
      CheckCopies<float, float16>(found_inf, scaled);
      CheckCopies<double, bfloat16>(found_inf, scaled);
      CheckCopies<double, float16>(found_inf, scaled);
    }
  }
}

// adam with step < 1 writes NaN into every param element (optimizers.h),
// and the copy is that NaN converted, single and multi.
template <typename T, typename C>
void CheckAdamNanCopy() {
  SCOPED_TRACE(testing::Message() << (sizeof(T) == 4 ? "float" : "double")
                                  << (std::is_same_v<C, bfloat16> ? " BF16" : " F16"));
  const std::vector<int64_t> n = Sizes();
  Tensors<T> p1(n, 1, -1, 1), m1(n, 2, -0.1, 0.1), v1(n, 3, 0, 0.01), g(n, 4, -1, 1);
  Tensors<T> p2(n, 1, -1, 1), m2(n, 2, -0.1, 0.1), v2(n, 3, 0, 0.01);
  Copies<C> c1(n), c2(n);
  const T lr = static_cast<T>(0.003);
  const int64_t step = 0;
  const float found_inf = 0;
  const kernel_math::AdamAttrs attrs;
  for (size_t i = 0; i < n.size(); ++i) {
    ASSERT_EQ(cuda::LaunchAdamUpdate(p1.ptrs[i], m1.ptrs[i], v1.ptrs[i], g.cptrs[i], &lr, &step, attrs, n[i],
                                     &found_inf, nullptr, nullptr, kCopyKind<C>, c1.ptrs[i]),
              cudaSuccess);
  }
  ASSERT_EQ(cuda::LaunchAdamUpdateMulti(p2.ptrs.data(), m2.ptrs.data(), v2.ptrs.data(), g.cptrs.data(), n.data(),
                                        static_cast<int>(n.size()), &lr, &step, attrs, &found_inf, nullptr, nullptr,
                                        kCopyKind<C>, c2.ptrs.data()),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_TRUE(SameBits(p1, p2, "param"));
  EXPECT_TRUE(std::isnan(p1.data[0][0]));
  EXPECT_TRUE(CopyOf(c1, p1, true, "single copy"));
  EXPECT_TRUE(CopyOf(c2, p2, true, "multi copy"));
  EXPECT_TRUE(std::isnan(ToFloat(c2.data[0][0])));
}

TEST(OptimizersEmulation, AdamStepZeroCopiesTheNan) {
  CheckAdamNanCopy<float, bfloat16>();
  CheckAdamNanCopy<float, float16>();
  CheckAdamNanCopy<double, bfloat16>();
  CheckAdamNanCopy<double, float16>();
}

}  // namespace
}  // namespace strata
