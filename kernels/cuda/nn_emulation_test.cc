// nn.cu's layer_norm family, launchers included, on the CPU: the genrule
// nn_emulated_src rewrites the file's <<<>>> launches into calls of
// testing/cuda_stand_in/'s Launch, and g++ compiles it against the stand-ins
// (blocks one after another, a block's CUDA threads as fibers, __shfl_sync
// with width 8 through a per-warp exchange and barrier). LaunchLayerNorm and
// LaunchLayerNormGrad must give the registered CPU kernels' (kernels/cpu/
// layer_norm.cc, run through the registry) bits exactly: the row groups'
// lanes, the shuffles and the fixed combining order reproduce the CPU's
// LaneSum, and the dgamma/dbeta partial sums its blocks of rows. Shapes with
// D not a multiple of 8 (the tail), D < 8, rows not filling a block, and a
// layer_norm_grad with several blocks of rows, and one storing dx in 16 bits
// too (dx_low, the cast kernel's rounding). Also the softmax family
// (within a few ulps: its fixed tree adds in another order than the CPU) and
// embedding / embedding_grad (the bitonic sort of the keys: bit for bit),
// and dropout (the CPU's Philox mask, also from counters in device memory).
// The emulated compile uses no FMA (-ffp-contract=off), as nvcc's
// --fmad=false.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/nn.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "kernels/cuda/testing/emulation_test_util.h"
#include "kernels/work_split.h"
#include "proto/fnv1a.h"

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
  std::vector<Y> y = emulation::Poisoned<Y>(R * D);
  ASSERT_EQ(cuda::LaunchLayerNorm(y.data(), env["x"].data<T>(), env["gamma"].data<T>(), env["beta"].data<T>(), R, D,
                                  kEpsilon, nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_TRUE(emulation::SameBits(y, env["y"], "y"));
}

// [300, 768]: GPT-2's D (batches of 12 terms a lane, no rest) over many
// blocks of rows, the last one partial; [6, 3000]: long rows.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{70, 37}, {33, 64},   {5, 5},    {1, 8},
                                                          {40, 1},  {300, 768}, {6, 3000}, {13, 765}};

// Each float case on both kernels: the rows kept in registers (D <= 768,
// STRATA_LN_ROW_REGISTERS=1) and read again for each sum (the default;
// cuda::LayerNormRowsInRegisters).
TEST(NnEmulation, LayerNormFloatAndDouble) {
  for (bool registers : {true, false}) {
    SCOPED_TRACE(registers ? "rows in registers" : "rows read again");
    cuda::ScopedLayerNormRowsInRegisters scoped(registers);
    for (auto [R, D] : kShapes) {
      CheckLayerNorm<float, float>(F32, F32, R, D);
      if (registers) CheckLayerNorm<double, double>(F64, F64, R, D);  // the same kernel either way
    }
  }
}

