// The registered CUDA kernels (kernels/cuda/cuda_ops.cc) against the CPU
// kernels, each run the way the executor runs it: the kernel registry by
// (op, device kind, dtype), the op's shape function, a KernelContext whose
// device is a CudaDevice, outputs from its caching allocator. Tagged gpu:
// without a CUDA device every test FAILS (never skips).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = CudaDevice::Create(0);
    ASSERT_TRUE(device.ok()) << device.status()
                             << ". This test is tagged gpu: filter it out with --test_tag_filters=-gpu, or run "
                                "it on a GPU machine (kernels/cuda/README.md).";
    device_ = *std::move(device);
    gpu_.device = device_.get();
  }

  // Runs `op` on the CPU and on the GPU from the same host inputs; returns
  // (cpu, gpu) outputs "y", the GPU's copied back to the host.
  std::pair<Tensor, Tensor> RunBoth(const std::string& op_text, const std::map<std::string, Tensor>& inputs) {
    std::map<std::string, Tensor> cpu_env = inputs, gpu_env;
    for (const auto& [name, t] : inputs) {
      absl::StatusOr<Tensor> on_gpu = t.CopyTo(device_.get());
      EXPECT_TRUE(on_gpu.ok()) << on_gpu.status();
      gpu_env[name] = on_gpu.ok() ? *on_gpu : Tensor();
    }
    const Op op = ParseOp(op_text);
    const absl::Status cpu = RunOp(op, &cpu_env);
    const absl::Status gpu = RunOp(op, &gpu_env, gpu_);
    EXPECT_TRUE(cpu.ok()) << op_text << ": " << cpu;
    EXPECT_TRUE(gpu.ok()) << op_text << ": " << gpu;
    if (!cpu.ok() || !gpu.ok()) return {};
    EXPECT_EQ(gpu_env.at("y").device(), device_.get()) << "the output lives on the GPU";
    EXPECT_TRUE(device_->Synchronize().ok());
    return {cpu_env.at("y"), gpu_env.at("y").Clone(GetCpuAllocator())};
  }

  std::unique_ptr<CudaDevice> device_;
  RunContext gpu_;
};

// Runs the registered kernel for (op, run's device kind, dtype) on `inputs`
// directly, past the op's shape function: what a kernel does with operands
// the compiler would have refused, or a dtype the schema does not take yet.
absl::StatusOr<Tensor> RunKernel(const Op& op, DataType dtype, const std::vector<const Tensor*>& inputs,
                                 const RunContext& run) {
  const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), run.device->kind(), dtype);
  if (factory == nullptr) return absl::NotFoundError(absl::StrCat("no kernel for ", op.type()));
  KernelDef def;
  def.op = &op;
  auto kernel = (*factory)(def);
  if (!kernel.ok()) return kernel.status();
  std::vector<Tensor> outputs(1);
  KernelContext ctx(&run, inputs, absl::MakeSpan(outputs));
  if (absl::Status s = (*kernel)->Compute(ctx); !s.ok()) return s;
  return outputs[0];
}

