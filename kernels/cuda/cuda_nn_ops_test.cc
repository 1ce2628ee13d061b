// The CUDA kernels of the nn ops (kernels/cuda/cuda_nn_ops.cc) against the
// CPU kernels: softmax, log_softmax and their grads, layer_norm(_grad),
// dropout(_grad), embedding(_grad). Tagged gpu: without a CUDA device every
// test FAILS (never skips).
//
// Bars: layer_norm(_grad), dropout and embedding(_grad) do the CPU's IEEE
// operations in the CPU's order, so they compare bit for bit. The softmax
// family differs in two places only, each bounded below: exp (CUDA's expf is
// within 2 ulp and exp within 1, glibc's within 1: at most 3 ulp apart), and
// the order of its double sums (a fixed tree on the GPU, index order on the
// CPU: each within (K - 1) * 2^-53 of the exact sum of the same terms).

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_op_test_util.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

using testing::BitEqual;
using testing::CudaOpsTest;
using testing::RunKernel;
using testing::Uniform;

STRATA_CUDA_OPS_TESTED(cuda_nn_ops_test, {
                                             {"softmax", {F32, F64}},
                                             {"log_softmax", {F32, F64}},
                                             {"softmax_grad", {F32, F64}},
                                             {"log_softmax_grad", {F32, F64}},
                                             {"layer_norm", {F32, F64}},
                                             {"layer_norm_grad", {F32, F64}},
                                             {"dropout", {F32, F64}},
                                             {"dropout_grad", {F32, F64}},
                                             {"embedding", {F32, F64}},
                                             {"embedding_grad", {F32, F64}},
                                         });

constexpr double kDoubleUnit = 0x1p-53;  // unit roundoff of the double sums

// eps of T: the spacing of [1, 2), so ulp(x) <= Eps * |x|.
double Eps(DataType dtype) { return dtype == F32 ? 0x1p-23 : 0x1p-52; }

// Every |gpu - cpu| <= bar[i] (same dtype and shape).
::testing::AssertionResult WithinBars(const Tensor& gpu, const Tensor& cpu, const std::vector<double>& bar) {
  if (gpu.dtype() != cpu.dtype() || gpu.shape() != cpu.shape()) {
    return ::testing::AssertionFailure() << TypeOf(gpu).ToString() << " vs " << TypeOf(cpu).ToString();
  }
  const std::vector<double> g = TensorValues(gpu), c = TensorValues(cpu);
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(std::abs(g[i] - c[i]) <= bar[i])) {
      return ::testing::AssertionFailure() << "element " << i << ": gpu " << g[i] << ", cpu " << c[i] << ", |diff| "
                                           << std::abs(g[i] - c[i]) << " > bar " << bar[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::string SoftmaxText(const std::string& type, int64_t axis) {
  const bool grad = type == "softmax_grad" || type == "log_softmax_grad";
  return absl::StrCat("type: \"", type, "\" input: ", grad ? "[\"y\", \"dy\"]" : "\"x\"",
                      " output: \"out\" attr { key: \"axis\" value { i: ", axis, " } }");
}

// [M, K, N] of `shape` along `axis` (already normalized).
void Dims(const Shape& shape, int axis, int64_t* M, int64_t* K, int64_t* N) {
  *M = *N = 1;
  for (int d = 0; d < axis; ++d) *M *= shape[d];
  *K = shape[axis];
  for (size_t d = axis + 1; d < shape.size(); ++d) *N *= shape[d];
}

// Per lane (m, n), f(index of each element of the lane, the lane's K).
template <typename F>
void ForEachLane(const Shape& shape, int axis, const F& f) {
  int64_t M, K, N;
  Dims(shape, axis, &M, &K, &N);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      std::vector<int64_t> idx(K);
      for (int64_t k = 0; k < K; ++k) idx[k] = (m * K + k) * N + n;
      f(idx, K);
    }
  }
}

struct SoftmaxCase {
  Shape shape;
  int64_t axis;
};

std::vector<SoftmaxCase> SoftmaxCases() {
  return {{{0, 5}, -1},      {{7}, 0},         {{3, 1000}, 1},   {{2, 5, 3}, 1},
          {{4, 6}, 0},       {{4, 50257}, -1}, {{70000, 8}, -1},  // more lanes than blocks: the grid-stride loop
          {{3, 300, 70}, -2}};
}

