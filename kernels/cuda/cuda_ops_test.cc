// The registered CUDA kernels (kernels/cuda/cuda_ops.cc) against the CPU
// kernels, each run the way the executor runs it: the kernel registry by
// (op, device kind, dtype), the op's shape function, a KernelContext whose
// device is a CudaDevice, outputs from its caching allocator. Tagged gpu:
// without a CUDA device every test FAILS (never skips).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_op_test_util.h"
#include "kernels/cuda/losses.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

using testing::BitEqual;
using testing::CudaOpsTest;
using testing::RandomTensor;
using testing::RunKernel;
using testing::TestedCudaKernels;
using testing::Uniform;

// The ops this file tests, with the dtypes each registers for DEVICE_CUDA.
STRATA_CUDA_OPS_TESTED(cuda_ops_test, {
                                          {"relu", {F32, F64}},
                                          {"relu_grad", {F32, F64}},
                                          {"matmul", {F32, F64, BF16, F16}},
                                          {"add", {F32, F64, I64}},
                                          {"sub", {F32, F64, I64}},
                                          {"mul", {F32, F64, I64}},
                                          {"div", {F32, F64}},
                                          {"sum_to_like", {F32, F64, I64}},
                                          {"fill_like", {F32, F64, I64, I32, BOOL, BF16, F16}},
                                          {"increment", {I64, F32}},
                                          {"lr_schedule", {I64}},
                                          {"adam_update", {F32, F64}},
                                          {"sgd_update", {F32, F64}},
                                          {"momentum_update", {F32, F64}},
                                          {"softmax_cross_entropy", {F32, F64, BF16, F16}},
                                          {"softmax_cross_entropy_grad", {F32, F64, BF16, F16}},
                                          {"accuracy", {F32, F64}},
                                      });

// Walks every op schema: an op with a CUDA kernel that no linked test file
// lists (STRATA_CUDA_OPS_TESTED) fails, and so does a tested op whose CUDA
// dtypes changed.
TEST_F(CudaOpsTest, EveryRegisteredCudaKernelIsTested) {
  EXPECT_TRUE(testing::TestedTwice().empty()) << "listed twice: " << testing::TestedTwice().front();
  std::set<std::string> registered;
  for (const std::string& op : OpRegistry::Global().Names()) {
    const std::vector<DataType> dtypes = KernelRegistry::Global().DtypesFor(op, DEVICE_CUDA);
    if (dtypes.empty()) continue;
    registered.insert(op);
    auto it = TestedCudaKernels().find(op);
    if (it == TestedCudaKernels().end()) {
      ADD_FAILURE() << "op '" << op << "' has CUDA kernels but no test file of cuda_ops_test lists it";
      continue;
    }
    std::set<DataType> got(dtypes.begin(), dtypes.end()), want(it->second.begin(), it->second.end());
    EXPECT_EQ(got, want) << op;
  }
  for (const auto& [op, dtypes] : TestedCudaKernels()) EXPECT_TRUE(registered.count(op)) << op << " is not registered";
  // Every op of the example MLP's training program (examples/mlp_fashion.pbtxt: adam, a cosine schedule).
  for (const char* op : {"accuracy", "adam_update", "add", "fill_like", "increment", "lr_schedule", "matmul", "relu",
                         "relu_grad", "softmax_cross_entropy", "softmax_cross_entropy_grad", "sum_to_like"}) {
    EXPECT_TRUE(registered.count(op)) << op;
  }
  // The scratch the loss and accuracy draw (one double per row) is in the memory plan.
  for (const char* op : {"softmax_cross_entropy", "accuracy"}) {
    const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace(op, DEVICE_CUDA);
    ASSERT_NE(ws, nullptr) << op;
    KernelDef def;
    def.input_types = {TensorType{F32, {3, 5, 10}}, TensorType{I64, {3, 5}}};
    const absl::StatusOr<int64_t> bytes = (*ws)(def, 1);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, 15 * 8) << op;
  }
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
  const Tensor aa = testing::AbsF64(a), ab = testing::AbsF64(b);
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
      EXPECT_TRUE(testing::WithinErrorBound(y_gpu, y_cpu, magnitude, dtype == F32 ? 1e-5 : 1e-13));
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
  EXPECT_NE(cpu.status().message().find("inner dims differ"), std::string::npos) << cpu.status();
}

