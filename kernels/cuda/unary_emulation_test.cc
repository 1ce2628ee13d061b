// unary.cu's casts between float and the 16-bit floats, its gelu_grad with
// folded casts and of a 16-bit x over a 16-bit or float dy
// (LaunchGeluGradStored; the float dy is matmul_gelu_grad's fallback), its gelu stored in
// 16 bits (LaunchGeluTanhStored) and of a 16-bit x (LaunchGeluWidened), its
// widened bf16 / f16 add_n, and
// elementwise.cuh's 16-byte packs against its one-element loop,
// launchers included, on the CPU: the genrule unary_emulated_src rewrites the
// file's <<<>>> launches into calls of testing/cuda_stand_in/'s Launch, and
// g++ compiles it against the stand-ins. Each must give the registered CPU
// kernel's bits (run through the registry); in the emulation the device
// functors call the host's libm, as the CPU kernels do, so gelu_grad is bit
// for bit here too (on a GPU CUDA's erf and exp may differ in the last bits:
// cuda_unary_ops_test bounds that). No FMA (-ffp-contract=off), as nvcc's
// --fmad=false.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "kernels/cuda/testing/emulation_test_util.h"
#include "kernels/cuda/unary.h"

namespace strata {
namespace {

constexpr int64_t kN = 1500;  // six blocks of 256 threads

Tensor RunCpu(const std::string& text, std::map<std::string, Tensor> env) {
  const absl::Status s = RunOp(ParseOp(text), &env);
  EXPECT_TRUE(s.ok()) << s;
  return env["y"];
}

// Values that exercise the conversions: random ones over many binades, ties
// of both 16-bit types, F16's subnormals and overflow, signed zeros,
// infinities and NaNs.
std::vector<double> CastValues() {
  std::vector<double> v;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> mantissa(-1, 1);
  std::uniform_int_distribution<int> exponent(-30, 20);
  for (int i = 0; i < 900; ++i) v.push_back(std::ldexp(mantissa(rng), exponent(rng)));
  for (int k = 0; k < 64; ++k) {
    v.push_back(1 + (2 * k + 1) * std::ldexp(1.0, -8));    // bf16 ties
    v.push_back(1 + (2 * k + 1) * std::ldexp(1.0, -11));   // f16 ties
    v.push_back(k * std::ldexp(1.0, -25));                 // f16 subnormals and their ties
    v.push_back(65504 + k * 8);                            // f16's largest and past it
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (double x : {0.0, -0.0, inf, -inf, std::nan(""), -std::nan(""), 3.4e38, -3.4e38, 1e-40, -1e-45}) v.push_back(x);
  return v;
}

std::string CastText(DataType to) {
  return std::string(R"pb(type: "cast" input: "x" output: "y" attr { key: "dtype" value { s: ")pb") +
         DataTypeName(to) + "\" } }";
}

template <typename S, typename D>
void CheckCast(DataType from, DataType to) {
  SCOPED_TRACE(testing::Message() << "cast " << DataTypeName(from) << " -> " << DataTypeName(to));
  const std::vector<double> values = CastValues();
  const Tensor x = MakeTensor(from, {static_cast<int64_t>(values.size())}, values);
  const Tensor want = RunCpu(CastText(to), {{"x", x}});
  std::vector<D> y = emulation::Poisoned<D>(x.num_elements());
  ASSERT_EQ((cuda::LaunchCast<S, D>(y.data(), x.data<S>(), x.num_elements(), nullptr)), cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_TRUE(emulation::SameBits(y, want, "y"));
}

TEST(UnaryEmulation, CastBetweenFloatAndSixteenBits) {
  CheckCast<float, bfloat16>(F32, BF16);
  CheckCast<float, float16>(F32, F16);
  CheckCast<bfloat16, float>(BF16, F32);
  CheckCast<float16, float>(F16, F32);
  CheckCast<double, bfloat16>(F64, BF16);
  CheckCast<double, float16>(F64, F16);
  CheckCast<bfloat16, float16>(BF16, F16);
  CheckCast<float16, bfloat16>(F16, BF16);
}

// gelu_grad of a float x with dy stored in DY and dx in DX (passes/fold_casts).
template <typename DY, typename DX>
void CheckGeluGradStored(DataType dy_dtype, DataType dx_dtype) {
  for (const char* form : {"none", "tanh"}) {
    SCOPED_TRACE(testing::Message() << "gelu_grad " << form << ", dy " << DataTypeName(dy_dtype) << ", dx "
                                    << DataTypeName(dx_dtype));
    const Tensor a = MakeTensor(F32, {kN}, emulation::UniformValues(kN, 21, 5));
    const Tensor dy = MakeTensor(dy_dtype, {kN}, emulation::UniformValues(kN, 22, 2));
    std::string text = std::string(R"pb(type: "gelu_grad" input: [ "a", "dy" ] output: "y")pb") +
                       R"( attr { key: "approximate" value { s: ")" + form + "\" } }";
    if (dx_dtype != F32) text += std::string(R"( attr { key: "out_dtype" value { s: ")") + DataTypeName(dx_dtype) + "\" } }";
    const Tensor want = RunCpu(text, {{"a", a}, {"dy", dy}});
    std::vector<DX> dx = emulation::Poisoned<DX>(kN);
    const cuda::UnaryGradOp op = std::string(form) == "tanh" ? cuda::UnaryGradOp::kGeluTanhGrad
                                                               : cuda::UnaryGradOp::kGeluGrad;
    ASSERT_EQ((cuda::LaunchGeluGradStored<float, DY, DX>(op, dx.data(), a.data<float>(), dy.data<DY>(), kN, nullptr)),
              cudaSuccess);
    emulation::ExpectCleanLaunches();
    EXPECT_TRUE(emulation::SameBits(dx, want, "dx"));
  }
}

TEST(UnaryEmulation, GeluGradWithFoldedCasts) {
  CheckGeluGradStored<float, float>(F32, F32);
  CheckGeluGradStored<float, bfloat16>(F32, BF16);
  CheckGeluGradStored<float, float16>(F32, F16);
  CheckGeluGradStored<bfloat16, float>(BF16, F32);
  CheckGeluGradStored<bfloat16, bfloat16>(BF16, BF16);
  CheckGeluGradStored<bfloat16, float16>(BF16, F16);
  CheckGeluGradStored<float16, float>(F16, F32);
  CheckGeluGradStored<float16, bfloat16>(F16, BF16);
  CheckGeluGradStored<float16, float16>(F16, F16);
}

TEST(UnaryEmulation, GeluLaunchersRefuseOtherOps) {
  std::vector<float> a(4, 1.0f), dy(4, 1.0f), dx(4);
  EXPECT_EQ((cuda::LaunchGeluGradStored<float, float, float>(cuda::UnaryGradOp::kTanhGrad, dx.data(), a.data(),
                                                             dy.data(), 4, nullptr)),
            cudaErrorInvalidValue);
  std::vector<bfloat16> x16(4), y16(4);
  EXPECT_EQ(cuda::LaunchGeluWidened<bfloat16>(cuda::UnaryOp::kTanh, y16.data(), x16.data(), 4, nullptr),
            cudaErrorInvalidValue);
}

// matmul_bias_gelu's stored output where cuBLASLt has no epilogue for it:
// gelu's tanh form then a cast, in one pass, with the CPU ops' bits.
template <typename Y>
void CheckGeluTanhStored(DataType y_dtype) {
  SCOPED_TRACE(DataTypeName(y_dtype));
  const Tensor x = MakeTensor(F32, {kN}, emulation::UniformValues(kN, 23, 6));
  const Tensor gelu =
      RunCpu(R"pb(type: "gelu" input: "x" output: "y" attr { key: "approximate" value { s: "tanh" } })pb", {{"x", x}});
  const Tensor want = RunCpu(CastText(y_dtype), {{"x", gelu}});
  std::vector<Y> y = emulation::Poisoned<Y>(kN);
  ASSERT_EQ(cuda::LaunchGeluTanhStored<Y>(y.data(), x.data<float>(), kN, nullptr), cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_TRUE(emulation::SameBits(y, want, "y"));
}

TEST(UnaryEmulation, GeluTanhStoredAsACastAfterTheGelu) {
  CheckGeluTanhStored<bfloat16>(BF16);
  CheckGeluTanhStored<float16>(F16);
}

std::string GeluText(const char* op, const std::string& inputs, const char* form) {
  return std::string("type: \"") + op + "\" input: " + inputs + " output: \"y\"" +
         R"( attr { key: "approximate" value { s: ")" + form + "\" } }";
}

// Mixed precision's gelu of a 16-bit x: the float kernel on the widened x,
// rounded once to x's type; the CPU's cast, gelu (F32) and cast give those
// bits.
template <typename X>
void CheckGeluWidened(DataType dtype) {
  for (const char* form : {"none", "tanh"}) {
    SCOPED_TRACE(testing::Message() << "gelu " << form << ", x " << DataTypeName(dtype));
    const Tensor x = MakeTensor(dtype, {kN}, emulation::UniformValues(kN, 24, 6));
    const Tensor wide = RunCpu(CastText(F32), {{"x", x}});
    const Tensor gelu = RunCpu(GeluText("gelu", "\"x\"", form), {{"x", wide}});
    const Tensor want = RunCpu(CastText(dtype), {{"x", gelu}});
    std::vector<X> y = emulation::Poisoned<X>(kN);
    const cuda::UnaryOp op = std::string(form) == "tanh" ? cuda::UnaryOp::kGeluTanh : cuda::UnaryOp::kGelu;
    ASSERT_EQ(cuda::LaunchGeluWidened<X>(op, y.data(), x.data<X>(), kN, nullptr), cudaSuccess);
    emulation::ExpectCleanLaunches();
    EXPECT_TRUE(emulation::SameBits(y, want, "y"));
  }
}

TEST(UnaryEmulation, SixteenBitGeluIsTheFloatGeluRoundedOnce) {
  CheckGeluWidened<bfloat16>(BF16);
  CheckGeluWidened<float16>(F16);
}

// Mixed precision's gelu_grad of a 16-bit x, dy and dx of its type: the
// CPU's float gelu_grad of the widened x (its folded dy and dx doing the
// rest) gives the bits.
template <typename X, typename DY, typename DX>
void CheckGeluGradWidened(DataType x_dtype, DataType dy_dtype, DataType dx_dtype) {
  for (const char* form : {"none", "tanh"}) {
    SCOPED_TRACE(testing::Message() << "gelu_grad " << form << ", x " << DataTypeName(x_dtype) << ", dy "
                                    << DataTypeName(dy_dtype) << ", dx " << DataTypeName(dx_dtype));
    const Tensor a = MakeTensor(x_dtype, {kN}, emulation::UniformValues(kN, 25, 5));
    const Tensor dy = MakeTensor(dy_dtype, {kN}, emulation::UniformValues(kN, 26, 2));
    const Tensor wide = RunCpu(CastText(F32), {{"x", a}});
    const std::string text = GeluText("gelu_grad", R"([ "a", "dy" ])", form) +
                             R"( attr { key: "out_dtype" value { s: ")" + DataTypeName(dx_dtype) + "\" } }";
    const Tensor want = RunCpu(text, {{"a", wide}, {"dy", dy}});
    std::vector<DX> dx = emulation::Poisoned<DX>(kN);
    const cuda::UnaryGradOp op =
        std::string(form) == "tanh" ? cuda::UnaryGradOp::kGeluTanhGrad : cuda::UnaryGradOp::kGeluGrad;
    ASSERT_EQ((cuda::LaunchGeluGradStored<X, DY, DX>(op, dx.data(), a.data<X>(), dy.data<DY>(), kN, nullptr)),
              cudaSuccess);
    emulation::ExpectCleanLaunches();
    EXPECT_TRUE(emulation::SameBits(dx, want, "dx"));
  }
}

TEST(UnaryEmulation, SixteenBitGeluGradIsTheFloatGradRoundedOnce) {
  CheckGeluGradWidened<bfloat16, bfloat16, bfloat16>(BF16, BF16, BF16);
  CheckGeluGradWidened<float16, float16, float16>(F16, F16, F16);
}

// matmul_gelu_grad's 16-bit fallback: a 16-bit z and dz over the GEMM's
// float product (never rounded to 16 bits): the CPU's float gelu_grad of the
// widened z with out_dtype gives the bits; and so does the CPU's
// matmul_gelu_grad kernel, whose per-element formula this is, on a GEMM that
// is exact in float (a [n, 1] of the 16-bit dy values, b = [[1]]).
template <typename X>
void CheckMatmulGeluGradFallback(DataType dtype) {
  CheckGeluGradWidened<X, float, X>(dtype, F32, dtype);
  SCOPED_TRACE(testing::Message() << "matmul_gelu_grad " << DataTypeName(dtype));
  const Tensor z = MakeTensor(dtype, {kN, 1}, emulation::UniformValues(kN, 27, 5));
  const Tensor a = MakeTensor(dtype, {kN, 1}, emulation::UniformValues(kN, 28, 2));
  const Tensor b = MakeTensor(dtype, {1, 1}, {1.0});
  const Tensor want = RunCpu(R"pb(type: "matmul_gelu_grad" input: [ "a", "b", "z" ] output: "y")pb",
                             {{"a", a}, {"b", b}, {"z", z}});
  const Tensor dy = RunCpu(CastText(F32), {{"x", a}});  // the exact float product
  std::vector<X> dz = emulation::Poisoned<X>(kN);
  ASSERT_EQ((cuda::LaunchGeluGradStored<X, float, X>(cuda::UnaryGradOp::kGeluTanhGrad, dz.data(), z.data<X>(),
                                                     dy.data<float>(), kN, nullptr)),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_TRUE(emulation::SameBits(dz, want, "dz"));
}

TEST(UnaryEmulation, MatmulGeluGradFallbackRoundsTheFloatProductOnce) {
  CheckMatmulGeluGradFallback<bfloat16>(BF16);
  CheckMatmulGeluGradFallback<float16>(F16);
}

// add_n of `count` bf16 / f16 inputs as the CPU's widened kernel: float sums
// in the CPU's order, past 16 inputs kept in `acc` between launches.
template <typename S>
void CheckAddN(DataType dtype, int count) {
  SCOPED_TRACE(testing::Message() << "add_n " << DataTypeName(dtype) << ", " << count << " inputs");
  std::map<std::string, Tensor> env;
  std::string inputs;
  std::vector<const S*> xs;
  for (int i = 0; i < count; ++i) {
    const std::string name = "x" + std::to_string(i);
    // Magnitudes far apart, so the order and the single rounding show.
    env[name] = MakeTensor(dtype, {kN}, emulation::UniformValues(kN, 100 + i, std::ldexp(1.0, i % 7 * 2 - 6)));
    inputs += (i ? ", \"" : "\"") + name + "\"";
  }
  for (int i = 0; i < count; ++i) xs.push_back(env["x" + std::to_string(i)].data<S>());
  const Tensor want = RunCpu(R"pb(type: "add_n" input: [)pb" + inputs + R"pb(] output: "y")pb", env);
  std::vector<S> y = emulation::Poisoned<S>(kN);
  std::vector<float> acc(kN, std::nanf(""));
  const int64_t launches = cuda_stand_in::launches;
  ASSERT_EQ(cuda::LaunchAddN(y.data(), xs.data(), count, kN, count > cuda::kAddNPerLaunch ? acc.data() : nullptr,
                             nullptr),
            cudaSuccess);
  emulation::ExpectCleanLaunches();
  EXPECT_EQ(cuda_stand_in::launches - launches, (count + cuda::kAddNPerLaunch - 1) / cuda::kAddNPerLaunch);
  EXPECT_TRUE(emulation::SameBits(y, want, "y"));
}

TEST(UnaryEmulation, WidenedAddN) {
  for (int count : {2, 3, 16, 17, 33}) {
    CheckAddN<bfloat16>(BF16, count);
    CheckAddN<float16>(F16, count);
  }
  // More than one launch's inputs need the float partial sums.
  std::vector<bfloat16> x(4), y(4);
  std::vector<const bfloat16*> xs(17, x.data());
  EXPECT_EQ(cuda::LaunchAddN(y.data(), xs.data(), 17, 4, nullptr, nullptr), cudaErrorInvalidValue);
}

// elementwise.cuh's paths: 16-byte packs where every operand is aligned for
// one (then the tail one by one), else element by element; the same bits
// either way. The cast, the stored gelu_grad (in place) and the bf16 gelu
// against the CPU on operands moved off their alignment by one element, n
// of one pack plus 3.
TEST(UnaryEmulation, PacksAndSingleElementsGiveTheSameBits) {
  for (int64_t offset : {0, 1}) {
    for (int64_t n : {int64_t{3}, int64_t{11}, kN - 1}) {
      SCOPED_TRACE(testing::Message() << "offset " << offset << ", n " << n);
      const Tensor x = MakeTensor(F32, {n}, emulation::UniformValues(n, 31, 8));
      const Tensor want = RunCpu(CastText(BF16), {{"x", x}});
      std::vector<float> xs(n + 1);
      std::memcpy(xs.data() + offset, x.data<float>(), n * sizeof(float));
      std::vector<bfloat16> y = emulation::Poisoned<bfloat16>(n + 1);
      const int64_t launches = cuda_stand_in::launches;
      ASSERT_EQ((cuda::LaunchCast<float, bfloat16>(y.data() + offset, xs.data() + offset, n, nullptr)), cudaSuccess);
      emulation::ExpectCleanLaunches();
      // Aligned: packs of 4 and a tail (n % 4 of 3); else one loop.
      EXPECT_EQ(cuda_stand_in::launches - launches, offset == 0 && n >= 4 ? 2 : 1);
      EXPECT_TRUE(emulation::SameBits(y.data() + offset, n, want, "y"));

      // gelu_grad in place over a float dy (dx aliases dy), stored as float.
      const Tensor a = MakeTensor(F32, {n}, emulation::UniformValues(n, 32, 5));
      const Tensor dy = MakeTensor(F32, {n}, emulation::UniformValues(n, 33, 2));
      const Tensor grad = RunCpu(
          R"pb(type: "gelu_grad" input: [ "a", "dy" ] output: "y" attr { key: "approximate" value { s: "tanh" } })pb",
          {{"a", a}, {"dy", dy}});
      std::vector<float> as(n + 1), dys(n + 1);
      std::memcpy(as.data() + offset, a.data<float>(), n * sizeof(float));
      std::memcpy(dys.data() + offset, dy.data<float>(), n * sizeof(float));
      ASSERT_EQ((cuda::LaunchGeluGradStored<float, float, float>(cuda::UnaryGradOp::kGeluTanhGrad, dys.data() + offset,
                                                                 as.data() + offset, dys.data() + offset, n, nullptr)),
                cudaSuccess);
      emulation::ExpectCleanLaunches();
      EXPECT_TRUE(emulation::SameBits(dys.data() + offset, n, grad, "dx"));

      // gelu of a bf16 x (mixed precision), into a bf16 y: packs of 8.
      const Tensor xb = MakeTensor(BF16, {n}, emulation::UniformValues(n, 34, 6));
      const Tensor wide = RunCpu(CastText(F32), {{"x", xb}});
      const Tensor gelu = RunCpu(CastText(BF16), {{"x", RunCpu(GeluText("gelu", "\"x\"", "tanh"), {{"x", wide}})}});
      std::vector<bfloat16> xbs(n + 1);
      std::memcpy(xbs.data() + offset, xb.data<bfloat16>(), n * sizeof(bfloat16));
      std::vector<bfloat16> ybs = emulation::Poisoned<bfloat16>(n + 1);
      ASSERT_EQ(cuda::LaunchGeluWidened<bfloat16>(cuda::UnaryOp::kGeluTanh, ybs.data() + offset, xbs.data() + offset, n,
                                                  nullptr),
                cudaSuccess);
      emulation::ExpectCleanLaunches();
      EXPECT_TRUE(emulation::SameBits(ybs.data() + offset, n, gelu, "gelu"));
    }
  }
}

}  // namespace
}  // namespace strata
