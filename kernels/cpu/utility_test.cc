// cast, add_n, fill_like and identity: values by hand or from PyTorch 1.13
// (/usr/bin/python3), and the shape functions' checks.

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "compiler/op_registry.h"
#include "runtime/float16.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

#define EXPECT_VALUES_NEAR(actual, shape, values, tol) EXPECT_TRUE(::strata::TensorNear((actual), shape, values, (tol)))

Tensor RunNamed(const std::string& op_text, std::map<std::string, Tensor> env) {
  absl::Status s = RunOp(ParseOp(op_text), &env);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? env.at("y") : Tensor();
}

Tensor Cast(const Tensor& x, const std::string& dtype) {
  return RunNamed("type: \"cast\" input: \"x\" output: \"y\" attr { key: \"dtype\" value { s: \"" + dtype + "\" } }",
                  {{"x", x}});
}

TEST(CastTest, FloatToIntegerTruncatesTowardZero) {
  // torch.tensor([-2.7, -0.5, 0.5, 2.9]).to(torch.int64) -> [-2, 0, 0, 2]
  Tensor y = Cast(MakeTensor(F32, {4}, {-2.7, -0.5, 0.5, 2.9}), "I64");
  EXPECT_EQ(y.dtype(), I64);
  EXPECT_EQ(std::vector<int64_t>(y.data<int64_t>(), y.data<int64_t>() + 4), (std::vector<int64_t>{-2, 0, 0, 2}));
  // Out of range saturates and nan gives 0 (a plain C++ cast is undefined there).
  Tensor z = Cast(MakeTensor(F64, {3}, {1e20, -1e20, std::numeric_limits<double>::quiet_NaN()}), "I32");
  EXPECT_EQ(std::vector<int32_t>(z.data<int32_t>(), z.data<int32_t>() + 3),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 0}));
}

TEST(CastTest, OtherConversions) {
  // torch.tensor([0.0, -0.0, 0.5, nan], dtype=torch.float64).to(torch.bool) -> [False, False, True, True]
  Tensor b = Cast(MakeTensor(F64, {4}, {0.0, -0.0, 0.5, std::numeric_limits<double>::quiet_NaN()}), "BOOL");
  EXPECT_EQ(b.dtype(), BOOL);
  EXPECT_EQ(std::vector<bool>(b.data<bool>(), b.data<bool>() + 4), (std::vector<bool>{false, false, true, true}));
  // torch.tensor([3, -7, 2**40]).to(torch.float32) -> [3.0, -7.0, 1099511627776.0]
  EXPECT_VALUES_NEAR(Cast(MakeTensor(I64, {3}, {3, -7, 1099511627776.0}), "F32"), (std::vector<int64_t>{3}),
                     (std::vector<double>{3, -7, 1099511627776.0}), 0);
  EXPECT_VALUES_NEAR(Cast(MakeTensor(BOOL, {2}, {1, 0}), "F64"), (std::vector<int64_t>{2}), (std::vector<double>{1, 0}), 0);
  EXPECT_VALUES_NEAR(Cast(MakeTensor(I32, {2}, {-5, 9}), "I64"), (std::vector<int64_t>{2}), (std::vector<double>{-5, 9}), 0);
  // 0.1 in F64 to F32 rounds to the nearest float.
  EXPECT_EQ(Cast(MakeTensor(F64, {1}, {0.1}), "F32").data<float>()[0], 0.1f);
  // To the same dtype: the buffer is shared, not copied.
  Tensor x = MakeTensor(F32, {2}, {1, 2});
  EXPECT_EQ(Cast(x, "F32").raw_data(), x.raw_data());
}