// bf16 storage, FP32 accumulate: within 2e-2 of the output's largest
// magnitude (the issue's bf16 bar) of the CPU float product of the same
// bf16-rounded inputs. The matmul schema takes F32 and F64 only until mixed
// precision (issue 18), so the kernel runs directly.
TEST_F(CudaOpsTest, MatmulBf16MatchesTheCpuFloatProductOfTheSameInputs) {
  const Shape as{4, 33, 100}, bs{100, 24};
  for (DataType half : {BF16, F16}) {
    SCOPED_TRACE(DataTypeName(half));
    const Tensor a16 = MakeTensor(half, as, Uniform(NumElements(as), 7));
    const Tensor b16 = MakeTensor(half, bs, Uniform(NumElements(bs), 8));
    const Tensor a_gpu = *a16.CopyTo(device_.get()), b_gpu = *b16.CopyTo(device_.get());
    const Op op = ParseOp(
        R"pb(type: "matmul" input: [ "a", "b" ] output: "y"
             attr { key: "transpose_a" value { b: false } }
             attr { key: "transpose_b" value { b: false } })pb");
    const absl::StatusOr<Tensor> y = RunKernel(op, half, {&a_gpu, &b_gpu}, gpu_);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->dtype(), half);
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
  }
  EXPECT_TRUE(device_->Synchronize().ok());
}

struct ShapePair {
  Shape x, y;
};

// The math is one IEEE operation per element on both sides (nvcc without
// FMA contraction, IEEE division), so the GPU must equal the CPU bit for bit.
TEST_F(CudaOpsTest, BinaryOpsEqualTheCpuBitForBitUnderBroadcasting) {
  const ShapePair cases[] = {
      {{64, 10}, {10}},     {{10}, {64, 10}},       {{4, 1, 5}, {3, 1}},    {{}, {7, 3}},     {{7, 3}, {}},
      {{37, 29}, {37, 29}}, {{2, 3, 1, 5}, {3, 4, 1}}, {{5, 1}, {1, 6}},    {{1}, {1}},        {{}, {}},
      {{0, 3}, {3}},        {{2, 1, 3, 1, 4, 1, 5}, {1, 6, 1, 2, 1, 3, 5}}, {{64, 1}, {64, 10}},
  };
  for (const char* op : {"add", "sub", "mul", "div"}) {
    for (DataType dtype : {F32, F64, I64}) {
      if (dtype == I64 && std::string(op) == "div") continue;
      for (const ShapePair& c : cases) {
        SCOPED_TRACE(absl::StrCat(op, " ", DataTypeName(dtype), " x", ShapeString(c.x), " y", ShapeString(c.y)));
        const Tensor x = RandomTensor(dtype, c.x, 11), y = RandomTensor(dtype, c.y, 12);
        auto [z_cpu, z_gpu] = RunBoth(absl::StrCat(R"pb(type: ")pb", op, R"pb(" input: [ "x", "y" ] output: "y")pb"),
                                      {{"x", x}, {"y", y}});
        EXPECT_TRUE(BitEqual(z_gpu, z_cpu));
      }
    }
  }
}

// More elements than one pass of the grid (65536 blocks x 256 threads), so
// the grid-stride loops wrap, on both paths.
TEST_F(CudaOpsTest, BinaryOpsCoverTensorsLargerThanTheGrid) {
  const Shape big{4100, 4100};
  const Tensor x = RandomTensor(F32, big, 13), y = RandomTensor(F32, big, 14), b = RandomTensor(F32, {4100}, 15);
  auto [same_cpu, same_gpu] = RunBoth(R"pb(type: "mul" input: [ "x", "b" ] output: "y")pb", {{"x", x}, {"b", y}});
  EXPECT_TRUE(BitEqual(same_gpu, same_cpu));
  auto [bias_cpu, bias_gpu] = RunBoth(R"pb(type: "add" input: [ "x", "b" ] output: "y")pb", {{"x", x}, {"b", b}});
  EXPECT_TRUE(BitEqual(bias_gpu, bias_cpu));
}

