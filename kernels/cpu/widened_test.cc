// BF16 and F16 matmuls on the CPU (mixed precision's storage, float32 math):
// each equals the float32 kernel run on the widened inputs with its result
// rounded to nearest even, bit for bit, for the plain product and the
// shared-weight gradients; and the memory plan's workspace counts the float32
// copies.

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
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

TEST(WidenedMatmulTest, WorkspaceCountsTheFloatCopies) {
  const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace("matmul", DEVICE_CPU);
  ASSERT_NE(ws, nullptr);
  Op op = ParseOp(R"(type: "matmul" input: ["a", "b"] output: "y")");
  KernelDef def;
  def.op = &op;
  def.input_types = {{BF16, {64, 32}}, {BF16, {32, 16}}};
  def.output_types = {{BF16, {64, 16}}};
  auto bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, (64 * 32 + 32 * 16 + 64 * 16) * 4);
  def.input_types = {{F32, {64, 32}}, {F32, {32, 16}}};
  def.output_types = {{F32, {64, 16}}};
  bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, 0);  // float32 needs no copies
}

}  // namespace
}  // namespace strata