TEST(CastTest, SixteenBitFloatsRoundToNearestEven) {
  // torch.tensor([0.1, 1 + 2**-8, 1 + 3 * 2**-8, 70000.0, -3.0]).to(torch.bfloat16).view(torch.int16)
  //   -> [0x3dcd, 0x3f80, 0x3f82, 0x4789, 0xc040]
  Tensor x = MakeTensor(F32, {5}, {0.1, 1 + std::ldexp(1.0, -8), 1 + 3 * std::ldexp(1.0, -8), 70000.0, -3.0});
  Tensor b = Cast(x, "BF16");
  ASSERT_EQ(b.dtype(), BF16);
  const std::vector<uint16_t> want_b = {0x3dcd, 0x3f80, 0x3f82, 0x4789, 0xc040};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b.data<bfloat16>()[i].bits, want_b[i]) << i;
  // torch.tensor([0.1, 1 + 2**-11, 1 + 3 * 2**-11, 70000.0, -3.0]).to(torch.float16).view(torch.int16)
  //   -> [0x2e66, 0x3c00, 0x3c02, 0x7c00 (inf), 0xc200]
  Tensor y = MakeTensor(F64, {5}, {0.1, 1 + std::ldexp(1.0, -11), 1 + 3 * std::ldexp(1.0, -11), 70000.0, -3.0});
  Tensor h = Cast(y, "F16");
  ASSERT_EQ(h.dtype(), F16);
  const std::vector<uint16_t> want_h = {0x2e66, 0x3c00, 0x3c02, 0x7c00, 0xc200};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(h.data<float16>()[i].bits, want_h[i]) << i;
  // And back: exact, since every 16-bit value is a float.
  Tensor back = Cast(b, "F32");
  ASSERT_EQ(back.dtype(), F32);
  EXPECT_EQ(back.data<float>()[0], ToFloat(bfloat16{0x3dcd}));
  EXPECT_EQ(Cast(h, "F64").data<double>()[4], -3.0);
  EXPECT_EQ(Cast(h, "I32").data<int32_t>()[4], -3);
}

TEST(AddNTest, SumsInputs) {
  Tensor a = MakeTensor(F32, {2, 2}, {1, 2, 3, 4});
  Tensor b = MakeTensor(F32, {2, 2}, {10, 20, 30, 40});
  Tensor c = MakeTensor(F32, {2, 2}, {0.5, -0.5, 0.25, -0.25});
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "add_n" input: ["a", "b", "c"] output: "y")pb", {{"a", a}, {"b", b}, {"c", c}}),
                     (std::vector<int64_t>{2, 2}), (std::vector<double>{11.5, 21.5, 33.25, 43.75}), 0);
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "add_n" input: ["a", "a"] output: "y")pb", {{"a", a}}),
                     (std::vector<int64_t>{2, 2}), (std::vector<double>{2, 4, 6, 8}), 0);
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "add_n" input: ["a", "b"] output: "y")pb",
                              {{"a", MakeTensor(I64, {2}, {1, 2})}, {"b", MakeTensor(I64, {2}, {3, 4})}}),
                     (std::vector<int64_t>{2}), (std::vector<double>{4, 6}), 0);
  // One input: a copy of it, a tensor of its own (the pipeline sends it
  // while its input is zeroed for the next step).
  Tensor one = RunNamed(R"pb(type: "add_n" input: ["a"] output: "y")pb", {{"a", a}});
  EXPECT_NE(one.raw_data(), a.raw_data());
  EXPECT_VALUES_NEAR(one, (std::vector<int64_t>{2, 2}), (std::vector<double>{1, 2, 3, 4}), 0);
}

TEST(AddNTest, LargeInputsAcrossThreads) {
  const int64_t n = 100000;
  std::vector<double> a(n), b(n), c(n), want(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = i;
    b[i] = -2.0 * i;
    c[i] = 0.5;
    want[i] = -i + 0.5;
  }
  Tensor y = RunNamed(R"pb(type: "add_n" input: ["a", "b", "c"] output: "y")pb",
                      {{"a", MakeTensor(F64, {n}, a)}, {"b", MakeTensor(F64, {n}, b)}, {"c", MakeTensor(F64, {n}, c)}});
  EXPECT_VALUES_NEAR(y, (std::vector<int64_t>{n}), want, 0);
}