TEST_F(CudaOpsTest, BinaryOpsRefuseWhatTheCpuRefusesWithTheSameWords) {
  const Tensor x = MakeTensor(F32, {2, 3}, Uniform(6, 5)), y = MakeTensor(F32, {4}, Uniform(4, 6));
  const Tensor x_gpu = *x.CopyTo(device_.get()), y_gpu = *y.CopyTo(device_.get());
  const Op op = ParseOp(R"pb(type: "add" input: [ "x", "y" ] output: "z")pb");
  const absl::StatusOr<Tensor> cpu = RunKernel(op, F32, {&x, &y}, RunContext());
  const absl::StatusOr<Tensor> gpu = RunKernel(op, F32, {&x_gpu, &y_gpu}, gpu_);
  ASSERT_FALSE(cpu.ok());
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument) << gpu.status();
  EXPECT_EQ(gpu.status().message(), cpu.status().message());
}

// Per output element, the CPU's sum of |x| over the same terms (F64).
Tensor AbsSumToLike(const Tensor& x, const Tensor& like) {
  const Tensor ax = testing::AbsF64(x);
  const Tensor al = MakeTensor(F64, like.shape(), std::vector<double>(like.num_elements(), 0.0));
  const Op op = ParseOp(R"pb(type: "sum_to_like" input: [ "x", "like" ] output: "y")pb");
  const absl::StatusOr<Tensor> y = RunKernel(op, F64, {&ax, &al}, RunContext());
  EXPECT_TRUE(y.ok()) << y.status();
  return y.ok() ? *y : Tensor();
}

// The sums run in another order than the CPU's, so the bar is a summation's
// error bound: |gpu - cpu| <= tol * sum |terms| + 1e-6, tol 1e-5 in F32 and
// 1e-13 in F64 (both sides accumulate in double, so F32 is nearly always
// bit-equal); I64 exactly.
TEST_F(CudaOpsTest, SumToLikeMatchesTheCpu) {
  const ShapePair cases[] = {
      {{64, 10}, {10}},       {{4, 3, 5}, {3, 1}},      {{4, 3, 5}, {1, 3, 1}}, {{4, 3, 5}, {4, 1, 5}},
      {{7}, {}},              {{3000, 7}, {7}},         {{5, 100, 6}, {5, 1, 6}}, {{6, 1}, {1}},
      {{2, 40, 3, 50}, {40, 1, 1}}, {{70000, 3}, {1, 3}}, {{3, 70000}, {3, 1}}, {{0, 4}, {4}},
  };
  for (DataType dtype : {F32, F64, I64}) {
    for (const ShapePair& c : cases) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " x", ShapeString(c.x), " like", ShapeString(c.y)));
      const Tensor x = RandomTensor(dtype, c.x, 21), like = RandomTensor(dtype, c.y, 22);
      auto [y_cpu, y_gpu] =
          RunBoth(R"pb(type: "sum_to_like" input: [ "x", "like" ] output: "y")pb", {{"x", x}, {"like", like}});
      ASSERT_EQ(y_gpu.shape(), y_cpu.shape());
      if (dtype == I64) {
        EXPECT_TRUE(BitEqual(y_gpu, y_cpu));
        continue;
      }
      EXPECT_TRUE(testing::WithinErrorBound(y_gpu, y_cpu, AbsSumToLike(x, like), dtype == F32 ? 1e-5 : 1e-13));
    }
  }
}

// like == x's shape: the output shares x's buffer, as on the CPU.
TEST_F(CudaOpsTest, SumToLikeOfTheSameShapeSharesTheBuffer) {
  // Only a size-1 leading dim is summed away: nothing to add, the output is x reshaped.
  const Tensor x = *MakeTensor(F32, {1, 3, 4}, Uniform(12, 23)).CopyTo(device_.get());
  const Tensor like = *MakeTensor(F32, {3, 4}, Uniform(12, 24)).CopyTo(device_.get());
  const Op op = ParseOp(R"pb(type: "sum_to_like" input: [ "x", "like" ] output: "y")pb");
  const absl::StatusOr<Tensor> y = RunKernel(op, F32, {&x, &like}, gpu_);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (Shape{3, 4}));
  EXPECT_EQ(y->raw_data(), x.raw_data());
}

TEST_F(CudaOpsTest, FillLikeEqualsTheCpuBitForBit) {
  for (DataType dtype : {F32, F64, I64, I32, BOOL}) {
    for (double value : {0.1, -2.7, 3.0, 0.0}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " value ", value));
      const Tensor x = MakeTensor(dtype, {13, 7}, std::vector<double>(91, 1.0));
      auto [y_cpu, y_gpu] = RunBoth(
          absl::StrCat(R"pb(type: "fill_like" input: "x" output: "y" attr { key: "value" value { f: )pb", value, " } }"),
          {{"x", x}});
      EXPECT_TRUE(BitEqual(y_gpu, y_cpu));
    }
  }
}

