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

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

// 16-bit logits (losses.h): float math where the cost is, so against the
// CPU's 16-bit kernels (double math) the loss within LossBound and each
// dlogits value within one spacing of the 16-bit type; two runs the same
// bits.
//
// S's relative error (losses.h): expf within 2 ulps (2^-22; glibc's, which
// the emulation calls, within 1), a group's 8 terms added pairwise in float
// (3 roundings of 2^-24), and x - M rounded (2^-24 |x - M| for a term
// e^(x - M), which weighted by the terms sums to at most 2^-24 (ln V + 1));
// the doubles' roundings are below 1e-14.
double SumBound(int64_t V) {
  return std::ldexp(1.0, -22) + 3 * std::ldexp(1.0, -24) + std::ldexp(1.0, -24) * (std::log(V) + 1) + 1e-14;
}

// log(S) is then off by at most SumBound (1 %), the row loss (M - x_l) +
// log(S) as much, their mean too; both sides round the mean to float.
double LossBound(int64_t V, double loss) { return 1.01 * SumBound(V) + std::ldexp(1.0, -23) * std::abs(loss); }

// The 16-bit type's spacing at magnitude v (its subnormals' below the least
// normal).
template <typename H>
double Spacing(double v) {
  constexpr int kDigits = std::is_same_v<H, bfloat16> ? 8 : 11;
  constexpr int kMinExponent = std::is_same_v<H, bfloat16> ? -126 : -14;
  const int e = v == 0 ? kMinExponent : std::max(std::ilogb(v), kMinExponent);
  return std::ldexp(1.0, e - (kDigits - 1));
}

template <typename H>
struct HalfRun {
  float loss = -1;
  std::vector<double> row_loss;  // the kernel's per-row losses (its scratch)
  std::vector<H> dlogits;
};

