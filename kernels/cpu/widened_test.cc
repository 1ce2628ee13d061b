// BF16 and F16 matmuls and convolutions on the CPU (mixed precision's
// storage, float32 math): each equals the float32 kernel run on the widened
// inputs with its result rounded to nearest even, bit for bit, for the plain
// product and the shared-weight gradients, conv2d and its two gradients; and
// the memory plan's workspace counts the float32 copies.

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/env_switch.h"
#include "runtime/float16.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

std::vector<double> Ramp(int64_t n, double scale) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * ((i * 37) % 23 - 11) / 7.0;
  return v;
}

Tensor RunText(const std::string& text, std::map<std::string, Tensor> env) {
  absl::Status s = RunOp(ParseOp(text), &env);
  EXPECT_TRUE(s.ok()) << s << " in " << text;
  return s.ok() ? env.at("y") : Tensor();
}

Tensor Cast(const Tensor& x, const std::string& dtype) {
  return RunText(absl::StrCat(R"(type: "cast" input: "x" output: "y" attr { key: "dtype" value { s: ")", dtype, R"(" } })"),
             {{"x", x}});
}

struct Case {
  std::string op;  // with inputs a, b and output y
  Shape a, b;
};

class WidenedMatmulTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WidenedMatmulTest, EqualsTheFloatKernelOnWidenedInputsRounded) {
  // BF16 widened too (oneDNN's bf16 GEMM, where this CPU has it, is
  // TheNativeBf16GemmReadsTheOperandsAsTheyAre's).
  ScopedSwitch widened(OnednnBf16Switch(), false);
  const std::string dtype = GetParam();
  const std::vector<Case> cases = {
      {R"(type: "matmul" input: ["a", "b"] output: "y")", {5, 7}, {7, 3}},
      {R"(type: "matmul" input: ["a", "b"] output: "y" attr { key: "transpose_b" value { b: true } })", {2, 5, 7}, {3, 7}},
      {R"(type: "matmul" input: ["a", "b"] output: "y" attr { key: "transpose_a" value { b: true } })", {2, 7, 5}, {2, 7, 3}},
      {R"(type: "matmul_shared_b_grad_a" input: ["a", "b"] output: "y")", {2, 5, 3}, {7, 3}},
      {R"(type: "matmul_shared_b_grad_b" input: ["a", "b"] output: "y")", {2, 5, 7}, {2, 5, 3}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    const Tensor a32 = MakeTensor(F32, c.a, Ramp(NumElements(c.a), 1.3));
    const Tensor b32 = MakeTensor(F32, c.b, Ramp(NumElements(c.b), 0.7));
    const Tensor a = Cast(a32, dtype), b = Cast(b32, dtype);
    const Tensor y = RunText(c.op, {{"a", a}, {"b", b}});
    ASSERT_TRUE(y.defined());
    EXPECT_EQ(DataTypeName(y.dtype()), dtype);
    // The reference: the float32 kernel on the widened values, rounded.
    const Tensor want = Cast(RunText(c.op, {{"a", Cast(a, "F32")}, {"b", Cast(b, "F32")}}), dtype);
    ASSERT_EQ(y.shape(), want.shape());
    ASSERT_EQ(y.bytes(), want.bytes());
    EXPECT_EQ(std::memcmp(y.raw_data(), want.raw_data(), y.bytes()), 0);
    // And it is a product, not zeros.
    double norm = 0;
    for (double v : TensorValues(y)) norm += v * v;
    EXPECT_GT(norm, 1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, WidenedMatmulTest, ::testing::Values("BF16", "F16"));

TEST(WidenedMatmulTest, WorkspaceCountsTheFloatCopiesOfTheLargerPhase) {
  // Widened BF16 (oneDNN's bf16 GEMM off; F16 always runs so).
  ScopedSwitch widened(OnednnBf16Switch(), false);
  const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace("matmul", DEVICE_CPU);
  ASSERT_NE(ws, nullptr);
  Op op = ParseOp(R"(type: "matmul" input: ["a", "b"] output: "y")");
  KernelDef def;
  def.op = &op;
  def.input_types = {{BF16, {64, 32}}, {BF16, {32, 16}}};
  def.output_types = {{BF16, {64, 16}}};
  auto bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // On top of the bf16 output: while the float32 matmul runs, its float
  // inputs and output; then the float output beside the bf16 one (the
  // float inputs freed). The first phase is the larger here.
  EXPECT_EQ(*bytes, (64 * 32 + 32 * 16 + 64 * 16) * 4 - 64 * 16 * 2);
  // A wide output from narrow inputs: the second phase is the larger.
  def.input_types = {{BF16, {64, 2}}, {BF16, {2, 512}}};
  def.output_types = {{BF16, {64, 512}}};
  bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 64 * 512 * 4);
  def.input_types = {{F32, {64, 32}}, {F32, {32, 16}}};
  def.output_types = {{F32, {64, 16}}};
  bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, 0);  // float32 needs no copies
}

// With oneDNN's bf16 GEMM the operands are read as they are: the float
// output before it is rounded is all the workspace, and the kernel's
// result is the widened kernel's up to the order of the float additions
// (exact here: small integers, every sum below 2^24), on this CPU or, where
// oneDNN has no bf16 JIT kernel, through the same widened kernel.
TEST(WidenedMatmulTest, TheNativeBf16GemmReadsTheOperandsAsTheyAre) {
  Op op = ParseOp(R"(type: "matmul" input: ["a", "b"] output: "y")");
  KernelDef def;
  def.op = &op;
  def.input_types = {{BF16, {64, 32}}, {BF16, {32, 16}}};
  def.output_types = {{BF16, {64, 16}}};
  const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace("matmul", DEVICE_CPU);
  ASSERT_NE(ws, nullptr);
  auto bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  if (NativeBf16Gemm()) {
    EXPECT_EQ(*bytes, 64 * 16 * 4);
  } else {
    EXPECT_EQ(*bytes, (64 * 32 + 32 * 16 + 64 * 16) * 4 - 64 * 16 * 2);
  }
  Op sums = ParseOp(
      R"(type: "matmul_shared_b_grad_b" input: ["a", "b"] output: "y" attr { key: "transpose_a" value { b: true } })");
  KernelDef sums_def;
  sums_def.op = &sums;
  sums_def.input_types = {{BF16, {3, 70, 50}}, {BF16, {3, 50, 24}}};
  sums_def.output_types = {{BF16, {70, 24}}};
  const WorkspaceFn* grad_b = KernelRegistry::Global().FindWorkspace("matmul_shared_b_grad_b", DEVICE_CPU);
  ASSERT_NE(grad_b, nullptr);
  bytes = (*grad_b)(sums_def, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  if (NativeBf16Gemm()) {
    EXPECT_EQ(*bytes, 70 * 24 * 4);  // the float sum before it is rounded
  } else {
    EXPECT_EQ(*bytes, (3 * 70 * 50 + 3 * 50 * 24 + 70 * 24) * 4 - 70 * 24 * 2);
  }

  const std::vector<Case> cases = {
      {R"(type: "matmul" input: ["a", "b"] output: "y")", {96, 200}, {200, 72}},
      {R"(type: "matmul" input: ["a", "b"] output: "y" attr { key: "transpose_b" value { b: true } })", {3, 40, 64}, {48, 64}},
      {R"(type: "matmul" input: ["a", "b"] output: "y" attr { key: "transpose_a" value { b: true } })", {2, 64, 40}, {2, 64, 24}},
      {R"(type: "matmul_shared_b_grad_a" input: ["a", "b"] output: "y")", {4, 50, 24}, {70, 24}},
      {R"(type: "matmul_shared_b_grad_b" input: ["a", "b"] output: "y")", {4, 50, 70}, {4, 50, 24}},
      {R"(type: "matmul_shared_b_grad_b" input: ["a", "b"] output: "y" attr { key: "transpose_a" value { b: true } })", {3, 70, 50}, {3, 50, 24}},
  };
  auto integers = [](const Shape& shape, int salt) {
    std::vector<double> v(NumElements(shape));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 37 + salt) % 17) - 8;
    return MakeTensor(BF16, shape, v);
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    const Tensor a = integers(c.a, 1), b = integers(c.b, 5);
    const Tensor native = RunText(c.op, {{"a", a}, {"b", b}});
    Tensor widened;
    {
      ScopedSwitch off(OnednnBf16Switch(), false);
      widened = RunText(c.op, {{"a", a}, {"b", b}});
    }
    ASSERT_TRUE(native.defined() && widened.defined());
    ASSERT_EQ(native.shape(), widened.shape());
    EXPECT_EQ(TensorValues(native), TensorValues(widened));
    double norm = 0;
    for (double v : TensorValues(native)) norm += v * v;
    EXPECT_GT(norm, 1.0);
  }
}