TEST_F(CudaOpsTest, SoftmaxAndLogSoftmaxAreWithinTheirExpAndSumBounds) {
  for (DataType dtype : {F32, F64}) {
    const double eps = Eps(dtype);
    for (const SoftmaxCase& c : SoftmaxCases()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), ShapeString(c.shape), " axis ", c.axis));
      const int axis = c.axis < 0 ? c.axis + static_cast<int>(c.shape.size()) : static_cast<int>(c.axis);
      const Tensor x = MakeTensor(dtype, c.shape, Uniform(NumElements(c.shape), 7));
      auto sm = RunBothNamed(SoftmaxText("softmax", c.axis), {{"x", x}}, {"out"});
      auto lsm = RunBothNamed(SoftmaxText("log_softmax", c.axis), {{"x", x}}, {"out"});
      ASSERT_EQ(sm.size(), 1u);
      ASSERT_EQ(lsm.size(), 1u);
      const std::vector<double> y = TensorValues(sm[0].first), ly = TensorValues(lsm[0].first);
      std::vector<double> bar(y.size()), log_bar(y.size());
      ForEachLane(c.shape, axis, [&](const std::vector<int64_t>& idx, int64_t K) {
        // softmax: e = exp(x - max) 3 eps apart; the double sums (2 K + 2) u apart with the
        // division; inv rounded to T (eps / 2 each side); e * inv rounded (eps / 2 each side).
        const double rel = 8 * eps + (2.0 * K + 2) * kDoubleUnit;
        // log_softmax: log(sum) moves by the sums' relative gap (3 eps + 2 K u), plus each
        // side's double log (1 ulp) and roundings to T of log_sum and the output, both at
        // most |out| (out = (x - max) - log_sum with both terms <= 0).
        const double abs_log = 4 * eps + (2.0 * K + 4) * kDoubleUnit;
        for (int64_t i : idx) {
          bar[i] = rel * std::abs(y[i]);
          log_bar[i] = abs_log * (1 + std::abs(ly[i]));
        }
      });
      EXPECT_TRUE(WithinBars(sm[0].second, sm[0].first, bar));
      EXPECT_TRUE(WithinBars(lsm[0].second, lsm[0].first, log_bar));
    }
  }
}

TEST_F(CudaOpsTest, SoftmaxGradsAreWithinTheirSumBounds) {
  for (DataType dtype : {F32, F64}) {
    const double eps = Eps(dtype);
    for (const SoftmaxCase& c : SoftmaxCases()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), ShapeString(c.shape), " axis ", c.axis));
      const int axis = c.axis < 0 ? c.axis + static_cast<int>(c.shape.size()) : static_cast<int>(c.axis);
      const int64_t n = NumElements(c.shape);
      const Tensor x = MakeTensor(dtype, c.shape, Uniform(n, 8));
      const Tensor dy = MakeTensor(dtype, c.shape, Uniform(n, 9));
      std::map<std::string, Tensor> env{{"x", x}};
      ASSERT_TRUE(RunOp(ParseOp(SoftmaxText("softmax", c.axis)), &env).ok());
      const Tensor y = env.at("out");
      env = {{"x", x}};
      ASSERT_TRUE(RunOp(ParseOp(SoftmaxText("log_softmax", c.axis)), &env).ok());
      const Tensor ly = env.at("out");
      auto g = RunBothNamed(SoftmaxText("softmax_grad", c.axis), {{"y", y}, {"dy", dy}}, {"out"});
      auto lg = RunBothNamed(SoftmaxText("log_softmax_grad", c.axis), {{"y", ly}, {"dy", dy}}, {"out"});
      ASSERT_EQ(g.size(), 1u);
      ASSERT_EQ(lg.size(), 1u);
      const std::vector<double> yv = TensorValues(y), lyv = TensorValues(ly), dyv = TensorValues(dy);
      const std::vector<double> gc = TensorValues(g[0].first), lgc = TensorValues(lg[0].first);
      std::vector<double> bar(n), log_bar(n);
      ForEachLane(c.shape, axis, [&](const std::vector<int64_t>& idx, int64_t K) {
        double s_dot = 0, s_dy = 0;  // sum |y dy| and sum |dy|: the scale of each sum's error
        for (int64_t i : idx) {
          s_dot += std::abs(yv[i] * dyv[i]);
          s_dy += std::abs(dyv[i]);
        }
        for (int64_t i : idx) {
          // softmax_grad: the dots differ by <= 2 K u S; rounded to T (eps S), dy - d rounded
          // (eps |dy - d| <= eps (|dy| + S)), times y rounded (eps |out|); doubled for slack
          // in each |x| <= |fl(x)| step.
          bar[i] = std::abs(yv[i]) * ((2.0 * K * kDoubleUnit + 2 * eps) * s_dot + 2 * eps * std::abs(dyv[i])) +
                   2 * eps * std::abs(gc[i]);
          // log_softmax_grad: the totals differ by <= 2 K u S + eps S after rounding; exp(y) is
          // 3 eps apart, e * t rounded (eps each side), the difference rounded (eps |out|).
          const double e = std::exp(lyv[i]);
          log_bar[i] = e * (2.0 * K * kDoubleUnit + 6 * eps) * s_dy + 2 * eps * std::abs(lgc[i]);
        }
      });
      EXPECT_TRUE(WithinBars(g[0].second, g[0].first, bar));
      EXPECT_TRUE(WithinBars(lg[0].second, lg[0].first, log_bar));
    }
  }
}