template <typename H>
HalfRun<H> RunHalf(const H* logits, const std::vector<int64_t>& labels, int64_t R, int64_t C, int64_t V) {
  const float dloss = 0.37f;
  HalfRun<H> run;
  run.dlogits.assign(R * C, cuda::Convert<H>(7.0f));
  run.row_loss.assign(R, -1);
  EXPECT_EQ(cuda::LaunchSoftmaxCrossEntropy(&run.loss, logits, labels.data(), R, C, V, run.row_loss.data(), nullptr),
            cudaSuccess);
  EXPECT_EQ(cuda::LaunchSoftmaxCrossEntropyGrad(run.dlogits.data(), logits, labels.data(), &dloss, R, C, V, nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  return run;
}

// Rows of V classes C apart (padding NaN, never read): r % 6 picks the kind.
// 0: U(-30, 30); 1: U(-30, 0) and the label's logit D (a dominant label);
// 2: U(-30, 0) and another class at D (p_l tiny); 3: U(-1, 1); 4: U(-8, 8);
// 5: {0, 1, 2} (ties of the max). D = min(30, ln(sum of the others' e^x) +
// 20.7) leaves 1 - p_l about 1e-9 (D = 28 at V = 50257), far above the
// CPU's own rounding of it (p_l from exp(x_l - lse) in double: ~2^-52 |lse|,
// 7e-15): past that the CPU's p_l - 1 is rounding noise and no bar against
// it means anything.
std::vector<double> HalfRows(int64_t R, int64_t C, int64_t V, const std::vector<int64_t>& labels) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> v(R * C, std::nan(""));
  for (int64_t r = 0; r < R; ++r) {
    double* row = v.data() + r * C;
    for (int64_t j = 0; j < V; ++j) {
      const double x = u(rng);
      switch (r % 6) {
        case 0: row[j] = 60 * x - 30; break;
        case 1:
        case 2: row[j] = -30 * x; break;
        case 3: row[j] = 2 * x - 1; break;
        case 4: row[j] = 16 * x - 8; break;
        default: row[j] = std::floor(3 * x); break;
      }
    }
    if (r % 6 == 1 || r % 6 == 2) {
      const int64_t top = r % 6 == 1 ? labels[r] : (labels[r] + V / 2) % V;
      double others = 0;
      for (int64_t j = 0; j < V; ++j) others += j == top ? 0 : std::exp(row[j]);
      row[top] = std::min(30.0, std::log(others) + 20.7);
    }
  }
  return v;
}

template <typename H>
void CheckHalf(DataType dtype, int64_t R, int64_t C, int64_t V) {
  SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " [" << R << ", " << V << " of " << C << "]");
  const std::vector<int64_t> labels = Labels(R, V);
  const Tensor logits = MakeTensor(dtype, {R, C}, HalfRows(R, C, V, labels));
  const HalfRun<H> run = RunHalf(logits.data<H>(), labels, R, C, V);
  const HalfRun<H> again = RunHalf(logits.data<H>(), labels, R, C, V);
  EXPECT_EQ(std::memcmp(&run.loss, &again.loss, sizeof(float)), 0) << "two runs";
  ASSERT_EQ(std::memcmp(run.dlogits.data(), again.dlogits.data(), sizeof(H) * R * C), 0) << "two runs";
  const std::string classes = V < C ? absl::StrCat(" attr { key: \"classes\" value { i: ", V, " } }") : "";
  std::map<std::string, Tensor> env{
      {"logits", logits}, {"label", LabelTensor(labels)}, {"dloss", MakeTensor(F32, {}, {0.37})}};
  const absl::Status s = RunOps(
      {ParseOp(std::string(kCrossEntropy) + classes), ParseOp(std::string(kCrossEntropyGrad) + classes)}, &env);
  ASSERT_TRUE(s.ok()) << s;
  const double want = TensorValues(env["loss"])[0];
  EXPECT_LE(std::abs(run.loss - want), LossBound(V, want)) << run.loss << " vs the CPU's " << want;
  // Each row's loss (the kernel's scratch, before the mean and its float
  // rounding) against the CPU kernel's formula in double: within
  // 1.01 SumBound (the double math's own error, ~1e-14, aside).
  const std::vector<double> x = TensorValues(logits);
  double worst_row = 0;
  for (int64_t r = 0; r < R; ++r) {
    const double* row = x.data() + r * C;
    double m = row[0], sum = 0;
    for (int64_t j = 1; j < V; ++j) m = std::max(m, row[j]);
    for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - m);
    const double want_row = m + std::log(sum) - row[labels[r]];
    worst_row = std::max(worst_row, std::abs(run.row_loss[r] - want_row));
    EXPECT_LE(std::abs(run.row_loss[r] - want_row), 1.01 * SumBound(V) + 1e-13)
        << "row " << r << ": " << run.row_loss[r] << " vs " << want_row;
  }
  const std::vector<double> cpu = TensorValues(env["dlogits"]);
  int64_t off = 0, bad = 0;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < C; ++j) {
      const int64_t i = r * C + j;
      const double g = ToFloat(run.dlogits[i]), w = cpu[i];
      if (j >= V) {
        if (run.dlogits[i].bits != 0 && ++bad <= 10) ADD_FAILURE() << "padding dlogits[" << r << ", " << j << "] " << g;
        continue;
      }
      off += g != w;
      if (!(std::abs(g - w) <= Spacing<H>(std::max(std::abs(g), std::abs(w)))) && ++bad <= 10) {
        ADD_FAILURE() << "dlogits[" << r << ", " << j << "] " << g << " vs the CPU's " << w;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  std::printf("%s [%lld, %lld of %lld]: loss %.9g, the CPU's %.9g (off %.3g, bound %.3g); rows off at most %.3g "
              "(bound %.3g); %lld of %lld dlogits one spacing off\n",
              DataTypeName(dtype).c_str(), static_cast<long long>(R), static_cast<long long>(V),
              static_cast<long long>(C), run.loss, want, std::abs(run.loss - want), LossBound(V, want), worst_row,
              1.01 * SumBound(V), static_cast<long long>(off), static_cast<long long>(R * V));
}

// Both paths of 16-bit logits meet the bounds: the fast kernels (the
// default since 2026-11-29) and the widened path (STRATA_FAST_HALF_LOSS=0).
TEST(LossesEmulation, SixteenBitLogitsWithinTheBoundsOfTheCpu) {
  for (const bool fast : {true, false}) {
    SCOPED_TRACE(fast ? "fast kernels" : "widened path");
    const cuda::ScopedFastHalfLoss path(fast);
    CheckHalf<bfloat16>(BF16, 6, 50304, 50257);  // GPT-2's padded LM head: 16-byte groups in registers
    CheckHalf<float16>(F16, 6, 50304, 50257);
    for (auto [R, C, V] : std::vector<std::array<int64_t, 3>>{
             {8, 300, 300},      // 8 does not divide C: scalars
             {3, 5, 5},          // under one group
             {12, 304, 304},     // 16-byte groups
             {2, 65536, 65536},  // the most classes the registers take
             {2, 70000, 70000},  // more: scalars
         }) {
      CheckHalf<bfloat16>(BF16, R, C, V);
      CheckHalf<float16>(F16, R, C, V);
    }
  }
}

// The widened path (the default) is the F32 kernels on the widened logits,
// the loss bit for bit and each dlogits value their float rounded once.
template <typename H>
void CheckWidened(DataType dtype, int64_t R, int64_t C, int64_t V) {
  SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " [" << R << ", " << V << " of " << C << "]");
  const cuda::ScopedFastHalfLoss path(false);
  const std::vector<int64_t> labels = Labels(R, V);
  const Tensor logits = MakeTensor(dtype, {R, C}, HalfRows(R, C, V, labels));
  std::vector<float> wide(R * C);
  for (int64_t i = 0; i < R * C; ++i) wide[i] = cuda::Convert<float>(logits.data<H>()[i]);
  const HalfRun<H> half = RunHalf(logits.data<H>(), labels, R, C, V);
  const float dloss = 0.37f;
  float loss = -1;
  std::vector<double> row_loss(R);
  std::vector<float> dlogits(R * C);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropy(&loss, wide.data(), labels.data(), R, C, V, row_loss.data(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchSoftmaxCrossEntropyGrad(dlogits.data(), wide.data(), labels.data(), &dloss, R, C, V, nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_EQ(std::memcmp(&loss, &half.loss, sizeof(float)), 0) << loss << " vs " << half.loss;
  int64_t differ = 0;
  for (int64_t i = 0; i < R * C; ++i) {
    const H want = cuda::Convert<H>(dlogits[i]);
    differ += std::memcmp(&want, &half.dlogits[i], sizeof(H)) != 0;
  }
  EXPECT_EQ(differ, 0) << "dlogits values off the float kernel's rounded";
}

TEST(LossesEmulation, WidenedSixteenBitPathIsTheFloatKernelsRounded) {
  CheckWidened<bfloat16>(BF16, 6, 320, 301);
  CheckWidened<float16>(F16, 6, 300, 300);
}

// The numbers depend on the classes' values only: rows read as 16-byte
// groups into registers and the same rows at an address 16 bytes do not
// divide (read as scalars) give the same bits.
template <typename H>
void CheckPathsAgree(DataType dtype, int64_t R, int64_t C, int64_t V) {
  SCOPED_TRACE(testing::Message() << DataTypeName(dtype) << " [" << R << ", " << V << " of " << C << "]");
  const std::vector<int64_t> labels = Labels(R, V);
  const Tensor logits = MakeTensor(dtype, {R, C}, HalfRows(R, C, V, labels));
  ASSERT_EQ(reinterpret_cast<uintptr_t>(logits.data<H>()) % 16, 0u);
  std::vector<H> buffer(R * C + 8);
  H* shifted = buffer.data() + (reinterpret_cast<uintptr_t>(buffer.data()) % 16 == 0 ? 1 : 0);
  std::memcpy(shifted, logits.data<H>(), sizeof(H) * R * C);
  const HalfRun<H> aligned = RunHalf(logits.data<H>(), labels, R, C, V);
  const HalfRun<H> scalars = RunHalf(static_cast<const H*>(shifted), labels, R, C, V);
  EXPECT_EQ(std::memcmp(&aligned.loss, &scalars.loss, sizeof(float)), 0) << aligned.loss << " vs " << scalars.loss;
  EXPECT_EQ(std::memcmp(aligned.dlogits.data(), scalars.dlogits.data(), sizeof(H) * R * C), 0);
}

TEST(LossesEmulation, SixteenBitGroupsInRegistersOrScalarsGiveTheSameBits) {
  const cuda::ScopedFastHalfLoss path(true);
  CheckPathsAgree<bfloat16>(BF16, 6, 50304, 50257);
  CheckPathsAgree<float16>(F16, 6, 1000, 997);
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
  for (const bool fast : {true, false}) {
    SCOPED_TRACE(fast ? "fast kernels" : "widened path");
    const cuda::ScopedFastHalfLoss path(fast);
    CheckInPlace<bfloat16>(BF16, 70, 257, 320);
    CheckInPlace<float16>(F16, 9, 37, 37);
  }
}

TEST(LossesEmulation, PaddedRowsGiveTheDenseRowsBits) {
  CheckPadded<float>(F32, 70, 300, 320);
  CheckPadded<double>(F64, 3, 5, 8);
  for (const bool fast : {true, false}) {
    SCOPED_TRACE(fast ? "fast kernels" : "widened path");
    const cuda::ScopedFastHalfLoss path(fast);
    CheckPadded<bfloat16>(BF16, 70, 257, 320);
    CheckPadded<float16>(F16, 9, 37, 64);
  }
}

}  // namespace
}  // namespace strata
