// losses.cu, launchers included, on the CPU: the genrule losses_emulated_src
// rewrites the file's <<<>>> launches into calls of testing/cuda_stand_in/'s
// Launch, and g++ compiles it against the stand-ins (blocks one after
// another, a block's CUDA threads as fibers). softmax_cross_entropy, its
// gradient and accuracy in F32 and F64 against the registered CPU kernels
// (run through the registry): the row sums and the batch mean go through
// fixed trees, so within a few ulps (accuracy exactly); the BF16 / F16 logits
// path (mixed precision) against the emulated float path on the widened
// logits bit for bit, as losses.h promises (the loss the float kernel's, each
// dlogits value its float rounded once); a label outside [0, C) gives NaN.
// No FMA (-ffp-contract=off), as nvcc's --fmad=false.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/losses.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "kernels/cuda/testing/emulation_test_util.h"
#include "kernels/cuda/unary_math.h"

namespace strata {
namespace {

constexpr char kCrossEntropy[] = R"pb(type: "softmax_cross_entropy" input: ["logits", "label"] output: "loss")pb";
constexpr char kCrossEntropyGrad[] =
    R"pb(type: "softmax_cross_entropy_grad" input: ["logits", "label", "dloss"] output: "dlogits")pb";

std::vector<int64_t> Labels(int64_t R, int64_t C) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> u(0, C - 1);
  std::vector<int64_t> v(R);
  for (int64_t& x : v) x = u(rng);
  v[0] = 0;
  v[R - 1] = C - 1;
  return v;
}

Tensor LabelTensor(const std::vector<int64_t>& labels) {
  return MakeTensor(I64, {static_cast<int64_t>(labels.size())}, std::vector<double>(labels.begin(), labels.end()));
}

template <typename T>
void CheckAgainstCpu(DataType dtype, int64_t R, int64_t C) {
  SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " [" << R << ", " << C << "]");
  const std::vector<int64_t> labels = Labels(R, C);
  std::map<std::string, Tensor> env{{"logits", MakeTensor(dtype, {R, C}, emulation::UniformValues(R * C, 1, 6))},
                                    {"label", LabelTensor(labels)},
                                    {"dloss", MakeTensor(dtype, {}, {0.37})}};
  absl::Status s = RunOps({ParseOp(kCrossEntropy), ParseOp(kCrossEntropyGrad),
                           ParseOp(R"pb(type: "accuracy" input: ["logits", "label"] output: "acc"
                                        attr { key: "k" value { i: 3 } })pb")},
                          &env);
  ASSERT_TRUE(s.ok()) << s;
  const T* logits = env["logits"].data<T>();
  std::vector<double> scratch(R);
  T loss = T(-1), accuracy = T(-1);
  std::vector<T> dlogits(R * C, T(12345));
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropy(&loss, logits, labels.data(), R, C, C, scratch.data(), nullptr), cudaSuccess);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropyGrad(dlogits.data(), logits, labels.data(), env["dloss"].data<T>(), R, C, C,
                                                nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchAccuracy(&accuracy, logits, labels.data(), R, C, 3, scratch.data(), nullptr), cudaSuccess);
  emulation::ExpectCleanLaunches();
  const double tol = dtype == F32 ? 1e-6 : 1e-14;
  EXPECT_TRUE(TensorNear(MakeTensor(dtype, {}, {static_cast<double>(loss)}), env["loss"], tol));
  EXPECT_TRUE(TensorNear(MakeTensor(dtype, {R, C}, std::vector<double>(dlogits.begin(), dlogits.end())),
                         env["dlogits"], tol));
  EXPECT_EQ(static_cast<double>(accuracy), TensorValues(env["acc"])[0]);
  EXPECT_GT(accuracy, 0);
}

TEST(LossesEmulation, FloatAndDoubleWithinUlpsOfTheCpu) {
  for (auto [R, C] : std::vector<std::pair<int64_t, int64_t>>{{70, 300}, {3, 5}, {300, 40}}) {
    CheckAgainstCpu<float>(F32, R, C);
    CheckAgainstCpu<double>(F64, R, C);
  }
}