TEST_F(CudaOpsTest, SoftmaxFamilyRunsAreBitIdenticalAndRefuseAsTheCpu) {
  const Tensor x = MakeTensor(F32, {4, 50257}, Uniform(4 * 50257, 10));
  for (const char* type : {"softmax", "log_softmax"}) {
    const Tensor a = RunGpu(SoftmaxText(type, -1), {{"x", x}}, "out");
    const Tensor b = RunGpu(SoftmaxText(type, -1), {{"x", x}}, "out");
    EXPECT_TRUE(BitEqual(a, b)) << type;
  }
  // Past the shape function: an axis out of range, a scalar, mismatched dy.
  const Tensor x2 = MakeTensor(F32, {2, 3}, Uniform(6, 11));
  const Tensor scalar = MakeTensor(F32, {}, {1.0});
  const Tensor dy_bad = MakeTensor(F32, {3, 2}, Uniform(6, 12));
  struct Refusal {
    std::string text;
    std::vector<const Tensor*> inputs;
  };
  const std::vector<Refusal> refusals = {
      {SoftmaxText("softmax", 2), {&x2}},
      {SoftmaxText("log_softmax", 0), {&scalar}},
      {SoftmaxText("softmax_grad", -1), {&x2, &dy_bad}},
      {SoftmaxText("log_softmax_grad", -1), {&x2, &dy_bad}},
  };
  for (const Refusal& r : refusals) {
    testing::ExpectSameRefusal(r.text, F32, r.inputs, gpu_);
  }
}

constexpr char kLayerNorm[] = R"pb(type: "layer_norm"
                                   input: [ "x", "gamma", "beta" ]
                                   output: "y"
                                   attr {
                                     key: "epsilon"
                                     value { f: 1e-5 }
                                   })pb";
constexpr char kLayerNormGrad[] = R"pb(type: "layer_norm_grad"
                                       input: [ "x", "gamma", "dy" ]
                                       output: [ "dx", "dgamma", "dbeta" ]
                                       attr {
                                         key: "epsilon"
                                         value { f: 1e-5 }
                                       })pb";