TEST(NnEmulation, LayerNormFloatStoredAs16Bits) {
  for (bool registers : {true, false}) {
    SCOPED_TRACE(registers ? "rows in registers" : "rows read again");
    cuda::ScopedLayerNormRowsInRegisters scoped(registers);
    for (auto [R, D] : kShapes) {
      CheckLayerNorm<float, bfloat16>(F32, BF16, R, D);
      CheckLayerNorm<float, float16>(F32, F16, R, D);
    }
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
  std::vector<T> dx = emulation::Poisoned<T>(R * D), dgamma = emulation::Poisoned<T>(D), dbeta = emulation::Poisoned<T>(D);
  std::vector<double> scratch(cuda::LayerNormGradScratchDoubles(R, D));
  ASSERT_EQ(cuda::LaunchLayerNormGrad(dx.data(), dgamma.data(), dbeta.data(), env["x"].data<T>(),
                                      env["gamma"].data<T>(), env["dy"].data<DY>(),
                                      residual ? env["res"].data<T>() : nullptr, R, D, kEpsilon, scratch.data(),
                                      nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_TRUE(emulation::SameBits(dx, env["dx"], "dx"));
  EXPECT_TRUE(emulation::SameBits(dgamma, env["dgamma"], "dgamma"));
  EXPECT_TRUE(emulation::SameBits(dbeta, env["dbeta"], "dbeta"));
  // The other kernel set too, its row means and rstds (doubles, which a
  // sum's order changes where a float output rarely shows it) bit for bit.
  const cuda::ScopedLayerNormRowsInRegisters other(!cuda::LayerNormRowsInRegisters().load());
  std::vector<T> dx2 = emulation::Poisoned<T>(R * D), dgamma2 = emulation::Poisoned<T>(D),
                 dbeta2 = emulation::Poisoned<T>(D);
  std::vector<double> scratch2(scratch.size());
  ASSERT_EQ(
      cuda::LaunchLayerNormGrad(dx2.data(), dgamma2.data(), dbeta2.data(), env["x"].data<T>(), env["gamma"].data<T>(),
                                env["dy"].data<DY>(), residual ? env["res"].data<T>() : nullptr, R, D, kEpsilon,
                                scratch2.data(), nullptr),
      cudaSuccess);
  EXPECT_EQ(std::memcmp(dx2.data(), dx.data(), dx.size() * sizeof(T)), 0);
  EXPECT_EQ(std::memcmp(dgamma2.data(), dgamma.data(), dgamma.size() * sizeof(T)), 0);
  EXPECT_EQ(std::memcmp(dbeta2.data(), dbeta.data(), dbeta.size() * sizeof(T)), 0);
  EXPECT_EQ(std::memcmp(scratch2.data(), scratch.data(), 2 * R * sizeof(double)), 0) << "row means and rstds";
}

// [250, 20]: three blocks of rows for dgamma and dbeta. [300, 768]: GPT-2's
// D, 60 blocks of 5 rows (the sum over blocks in a batch of 32 and a rest).
// [2200, 64]: 63 blocks of 35 rows (the rows of a block in a batch of 32
// and a rest), the last of 30. [6, 3000]: long rows.
// [13, 765]: a lane's 96 terms with a tail, in rows that leave a block part empty.
const std::vector<std::pair<int64_t, int64_t>> kGradShapes = {{70, 37},   {250, 20},  {5, 5},    {9, 64},
                                                              {300, 768}, {2200, 64}, {6, 3000}, {13, 765}};

TEST(NnEmulation, LayerNormGradSeveralBlocksOfRows) {
  ASSERT_EQ(nn_kernels::LayerNormGradBlocks(250, 20), 3);
  ASSERT_EQ(nn_kernels::LayerNormGradRowsPerBlock(300, 768), 5);
  ASSERT_EQ(nn_kernels::LayerNormGradBlocks(300, 768), 60);
  ASSERT_EQ(nn_kernels::LayerNormGradRowsPerBlock(2200, 64), 35);
  ASSERT_EQ(nn_kernels::LayerNormGradBlocks(2200, 64), 63);
}

TEST(NnEmulation, LayerNormGradFloatAndDouble) {
  for (bool registers : {true, false}) {
    SCOPED_TRACE(registers ? "rows in registers" : "rows read again");
    cuda::ScopedLayerNormRowsInRegisters scoped(registers);
    for (auto [R, D] : kGradShapes) {
      for (bool residual : {false, true}) {
        CheckLayerNormGrad<float, float>(F32, F32, R, D, residual);
        if (registers) CheckLayerNormGrad<double, double>(F64, F64, R, D, residual);
      }
    }
  }
}

TEST(NnEmulation, LayerNormGradSixteenBitDy) {
  for (bool registers : {true, false}) {
    SCOPED_TRACE(registers ? "rows in registers" : "rows read again");
    cuda::ScopedLayerNormRowsInRegisters scoped(registers);
    for (auto [R, D] : kGradShapes) {
      for (bool residual : {false, true}) {
        CheckLayerNormGrad<float, bfloat16>(F32, BF16, R, D, residual);
        CheckLayerNormGrad<float, float16>(F32, F16, R, D, residual);
      }
    }
  }
}

// layer_norm_grad with out_dtype: dx also stored as L (dx_low) by the rows
// kernel, against the CPU kernel's dx_low (the cast kernel's rounding of dx)
// and dx, dgamma, dbeta, bit for bit; every dy storage, with and without a
// residual.
template <typename DY, typename L>
void CheckLayerNormGradStored(DataType dy_dtype, DataType low, int64_t R, int64_t D, bool residual) {
  SCOPED_TRACE(testing::Message() << "layer_norm_grad F32, dy " << DataTypeName(dy_dtype) << ", dx_low "
                                  << DataTypeName(low) << " [" << R << ", " << D << "]"
                                  << (residual ? " with a residual" : ""));
  std::map<std::string, Tensor> env{{"x", Random(F32, {R, D}, 4, 2, -0.3)},
                                    {"gamma", Random(F32, {D}, 5, 0.5, 1)},
                                    {"dy", Random(dy_dtype, {R, D}, 6, 30)},
                                    {"res", Random(F32, {R, D}, 7, 50)}};
  const std::string text = std::string(R"pb(type: "layer_norm_grad" input: ["x", "gamma", "dy")pb") +
                           (residual ? R"(, "res")" : "") + R"(] output: ["dx", "dgamma", "dbeta", "dx_low"])" +
                           kEpsilonAttr + R"( attr { key: "out_dtype" value { s: ")" + DtypeName(low) + "\" } }";
  const absl::Status s = RunOp(ParseOp(text), &env);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<float> dx = emulation::Poisoned<float>(R * D), dgamma = emulation::Poisoned<float>(D),
                     dbeta = emulation::Poisoned<float>(D);
  std::vector<L> dx_low = emulation::Poisoned<L>(R * D);
  std::vector<double> scratch(cuda::LayerNormGradScratchDoubles(R, D));
  ASSERT_EQ(cuda::LaunchLayerNormGrad(dx.data(), dx_low.data(), dgamma.data(), dbeta.data(), env["x"].data<float>(),
                                      env["gamma"].data<float>(), env["dy"].data<DY>(),
                                      residual ? env["res"].data<float>() : nullptr, R, D, kEpsilon, scratch.data(),
                                      nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_TRUE(emulation::SameBits(dx, env["dx"], "dx"));
  EXPECT_TRUE(emulation::SameBits(dx_low, env["dx_low"], "dx_low"));
  EXPECT_TRUE(emulation::SameBits(dgamma, env["dgamma"], "dgamma"));
  EXPECT_TRUE(emulation::SameBits(dbeta, env["dbeta"], "dbeta"));
  // The other kernel set's row means and rstds, bit for bit (as CheckLayerNormGrad).
  const cuda::ScopedLayerNormRowsInRegisters other(!cuda::LayerNormRowsInRegisters().load());
  std::vector<float> dx2(dx.size()), dgamma2(D), dbeta2(D);
  std::vector<L> dx_low2(dx_low.size());
  std::vector<double> scratch2(scratch.size());
  ASSERT_EQ(cuda::LaunchLayerNormGrad(dx2.data(), dx_low2.data(), dgamma2.data(), dbeta2.data(), env["x"].data<float>(),
                                      env["gamma"].data<float>(), env["dy"].data<DY>(),
                                      residual ? env["res"].data<float>() : nullptr, R, D, kEpsilon, scratch2.data(),
                                      nullptr),
            cudaSuccess);
  EXPECT_EQ(std::memcmp(dx_low2.data(), dx_low.data(), dx_low.size() * sizeof(L)), 0);
  EXPECT_EQ(std::memcmp(scratch2.data(), scratch.data(), 2 * R * sizeof(double)), 0) << "row means and rstds";
}

TEST(NnEmulation, LayerNormGradStoresDxAgainInSixteenBits) {
  for (bool registers : {true, false}) {
    SCOPED_TRACE(registers ? "rows in registers" : "rows read again");
    cuda::ScopedLayerNormRowsInRegisters scoped(registers);
    for (auto [R, D] : kGradShapes) {
      for (bool residual : {false, true}) {
        CheckLayerNormGradStored<float, bfloat16>(F32, BF16, R, D, residual);
        CheckLayerNormGradStored<bfloat16, bfloat16>(BF16, BF16, R, D, residual);
        CheckLayerNormGradStored<float16, float16>(F16, F16, R, D, residual);
        CheckLayerNormGradStored<float, float16>(F32, F16, R, D, residual);
      }
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

// softmax family on [M, K, N] (axis 1), K past one block's 256 threads: the
// GPU's fixed tree adds the double sums in another order than the CPU's
// index order, so within a few ulps of the result's type.
template <typename T>
void CheckSoftmax(DataType dtype, cuda::SoftmaxMode mode, const char* type, bool grad, int64_t M, int64_t K,
                  int64_t N) {
  SCOPED_TRACE(testing::Message() << type << " " << DataTypeName(dtype) << " [" << M << ", " << K << ", " << N
                                  << "]");
  const Tensor x = Random(dtype, {M, K, N}, 8, 4), dy = Random(dtype, {M, K, N}, 9);
  const std::string attr = R"( attr { key: "axis" value { i: 1 } })";
  std::map<std::string, Tensor> env{{"x", x}, {"dy", dy}};
  Tensor a = x;
  if (grad) {  // the gradients read y: the forward's output (CPU's), as a plan would feed them
    const std::string forward = std::string(mode == cuda::SoftmaxMode::kSoftmaxGrad ? "softmax" : "log_softmax");
    const absl::Status s = RunOp(ParseOp("type: \"" + forward + "\" input: \"x\" output: \"y\"" + attr), &env);
    ASSERT_TRUE(s.ok()) << s;
    a = env["y"];
  }
  const std::string text = grad ? "type: \"" + std::string(type) + "\" input: [\"y\", \"dy\"] output: \"out\"" + attr
                                : "type: \"" + std::string(type) + "\" input: \"x\" output: \"out\"" + attr;
  const absl::Status s = RunOp(ParseOp(text), &env);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<T> out = emulation::Poisoned<T>(M * K * N);
  ASSERT_EQ(cuda::LaunchSoftmax(mode, out.data(), a.data<T>(), grad ? dy.data<T>() : nullptr, M, K, N, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<double> got(out.begin(), out.end());
  EXPECT_TRUE(TensorNear(MakeTensor(dtype, {M, K, N}, got), env["out"], dtype == F32 ? 4e-7 : 1e-15));
}

TEST(NnEmulation, SoftmaxFamilyWithinUlpsOfTheCpu) {
  using M = cuda::SoftmaxMode;
  for (auto [m, k, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{3, 300, 2}, {2, 7, 1}}) {
    CheckSoftmax<float>(F32, M::kSoftmax, "softmax", false, m, k, n);
    CheckSoftmax<double>(F64, M::kSoftmax, "softmax", false, m, k, n);
    CheckSoftmax<float>(F32, M::kLogSoftmax, "log_softmax", false, m, k, n);
    CheckSoftmax<double>(F64, M::kLogSoftmax, "log_softmax", false, m, k, n);
    CheckSoftmax<float>(F32, M::kSoftmaxGrad, "softmax_grad", true, m, k, n);
    CheckSoftmax<double>(F64, M::kSoftmaxGrad, "softmax_grad", true, m, k, n);
    CheckSoftmax<float>(F32, M::kLogSoftmaxGrad, "log_softmax_grad", true, m, k, n);
    CheckSoftmax<double>(F64, M::kLogSoftmaxGrad, "log_softmax_grad", true, m, k, n);
  }
  EXPECT_EQ(cuda_stand_in::errors.load(), 0);
}

// embedding and embedding_grad of n ids (repeats) into [V, D]: the bitonic
// sort of the keys (tiles of 2048 in dynamic shared memory, global stages
// past one tile) then each id's rows in position order: the CPU's bits.
template <typename T>
void CheckEmbedding(DataType dtype, int64_t n, int64_t V, int64_t D) {
  SCOPED_TRACE(testing::Message() << "embedding " << DataTypeName(dtype) << " n " << n << ", [" << V << ", " << D
                                  << "]");
  std::mt19937 rng(10);
  std::uniform_int_distribution<int64_t> id(0, V - 1);
  std::vector<double> ids(n);
  for (double& i : ids) i = static_cast<double>(id(rng));
  std::map<std::string, Tensor> env{{"ids", MakeTensor(I64, {n}, ids)},
                                    {"table", Random(dtype, {V, D}, 11)},
                                    {"dy", Random(dtype, {n, D}, 12)}};
  absl::Status s = RunOp(ParseOp(R"pb(type: "embedding" input: ["ids", "table"] output: "y")pb"), &env);
  ASSERT_TRUE(s.ok()) << s;
  s = RunOp(ParseOp(R"pb(type: "embedding_grad" input: ["ids", "dy"] output: "dtable" attr { key: "num_embeddings" value { i: )pb" +
                    std::to_string(V) + " } }"),
            &env);
  ASSERT_TRUE(s.ok()) << s;
  std::vector<T> y = emulation::Poisoned<T>(n * D), dtable = emulation::Poisoned<T>(V * D);
  std::vector<int64_t> keys(cuda::EmbeddingGradScratchKeys(n));
  ASSERT_EQ(cuda::LaunchEmbedding(y.data(), env["table"].data<T>(), env["ids"].data<int64_t>(), n, V, D, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchEmbeddingGrad(dtable.data(), env["dy"].data<T>(), env["ids"].data<int64_t>(), n, V, D,
                                      keys.data(), nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_TRUE(emulation::SameBits(y, env["y"], "y"));
  EXPECT_TRUE(emulation::SameBits(dtable, env["dtable"], "dtable"));
}

TEST(NnEmulation, EmbeddingAndItsGradient) {
  CheckEmbedding<float>(F32, 5, 4, 3);       // 8 keys: one tile
  CheckEmbedding<double>(F64, 300, 17, 6);   // 512 keys
  CheckEmbedding<float>(F32, 3000, 50, 5);   // 4096 keys: two tiles and a global stage
}

TEST(NnEmulation, EmbeddingGradOfABadIdIsAllNan) {
  const std::vector<int64_t> ids = {1, 7, 0};  // 7 is outside [0, 4)
  std::vector<float> dy(3 * 2, 1.0f), dtable(4 * 2, 0.0f);
  std::vector<int64_t> keys(cuda::EmbeddingGradScratchKeys(3));
  ASSERT_EQ(cuda::LaunchEmbeddingGrad(dtable.data(), dy.data(), ids.data(), 3, 4, 2, keys.data(), nullptr),
            cudaSuccess);
  for (float v : dtable) EXPECT_TRUE(std::isnan(v));
}

// dropout: the CPU's Philox mask bit for bit, with step and sample offset
// from the host and (the CUDA-graph path, not yet run on a GPU) read from the
// executor's counters in device memory; samples of 15 elements, so the
// pieces start mid-group of four.
template <typename T>
void CheckDropout(DataType dtype, double p) {
  SCOPED_TRACE(testing::Message() << "dropout " << DataTypeName(dtype) << " p " << p);
  const int64_t N = 70, per_sample = 15, n = N * per_sample;
  const uint64_t seed = 99;
  const int64_t uid = 11, step = 7, sample_offset = 5;
  RunContext run;
  run.seed = seed;
  run.step = step;
  run.sample_offset = sample_offset;
  run.training = true;
  std::map<std::string, Tensor> env{{"x", Random(dtype, {N, per_sample}, 13, 2)}};
  const absl::Status s = RunOp(ParseOp("type: \"dropout\" input: \"x\" output: \"y\" uid: " + std::to_string(uid) +
                                       " attr { key: \"p\" value { f: " + std::to_string(p) + " } }"),
                               &env, run);
  ASSERT_TRUE(s.ok()) << s;
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const uint64_t key = MixKey(seed, static_cast<uint64_t>(uid));
  std::vector<T> host = emulation::Poisoned<T>(n), device = emulation::Poisoned<T>(n);
  cuda::DropoutCounters from_host;
  from_host.step = step;
  from_host.base = sample_offset * per_sample;
  from_host.per_sample = per_sample;
  ASSERT_EQ(cuda::LaunchDropout(host.data(), env["x"].data<T>(), n, key, from_host, p, scale, nullptr), cudaSuccess);
  const int64_t counters[2] = {step, sample_offset};
  cuda::DropoutCounters from_device;
  from_device.device = counters;
  from_device.step = 12345;  // ignored: the counters win
  from_device.base = 678;
  from_device.per_sample = per_sample;
  ASSERT_EQ(cuda::LaunchDropout(device.data(), env["x"].data<T>(), n, key, from_device, p, scale, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(emulation::SameBits(host, env["y"], "y (step from the host)"));
  EXPECT_TRUE(emulation::SameBits(device, env["y"], "y (counters in device memory)"));
  // A mask, not all or nothing.
  int64_t dropped = 0;
  for (T v : host) dropped += v == T(0);
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, n);
}

TEST(NnEmulation, DropoutIsTheCpuMask) {
  for (double p : {0.1, 0.5}) {
    CheckDropout<float>(F32, p);
    CheckDropout<double>(F64, p);
  }
}

}  // namespace
}  // namespace strata