TEST_F(CudaOpsTest, IncrementCountsInPlaceOnTheDevice) {
  const Tensor counter = MakeTensor(I64, {}, {41});
  auto [c_cpu, c_gpu] = RunBoth(
      R"pb(type: "increment" input: "y" output: "y" attr { key: "by" value { i: 3 } })pb", {{"y", counter}});
  EXPECT_TRUE(BitEqual(c_gpu, c_cpu));
  EXPECT_EQ(c_gpu.ValueAt(0), 44);
  // In place: the output is the input's buffer.
  const Tensor on_gpu = *counter.CopyTo(device_.get());
  const Op op = ParseOp(R"pb(type: "increment" input: "c" output: "c" attr { key: "by" value { i: 1 } })pb");
  const absl::StatusOr<Tensor> out = RunKernel(op, I64, {&on_gpu}, gpu_);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->raw_data(), on_gpu.raw_data());
  EXPECT_EQ(on_gpu.ValueAt(0), 42);
}

// lr_schedule reads its step on the device. Exact for F32 outputs and for the
// constant and warm-up rates; the cosine and step kinds in F64 within 1e-15
// of base_lr (CUDA's double cos and pow are within 2 ulp, glibc's within 1).
TEST_F(CudaOpsTest, LrScheduleMatchesTheCpuForEveryKind) {
  struct Case {
    std::string attrs;
    int64_t total_steps;
    bool transcendental;
  };
  const Case cases[] = {
      {R"pb(attr { key: "kind" value { s: "constant" } } attr { key: "warmup_steps" value { i: 5 } })pb", 0, false},
      {R"pb(attr { key: "kind" value { s: "cosine" } } attr { key: "warmup_steps" value { i: 5 } }
            attr { key: "decay_steps" value { i: 100 } } attr { key: "alpha" value { f: 0.1 } })pb",
       0, true},
      {R"pb(attr { key: "kind" value { s: "cosine" } })pb", 120, true},
      {R"pb(attr { key: "kind" value { s: "cosine" } })pb", 0, false},
      {R"pb(attr { key: "kind" value { s: "step" } } attr { key: "warmup_steps" value { i: 3 } }
            attr { key: "step_size" value { i: 7 } } attr { key: "gamma" value { f: 0.5 } })pb",
       0, true},
  };
  for (const Case& c : cases) {
    for (const char* dtype : {"F32", "F64"}) {
      const std::string op = absl::StrCat(R"pb(type: "lr_schedule" input: "step" output: "y"
                                               attr { key: "base_lr" value { f: 0.003 } }
                                               attr { key: "dtype" value { s: ")pb",
                                          dtype, "\" } } ", c.attrs);
      for (int64_t step : {0, 1, 2, 4, 5, 9, 10, 57, 99, 100, 119, 150}) {
        SCOPED_TRACE(absl::StrCat(c.attrs, " total ", c.total_steps, " ", dtype, " step ", step));
        auto out = RunBothNamed(op, {{"step", MakeTensor(I64, {}, {static_cast<double>(step)})}}, {"y"}, c.total_steps);
        ASSERT_EQ(out.size(), 1u);
        const double want = out[0].first.ValueAt(0), got = out[0].second.ValueAt(0);
        if (std::string(dtype) == "F64" && c.transcendental) {
          EXPECT_NEAR(got, want, 1e-15 * 0.003);  // of base_lr: cos(pi) may miss -1 by an ulp
        } else {
          EXPECT_EQ(got, want);
        }
      }
    }
  }
}

// Optimizer updates: param, m, v (velocity) against the CPU's in-place update.
// The element math is the CPU's operation for operation; only the scalars
// from pow (bias corrections) may round differently in double, so the bar is
// 1e-6 relative in F32 (bit-equal is expected in practice, but one ulp of a
// bias correction may flip a float's last bit) and 1e-13 in F64.
TEST_F(CudaOpsTest, AdamUpdateMatchesTheCpu) {
  const std::string variants[] = {
      "",
      R"pb(attr { key: "weight_decay" value { f: 0.01 } })pb",
      R"pb(attr { key: "weight_decay" value { f: 0.01 } } attr { key: "decoupled" value { b: true } })pb",
  };
  for (DataType dtype : {F32, F64}) {
    for (const std::string& attrs : variants) {
      for (int64_t step : {1, 7, 1000}) {
        for (const Shape& shape : {Shape{37, 29}, Shape{10}, Shape{300, 1000}}) {
          SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", attrs, " step ", step, " ", ShapeString(shape)));
          const int64_t n = NumElements(shape);
          std::vector<double> v = Uniform(n, 34);
          for (double& e : v) e = std::abs(e) * 1e-3;
          const std::map<std::string, Tensor> inputs = {
              {"p", MakeTensor(dtype, shape, Uniform(n, 31))},  {"g", MakeTensor(dtype, shape, Uniform(n, 32))},
              {"m", MakeTensor(dtype, shape, Uniform(n, 33))},  {"v", MakeTensor(dtype, shape, v)},
              {"lr", MakeTensor(dtype, {}, {1e-3})},            {"step", MakeTensor(I64, {}, {double(step)})}};
          auto out = RunBothNamed(
              absl::StrCat(R"pb(type: "adam_update" input: [ "p", "g", "m", "v", "lr", "step" ]
                                output: [ "p", "m", "v" ] )pb",
                           attrs),
              inputs, {"p", "m", "v"});
          ASSERT_EQ(out.size(), 3u);
          const double tol = dtype == F32 ? 1e-6 : 1e-13;
          for (const auto& [cpu, gpu] : out) EXPECT_TENSOR_NEAR(gpu, cpu, tol);
        }
      }
    }
  }
}