// Eight threads per row add the CPU's eight lanes in its order: every double,
// hence every output, is the CPU's.
TEST_F(CudaOpsTest, LayerNormAndItsGradientEqualTheCpuBitForBit) {
  const std::vector<Shape> shapes = {
      {0, 5}, {7},    {2, 3, 37},          {5, 768}, {33, 1001}, {300, 64}, {129, 3},
      {1, 8}, {4, 1}, {65536 * 32 + 77, 3}};  // more row groups than blocks: the grid-stride loop
  for (DataType dtype : {F32, F64}) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), ShapeString(shape)));
      const int64_t n = NumElements(shape), d = shape.back();
      std::vector<double> xv = Uniform(n, 13);
      for (double& v : xv) v = 3 * v + 1;  // off-centre, so the mean matters
      const Tensor x = MakeTensor(dtype, shape, xv);
      const Tensor gamma = MakeTensor(dtype, {d}, Uniform(d, 14));
      const Tensor beta = MakeTensor(dtype, {d}, Uniform(d, 15));
      const Tensor dy = MakeTensor(dtype, shape, Uniform(n, 16));
      auto y = RunBothNamed(kLayerNorm, {{"x", x}, {"gamma", gamma}, {"beta", beta}}, {"y"});
      ASSERT_EQ(y.size(), 1u);
      EXPECT_TRUE(BitEqual(y[0].second, y[0].first));
      auto g = RunBothNamed(kLayerNormGrad, {{"x", x}, {"gamma", gamma}, {"dy", dy}}, {"dx", "dgamma", "dbeta"});
      ASSERT_EQ(g.size(), 3u);
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(BitEqual(g[i].second, g[i].first)) << "output " << i;
    }
  }
}

// passes/fold_casts: layer_norm storing a 16-bit y is the F32 kernel then
// the cast, and layer_norm_grad reading a 16-bit dy is the F32 kernel on the
// widened dy, bit for bit on the GPU; and each equals the CPU's folded
// kernel bit for bit (the F32 kernels are the CPU's bits).
TEST_F(CudaOpsTest, LayerNormWithFoldedCastsIsTheCastsAroundTheFloatKernel) {
  for (DataType low : {BF16, F16}) {
    for (const Shape& shape : std::vector<Shape>{{5, 768}, {33, 1001}, {2, 3, 37}}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(low), ShapeString(shape)));
      const int64_t n = NumElements(shape), d = shape.back();
      std::vector<double> xv = Uniform(n, 19);
      for (double& v : xv) v = 3 * v + 1;
      const Tensor x = MakeTensor(F32, shape, xv);
      const Tensor gamma = MakeTensor(F32, {d}, Uniform(d, 20));
      const Tensor beta = MakeTensor(F32, {d}, Uniform(d, 21));
      const Tensor dy_low = MakeTensor(low, shape, Uniform(n, 22));
      const Tensor dy_wide = MakeTensor(F32, shape, TensorValues(dy_low));  // exact
      const std::string cast = absl::StrCat(R"(type: "cast" input: "x" output: "y" attr { key: "dtype" value { s: ")",
                                            DataTypeName(low), R"(" } })");
      const std::string folded_ln =
          absl::StrCat(kLayerNorm, R"( attr { key: "out_dtype" value { s: ")", DataTypeName(low), R"(" } })");
      const Tensor y_f32 = RunGpu(kLayerNorm, {{"x", x}, {"gamma", gamma}, {"beta", beta}});
      const Tensor want = RunGpu(cast, {{"x", y_f32}});
      auto y = RunBothNamed(folded_ln, {{"x", x}, {"gamma", gamma}, {"beta", beta}}, {"y"});
      ASSERT_EQ(y.size(), 1u);
      EXPECT_TRUE(BitEqual(y[0].second, want));
      EXPECT_TRUE(BitEqual(y[0].second, y[0].first));
      for (const char* out : {"dx", "dgamma", "dbeta"}) {
        const Tensor want_g = RunGpu(kLayerNormGrad, {{"x", x}, {"gamma", gamma}, {"dy", dy_wide}}, out);
        EXPECT_TRUE(BitEqual(RunGpu(kLayerNormGrad, {{"x", x}, {"gamma", gamma}, {"dy", dy_low}}, out), want_g)) << out;
      }
      auto g = RunBothNamed(kLayerNormGrad, {{"x", x}, {"gamma", gamma}, {"dy", dy_low}}, {"dx", "dgamma", "dbeta"});
      ASSERT_EQ(g.size(), 3u);
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(BitEqual(g[i].second, g[i].first)) << "output " << i;
      // With the residual connection's gradient (passes/fuse_epilogues): dx is
      // add_n(residual, dx) on the GPU, and the CPU's, bit for bit.
      std::string with_residual = kLayerNormGrad;
      with_residual.replace(with_residual.find("\"dy\" ]"), 6, "\"dy\", \"residual\" ]");
      const Tensor residual = MakeTensor(F32, shape, Uniform(n, 23));
      const std::string add_n = R"(type: "add_n" input: [ "a", "b" ] output: "y")";
      const Tensor want_dx = RunGpu(add_n, {{"a", residual}, {"b", RunGpu(kLayerNormGrad, {{"x", x}, {"gamma", gamma},
                                                                                          {"dy", dy_low}}, "dx")}});
      auto r = RunBothNamed(with_residual, {{"x", x}, {"gamma", gamma}, {"dy", dy_low}, {"residual", residual}},
                            {"dx", "dgamma", "dbeta"});
      ASSERT_EQ(r.size(), 3u);
      EXPECT_TRUE(BitEqual(r[0].second, want_dx));
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(BitEqual(r[i].second, r[i].first)) << "residual, output " << i;
      // dx also stored in 16 bits (out_dtype, dx_low; passes/fold_casts): the
      // cast of that dx on the GPU, and the CPU's, bit for bit; dx unchanged.
      std::string stored = with_residual;
      stored.replace(stored.find("\"dbeta\" ]"), 9, "\"dbeta\", \"dx_low\" ]");
      stored += absl::StrCat(R"( attr { key: "out_dtype" value { s: ")", DataTypeName(low), R"(" } })");
      auto l = RunBothNamed(stored, {{"x", x}, {"gamma", gamma}, {"dy", dy_low}, {"residual", residual}},
                            {"dx", "dgamma", "dbeta", "dx_low"});
      ASSERT_EQ(l.size(), 4u);
      EXPECT_TRUE(BitEqual(l[0].second, want_dx));
      EXPECT_TRUE(BitEqual(l[3].second, RunGpu(cast, {{"x", want_dx}})));
      for (int i = 0; i < 4; ++i) EXPECT_TRUE(BitEqual(l[i].second, l[i].first)) << "dx_low, output " << i;
    }
  }
}

