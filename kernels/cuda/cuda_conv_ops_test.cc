// The CUDA kernels of kernels/cuda/cuda_conv_ops.cc against the CPU kernels:
// max_pool2d, avg_pool2d and their grads; conv2d, conv2d_grad_input and
// conv2d_grad_filter. Tagged gpu: without a CUDA device every test FAILS
// (never skips).
//
// Bars: every pooling kernel does the CPU's IEEE operations in the CPU's
// order (the max scan, the window sums in row order, the divisions, and the
// backward sums from 0 in the order of the outputs), so all compare bit for
// bit, ties included, and NaN as NaN (BitEqualNaNAsNaN). The convolutions
// are sums of products that cuDNN and the CPU's im2col GEMM add in different
// orders (and either may fuse a product into an FMA): each output is a sum of K terms a_k b_k, so
// the bar is |gpu - cpu| <= tol * m + 1e-6, m the same op on |a|, |b| (the
// CPU kernel), tol 1e-5 in F32 and 1e-13 in F64. K here is at most 162 (the
// filter gradient of the first case): the worst-case bound of two orders,
// about 2 K u m, is 1.9e-5 m in F32 (u = 6e-8) and 3.6e-14 m in F64; the
// F32 tol is below that worst case but ~10x the typical sqrt(K) u error.
// BF16 and F16 (mixed precision's storage, float products and sums on both
// sides: cuDNN with compute type FLOAT, the CPU's float32 kernel on widened
// copies): within 2e-2 of the output's largest magnitude, the bf16
// bar, as cuda_matmul_ops_test's 16-bit GEMMs; one rounding of the output
// (2^-9 in bf16, 2^-12 in f16, relative) plus float sums is far inside it.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
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

STRATA_CUDA_OPS_TESTED(cuda_conv_ops_test, {
                                               {"max_pool2d", {F32, F64}},
                                               {"max_pool2d_grad", {F32, F64}},
                                               {"avg_pool2d", {F32, F64}},
                                               {"avg_pool2d_grad", {F32, F64}},
                                               {"conv2d", {F32, F64, BF16, F16}},
                                               {"conv2d_grad_input", {F32, F64, BF16, F16}},
                                               {"conv2d_grad_filter", {F32, F64, BF16, F16}},
                                           });

std::string Ints(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&s, i ? ", " : "", v[i]);
  return s;
}

// One pooling configuration.
struct Pool {
  std::vector<int64_t> kernel, strides, paddings;
  bool exclusive = false;
};

// The text of pooling op `type` (inputs "x" and "dy" as the op takes them,
// output "y"); input_size for avg_pool2d_grad.
std::string PoolText(const std::string& type, const Pool& p, const std::vector<int64_t>& input_size = {}) {
  std::string inputs = "input: \"x\"";
  if (type == "max_pool2d_grad") inputs = "input: [\"x\", \"dy\"]";
  if (type == "avg_pool2d_grad") inputs = "input: \"dy\"";
  std::string text = absl::StrCat("type: \"", type, "\" ", inputs, " output: \"y\"",
                                  " attr { key: \"kernel_size\" value { list { i: [", Ints(p.kernel), "] } } }",
                                  " attr { key: \"strides\" value { list { i: [", Ints(p.strides), "] } } }",
                                  " attr { key: \"paddings\" value { list { i: [", Ints(p.paddings), "] } } }");
  if (type == "avg_pool2d" || type == "avg_pool2d_grad") {
    absl::StrAppend(&text, " attr { key: \"exclusive\" value { b: ", p.exclusive ? "true" : "false", " } }");
  }
  if (!input_size.empty()) {
    absl::StrAppend(&text, " attr { key: \"input_size\" value { list { i: [", Ints(input_size), "] } } }");
  }
  return text;
}

// Same dtype, shape and bits, except that any NaN equals any NaN: arithmetic
// on a NaN gives the GPU's canonical NaN but keeps the operand's payload on
// x86 (the avg sums and the grads' sums of a NaN dy), so only NaN-ness can
// match there. Every other value, -0 included, must have the same bits.
::testing::AssertionResult BitEqualNaNAsNaN(const Tensor& gpu, const Tensor& cpu) {
  if (gpu.dtype() != cpu.dtype() || gpu.shape() != cpu.shape()) {
    return ::testing::AssertionFailure() << ShapeString(gpu.shape()) << " vs " << ShapeString(cpu.shape());
  }
  const std::vector<double> g = TensorValues(gpu), c = TensorValues(cpu);
  for (size_t i = 0; i < g.size(); ++i) {
    const bool same =
        (std::isnan(g[i]) && std::isnan(c[i])) || (g[i] == c[i] && std::signbit(g[i]) == std::signbit(c[i]));
    if (!same) return ::testing::AssertionFailure() << "element " << i << ": gpu " << g[i] << " cpu " << c[i];
  }
  return ::testing::AssertionSuccess();
}