TEST_F(CudaOpsTest, SgdAndMomentumUpdatesEqualTheCpuBitForBit) {
  for (DataType dtype : {F32, F64}) {
    for (const char* wd : {"0", "0.1"}) {
      for (const char* nesterov : {"false", "true"}) {
        SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " wd ", wd, " nesterov ", nesterov));
        const Shape shape{37, 29};
        const int64_t n = NumElements(shape);
        const std::map<std::string, Tensor> inputs = {{"p", MakeTensor(dtype, shape, Uniform(n, 41))},
                                                      {"g", MakeTensor(dtype, shape, Uniform(n, 42))},
                                                      {"vel", MakeTensor(dtype, shape, Uniform(n, 43))},
                                                      {"lr", MakeTensor(dtype, {}, {0.05})}};
        const std::string wd_attr = absl::StrCat(R"pb( attr { key: "weight_decay" value { f: )pb", wd, " } }");
        auto sgd = RunBothNamed(
            absl::StrCat(R"pb(type: "sgd_update" input: [ "p", "g", "lr" ] output: "p")pb", wd_attr), inputs, {"p"});
        ASSERT_EQ(sgd.size(), 1u);
        EXPECT_TRUE(BitEqual(sgd[0].second, sgd[0].first));
        auto momentum = RunBothNamed(
            absl::StrCat(R"pb(type: "momentum_update" input: [ "p", "g", "vel", "lr" ] output: [ "p", "vel" ])pb",
                         wd_attr, R"pb( attr { key: "nesterov" value { b: )pb", nesterov, " } }"),
            inputs, {"p", "vel"});
        ASSERT_EQ(momentum.size(), 2u);
        for (const auto& [cpu, gpu] : momentum) EXPECT_TRUE(BitEqual(gpu, cpu));
      }
    }
  }
}

struct LossCase {
  Shape logits;
  bool ties;  // logits drawn from {0, 1, 2}: the label's logit ties others
};

Tensor Labels(const Shape& logits, uint32_t seed) {
  const Shape shape(logits.begin(), logits.end() - 1);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> u(0, logits.back() - 1);
  std::vector<double> v(NumElements(shape));
  for (double& x : v) x = static_cast<double>(u(rng));
  return MakeTensor(I64, shape, v);
}

Tensor Logits(DataType dtype, const LossCase& c, uint32_t seed) {
  std::vector<double> v = Uniform(NumElements(c.logits), seed);
  if (c.ties) {
    for (double& x : v) x = std::floor(std::abs(x) * 1.5);
  } else {
    for (double& x : v) x *= 4;
  }
  return MakeTensor(dtype, c.logits, v);
}