TEST_F(CudaOpsTest, LayerNormGradRunsAreBitIdenticalAndItsScratchIsPlanned) {
  const Tensor x = MakeTensor(F32, {8192, 768}, Uniform(8192 * 768, 17));
  const Tensor gamma = MakeTensor(F32, {768}, Uniform(768, 18));
  const Tensor dy = MakeTensor(F32, {8192, 768}, Uniform(8192 * 768, 19));
  for (const char* out : {"dx", "dgamma"}) {
    const Tensor a = RunGpu(kLayerNormGrad, {{"x", x}, {"gamma", gamma}, {"dy", dy}}, out);
    const Tensor b = RunGpu(kLayerNormGrad, {{"x", x}, {"gamma", gamma}, {"dy", dy}}, out);
    EXPECT_TRUE(BitEqual(a, b)) << out;
  }
  const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace("layer_norm_grad", DEVICE_CUDA);
  ASSERT_NE(ws, nullptr);
  KernelDef def;
  def.input_types = {TensorType{F32, {8192, 768}}, TensorType{F32, {768}}, TensorType{F32, {8192, 768}}};
  const absl::StatusOr<int64_t> bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // Each row's mean and rstd, and 64 blocks of 128 rows' partial dgamma and dbeta.
  EXPECT_EQ(*bytes, (2 * 8192 + 64 * 2 * 768) * 8);
}

TEST_F(CudaOpsTest, LayerNormRefusesAsTheCpu) {
  const Tensor x = MakeTensor(F32, {2, 3}, Uniform(6, 20));
  const Tensor gamma_bad = MakeTensor(F32, {4}, Uniform(4, 21));
  const Tensor gamma = MakeTensor(F32, {3}, Uniform(3, 22));
  const Tensor dy_bad = MakeTensor(F32, {3, 2}, Uniform(6, 23));
  struct Refusal {
    const char* text;
    std::vector<const Tensor*> inputs;
  };
  for (const Refusal& r : std::vector<Refusal>{{kLayerNorm, {&x, &gamma_bad, &gamma}},
                                               {kLayerNorm, {&x, &gamma, &gamma_bad}},
                                               {kLayerNormGrad, {&x, &gamma_bad, &x}},
                                               {kLayerNormGrad, {&x, &gamma, &dy_bad}}}) {
    testing::ExpectSameRefusal(r.text, F32, r.inputs, gpu_);
  }
}

