// The CUDA kernels of the pooling ops (kernels/cuda/cuda_conv_ops.cc) against
// the CPU kernels: max_pool2d, avg_pool2d and their grads. Tagged gpu: without
// a CUDA device every test FAILS (never skips).
//
// Bars: every pooling kernel does the CPU's IEEE operations in the CPU's
// order (the max scan, the window sums in row order, the divisions, and the
// backward sums from 0 in the order of the outputs), so all compare bit for
// bit, NaN and ties included.

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
          EXPECT_TRUE(BitEqual(gpu, cpu)) << "max_pool2d";
        }
        {
          auto [cpu, gpu] = RunBoth(PoolText("avg_pool2d", p), {{"x", x}});
          EXPECT_TRUE(BitEqual(gpu, cpu)) << "avg_pool2d";
        }
        {
          auto [cpu, gpu] = RunBoth(PoolText("max_pool2d_grad", p), {{"x", x}, {"dy", dy}});
          EXPECT_TRUE(BitEqual(gpu, cpu)) << "max_pool2d_grad";
        }
        {
          auto [cpu, gpu] = RunBoth(PoolText("avg_pool2d_grad", p, {c.x[2], c.x[3]}), {{"dy", dy}});
          EXPECT_TRUE(BitEqual(gpu, cpu)) << "avg_pool2d_grad";
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
    SCOPED_TRACE(r.text);
    const Op op = ParseOp(r.text);
    RunContext cpu;
    const absl::StatusOr<Tensor> on_cpu = RunKernel(op, F32, r.inputs, cpu);
    std::vector<Tensor> on_device;
    for (const Tensor* t : r.inputs) on_device.push_back(*t->CopyTo(device_.get()));
    std::vector<const Tensor*> device_inputs;
    for (const Tensor& t : on_device) device_inputs.push_back(&t);
    const absl::StatusOr<Tensor> on_gpu = RunKernel(op, F32, device_inputs, gpu_);
    ASSERT_FALSE(on_cpu.ok());
    ASSERT_FALSE(on_gpu.ok());
    EXPECT_EQ(on_gpu.status(), on_cpu.status());
  }
}

}  // namespace
}  // namespace strata