// Row log-sum-exp and the batch mean in double on both sides, in another
// order (a tree) on the GPU, and CUDA's exp and log within 1 ulp: loss and
// dlogits within 1e-6 relative in F32 (|x| >= 1 relative, smaller absolute:
// TensorNear's bar) and 1e-12 in F64; accuracy, a count, exactly.
TEST_F(CudaOpsTest, SoftmaxCrossEntropyItsGradientAndAccuracyMatchTheCpu) {
  const LossCase cases[] = {
      {{64, 10}, false}, {{3, 5, 7}, false}, {{8, 1000}, false}, {{1, 3}, false}, {{4096, 10}, false},
      {{50, 6}, true},
  };
  for (DataType dtype : {F32, F64}) {
    for (const LossCase& c : cases) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " logits", ShapeString(c.logits), c.ties ? " ties" : ""));
      const double tol = dtype == F32 ? 1e-6 : 1e-12;
      const Tensor logits = Logits(dtype, c, 51), label = Labels(c.logits, 52);
      auto [loss_cpu, loss_gpu] = RunBoth(R"pb(type: "softmax_cross_entropy" input: [ "x", "l" ] output: "y")pb",
                                          {{"x", logits}, {"l", label}});
      EXPECT_TENSOR_NEAR(loss_gpu, loss_cpu, tol);
      auto [d_cpu, d_gpu] =
          RunBoth(R"pb(type: "softmax_cross_entropy_grad" input: [ "x", "l", "dloss" ] output: "y")pb",
                  {{"x", logits}, {"l", label}, {"dloss", MakeTensor(dtype, {}, {0.7})}});
      EXPECT_TENSOR_NEAR(d_gpu, d_cpu, tol);
      for (int k : {1, 3}) {
        if (k > c.logits.back()) continue;
        auto [acc_cpu, acc_gpu] = RunBoth(
            absl::StrCat(R"pb(type: "accuracy" input: [ "x", "l" ] output: "y" attr { key: "k" value { i: )pb", k,
                         " } }"),
            {{"x", logits}, {"l", label}});
        EXPECT_TRUE(BitEqual(acc_gpu, acc_cpu)) << "k " << k;
      }
    }
  }
}

// BF16 / F16 logits (mixed precision: the loss reads the LM head's 16-bit
// output): float math on the GPU where the cost is, double on the CPU
// (kernels/cuda/losses.h). With eps_S = 2^-22 + 3 2^-24 + 2^-24 (ln V + 1)
// (S's relative error: expf's 2 ulps, a group's pairwise float sum, x - M
// rounded in float; 1.1e-6 at V = 50257) the loss within 1.01 eps_S +
// 2^-23 |loss| of the CPU's, each dlogits value within one spacing of the
// 16-bit type at its magnitude of the CPU's, the padding columns +0, and
// two runs the same bits. Among the cases GPT-2's padded LM head: rows
// 50304 apart of which 50257 are classes, logits up to 30 in magnitude, a
// row whose label dominates (1 - p_l about 1.6e-10, well above the CPU's
// own rounding of it, ~7e-15) and one where another class dominates.
double HalfSumBound(int64_t V) {
  return std::ldexp(1.0, -22) + 3 * std::ldexp(1.0, -24) + std::ldexp(1.0, -24) * (std::log(V) + 1) + 1e-14;
}

// The 16-bit type's spacing at magnitude v (its subnormals' below the least
// normal).
double HalfSpacing(DataType half, double v) {
  const int digits = half == BF16 ? 8 : 11, min_exponent = half == BF16 ? -126 : -14;
  const int e = v == 0 ? min_exponent : std::max(std::ilogb(v), min_exponent);
  return std::ldexp(1.0, e - (digits - 1));
}

// R rows of V classes C apart (padding NaN): r % 4 picks U(-30, 30); U(-30,
// 0) with the label's logit 30; U(-30, 0) with another class at 30;
// U(-8, 8).
Tensor DominantRows(DataType half, int64_t R, int64_t C, int64_t V, const std::vector<double>& labels) {
  std::mt19937 rng(83);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> v(R * C, std::nan(""));
  for (int64_t r = 0; r < R; ++r) {
    double* row = v.data() + r * C;
    for (int64_t j = 0; j < V; ++j) {
      row[j] = r % 4 == 0 ? 60 * u(rng) - 30 : r % 4 == 3 ? 16 * u(rng) - 8 : -30 * u(rng);
    }
    const int64_t l = static_cast<int64_t>(labels[r]);
    if (r % 4 == 1) row[l] = 30;
    if (r % 4 == 2) row[(l + V / 2) % V] = 30;
  }
  return MakeTensor(half, {R, C}, v);
}