// Pooled extent of `in` (the schema's rule, for building dy).
int64_t Pooled(int64_t in, int64_t k, int64_t s, int64_t p) { return (in + 2 * p - k) / s + 1; }

// x with ties (a few distinct values) and, when `nans`, a NaN every 7th element.
Tensor PoolInput(DataType dtype, const Shape& shape, uint32_t seed, bool nans) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v = Uniform(n, seed);
  for (int64_t i = 0; i < n; ++i) {
    if (i % 3 == 0) v[i] = std::round(v[i]);  // ties among -2, -1, 0, 1, 2
    if (nans && i % 7 == 3) v[i] = std::numeric_limits<double>::quiet_NaN();
  }
  return MakeTensor(dtype, shape, v);
}

struct Case {
  Shape x;
  Pool pool;
};

// Shapes: overlapping 3x3 windows with padding, the CPU's 2x2 stride-2 fast
// path with odd H and W, non-square windows and strides, exclusive and not,
// batch 1, one window per plane, and an empty batch.
std::vector<Case> Cases() {
  return {
      {{2, 3, 7, 9}, {{3, 3}, {2, 2}, {1, 1}, false}},
      {{2, 3, 7, 9}, {{3, 3}, {2, 2}, {1, 1}, true}},
      {{2, 2, 9, 11}, {{2, 2}, {2, 2}, {0, 0}, false}},
      {{1, 4, 8, 8}, {{2, 2}, {2, 2}, {0, 0}, true}},
      {{1, 2, 6, 7}, {{3, 2}, {2, 1}, {1, 1}, false}},
      {{3, 1, 5, 6}, {{3, 2}, {1, 2}, {1, 0}, true}},
      {{2, 2, 4, 4}, {{4, 4}, {1, 1}, {0, 0}, false}},
      {{1, 1, 5, 5}, {{1, 1}, {1, 1}, {0, 0}, false}},
      {{0, 3, 6, 6}, {{2, 2}, {2, 2}, {0, 0}, false}},
  };
}

TEST_F(CudaOpsTest, PoolsEqualTheCpuBitForBit) {
  for (DataType dtype : {F32, F64}) {
    uint32_t seed = 100;
    for (const Case& c : Cases()) {
      for (bool nans : {false, true}) {
        SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " x ", ShapeString(c.x), " k ", Ints(c.pool.kernel), " s ",
                                  Ints(c.pool.strides), " p ", Ints(c.pool.paddings), " excl ", c.pool.exclusive,
                                  " nans ", nans));
        const Pool& p = c.pool;
        const Tensor x = PoolInput(dtype, c.x, ++seed, nans);
        const Shape ys{c.x[0], c.x[1], Pooled(c.x[2], p.kernel[0], p.strides[0], p.paddings[0]),
                       Pooled(c.x[3], p.kernel[1], p.strides[1], p.paddings[1])};
        const Tensor dy = PoolInput(dtype, ys, ++seed, nans);
        {
          auto [cpu, gpu] = RunBoth(PoolText("max_pool2d", p), {{"x", x}});
          EXPECT_TRUE(BitEqualNaNAsNaN(gpu, cpu)) << "max_pool2d";
        }
        {
          auto [cpu, gpu] = RunBoth(PoolText("avg_pool2d", p), {{"x", x}});
          EXPECT_TRUE(BitEqualNaNAsNaN(gpu, cpu)) << "avg_pool2d";
        }
        {
          auto [cpu, gpu] = RunBoth(PoolText("max_pool2d_grad", p), {{"x", x}, {"dy", dy}});
          EXPECT_TRUE(BitEqualNaNAsNaN(gpu, cpu)) << "max_pool2d_grad";
        }
        {
          auto [cpu, gpu] = RunBoth(PoolText("avg_pool2d_grad", p, {c.x[2], c.x[3]}), {{"dy", dy}});
          EXPECT_TRUE(BitEqualNaNAsNaN(gpu, cpu)) << "avg_pool2d_grad";
        }
      }
    }
  }
}