TEST(FillLikeTest, FillsEveryDtype) {
  Tensor x = MakeTensor(F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "fill_like" input: "x" output: "y")pb", {{"x", x}}),
                     (std::vector<int64_t>{2, 3}), (std::vector<double>(6, 1.0)), 0);
  EXPECT_VALUES_NEAR(RunNamed(R"pb(type: "fill_like" input: "x" output: "y" attr { key: "value" value { f: -0.5 } })pb",
                              {{"x", MakeTensor(F64, {}, {7})}}),
                     (std::vector<int64_t>{}), (std::vector<double>{-0.5}), 0);
  Tensor i = RunNamed(R"pb(type: "fill_like" input: "x" output: "y" attr { key: "value" value { i: 3 } })pb",
                      {{"x", MakeTensor(I64, {2}, {0, 0})}});
  EXPECT_EQ(i.dtype(), I64);
  EXPECT_VALUES_NEAR(i, (std::vector<int64_t>{2}), (std::vector<double>{3, 3}), 0);
  Tensor b = RunNamed(R"pb(type: "fill_like" input: "x" output: "y" attr { key: "value" value { f: 0 } })pb",
                      {{"x", MakeTensor(BOOL, {2}, {1, 1})}});
  EXPECT_EQ(b.dtype(), BOOL);
  EXPECT_VALUES_NEAR(b, (std::vector<int64_t>{2}), (std::vector<double>{0, 0}), 0);
  // 16-bit floats, rounded as a cast rounds: 0.1 is not a bfloat16 or a half.
  for (DataType dt : {BF16, F16}) {
    Tensor h = RunNamed(R"pb(type: "fill_like" input: "x" output: "y" attr { key: "value" value { f: 0.1 } })pb",
                        {{"x", MakeTensor(dt, {3}, {1, 2, 3})}});
    EXPECT_EQ(h.dtype(), dt);
    const double want = dt == BF16 ? ToFloat(ToBfloat16(0.1f)) : ToFloat(ToFloat16(0.1f));
    EXPECT_VALUES_NEAR(h, (std::vector<int64_t>{3}), (std::vector<double>(3, want)), 0) << DataTypeName(dt);
  }
}

TEST(IdentityTest, SharesTheBuffer) {
  for (DataType dt : {F32, F64, I64, I32, BOOL}) {
    Tensor x = MakeTensor(dt, {3}, {1, 0, 1});
    Tensor y = RunNamed(R"pb(type: "identity" input: "x" output: "y")pb", {{"x", x}});
    EXPECT_EQ(y.raw_data(), x.raw_data()) << DataTypeName(dt);
    EXPECT_EQ(y.dtype(), dt);
  }
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

TEST(UtilityShapeTest, CastNeedsAKnownDtype) {
  auto ok = Infer(R"pb(type: "cast" input: "x" output: "y" attr { key: "dtype" value { s: "F64" } })pb",
                  {{I64, {-1, 3}}});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ((*ok)[0], (TensorType{F64, {-1, 3}}));

  auto missing = Infer(R"pb(type: "cast" input: "x" output: "y")pb", {{F32, {3}}});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("missing required attr 'dtype' (string)"));

  auto bad = Infer(R"pb(type: "cast" input: "x" output: "y" attr { key: "dtype" value { s: "float" } })pb",
                   {{F32, {3}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("attr 'dtype' must be one of F32, F64, I64, I32, BOOL, BF16, F16, got 'float'"));

  bad = Infer(R"pb(type: "cast" input: "x" output: "y" attr { key: "dtype" value { s: "DT_INVALID" } })pb",
              {{F32, {3}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("attr 'dtype' must be one of"));
}

TEST(UtilityShapeTest, AddNNeedsIdenticalTypes) {
  auto ok = Infer(R"pb(type: "add_n" input: ["a", "b", "c"] output: "y")pb",
                  {{F32, {-1, 4}}, {F32, {-1, 4}}, {F32, {-1, 4}}});
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ((*ok)[0], (TensorType{F32, {-1, 4}}));

  auto bad = Infer(R"pb(type: "add_n" input: ["a", "b"] output: "y")pb", {{F32, {-1, 4}}, {F32, {4}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("input 'xs[1]' is F32[4] but 'xs[0]' is F32[-1, 4]"));
  bad = Infer(R"pb(type: "add_n" input: ["a", "b"] output: "y")pb", {{F32, {4}}, {F64, {4}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("add_n needs identical types"));
  bad = Infer(R"pb(type: "add_n" input: ["a"] output: "y")pb", {{BOOL, {4}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("input 'xs[0]' must be F32, F64, I64, BF16 or F16, got BOOL"));
  bad = Infer(R"pb(type: "add_n" output: "y")pb", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("expects at least 1 inputs"));
}

TEST(UtilityShapeTest, FillLikeAndIdentityKeepTheType) {
  for (const char* text : {R"pb(type: "fill_like" input: "x" output: "y")pb", R"pb(type: "identity" input: "x" output: "y")pb"}) {
    auto ok = Infer(text, {{BOOL, {-1, 2}}});
    ASSERT_TRUE(ok.ok()) << ok.status().message();
    EXPECT_EQ((*ok)[0], (TensorType{BOOL, {-1, 2}}));
    auto bad = Infer(text, {{DT_INVALID, {2}}});
    ASSERT_FALSE(bad.ok());
    EXPECT_THAT(bad.status().message(), HasSubstr("got DT_INVALID"));
  }
}

}  // namespace
}  // namespace strata