std::string DropoutText(const std::string& type, double p, int64_t uid) {
  return absl::StrCat("type: \"", type, "\" input: \"x\" output: \"y\" uid: ", uid, " attr { key: \"p\" value { f: ", p,
                      " } }");
}

// The op on the CPU and on the GPU under the same seed, step and sample offset.
std::pair<Tensor, Tensor> RunDropoutBoth(CudaDevice* device, const std::string& text, const Tensor& x,
                                         const RunContext& settings) {
  std::map<std::string, Tensor> cpu_env{{"x", x}}, gpu_env{{"x", *x.CopyTo(device)}};
  RunContext cpu = settings, gpu = settings;
  cpu.device = GetCpuDevice();
  cpu.random_counters = nullptr;  // the GPU's counters, when given, are in device memory: the CPU reads the fields
  gpu.device = device;
  const Op op = ParseOp(text);
  const absl::Status c = RunOp(op, &cpu_env, cpu), g = RunOp(op, &gpu_env, gpu);
  EXPECT_TRUE(c.ok()) << c;
  EXPECT_TRUE(g.ok()) << g;
  if (!c.ok() || !g.ok()) return {};
  Tensor host = gpu_env.at("y").Clone(GetCpuAllocator());
  EXPECT_TRUE(device->Synchronize().ok());
  return {cpu_env.at("y"), host};
}

// Dropout of ones is the mask times 1 / (1 - p): the GPU draws the CPU's bits.
TEST_F(CudaOpsTest, DropoutMasksEqualTheCpuBitForBit) {
  struct Draw {
    uint64_t seed;
    int64_t step, sample_offset;
    Shape shape;
    double p;
  };
  const std::vector<Draw> draws = {
      {0, 0, 0, {}, 0.5},
      {1, 0, 0, {0, 4}, 0.5},
      {42, 5, 0, {1000, 50}, 0.3},
      {42, 5, 3, {7, 13}, 0.3},
      {7, 123456, 17, {5, 3, 7}, 0.9},
      {99, 7, 5, {4, 3}, 0.5},
      {uint64_t{1} << 40, int64_t{1} << 33, int64_t{1} << 20, {3, 5}, 0.1},
      {5, 2, 1, {4 * 65536 * 256 + 13}, 0.25},  // more Philox blocks than threads: the grid-stride loop
  };
  for (DataType dtype : {F32, F64}) {
    for (const Draw& d : draws) {
      if (dtype == F64 && NumElements(d.shape) > 1000000) continue;  // the F32 case covers the grid stride
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), ShapeString(d.shape), " seed ", d.seed, " step ", d.step,
                                " offset ", d.sample_offset, " p ", d.p));
      RunContext run;
      run.seed = d.seed;
      run.step = d.step;
      run.sample_offset = d.sample_offset;
      run.training = true;
      const Tensor ones = MakeTensor(dtype, d.shape, std::vector<double>(NumElements(d.shape), 1.0));
      for (const char* type : {"dropout", "dropout_grad"}) {
        auto [cpu, gpu] = RunDropoutBoth(device_.get(), DropoutText(type, d.p, 11), ones, run);
        EXPECT_TRUE(BitEqual(gpu, cpu)) << type;
      }
      // And of random values: the same mask, the same scaling.
      const Tensor x = MakeTensor(dtype, d.shape, Uniform(NumElements(d.shape), 24));
      auto [cpu, gpu] = RunDropoutBoth(device_.get(), DropoutText("dropout", d.p, 12), x, run);
      EXPECT_TRUE(BitEqual(gpu, cpu));
    }
  }
}