TEST_F(CudaOpsTest, HalfLogitsCrossEntropyWithinTheBoundsOfTheCpu) {
  struct HalfCase {
    Shape logits;
    int64_t classes;
    bool ties;
  };
  const HalfCase cases[] = {{{64, 10}, 10, false}, {{3, 5, 7}, 7, false},     {{8, 1000}, 1000, false},
                            {{50, 6}, 6, true},    {{8, 50304}, 50257, false}, {{2, 70000}, 70000, false}};
  for (const bool fast : {true, false}) {
    const cuda::ScopedFastHalfLoss path(fast);
    for (DataType half : {BF16, F16}) {
      for (const HalfCase& c : cases) {
        const int64_t C = c.logits.back(), V = c.classes, R = NumElements(c.logits) / C;
        SCOPED_TRACE(absl::StrCat(fast ? "fast kernels, " : "widened, ", DataTypeName(half), " logits",
                                  ShapeString(c.logits), ", ", V, " classes", c.ties ? " ties" : ""));
        Tensor logits, label;
        if (V < C) {
          std::mt19937 rng(82);
          std::uniform_int_distribution<int64_t> u(0, V - 1);
          std::vector<double> l(R);
          for (double& x : l) x = static_cast<double>(u(rng));
          label = MakeTensor(I64, {R}, l);
          logits = DominantRows(half, R, C, V, l);
        } else {
          logits = Logits(half, LossCase{c.logits, c.ties}, 81);
          label = Labels(c.logits, 82);
        }
        const std::string classes = V < C ? absl::StrCat(R"pb( attr { key: "classes" value { i: )pb", V, " } }") : "";
        const std::string fwd =
            absl::StrCat(R"pb(type: "softmax_cross_entropy" input: [ "x", "l" ] output: "y")pb", classes);
        const std::string bwd =
            absl::StrCat(R"pb(type: "softmax_cross_entropy_grad" input: [ "x", "l", "dloss" ] output: "y")pb", classes);
        auto [loss_cpu, loss_gpu] = RunBoth(fwd, {{"x", logits}, {"l", label}});
        ASSERT_EQ(loss_gpu.dtype(), F32);
        const double want = loss_cpu.ValueAt(0), got = loss_gpu.ValueAt(0);
        EXPECT_LE(std::abs(got - want), 1.01 * HalfSumBound(V) + std::ldexp(1.0, -23) * std::abs(want))
            << got << " vs the CPU's " << want;
        EXPECT_TRUE(BitEqual(loss_gpu, RunGpu(fwd, {{"x", logits}, {"l", label}}))) << "two runs";
        const Tensor dloss = MakeTensor(F32, {}, {0.7});
        auto [d_cpu, d_gpu] = RunBoth(bwd, {{"x", logits}, {"l", label}, {"dloss", dloss}});
        ASSERT_EQ(d_gpu.dtype(), half);
        EXPECT_TRUE(BitEqual(d_gpu, RunGpu(bwd, {{"x", logits}, {"l", label}, {"dloss", dloss}}))) << "two runs";
        const std::vector<double> g = TensorValues(d_gpu), w = TensorValues(d_cpu);
        int64_t bad = 0;
        for (size_t i = 0; i < g.size(); ++i) {
          const bool padding = static_cast<int64_t>(i) % C >= V;
          const bool ok = padding
                              ? g[i] == 0 && !std::signbit(g[i])
                              : std::abs(g[i] - w[i]) <= HalfSpacing(half, std::max(std::abs(g[i]), std::abs(w[i])));
          if (!ok && ++bad <= 10) ADD_FAILURE() << "element " << i << ": " << g[i] << " vs the CPU's " << w[i];
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

TEST_F(CudaOpsTest, LossKernelsRefuseMismatchedLabelsWithTheCpusWords) {
  const Tensor logits = MakeTensor(F32, {4, 3}, Uniform(12, 53));
  const Tensor label = MakeTensor(I64, {5}, {0, 1, 2, 0, 1});
  const Tensor logits_gpu = *logits.CopyTo(device_.get()), label_gpu = *label.CopyTo(device_.get());
  for (const char* type : {"softmax_cross_entropy", "accuracy"}) {
    const Op op = ParseOp(absl::StrCat(R"pb(type: ")pb", type,
                                       R"pb(" input: [ "x", "l" ] output: "y" attr { key: "k" value { i: 1 } })pb"));
    const absl::StatusOr<Tensor> cpu = RunKernel(op, F32, {&logits, &label}, RunContext());
    const absl::StatusOr<Tensor> gpu = RunKernel(op, F32, {&logits_gpu, &label_gpu}, gpu_);
    ASSERT_FALSE(cpu.ok()) << type;
    ASSERT_FALSE(gpu.ok()) << type;
    EXPECT_EQ(gpu.status().message(), cpu.status().message());
  }
}

// What the CPU refuses by looking at device values, the GPU cannot refuse
// without waiting for the device: it poisons the outputs with NaN instead
// (kernels/cuda/optimizers.h, losses.h).
TEST_F(CudaOpsTest, ValuesTheCpuRefusesComeOutNanOnTheGpu) {
  const Tensor logits = MakeTensor(F32, {3, 4}, Uniform(12, 61));
  const Tensor bad_label = MakeTensor(I64, {3}, {0, 4, 1});
  EXPECT_TRUE(std::isnan(RunGpu(R"pb(type: "softmax_cross_entropy" input: [ "x", "l" ] output: "y")pb",
                                {{"x", logits}, {"l", bad_label}})
                             .ValueAt(0)));
  EXPECT_TRUE(std::isnan(RunGpu(R"pb(type: "accuracy" input: [ "x", "l" ] output: "y")pb",
                                {{"x", logits}, {"l", bad_label}})
                             .ValueAt(0)));
  const Tensor d = RunGpu(R"pb(type: "softmax_cross_entropy_grad" input: [ "x", "l", "dloss" ] output: "y")pb",
                          {{"x", logits}, {"l", bad_label}, {"dloss", MakeTensor(F32, {}, {1})}});
  EXPECT_FALSE(std::isnan(d.ValueAt(0)));  // row 0's label is fine
  EXPECT_TRUE(std::isnan(d.ValueAt(4)));   // row 1's is not
  EXPECT_TRUE(std::isnan(RunGpu(R"pb(type: "lr_schedule" input: "s" output: "y"
                                     attr { key: "base_lr" value { f: 0.1 } })pb",
                                {{"s", MakeTensor(I64, {}, {-1})}})
                             .ValueAt(0)));
  const Tensor p = RunGpu(
      R"pb(type: "adam_update" input: [ "p", "g", "m", "v", "lr", "step" ] output: [ "p", "m", "v" ])pb",
      {{"p", MakeTensor(F32, {3}, {1, 2, 3})},
       {"g", MakeTensor(F32, {3}, {1, 1, 1})},
       {"m", MakeTensor(F32, {3}, {0, 0, 0})},
       {"v", MakeTensor(F32, {3}, {0, 0, 0})},
       {"lr", MakeTensor(F32, {}, {0.1})},
       {"step", MakeTensor(I64, {}, {0})}},
      "p");
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(p.ValueAt(i))) << i;
}

// The reductions use no atomics and a fixed order: two runs, the same bits.
TEST_F(CudaOpsTest, ReductionsAreBitForBitDeterministic) {
  for (DataType dtype : {F32, F64}) {
    SCOPED_TRACE(DataTypeName(dtype));
    for (const ShapePair& c : {ShapePair{{64, 10}, {10}}, ShapePair{{3000, 7}, {7}}, ShapePair{{70000, 3}, {3}}}) {
      const std::map<std::string, Tensor> in = {{"x", RandomTensor(dtype, c.x, 71)}, {"like", RandomTensor(dtype, c.y, 72)}};
      const char* op = R"pb(type: "sum_to_like" input: [ "x", "like" ] output: "y")pb";
      const Tensor first = RunGpu(op, in), second = RunGpu(op, in);
      EXPECT_TRUE(BitEqual(first, second)) << ShapeString(c.x);
    }
    for (const Shape& shape : {Shape{4096, 10}, Shape{8, 1000}}) {
      const LossCase c{shape, false};
      const std::map<std::string, Tensor> in = {{"x", Logits(dtype, c, 73)}, {"l", Labels(shape, 74)}};
      const char* op = R"pb(type: "softmax_cross_entropy" input: [ "x", "l" ] output: "y")pb";
      const Tensor first = RunGpu(op, in), second = RunGpu(op, in);
      EXPECT_TRUE(BitEqual(first, second)) << ShapeString(shape);
    }
  }
}

}  // namespace
}  // namespace strata