// 16-bit logits: the float path's numbers on the widened logits, bit for bit.
template <typename H>
void CheckHalf(DataType dtype, int64_t R, int64_t C) {
  SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " [" << R << ", " << C << "]");
  const std::vector<int64_t> labels = Labels(R, C);
  const Tensor low = MakeTensor(dtype, {R, C}, emulation::UniformValues(R * C, 2, 6));
  const std::vector<double> values = TensorValues(low);
  const std::vector<float> wide(values.begin(), values.end());  // exact
  const float dloss = 0.37f;
  std::vector<double> scratch(R);
  float loss_low = -1, loss_wide = -2;
  std::vector<H> dlogits_low(R * C);
  std::vector<float> dlogits_wide(R * C);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropy(&loss_low, low.data<H>(), labels.data(), R, C, C, scratch.data(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropy(&loss_wide, wide.data(), labels.data(), R, C, C, scratch.data(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropyGrad(dlogits_low.data(), low.data<H>(), labels.data(), &dloss, R, C, C,
                                                nullptr),
            cudaSuccess);
  ASSERT_EQ(
      cuda::LaunchSoftmaxCrossEntropyGrad(dlogits_wide.data(), wide.data(), labels.data(), &dloss, R, C, C, nullptr),
      cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_EQ(std::memcmp(&loss_low, &loss_wide, sizeof(float)), 0) << loss_low << " vs " << loss_wide;
  for (int64_t i = 0; i < R * C; ++i) {
    const H want = cuda::Convert<H>(dlogits_wide[i]);
    ASSERT_EQ(dlogits_low[i].bits, want.bits) << "dlogits element " << i;
  }
  // And the CPU's 16-bit kernels within the float kernels' ulps.
  std::map<std::string, Tensor> env{
      {"logits", low}, {"label", LabelTensor(labels)}, {"dloss", MakeTensor(F32, {}, {dloss})}};
  const absl::Status s = RunOps({ParseOp(kCrossEntropy), ParseOp(kCrossEntropyGrad)}, &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(MakeTensor(F32, {}, {loss_low}), env["loss"], 1e-6));
}

TEST(LossesEmulation, SixteenBitLogitsAreTheFloatPathOnWidenedLogits) {
  for (auto [R, C] : std::vector<std::pair<int64_t, int64_t>>{{70, 300}, {3, 5}}) {
    CheckHalf<bfloat16>(BF16, R, C);
    CheckHalf<float16>(F16, R, C);
  }
}

TEST(LossesEmulation, ALabelOutOfRangeGivesNan) {
  const std::vector<float> logits = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> labels = {0, 3};  // C = 3
  std::vector<double> scratch(2);
  float loss = 0, dloss = 1;
  std::vector<float> dlogits(6);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropy(&loss, logits.data(), labels.data(), 2, 3, 3, scratch.data(), nullptr),
            cudaSuccess);
  ASSERT_EQ(
      cuda::LaunchSoftmaxCrossEntropyGrad(dlogits.data(), logits.data(), labels.data(), &dloss, 2, 3, 3, nullptr),
      cudaSuccess);
  EXPECT_TRUE(std::isnan(loss));
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(std::isnan(dlogits[i])) << i;
}

// Rows C apart of which the first V columns are classes (a row-aligned LM
// head's padding, passes/pad_vocab): the loss and the first V columns of
// dlogits are the unpadded rows' bit for bit whatever the padding holds (NaN
// here), the padding columns of dlogits are zero; on the CPU's kernels with
// the `classes` attr too.
template <typename T>
void CheckPadded(DataType dtype, int64_t R, int64_t V, int64_t C) {
  SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " [" << R << ", " << V << " of " << C << "]");
  const std::vector<int64_t> labels = Labels(R, V);
  const Tensor dense = MakeTensor(dtype, {R, V}, emulation::UniformValues(R * V, 3, 6));
  std::vector<double> values = TensorValues(dense), padded_values;
  for (int64_t r = 0; r < R; ++r) {
    padded_values.insert(padded_values.end(), values.begin() + r * V, values.begin() + (r + 1) * V);
    padded_values.insert(padded_values.end(), C - V, std::nan(""));
  }
  const Tensor padded = MakeTensor(dtype, {R, C}, padded_values);
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const L dloss = static_cast<L>(0.37);
  std::vector<double> scratch(R);
  L loss_dense = -1, loss_padded = -2;
  std::vector<T> d_dense(R * V), d_padded(R * C, cuda::Convert<T>(7.0f));
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropy(&loss_dense, dense.data<T>(), labels.data(), R, V, V, scratch.data(),
                                            nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropy(&loss_padded, padded.data<T>(), labels.data(), R, C, V, scratch.data(),
                                            nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropyGrad(d_dense.data(), dense.data<T>(), labels.data(), &dloss, R, V, V,
                                                nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropyGrad(d_padded.data(), padded.data<T>(), labels.data(), &dloss, R, C, V,
                                                nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_EQ(std::memcmp(&loss_dense, &loss_padded, sizeof(L)), 0) << loss_dense << " vs " << loss_padded;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < C; ++j) {
      const T got = d_padded[r * C + j];
      const T want = j < V ? d_dense[r * V + j] : cuda::Convert<T>(0.0f);
      ASSERT_EQ(std::memcmp(&got, &want, sizeof(T)), 0) << "dlogits[" << r << ", " << j << "]";
    }
  }
  // The CPU's kernels: the attr on the padded rows gives the dense rows' bits.
  const std::string classes = absl::StrCat(" attr { key: \"classes\" value { i: ", V, " } }");
  std::map<std::string, Tensor> dense_env{
      {"logits", dense}, {"label", LabelTensor(labels)}, {"dloss", MakeTensor(DataTypeOf<L>::value, {}, {0.37})}};
  std::map<std::string, Tensor> padded_env = dense_env;
  padded_env["logits"] = padded;
  absl::Status s = RunOps({ParseOp(kCrossEntropy), ParseOp(kCrossEntropyGrad)}, &dense_env);
  ASSERT_TRUE(s.ok()) << s;
  s = RunOps({ParseOp(std::string(kCrossEntropy) + classes),
                                 ParseOp(std::string(kCrossEntropyGrad) + classes)},
                                &padded_env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(TensorValues(padded_env["loss"]), TensorValues(dense_env["loss"]));
  const std::vector<double> dd = TensorValues(dense_env["dlogits"]), dp = TensorValues(padded_env["dlogits"]);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < C; ++j) {
      EXPECT_EQ(dp[r * C + j], j < V ? dd[r * V + j] : 0.0) << "CPU dlogits[" << r << ", " << j << "]";
    }
  }
}

// in_place (passes/in_place_loss_grad): dlogits written over the logits
// gives the out-of-place gradient's bits, on the device and on the CPU's
// kernels.
template <typename T>
void CheckInPlace(DataType dtype, int64_t R, int64_t V, int64_t C) {
  SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " [" << R << ", " << V << " of " << C << "]");
  const std::vector<int64_t> labels = Labels(R, V);
  const Tensor logits = MakeTensor(dtype, {R, C}, emulation::UniformValues(R * C, 4, 6));
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const L dloss = static_cast<L>(0.37);
  std::vector<T> apart(R * C);
  std::vector<T> over(logits.data<T>(), logits.data<T>() + R * C);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropyGrad(apart.data(), logits.data<T>(), labels.data(), &dloss, R, C, V,
                                                nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropyGrad(over.data(), over.data(), labels.data(), &dloss, R, C, V, nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  ASSERT_EQ(std::memcmp(apart.data(), over.data(), sizeof(T) * R * C), 0) << "device, in place";
  const std::string attrs = absl::StrCat(" attr { key: \"classes\" value { i: ", V, " } }");
  std::map<std::string, Tensor> env{{"logits", logits.Clone(GetCpuAllocator())},
                                    {"label", LabelTensor(labels)},
                                    {"dloss", MakeTensor(DataTypeOf<L>::value, {}, {0.37})}};
  std::map<std::string, Tensor> in_place_env = env;
  in_place_env["logits"] = logits.Clone(GetCpuAllocator());
  absl::Status s = RunOps({ParseOp(std::string(kCrossEntropyGrad) + attrs)}, &env);
  ASSERT_TRUE(s.ok()) << s;
  s = RunOps({ParseOp(std::string(kCrossEntropyGrad) + attrs + " attr { key: \"in_place\" value { b: true } }")},
             &in_place_env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(in_place_env["dlogits"].raw_data(), in_place_env["logits"].raw_data()) << "written over the logits";
  EXPECT_EQ(std::memcmp(env["dlogits"].raw_data(), in_place_env["dlogits"].raw_data(), env["dlogits"].bytes()), 0)
      << "CPU, in place";
}

TEST(LossesEmulation, InPlaceGradientGivesTheOutOfPlaceBits) {
  CheckInPlace<float>(F32, 70, 300, 300);
  CheckInPlace<double>(F64, 3, 5, 8);
  CheckInPlace<bfloat16>(BF16, 70, 257, 320);
  CheckInPlace<float16>(F16, 9, 37, 37);
}

TEST(LossesEmulation, PaddedRowsGiveTheDenseRowsBits) {
  CheckPadded<float>(F32, 70, 300, 320);
  CheckPadded<double>(F64, 3, 5, 8);
  CheckPadded<bfloat16>(BF16, 70, 257, 320);
  CheckPadded<float16>(F16, 9, 37, 64);
}

}  // namespace
}  // namespace strata