// More than 65536 * 256 elements on both sides of the grads: the grid-stride
// loops wrap. F32 only (the loops do not depend on the dtype).
TEST_F(CudaOpsTest, PoolsLargerThanTheGridEqualTheCpu) {
  const Shape xs{1, 2, 2900, 2900};  // 16.82e6 > 16.78e6 elements
  const Pool p{{3, 3}, {2, 2}, {1, 1}, false};
  const Tensor x = PoolInput(F32, xs, 7, false);
  const int64_t ho = Pooled(2900, 3, 2, 1);
  const Tensor dy = PoolInput(F32, {1, 2, ho, ho}, 8, false);
  {
    auto [cpu, gpu] = RunBoth(PoolText("max_pool2d", p), {{"x", x}});
    EXPECT_TRUE(BitEqual(gpu, cpu));
  }
  {
    auto [cpu, gpu] = RunBoth(PoolText("max_pool2d_grad", p), {{"x", x}, {"dy", dy}});
    EXPECT_TRUE(BitEqual(gpu, cpu));
  }
  {
    auto [cpu, gpu] = RunBoth(PoolText("avg_pool2d_grad", p, {2900, 2900}), {{"dy", dy}});
    EXPECT_TRUE(BitEqual(gpu, cpu));
  }
  const Pool q{{1, 1}, {1, 1}, {0, 0}, false};  // output as large as the input
  auto [cpu, gpu] = RunBoth(PoolText("avg_pool2d", q), {{"x", x}});
  EXPECT_TRUE(BitEqual(gpu, cpu));
}

TEST_F(CudaOpsTest, PoolGradRunsAreBitIdentical) {
  const Pool p{{3, 3}, {1, 1}, {1, 1}, false};
  const Tensor x = PoolInput(F32, {4, 8, 32, 32}, 21, true);
  const Tensor dy = PoolInput(F32, {4, 8, 32, 32}, 22, false);
  for (const std::string& type : {std::string("max_pool2d_grad"), std::string("avg_pool2d_grad")}) {
    const bool avg = type == "avg_pool2d_grad";
    const std::string text = avg ? PoolText(type, p, {32, 32}) : PoolText(type, p);
    const std::map<std::string, Tensor> inputs =
        avg ? std::map<std::string, Tensor>{{"dy", dy}} : std::map<std::string, Tensor>{{"x", x}, {"dy", dy}};
    const Tensor a = RunGpu(text, inputs);
    const Tensor b = RunGpu(text, inputs);
    EXPECT_TRUE(BitEqual(a, b)) << type;
  }
}

// Past the shape function: a rank-3 x, a window larger than the padded input,
// a dy of the wrong shape, a rank-3 dy.
TEST_F(CudaOpsTest, PoolsRefuseAsTheCpu) {
  const Pool p{{3, 3}, {2, 2}, {1, 1}, false};
  const Pool big{{5, 5}, {1, 1}, {0, 0}, false};
  const Tensor x3 = MakeTensor(F32, {2, 5, 5}, Uniform(50, 31));
  const Tensor x = MakeTensor(F32, {1, 2, 5, 5}, Uniform(50, 32));
  const Tensor small = MakeTensor(F32, {1, 2, 3, 3}, Uniform(18, 33));
  const Tensor dy_bad = MakeTensor(F32, {1, 2, 2, 3}, Uniform(12, 34));
  const Tensor dy3 = MakeTensor(F32, {2, 3, 3}, Uniform(18, 35));
  struct Refusal {
    std::string text;
    std::vector<const Tensor*> inputs;
  };
  const std::vector<Refusal> refusals = {
      {PoolText("max_pool2d", p), {&x3}},
      {PoolText("avg_pool2d", p), {&x3}},
      {PoolText("max_pool2d", big), {&small}},
      {PoolText("avg_pool2d", big), {&small}},
      {PoolText("max_pool2d_grad", p), {&x, &dy_bad}},
      {PoolText("max_pool2d_grad", p), {&x3, &dy3}},
      {PoolText("avg_pool2d_grad", p, {5, 5}), {&dy_bad}},
      {PoolText("avg_pool2d_grad", p, {5, 5}), {&dy3}},
      {PoolText("avg_pool2d_grad", big, {3, 3}), {&dy_bad}},
  };
  for (const Refusal& r : refusals) {
    testing::ExpectSameRefusal(r.text, F32, r.inputs, gpu_);
  }
}


// ---------------------------------------------------------------- conv2d

// One convolution: x [N, C, H, W], w [O, C/groups, kh, kw] and its attrs.
struct Conv {
  Shape x, w;
  std::vector<int64_t> strides, paddings, dilations;
  int64_t groups = 1;
};