std::vector<double> Uniform(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

TEST_F(CudaOpsTest, EveryRegisteredCudaKernelIsHere) {
  // The ops this file covers; a kernel registered without a test here fails.
  for (const char* op : {"relu", "relu_grad", "matmul"}) {
    EXPECT_FALSE(KernelRegistry::Global().DtypesFor(op, DEVICE_CUDA).empty()) << op;
  }
  EXPECT_EQ(KernelRegistry::Global().DtypesFor("matmul", DEVICE_CUDA), (std::vector<DataType>{F32, F64, BF16}));
  EXPECT_EQ(KernelRegistry::Global().Find("softmax", DEVICE_CUDA, F32), nullptr);
}

TEST_F(CudaOpsTest, ReluAndItsGradientEqualTheCpuBitForBit) {
  for (DataType dtype : {F32, F64}) {
    SCOPED_TRACE(DataTypeName(dtype));
    const Tensor x = MakeTensor(dtype, {37, 29}, Uniform(37 * 29, 1));
    const Tensor dy = MakeTensor(dtype, {37, 29}, Uniform(37 * 29, 2));
    auto [y_cpu, y_gpu] = RunBoth(R"pb(type: "relu" input: "x" output: "y")pb", {{"x", x}});
    EXPECT_TENSOR_NEAR(y_gpu, y_cpu, 0);
    auto [dx_cpu, dx_gpu] =
        RunBoth(R"pb(type: "relu_grad" input: [ "r", "dy" ] output: "y")pb", {{"r", y_cpu}, {"dy", dy}});
    EXPECT_TENSOR_NEAR(dx_gpu, dx_cpu, 0);
  }
}

// sum_k |op(a)_ik| |op(b)_kj| for each output element: |a| @ |b| on the CPU
// in F64, through the CPU matmul kernel itself.
Tensor AbsProduct(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  auto abs64 = [](const Tensor& t) {
    std::vector<double> v = TensorValues(t);
    for (double& x : v) x = std::abs(x);
    return MakeTensor(F64, t.shape(), v);
  };
  const Tensor aa = abs64(a), ab = abs64(b);
  Op op = ParseOp(R"pb(type: "matmul" input: [ "a", "b" ] output: "y")pb");
  AttrValue ta, tb;
  ta.set_b(transpose_a);
  tb.set_b(transpose_b);
  (*op.mutable_attr())["transpose_a"] = ta;
  (*op.mutable_attr())["transpose_b"] = tb;
  const absl::StatusOr<Tensor> y = RunKernel(op, F64, {&aa, &ab}, RunContext());
  EXPECT_TRUE(y.ok()) << y.status();
  return y.ok() ? *y : Tensor();
}

struct MatmulCase {
  Shape a, b;
  bool transpose_a, transpose_b;
};

// Every path of the kernel: 2-D, x @ W with a batched x folded into one GEMM,
// a batched transposed x with a shared W, and batched a with batched b.
TEST_F(CudaOpsTest, MatmulMatchesTheCpuOnEveryPath) {
  const MatmulCase cases[] = {
      {{33, 17}, {17, 9}, false, false},     {{33, 17}, {9, 17}, false, true},
      {{17, 33}, {17, 9}, true, false},      {{4, 6, 33, 17}, {17, 9}, false, false},
      {{4, 17, 33}, {17, 9}, true, false},   {{4, 33, 17}, {4, 9, 17}, false, true},
      {{3, 17, 33}, {3, 17, 9}, true, false}, {{128, 768}, {768, 256}, false, false},
  };
  for (DataType dtype : {F32, F64}) {
    for (const MatmulCase& c : cases) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " a", ShapeString(c.a), " b", ShapeString(c.b), " ta=",
                                c.transpose_a, " tb=", c.transpose_b));
      const Tensor a = MakeTensor(dtype, c.a, Uniform(NumElements(c.a), 3));
      const Tensor b = MakeTensor(dtype, c.b, Uniform(NumElements(c.b), 4));
      const std::string op = absl::StrCat(
          R"pb(type: "matmul" input: [ "a", "b" ] output: "y" attr { key: "transpose_a" value { b: )pb",
          c.transpose_a ? "true" : "false", R"pb( } } attr { key: "transpose_b" value { b: )pb",
          c.transpose_b ? "true" : "false", " } }");
      auto [y_cpu, y_gpu] = RunBoth(op, {{"a", a}, {"b", b}});
      // GPU and CPU sum in different orders, so an element whose products
      // cancel carries the rounding of the products, not of itself: the bar
      // is |gpu - cpu| <= tol * sum_k |a_ik b_kj| + 1e-6 (GEMM's error bound),
      // tol = 1e-5 in F32, 1e-13 in F64.
      const Tensor magnitude = AbsProduct(a, b, c.transpose_a, c.transpose_b);
      const std::vector<double> got = TensorValues(y_gpu), want = TensorValues(y_cpu), scale = TensorValues(magnitude);
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(scale.size(), want.size());
      const double tol = dtype == F32 ? 1e-5 : 1e-13;
      int bad = 0;
      for (size_t i = 0; i < got.size() && bad < 5; ++i) {
        if (!(std::abs(got[i] - want[i]) <= tol * scale[i] + 1e-6)) {
          ADD_FAILURE() << "element " << i << ": gpu " << got[i] << " cpu " << want[i] << " scale " << scale[i];
          ++bad;
        }
      }
    }
  }
}

