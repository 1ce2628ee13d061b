// The CUDA kernels of dynamic loss scaling (check_finite_and_unscale,
// update_loss_scaling, kernels/cuda/loss_scaling.cu) and the optimizer
// updates' and increment's optional found_inf, against the CPU kernels.
// Tagged gpu: without a CUDA device every test FAILS (never skips).
//
// Bars: bit for bit everywhere. Unscaling is one IEEE multiplication by the
// same float reciprocal (kernels/loss_scaling_math.h on both sides, nvcc
// without FMA contraction); the scale update is the same double products;
// a skipped update changes nothing on either side.

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_op_test_util.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

using testing::BitEqual;
using testing::CudaOpsTest;
using testing::RandomTensor;

STRATA_CUDA_OPS_TESTED(cuda_loss_scaling_ops_test, {
                                                       {"check_finite_and_unscale", {F32}},
                                                       {"update_loss_scaling", {F32}},
                                                   });

constexpr char kCheck[] =
    R"pb(type: "check_finite_and_unscale" input: ["s", "a", "b"] output: ["found", "ua", "ub"])pb";

// A scale that is not a power of two (its reciprocal rounds), F32 and F64
// gradients, one larger than a block; finite, then an inf or a nan in
// either gradient, at its first or last element.
TEST_F(CudaOpsTest, CheckFiniteAndUnscaleEqualsTheCpu) {
  const Tensor scale = MakeTensor(F32, {}, {3.0 * 65536});
  const Tensor a = RandomTensor(F32, {1000, 70}, 1), b = RandomTensor(F64, {33}, 2);
  auto finite = RunBothNamed(kCheck, {{"s", scale}, {"a", a}, {"b", b}}, {"found", "ua", "ub"});
  ASSERT_EQ(finite.size(), 3u);
  for (const auto& [cpu, gpu] : finite) EXPECT_TRUE(BitEqual(gpu, cpu));
  EXPECT_EQ(TensorValues(finite[0].second), std::vector<double>{0.0});
  for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    for (int which : {0, 1}) {
      for (bool last : {false, true}) {
        SCOPED_TRACE(absl::StrCat(bad, " in ", which == 0 ? "a" : "b", last ? " last" : " first"));
        std::vector<double> va = TensorValues(a), vb = TensorValues(b);
        std::vector<double>& v = which == 0 ? va : vb;
        v[last ? v.size() - 1 : 0] = bad;
        const Tensor ta = MakeTensor(F32, a.shape(), va), tb = MakeTensor(F64, b.shape(), vb);
        auto out = RunBothNamed(kCheck, {{"s", scale}, {"a", ta}, {"b", tb}}, {"found", "ua", "ub"});
        ASSERT_EQ(out.size(), 3u);
        EXPECT_EQ(TensorValues(out[0].second), std::vector<double>{1.0});
        for (const auto& [cpu, gpu] : out) EXPECT_TRUE(BitEqual(gpu, cpu));
      }
    }
  }
}

// GradScaler's walk: backoff on an overflow, growth after growth_interval
// good steps, a growth that would overflow float32 refused; the GPU's
// scale and counters equal the CPU's after every step.
TEST_F(CudaOpsTest, UpdateLossScalingFollowsTheCpu) {
  const std::string op =
      R"pb(type: "update_loss_scaling" input: ["f", "s", "g", "k"] output: ["s", "g", "k"]
           attr { key: "growth_factor" value { f: 2 } }
           attr { key: "backoff_factor" value { f: 0.5 } }
           attr { key: "growth_interval" value { i: 3 } })pb";
  double scale = 3e38, good = 0, skipped = 0;
  for (int found : {0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0}) {
    SCOPED_TRACE(absl::StrCat("scale ", scale, " found ", found));
    auto out = RunBothNamed(op,
                            {{"f", MakeTensor(F32, {}, {static_cast<double>(found)})},
                             {"s", MakeTensor(F32, {}, {scale})},
                             {"g", MakeTensor(I64, {}, {good})},
                             {"k", MakeTensor(I64, {}, {skipped})}},
                            {"s", "g", "k"});
    ASSERT_EQ(out.size(), 3u);
    for (const auto& [cpu, gpu] : out) EXPECT_TRUE(BitEqual(gpu, cpu));
    scale = TensorValues(out[0].first)[0];
    good = TensorValues(out[1].first)[0];
    skipped = TensorValues(out[2].first)[0];
  }
  EXPECT_EQ(skipped, 3);
}

// found_inf 1: sgd, momentum, adam and increment leave everything as it was
// (bit for bit); found_inf 0: the same as without the input.
TEST_F(CudaOpsTest, UpdatesSkipOnFoundInf) {
  const Tensor p = RandomTensor(F32, {300}, 3), g = RandomTensor(F32, {300}, 4), m = RandomTensor(F32, {300}, 5);
  Tensor v = RandomTensor(F32, {300}, 6);
  v = MakeTensor(F32, {300}, [&] {
    std::vector<double> x = TensorValues(v);
    for (double& e : x) e = std::abs(e);
    return x;
  }());
  const Tensor lr = MakeTensor(F32, {}, {0.01}), step = MakeTensor(I64, {}, {4});
  for (double found : {1.0, 0.0}) {
    SCOPED_TRACE(absl::StrCat("found_inf ", found));
    const Tensor f = MakeTensor(F32, {}, {found});
    auto adam = RunBothNamed(
        R"pb(type: "adam_update" input: ["p", "g", "m", "v", "lr", "step", "f"] output: ["p", "m", "v"])pb",
        {{"p", p}, {"g", g}, {"m", m}, {"v", v}, {"lr", lr}, {"step", step}, {"f", f}}, {"p", "m", "v"});
    ASSERT_EQ(adam.size(), 3u);
    for (const auto& [cpu, gpu] : adam) EXPECT_TRUE(BitEqual(gpu, cpu));
    if (found != 0) {
      EXPECT_TRUE(BitEqual(adam[0].second, p));
    }
    auto sgd = RunBothNamed(R"pb(type: "sgd_update" input: ["p", "g", "lr", "f"] output: ["p"])pb",
                            {{"p", p}, {"g", g}, {"lr", lr}, {"f", f}}, {"p"});
    ASSERT_EQ(sgd.size(), 1u);
    EXPECT_TRUE(BitEqual(sgd[0].second, sgd[0].first));
    if (found != 0) {
      EXPECT_TRUE(BitEqual(sgd[0].second, p));
    }
    auto momentum = RunBothNamed(
        R"pb(type: "momentum_update" input: ["p", "g", "m", "lr", "f"] output: ["p", "m"]
             attr { key: "momentum" value { f: 0.9 } })pb",
        {{"p", p}, {"g", g}, {"m", m}, {"lr", lr}, {"f", f}}, {"p", "m"});
    ASSERT_EQ(momentum.size(), 2u);
    for (const auto& [cpu, gpu] : momentum) EXPECT_TRUE(BitEqual(gpu, cpu));
    auto counter = RunBothNamed(R"pb(type: "increment" input: ["c", "f"] output: ["c"]
                                     attr { key: "by" value { i: 1 } })pb",
                                {{"c", step}, {"f", f}}, {"c"});
    ASSERT_EQ(counter.size(), 1u);
    EXPECT_TRUE(BitEqual(counter[0].second, counter[0].first));
    EXPECT_EQ(TensorValues(counter[0].second), std::vector<double>{found != 0 ? 4.0 : 5.0});
  }
}

}  // namespace
}  // namespace strata