int64_t ConvOut(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

Shape ConvY(const Conv& c) {
  return {c.x[0], c.w[0], ConvOut(c.x[2], c.w[2], c.strides[0], c.paddings[0], c.dilations[0]),
          ConvOut(c.x[3], c.w[3], c.strides[1], c.paddings[1], c.dilations[1])};
}

// The text of conv op `type` (output "y").
std::string ConvText(const std::string& type, const Conv& c) {
  std::string inputs = "input: [\"x\", \"w\"]";
  if (type == "conv2d_grad_input") inputs = "input: [\"dy\", \"w\"]";
  if (type == "conv2d_grad_filter") inputs = "input: [\"x\", \"dy\"]";
  std::string text = absl::StrCat("type: \"", type, "\" ", inputs, " output: \"y\"",
                                  " attr { key: \"strides\" value { list { i: [", Ints(c.strides), "] } } }",
                                  " attr { key: \"paddings\" value { list { i: [", Ints(c.paddings), "] } } }",
                                  " attr { key: \"dilations\" value { list { i: [", Ints(c.dilations), "] } } }",
                                  " attr { key: \"groups\" value { i: ", c.groups, " } }");
  if (type == "conv2d_grad_input") {
    absl::StrAppend(&text, " attr { key: \"input_size\" value { list { i: [", c.x[2], ", ", c.x[3], "] } } }");
  }
  if (type == "conv2d_grad_filter") {
    absl::StrAppend(&text, " attr { key: \"filter_size\" value { list { i: [", c.w[2], ", ", c.w[3], "] } } }");
  }
  return text;
}


// Shapes: 3x3 with padding, stride 2, 1x1 at batch 1, dilation with groups,
// unequal strides and paddings, and an empty batch.
std::vector<Conv> ConvCases() {
  return {
      {{2, 3, 9, 9}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
      {{2, 4, 10, 11}, {6, 4, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
      {{1, 8, 7, 7}, {5, 8, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
      {{2, 4, 9, 9}, {4, 2, 3, 3}, {2, 2}, {1, 1}, {2, 2}, 2},
      {{3, 2, 8, 6}, {3, 2, 2, 3}, {1, 2}, {2, 0}, {1, 1}, 1},
      {{0, 3, 5, 5}, {2, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
  };
}

TEST_F(CudaOpsTest, ConvsAreWithinTheGemmBarOfTheCpu) {
  for (DataType dtype : {F32, F64}) {
    const double tol = dtype == F32 ? 1e-5 : 1e-13;
    uint32_t seed = 300;
    for (const Conv& c : ConvCases()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " x ", ShapeString(c.x), " w ", ShapeString(c.w), " s ",
                                Ints(c.strides), " p ", Ints(c.paddings), " d ", Ints(c.dilations), " g ", c.groups));
      const Tensor x = testing::RandomTensor(dtype, c.x, ++seed);
      const Tensor w = testing::RandomTensor(dtype, c.w, ++seed);
      const Tensor dy = testing::RandomTensor(dtype, ConvY(c), ++seed);
      struct Pass {
        std::string type;
        std::string a_name, b_name;
        const Tensor *a, *b;
      };
      for (const Pass& pass : {Pass{"conv2d", "x", "w", &x, &w}, Pass{"conv2d_grad_input", "dy", "w", &dy, &w},
                               Pass{"conv2d_grad_filter", "x", "dy", &x, &dy}}) {
        SCOPED_TRACE(pass.type);
        const std::string text = ConvText(pass.type, c);
        auto [cpu, gpu] = RunBoth(text, {{pass.a_name, *pass.a}, {pass.b_name, *pass.b}});
        const Tensor abs_a = testing::AbsF64(*pass.a), abs_b = testing::AbsF64(*pass.b);
        const absl::StatusOr<Tensor> magnitude = RunKernel(ParseOp(text), F64, {&abs_a, &abs_b}, RunContext());
        ASSERT_TRUE(magnitude.ok()) << magnitude.status();
        EXPECT_TRUE(testing::WithinErrorBound(gpu, cpu, *magnitude, tol));
      }
    }
  }
}

// Every case of ConvCases in BF16 and F16, each pass, against the CPU's
// widened kernel: within 2e-2 of the largest |cpu| (the bf16 bar).
TEST_F(CudaOpsTest, ConvsInBf16AndF16MatchTheCpu) {
  for (DataType half : {BF16, F16}) {
    uint32_t seed = 700;
    for (const Conv& c : ConvCases()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(half), " x ", ShapeString(c.x), " w ", ShapeString(c.w), " s ",
                                Ints(c.strides), " p ", Ints(c.paddings), " d ", Ints(c.dilations), " g ", c.groups));
      const Tensor x = MakeTensor(half, c.x, Uniform(NumElements(c.x), ++seed));
      const Tensor w = MakeTensor(half, c.w, Uniform(NumElements(c.w), ++seed));
      const Shape ys = ConvY(c);
      const Tensor dy = MakeTensor(half, ys, Uniform(NumElements(ys), ++seed));
      struct Pass {
        std::string type;
        std::string a_name, b_name;
        const Tensor *a, *b;
      };
      for (const Pass& pass : {Pass{"conv2d", "x", "w", &x, &w}, Pass{"conv2d_grad_input", "dy", "w", &dy, &w},
                               Pass{"conv2d_grad_filter", "x", "dy", &x, &dy}}) {
        SCOPED_TRACE(pass.type);
        auto [cpu, gpu] = RunBoth(ConvText(pass.type, c), {{pass.a_name, *pass.a}, {pass.b_name, *pass.b}});
        ASSERT_EQ(gpu.dtype(), half);
        ASSERT_EQ(cpu.dtype(), half);
        ASSERT_EQ(gpu.shape(), cpu.shape());
        const std::vector<double> got = TensorValues(gpu), want = TensorValues(cpu);
        double largest = 0;
        for (double v : want) largest = std::max(largest, std::abs(v));
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-2 * largest) << "element " << i;
        if (NumElements(cpu.shape()) > 0 && pass.a->num_elements() > 0) {  // not zeros
          EXPECT_GT(largest, 0.0);
        }
      }
    }
  }
}

// The deterministic algorithms, in float32 and in the 16-bit types.
TEST_F(CudaOpsTest, ConvRunsAreBitIdentical) {
  const Conv c{{4, 16, 20, 20}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1};
  for (DataType dtype : {F32, BF16, F16}) {
    const Tensor x = MakeTensor(dtype, c.x, Uniform(NumElements(c.x), 41));
    const Tensor w = MakeTensor(dtype, c.w, Uniform(NumElements(c.w), 42));
    const Tensor dy = MakeTensor(dtype, ConvY(c), Uniform(NumElements(ConvY(c)), 43));
    const std::vector<std::pair<std::string, std::map<std::string, Tensor>>> passes = {
        {"conv2d", {{"x", x}, {"w", w}}},
        {"conv2d_grad_input", {{"dy", dy}, {"w", w}}},
        {"conv2d_grad_filter", {{"x", x}, {"dy", dy}}},
    };
    for (const auto& [type, inputs] : passes) {
      const Tensor a = RunGpu(ConvText(type, c), inputs);
      const Tensor b = RunGpu(ConvText(type, c), inputs);
      EXPECT_TRUE(BitEqual(a, b)) << DataTypeName(dtype) << " " << type;
    }
  }
}

// Past the shape function: rank-3 x, channels that do not match the filter,
// a dy of the wrong shape, channels not divisible by groups.
TEST_F(CudaOpsTest, ConvsRefuseAsTheCpu) {
  const Conv c{{1, 4, 6, 6}, {2, 4, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1};
  Conv grouped = c;
  grouped.groups = 3;
  const Tensor x = MakeTensor(F32, {1, 4, 6, 6}, Uniform(144, 51));
  const Tensor x3 = MakeTensor(F32, {4, 6, 6}, Uniform(144, 52));
  const Tensor x_bad_c = MakeTensor(F32, {1, 3, 6, 6}, Uniform(108, 53));
  const Tensor w = MakeTensor(F32, {2, 4, 3, 3}, Uniform(72, 54));
  const Tensor dy = MakeTensor(F32, {1, 2, 4, 4}, Uniform(32, 55));
  const Tensor dy_bad = MakeTensor(F32, {1, 2, 3, 4}, Uniform(24, 56));
  struct Refusal {
    std::string text;
    std::vector<const Tensor*> inputs;
  };
  const std::vector<Refusal> refusals = {
      {ConvText("conv2d", c), {&x3, &w}},
      {ConvText("conv2d", c), {&x_bad_c, &w}},
      {ConvText("conv2d_grad_input", c), {&dy_bad, &w}},
      {ConvText("conv2d_grad_input", c), {&x3, &w}},
      {ConvText("conv2d_grad_filter", c), {&x, &dy_bad}},
      {ConvText("conv2d_grad_filter", grouped), {&x, &dy}},
  };
  for (const Refusal& r : refusals) {
    testing::ExpectSameRefusal(r.text, F32, r.inputs, gpu_);
  }
}

}  // namespace
}  // namespace strata