// conv2d and its two gradients in BF16 and F16: each equals the float32
// kernel on the widened inputs with its output rounded, bit for bit, for
// plain, padded-strided, dilated-grouped and batch-chunked (several images
// per thread share) convolutions.
struct ConvCase {
  std::string attrs;  // strides, paddings, dilations, groups
  Shape x, w, y;
};

std::string ConvOp(const std::string& type, const ConvCase& c) {
  std::string text = absl::StrCat(R"(type: ")", type, R"(" input: ["a", "b"] output: "y" )", c.attrs);
  if (type == "conv2d_grad_input") {
    absl::StrAppend(&text, R"( attr { key: "input_size" value { list { i: [)", c.x[2], ", ", c.x[3], "] } } }");
  }
  if (type == "conv2d_grad_filter") {
    absl::StrAppend(&text, R"( attr { key: "filter_size" value { list { i: [)", c.w[2], ", ", c.w[3], "] } } }");
  }
  return text;
}

class WidenedConvTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WidenedConvTest, EqualsTheFloatKernelOnWidenedInputsRounded) {
  const std::string dtype = GetParam();
  const std::vector<ConvCase> cases = {
      {"", {2, 3, 6, 6}, {4, 3, 3, 3}, {2, 4, 4, 4}},
      {R"(attr { key: "strides" value { list { i: [2, 2] } } } attr { key: "paddings" value { list { i: [1, 1] } } })",
       {3, 2, 7, 8}, {5, 2, 3, 3}, {3, 5, 4, 4}},
      {R"(attr { key: "dilations" value { list { i: [2, 2] } } } attr { key: "groups" value { i: 2 } })",
       {2, 4, 9, 9}, {6, 2, 3, 3}, {2, 6, 5, 5}},
      {R"(attr { key: "paddings" value { list { i: [1, 1] } } })", {16, 1, 8, 8}, {3, 1, 3, 3}, {16, 3, 8, 8}},
  };
  for (const ConvCase& c : cases) {
    const Tensor x32 = MakeTensor(F32, c.x, Ramp(NumElements(c.x), 1.3));
    const Tensor w32 = MakeTensor(F32, c.w, Ramp(NumElements(c.w), 0.7));
    const Tensor dy32 = MakeTensor(F32, c.y, Ramp(NumElements(c.y), 0.9));
    const Tensor x = Cast(x32, dtype), w = Cast(w32, dtype), dy = Cast(dy32, dtype);
    struct Pass {
      std::string type;
      const Tensor *a, *b;
    };
    for (const Pass& pass : {Pass{"conv2d", &x, &w}, Pass{"conv2d_grad_input", &dy, &w},
                             Pass{"conv2d_grad_filter", &x, &dy}}) {
      const std::string op = ConvOp(pass.type, c);
      SCOPED_TRACE(op);
      const Tensor y = RunText(op, {{"a", *pass.a}, {"b", *pass.b}});
      ASSERT_TRUE(y.defined());
      EXPECT_EQ(DataTypeName(y.dtype()), dtype);
      const Tensor want =
          Cast(RunText(op, {{"a", Cast(*pass.a, "F32")}, {"b", Cast(*pass.b, "F32")}}), dtype);
      ASSERT_EQ(y.shape(), want.shape());
      ASSERT_EQ(y.bytes(), want.bytes());
      EXPECT_EQ(std::memcmp(y.raw_data(), want.raw_data(), y.bytes()), 0);
      double norm = 0;
      for (double v : TensorValues(y)) norm += v * v;
      EXPECT_GT(norm, 1.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, WidenedConvTest, ::testing::Values("BF16", "F16"));

// The conv workspace in BF16: the float32 kernel's columns (as in F32) plus
// the widened copies of both inputs and the output.
TEST(WidenedConvTest, WorkspaceAddsTheFloatCopiesToTheColumnsLessTheOutput) {
  for (const std::string type : {"conv2d", "conv2d_grad_input", "conv2d_grad_filter"}) {
    SCOPED_TRACE(type);
    const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace(type, DEVICE_CPU);
    ASSERT_NE(ws, nullptr);
    // Every attr spelled out: the workspace reads the op as the compiler left it, defaults filled in.
    const ConvCase c{R"(attr { key: "strides" value { list { i: [1, 1] } } })"
                     R"( attr { key: "paddings" value { list { i: [1, 1] } } })"
                     R"( attr { key: "dilations" value { list { i: [1, 1] } } })"
                     R"( attr { key: "groups" value { i: 1 } })",
                     {8, 3, 10, 10}, {4, 3, 3, 3}, {8, 4, 10, 10}};
    Op op = ParseOp(ConvOp(type, c));
    const Shape& a = type == "conv2d_grad_input" ? c.y : c.x;
    const Shape& b = type == "conv2d_grad_filter" ? c.y : c.w;
    const Shape& out = type == "conv2d" ? c.y : type == "conv2d_grad_input" ? c.x : c.w;
    KernelDef def;
    def.op = &op;
    def.input_types = {{F32, a}, {F32, b}};
    def.output_types = {{F32, out}};
    auto f32 = (*ws)(def, 2);
    ASSERT_TRUE(f32.ok()) << f32.status();
    EXPECT_GT(*f32, 0);
    for (DataType half : {BF16, F16}) {
      def.input_types = {{half, a}, {half, b}};
      def.output_types = {{half, out}};
      auto bytes = (*ws)(def, 2);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      // The float32 kernel's columns with its float copies, less the 16-bit
      // output the plan counts beside them (the larger phase here).
      EXPECT_EQ(*bytes, *f32 + (NumElements(a) + NumElements(b) + NumElements(out)) * 4 - NumElements(out) * 2)
          << DataTypeName(half);
    }
  }
}

}  // namespace
}  // namespace strata