// In a training step the executor hands {step, sample_offset} in device
// memory (RunContext::random_counters), which a CUDA graph replays with the
// current step's values: the kernel reads them there, not the RunContext's
// fields, and draws the CPU's bits for them.
TEST_F(CudaOpsTest, DropoutReadsTheCountersFromDeviceMemory) {
  const std::vector<std::pair<int64_t, int64_t>> counters = {{0, 0}, {5, 3}, {123456, 17}, {int64_t{1} << 33, 1 << 20}};
  for (const auto& [step, sample_offset] : counters) {
    SCOPED_TRACE(absl::StrCat("step ", step, " offset ", sample_offset));
    RunContext cpu;
    cpu.seed = 42;
    cpu.step = step;
    cpu.sample_offset = sample_offset;
    cpu.training = true;
    RunContext gpu = cpu;
    gpu.step = step + 1;  // stale values a captured launch would have frozen: must not be read
    gpu.sample_offset = sample_offset + 7;
    const Tensor on_host = MakeTensor(I64, {2}, {static_cast<double>(step), static_cast<double>(sample_offset)});
    absl::StatusOr<Tensor> on_device = on_host.CopyTo(device_.get());
    ASSERT_TRUE(on_device.ok()) << on_device.status();
    gpu.random_counters = on_device->data<int64_t>();
    const Tensor x = MakeTensor(F32, {7, 13}, Uniform(7 * 13, 25));
    auto [want, unused] = RunDropoutBoth(device_.get(), DropoutText("dropout", 0.3, 12), x, cpu);
    auto [stale, got] = RunDropoutBoth(device_.get(), DropoutText("dropout", 0.3, 12), x, gpu);
    EXPECT_TRUE(BitEqual(got, want));
    EXPECT_FALSE(BitEqual(stale, want));  // the CPU run of the stale fields draws another mask
  }
}

TEST_F(CudaOpsTest, DropoutInEvaluationOrWithPZeroSharesItsInput) {
  const Tensor x = MakeTensor(F32, {4, 5}, Uniform(20, 25));
  const Tensor on_gpu = *x.CopyTo(device_.get());
  for (bool training : {false, true}) {
    RunContext run = gpu_;
    run.training = training;
    std::map<std::string, Tensor> env{{"x", on_gpu}};
    ASSERT_TRUE(RunOp(ParseOp(DropoutText("dropout", training ? 0.0 : 0.5, 3)), &env, run).ok());
    EXPECT_EQ(env.at("y").raw_data(), on_gpu.raw_data()) << training;
  }
}

constexpr char kEmbedding[] = R"pb(type: "embedding"
                                   input: [ "ids", "table" ]
                                   output: "y")pb";

std::string EmbeddingGradText(int64_t vocab) {
  return absl::StrCat(R"pb(type: "embedding_grad"
                           input: [ "ids", "dy" ]
                           output: "y"
                           attr { key: "num_embeddings"
                                  value { i:)pb",
                      vocab, " } }");
}

// n ids in [0, V): a quarter one padding id, the rest skewed towards small ids
// (many repeats, as text has).
Tensor Ids(const Shape& shape, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> v(NumElements(shape));
  for (double& id : v) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    id = rng() % 4 == 0 ? static_cast<double>(V - 1) : std::floor(std::pow(u, 3) * (V - 1));
  }
  return MakeTensor(I64, shape, v);
}

TEST_F(CudaOpsTest, EmbeddingAndItsGradientEqualTheCpuBitForBit) {
  struct Case {
    Shape ids;
    int64_t V, D;
  };
  const std::vector<Case> cases = {
      {{0}, 5, 3},
      {{}, 7, 4},
      {{3, 4}, 10, 5},
      {{3000}, 1000, 17},
      {{5000}, 50257, 8},
      {{2, 2048}, 64, 33},      // one sort tile, then more than one
      {{8, 1024}, 50257, 768},  // GPT-2: vocab 50257, 8192 positions
      {{8192}, 300, 2100},      // y has more elements than threads: the grid-stride loop
  };
  for (DataType dtype : {F32, F64}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ids ", ShapeString(c.ids), " V ", c.V, " D ", c.D));
      const Tensor ids = Ids(c.ids, c.V, 26);
      const Tensor table = MakeTensor(dtype, {c.V, c.D}, Uniform(c.V * c.D, 27));
      Shape dy_shape = c.ids;
      dy_shape.push_back(c.D);
      const Tensor dy = MakeTensor(dtype, dy_shape, Uniform(NumElements(dy_shape), 28));
      auto [y_cpu, y_gpu] = RunBoth(kEmbedding, {{"ids", ids}, {"table", table}});
      EXPECT_TRUE(BitEqual(y_gpu, y_cpu));
      auto [g_cpu, g_gpu] = RunBoth(EmbeddingGradText(c.V), {{"ids", ids}, {"dy", dy}});
      EXPECT_TRUE(BitEqual(g_gpu, g_cpu));
    }
  }
}

