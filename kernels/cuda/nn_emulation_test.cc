// nn.cu's layer_norm family, launchers included, on the CPU: the genrule
// nn_emulated_src rewrites the file's <<<>>> launches into calls of
// testing/cuda_stand_in/'s Launch, and g++ compiles it against the stand-ins
// (a std::thread per CUDA thread, blocks one after another, __shfl_sync with
// width 8 through a per-warp exchange and barrier). LaunchLayerNorm and
// LaunchLayerNormGrad must give the registered CPU kernels' (kernels/cpu/
// layer_norm.cc, run through the registry) bits exactly: the row groups'
// lanes, the shuffles and the fixed combining order reproduce the CPU's
// LaneSum, and the dgamma/dbeta partial sums its blocks of rows. Shapes with
// D not a multiple of 8 (the tail), D < 8, rows not filling a block, and a
// layer_norm_grad with several blocks of rows. The emulated compile uses no
// FMA (-ffp-contract=off), as nvcc's --fmad=false.

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/nn.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "kernels/work_split.h"

namespace strata {
namespace {

// 2^-10: the same double whether the attr passes through float or not.
constexpr double kEpsilon = 0.0009765625;
const char kEpsilonAttr[] = R"( attr { key: "epsilon" value { f: 0.0009765625 } })";

Tensor Random(DataType dtype, Shape shape, uint32_t seed, double scale = 1, double shift = 0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<double> v(NumElements(shape));
  for (double& x : v) x = u(rng) + shift;
  return MakeTensor(dtype, shape, v);
}

template <typename T>
std::vector<T> Filled(int64_t n) {
  std::vector<T> v(n);
  std::memset(static_cast<void*>(v.data()), 0x7f, n * sizeof(T));  // what no kernel would write
  return v;
}

template <typename T>
::testing::AssertionResult Same(const std::vector<T>& got, const Tensor& want, const char* what) {
  if (static_cast<int64_t>(got.size()) != want.num_elements()) {
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, want " << want.num_elements();
  }
  const T* w = want.data<T>();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &w[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << what << ": element " << i << " differs from the CPU's (of "
                                           << got.size() << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

const char* DtypeName(DataType dt) { return dt == BF16 ? "BF16" : dt == F16 ? "F16" : ""; }

// layer_norm of x [R, D] in T, y stored in Y (T, or BF16 / F16 for an F32 x).
template <typename T, typename Y>
void CheckLayerNorm(DataType x_dtype, DataType y_dtype, int64_t R, int64_t D) {
  SCOPED_TRACE(testing::Message() << "layer_norm " << DataTypeName(x_dtype) << " -> " << DataTypeName(y_dtype)
                                  << " [" << R << ", " << D << "]");
  std::map<std::string, Tensor> env{{"x", Random(x_dtype, {R, D}, 1, 3, 0.5)},
                                    {"gamma", Random(x_dtype, {D}, 2, 0.5, 1)},
                                    {"beta", Random(x_dtype, {D}, 3)}};
  std::string text = std::string(R"pb(type: "layer_norm" input: ["x", "gamma", "beta"] output: "y")pb") +
                     kEpsilonAttr;
  if (y_dtype != x_dtype) text += std::string(R"( attr { key: "out_dtype" value { s: ")") + DtypeName(y_dtype) + "\" } }";
  const absl::Status s = RunOp(ParseOp(text), &env);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<Y> y = Filled<Y>(R * D);
  ASSERT_EQ(cuda::LaunchLayerNorm(y.data(), env["x"].data<T>(), env["gamma"].data<T>(), env["beta"].data<T>(), R, D,
                                  kEpsilon, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cuda_stand_in::errors.load(), 0);
  EXPECT_TRUE(Same(y, env["y"], "y"));
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{70, 37}, {33, 64}, {5, 5}, {1, 8}, {40, 1}};

TEST(NnEmulation, LayerNormFloatAndDouble) {
  for (auto [R, D] : kShapes) {
    CheckLayerNorm<float, float>(F32, F32, R, D);
    CheckLayerNorm<double, double>(F64, F64, R, D);
  }
}

TEST(NnEmulation, LayerNormFloatStoredAs16Bits) {
  for (auto [R, D] : kShapes) {
    CheckLayerNorm<float, bfloat16>(F32, BF16, R, D);
    CheckLayerNorm<float, float16>(F32, F16, R, D);
  }
}

// layer_norm_grad of x [R, D] in T with dy stored in DY, with or without a residual.
template <typename T, typename DY>
void CheckLayerNormGrad(DataType x_dtype, DataType dy_dtype, int64_t R, int64_t D, bool residual) {
  SCOPED_TRACE(testing::Message() << "layer_norm_grad " << DataTypeName(x_dtype) << ", dy "
                                  << DataTypeName(dy_dtype) << " [" << R << ", " << D << "]"
                                  << (residual ? " with a residual" : ""));
  std::map<std::string, Tensor> env{{"x", Random(x_dtype, {R, D}, 4, 2, -0.3)},
                                    {"gamma", Random(x_dtype, {D}, 5, 0.5, 1)},
                                    {"dy", Random(dy_dtype, {R, D}, 6)},
                                    {"res", Random(x_dtype, {R, D}, 7)}};
  const std::string text = std::string(R"pb(type: "layer_norm_grad" input: ["x", "gamma", "dy")pb") +
                           (residual ? R"(, "res")" : "") + R"(] output: ["dx", "dgamma", "dbeta"])" + kEpsilonAttr;
  const absl::Status s = RunOp(ParseOp(text), &env);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<T> dx = Filled<T>(R * D), dgamma = Filled<T>(D), dbeta = Filled<T>(D);
  std::vector<double> scratch(cuda::LayerNormGradScratchDoubles(R, D));
  ASSERT_EQ(cuda::LaunchLayerNormGrad(dx.data(), dgamma.data(), dbeta.data(), env["x"].data<T>(),
                                      env["gamma"].data<T>(), env["dy"].data<DY>(),
                                      residual ? env["res"].data<T>() : nullptr, R, D, kEpsilon, scratch.data(),
                                      nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cuda_stand_in::errors.load(), 0);
  EXPECT_TRUE(Same(dx, env["dx"], "dx"));
  EXPECT_TRUE(Same(dgamma, env["dgamma"], "dgamma"));
  EXPECT_TRUE(Same(dbeta, env["dbeta"], "dbeta"));
}

// [250, 20]: three blocks of rows for dgamma and dbeta.
const std::vector<std::pair<int64_t, int64_t>> kGradShapes = {{70, 37}, {250, 20}, {5, 5}, {9, 64}};

TEST(NnEmulation, LayerNormGradSeveralBlocksOfRows) {
  ASSERT_EQ(nn_kernels::LayerNormGradBlocks(250, 20), 3);
}

TEST(NnEmulation, LayerNormGradFloatAndDouble) {
  for (auto [R, D] : kGradShapes) {
    for (bool residual : {false, true}) {
      CheckLayerNormGrad<float, float>(F32, F32, R, D, residual);
      CheckLayerNormGrad<double, double>(F64, F64, R, D, residual);
    }
  }
}

TEST(NnEmulation, LayerNormGradSixteenBitDy) {
  for (auto [R, D] : kGradShapes) {
    for (bool residual : {false, true}) {
      CheckLayerNormGrad<float, bfloat16>(F32, BF16, R, D, residual);
      CheckLayerNormGrad<float, float16>(F32, F16, R, D, residual);
    }
  }
}

TEST(NnEmulation, LayerNormGradNoRowsZeroesTheParameterGradients) {
  std::vector<float> dgamma(6, 1.0f), dbeta(6, 1.0f);
  ASSERT_EQ(cuda::LaunchLayerNormGrad(nullptr, dgamma.data(), dbeta.data(), nullptr, nullptr,
                                      static_cast<const float*>(nullptr), nullptr, 0, 6, kEpsilon, nullptr, nullptr),
            cudaSuccess);
  EXPECT_EQ(dgamma, std::vector<float>(6, 0.0f));
  EXPECT_EQ(dbeta, std::vector<float>(6, 0.0f));
}

}  // namespace
}  // namespace strata
