// block_sums.cu, launchers included, on the CPU: the genrule
// block_sums_emulated_src rewrites the file's <<<>>> launches into calls of
// testing/cuda_stand_in/'s Launch, and g++ compiles it against the stand-ins
// (blocks one after another, a block's CUDA threads as fibers).
// sum_squares (several tensors, more than one 16384-element block),
// sum_squares_grad, clip_coefficient, mse_loss and mse_loss_grad in F32 and
// F64 give the registered CPU kernels' bits (run through the registry): the
// fixed blocks summed in index order, then in block order, as block_sums.h
// promises. No FMA (-ffp-contract=off), as nvcc's --fmad=false.

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/block_sums.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "kernels/cuda/testing/emulation_test_util.h"

namespace strata {
namespace {

Tensor Random(DataType dtype, Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-3, 3);
  std::vector<double> v(NumElements(shape));
  for (double& x : v) x = u(rng);
  return MakeTensor(dtype, shape, v);
}

template <typename T>
void Check(DataType dtype) {
  SCOPED_TRACE(DataTypeName(dtype));
  const int64_t big = 16384 * 2 + 123;
  std::map<std::string, Tensor> env{{"a", Random(dtype, {big}, 1)},      {"b", Random(dtype, {7, 3}, 2)},
                                    {"c", Random(dtype, {1000}, 3)},     {"dy", MakeTensor(dtype, {}, {0.75})},
                                    {"pred", Random(dtype, {big}, 4)},   {"target", Random(dtype, {big}, 5)},
                                    {"dloss", MakeTensor(dtype, {}, {1.25})}};
  const absl::Status s = RunOps(
      {ParseOp(R"pb(type: "sum_squares" input: ["a", "b"] output: "s0")pb"),
       ParseOp(R"pb(type: "sum_squares" input: "c" output: "s1")pb"),
       ParseOp(R"pb(type: "clip_coefficient" input: ["s0", "s1"] output: "coef"
                    attr { key: "max_norm" value { f: 0.5 } })pb"),
       ParseOp(R"pb(type: "sum_squares_grad" input: ["a", "dy"] output: "dx")pb"),
       ParseOp(R"pb(type: "mse_loss" input: ["pred", "target"] output: "loss")pb"),
       ParseOp(R"pb(type: "mse_loss_grad" input: ["pred", "target", "dloss"] output: "dpred")pb")},
      &env);
  ASSERT_TRUE(s.ok()) << s;

  const T* xs[] = {env["a"].data<T>(), env["b"].data<T>()};
  const int64_t ns[] = {big, 21};
  std::vector<double> scratch(cuda::SumSquaresScratchDoubles(ns, 2));
  T s0 = -1, s1 = -1, coef = -1, loss = -1;
  ASSERT_EQ(cuda::LaunchSumSquares(&s0, xs, ns, 2, scratch.data(), nullptr), cudaSuccess);
  const T* cs[] = {env["c"].data<T>()};
  const int64_t nc[] = {1000};
  std::vector<double> scratch1(cuda::SumSquaresScratchDoubles(nc, 1));
  ASSERT_EQ(cuda::LaunchSumSquares(&s1, cs, nc, 1, scratch1.data(), nullptr), cudaSuccess);
  const T* sums[] = {&s0, &s1};
  double one = 0;
  ASSERT_EQ(cuda::LaunchClipCoefficient(&coef, sums, 2, 0.5, &one, nullptr), cudaSuccess);
  std::vector<T> dx(big), dpred(big);
  ASSERT_EQ(cuda::LaunchSumSquaresGrad(dx.data(), env["a"].data<T>(), env["dy"].data<T>(), big, nullptr), cudaSuccess);
  std::vector<double> mse_scratch(cuda::MseLossScratchDoubles(big));
  ASSERT_EQ(cuda::LaunchMseLoss(&loss, env["pred"].data<T>(), env["target"].data<T>(), big, mse_scratch.data(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchMseLossGrad(dpred.data(), env["pred"].data<T>(), env["target"].data<T>(),
                                    env["dloss"].data<T>(), big, nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_TRUE(emulation::SameBits(&s0, 1, env["s0"], "sum_squares of two tensors"));
  EXPECT_TRUE(emulation::SameBits(&s1, 1, env["s1"], "sum_squares of one"));
  EXPECT_TRUE(emulation::SameBits(&coef, 1, env["coef"], "clip_coefficient"));
  EXPECT_LT(coef, 1);  // clipping
  EXPECT_TRUE(emulation::SameBits(dx, env["dx"], "sum_squares_grad"));
  EXPECT_TRUE(emulation::SameBits(&loss, 1, env["loss"], "mse_loss"));
  EXPECT_TRUE(emulation::SameBits(dpred, env["dpred"], "mse_loss_grad"));
}

TEST(BlockSumsEmulation, FloatAndDoubleAreTheCpuBits) {
  Check<float>(F32);
  Check<double>(F64);
}

}  // namespace
}  // namespace strata