TEST_F(CudaOpsTest, MatmulRefusesWhatTheCpuRefusesWithTheSameWords) {
  const Tensor a = MakeTensor(F32, {2, 3}, Uniform(6, 5));
  const Tensor b = MakeTensor(F32, {4, 5}, Uniform(20, 6));
  const Tensor a_gpu = *a.CopyTo(device_.get()), b_gpu = *b.CopyTo(device_.get());
  const Op op = ParseOp(
      R"pb(type: "matmul" input: [ "a", "b" ] output: "y"
           attr { key: "transpose_a" value { b: false } }
           attr { key: "transpose_b" value { b: false } })pb");
  const absl::StatusOr<Tensor> cpu = RunKernel(op, F32, {&a, &b}, RunContext());
  const absl::StatusOr<Tensor> gpu = RunKernel(op, F32, {&a_gpu, &b_gpu}, gpu_);
  ASSERT_FALSE(cpu.ok());
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument) << gpu.status();
  EXPECT_EQ(gpu.status().message(), cpu.status().message());
  EXPECT_NE(cpu.status().message().find("do not multiply"), std::string::npos) << cpu.status();
}

// bf16 storage, FP32 accumulate: within 2e-2 of the output's largest
// magnitude (the issue's bf16 bar) of the CPU float product of the same
// bf16-rounded inputs. The matmul schema takes F32 and F64 only until mixed
// precision (issue 18), so the kernel runs directly.
TEST_F(CudaOpsTest, MatmulBf16MatchesTheCpuFloatProductOfTheSameInputs) {
  const Shape as{4, 33, 100}, bs{100, 24};
  const Tensor a16 = MakeTensor(BF16, as, Uniform(NumElements(as), 7));
  const Tensor b16 = MakeTensor(BF16, bs, Uniform(NumElements(bs), 8));
  const Tensor a_gpu = *a16.CopyTo(device_.get()), b_gpu = *b16.CopyTo(device_.get());
  const Op op = ParseOp(
      R"pb(type: "matmul" input: [ "a", "b" ] output: "y"
           attr { key: "transpose_a" value { b: false } }
           attr { key: "transpose_b" value { b: false } })pb");
  const absl::StatusOr<Tensor> y = RunKernel(op, BF16, {&a_gpu, &b_gpu}, gpu_);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->dtype(), BF16);
  EXPECT_EQ(y->shape(), (Shape{4, 33, 24}));
  const std::vector<double> got = TensorValues(*y);
  // The reference in float over the same (already bf16-rounded) values.
  const Tensor a32 = MakeTensor(F32, as, TensorValues(a16)), b32 = MakeTensor(F32, bs, TensorValues(b16));
  const absl::StatusOr<Tensor> want_t = RunKernel(op, F32, {&a32, &b32}, RunContext());
  ASSERT_TRUE(want_t.ok()) << want_t.status();
  const std::vector<double> want = TensorValues(*want_t);
  ASSERT_EQ(got.size(), want.size());
  double largest = 0;
  for (double w : want) largest = std::max(largest, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-2 * largest) << "element " << i;
  EXPECT_TRUE(device_->Synchronize().ok());
}

}  // namespace
}  // namespace strata