TEST_F(CudaOpsTest, EmbeddingGradRunsAreBitIdenticalAndItsScratchIsPlanned) {
  const Tensor ids = Ids({8, 1024}, 50257, 29);
  const Tensor dy = MakeTensor(F32, {8, 1024, 64}, Uniform(8192 * 64, 30));
  const Tensor a = RunGpu(EmbeddingGradText(50257), {{"ids", ids}, {"dy", dy}});
  const Tensor b = RunGpu(EmbeddingGradText(50257), {{"ids", ids}, {"dy", dy}});
  EXPECT_TRUE(BitEqual(a, b));
  const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace("embedding_grad", DEVICE_CUDA);
  ASSERT_NE(ws, nullptr);
  KernelDef def;
  def.input_types = {TensorType{I64, {8, 1000}}, TensorType{F32, {8, 1000, 64}}};
  const absl::StatusOr<int64_t> bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 8192 * 8);  // the sort keys: 8000 rounded up to a power of two
}

// The CPU refuses an id outside [0, V) before computing; the GPU does not read
// the ids on the host: embedding's row for it is NaN, embedding_grad's whole
// dtable is NaN (kernels/cuda/nn.h). Shape and dtype refusals are the CPU's.
TEST_F(CudaOpsTest, EmbeddingIdsOutOfRangeGiveNaNAndShapesRefuseAsTheCpu) {
  for (int64_t bad : {int64_t{-1}, int64_t{10}}) {
    SCOPED_TRACE(bad);
    const Tensor ids = MakeTensor(I64, {3}, {1.0, static_cast<double>(bad), 2.0});
    const Tensor table = MakeTensor(F32, {10, 4}, Uniform(40, 31));
    std::map<std::string, Tensor> cpu_env{{"ids", ids}, {"table", table}};
    EXPECT_FALSE(RunOp(ParseOp(kEmbedding), &cpu_env).ok());
    const Tensor y = RunGpu(kEmbedding, {{"ids", ids}, {"table", table}});
    const std::vector<double> v = TensorValues(y), t = TensorValues(table);
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(v[j], t[4 + j]);
      EXPECT_TRUE(std::isnan(v[4 + j]));
      EXPECT_EQ(v[8 + j], t[8 + j]);
    }
    const Tensor dy = MakeTensor(F32, {3, 4}, Uniform(12, 32));
    const Tensor dtable = RunGpu(EmbeddingGradText(10), {{"ids", ids}, {"dy", dy}});
    for (double x : TensorValues(dtable)) EXPECT_TRUE(std::isnan(x));
  }
  const Tensor ids = MakeTensor(I64, {3}, {1.0, 2.0, 3.0});
  const Tensor ids_f32 = MakeTensor(F32, {3}, {1.0, 2.0, 3.0});
  const Tensor table = MakeTensor(F32, {10, 4}, Uniform(40, 33));
  const Tensor table_1d = MakeTensor(F32, {10}, Uniform(10, 34));
  const Tensor dy_bad = MakeTensor(F32, {4, 4}, Uniform(16, 35));
  const Tensor dy = MakeTensor(F32, {3, 4}, Uniform(12, 36));
  struct Refusal {
    std::string text;
    std::vector<const Tensor*> inputs;
  };
  for (const Refusal& r : std::vector<Refusal>{{kEmbedding, {&ids, &table_1d}},
                                               {kEmbedding, {&ids_f32, &table}},
                                               {EmbeddingGradText(10), {&ids, &dy_bad}},
                                               {EmbeddingGradText(10), {&ids_f32, &dy}}}) {
    testing::ExpectSameRefusal(r.text, F32, r.inputs, gpu_);
  }
}

}  // namespace
}  // namespace strata
