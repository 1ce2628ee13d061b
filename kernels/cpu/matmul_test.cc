#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

std::vector<double> Values(int64_t n, double seed) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.37 * i + seed);
  return v;
}

Tensor Make(DataType dtype, Shape shape, double seed) {
  return MakeTensor(dtype, shape, Values(NumElements(shape), seed));
}

std::string Attrs(bool ta, bool tb) {
  return absl::StrCat("attr { key: \"transpose_a\" value { b: ", ta ? "true" : "false",
                      " } } attr { key: \"transpose_b\" value { b: ", tb ? "true" : "false", " } }");
}

absl::StatusOr<Tensor> RunBinary(const std::string& type, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  std::map<std::string, Tensor> env{{"a", a}, {"b", b}};
  auto s = RunOp(ParseOp(absl::StrCat("type: \"", type, "\" input: [\"a\", \"b\"] output: [\"y\"] ", Attrs(ta, tb))),
                 &env);
  if (!s.ok()) return s;
  return env["y"];
}

// Element (i, j) of op(m) for a row-major matrix m of `cols` columns at `base`.
double At(const std::vector<double>& m, int64_t base, int64_t cols, bool trans, int64_t i, int64_t j) {
  return trans ? m[base + j * cols + i] : m[base + i * cols + j];
}

// The plain triple loop: y[b] = op(a[b]) @ op(b or b[b]).
std::vector<double> NaiveMatmul(const Tensor& a, const Tensor& b, bool ta, bool tb, std::vector<int64_t>* shape) {
  const int ra = a.rank(), rb = b.rank();
  const int64_t M = ta ? a.dim(ra - 1) : a.dim(ra - 2), K = ta ? a.dim(ra - 2) : a.dim(ra - 1);
  const int64_t N = tb ? b.dim(rb - 2) : b.dim(rb - 1);
  int64_t batch = 1;
  shape->clear();
  for (int i = 0; i < ra - 2; ++i) {
    batch *= a.dim(i);
    shape->push_back(a.dim(i));
  }
  shape->push_back(M);
  shape->push_back(N);
  std::vector<double> av = TensorValues(a), bv = TensorValues(b), y(batch * M * N, 0.0);
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) {
          s += At(av, p * M * K, a.dim(ra - 1), ta, i, k) *
               At(bv, rb == 2 ? 0 : p * K * N, b.dim(rb - 1), tb, k, j);
        }
        y[(p * M + i) * N + j] = s;
      }
  return y;
}

void ExpectMatchesNaive(const Tensor& a, const Tensor& b, bool ta, bool tb, double tol) {
  SCOPED_TRACE(absl::StrCat("a ", ShapeString(a.shape()), " b ", ShapeString(b.shape()), " ta=", ta, " tb=", tb,
                            " ", DataTypeName(a.dtype())));
  std::vector<int64_t> shape;
  std::vector<double> want = NaiveMatmul(a, b, ta, tb, &shape);
  auto y = RunBinary("matmul", a, b, ta, tb);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(TensorNear(*y, shape, want, tol));
}

TEST(MatmulTest, TwoDimensionalEveryTransposeMatchesTripleLoop) {
  for (DataType dt : {F32, F64}) {
    const double tol = dt == F32 ? 1e-5 : 1e-12;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Tensor a = Make(dt, ta ? Shape{7, 5} : Shape{5, 7}, 0.3);
        Tensor b = Make(dt, tb ? Shape{3, 7} : Shape{7, 3}, 1.1);
        ExpectMatchesNaive(a, b, ta, tb, tol);
      }
    }
  }
}

TEST(MatmulTest, BatchedTimesSharedWeightMatchesTripleLoop) {
  for (DataType dt : {F32, F64}) {
    const double tol = dt == F32 ? 1e-5 : 1e-12;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Tensor a = Make(dt, ta ? Shape{2, 3, 7, 5} : Shape{2, 3, 5, 7}, 0.5);
        Tensor b = Make(dt, tb ? Shape{4, 7} : Shape{7, 4}, 2.0);
        ExpectMatchesNaive(a, b, ta, tb, tol);
      }
    }
  }
}

TEST(MatmulTest, BatchedTimesBatchedMatchesTripleLoop) {
  for (DataType dt : {F32, F64}) {
    const double tol = dt == F32 ? 1e-5 : 1e-12;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Tensor a = Make(dt, ta ? Shape{2, 3, 7, 5} : Shape{2, 3, 5, 7}, 0.7);
        Tensor b = Make(dt, tb ? Shape{2, 3, 4, 7} : Shape{2, 3, 7, 4}, 1.7);
        ExpectMatchesNaive(a, b, ta, tb, tol);
      }
    }
  }
}

TEST(MatmulTest, ManySmallBatchItemsRunInParallelCorrectly) {
  // 2000 items of 8x8 @ 8x8: small enough to be spread over the pool.
  ExpectMatchesNaive(Make(F64, {2000, 8, 8}, 0.1), Make(F64, {2000, 8, 8}, 0.2), false, true, 1e-12);
}

TEST(MatmulTest, LargeSharedWeightProductMatchesTripleLoop) {
  // One [64*10, 300] x [300, 70] GEMM, large enough for OpenBLAS to thread.
  ExpectMatchesNaive(Make(F32, {64, 10, 300}, 0.4), Make(F32, {300, 70}, 0.9), false, false, 1e-4);
}

TEST(MatmulTest, EmptyInnerDimGivesZeros) {
  auto y = RunBinary("matmul", MakeTensor(F32, {3, 0}, {}), MakeTensor(F32, {0, 4}, {}), false, false);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(TensorNear(*y, {3, 4}, std::vector<double>(12, 0.0), 0));
  auto batched = RunBinary("matmul", MakeTensor(F32, {2, 0, 3}, {}), MakeTensor(F32, {0, 4}, {}), true, false);
  ASSERT_TRUE(batched.ok()) << batched.status();
  EXPECT_TRUE(TensorNear(*batched, {2, 3, 4}, std::vector<double>(24, 0.0), 0));
  auto empty_rows = RunBinary("matmul", MakeTensor(F32, {0, 3}, {}), Make(F32, {3, 4}, 0), false, false);
  ASSERT_TRUE(empty_rows.ok()) << empty_rows.status();
  EXPECT_EQ(empty_rows->shape(), (Shape{0, 4}));
}

// db for a shared weight is the sum over the batch of op(a_i)^T @ dy_i, laid out as b.
TEST(MatmulTest, SharedWeightGradientsMatchTripleLoops) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(absl::StrCat("ta=", ta, " tb=", tb));
      const int64_t B = 6, M = 5, K = 4, N = 3;
      Tensor a = Make(F64, ta ? Shape{2, 3, K, M} : Shape{2, 3, M, K}, 0.2);
      Tensor b = Make(F64, tb ? Shape{N, K} : Shape{K, N}, 0.6);
      Tensor dy = Make(F64, {2, 3, M, N}, 1.4);
      std::vector<double> av = TensorValues(a), bv = TensorValues(b), dyv = TensorValues(dy);
      // da[p] (laid out as a[p]): d op(a)[i][k] = sum_j dy[i][j] op(b)[k][j].
      std::vector<double> da(av.size(), 0.0), db(bv.size(), 0.0);
      for (int64_t p = 0; p < B; ++p)
        for (int64_t i = 0; i < M; ++i)
          for (int64_t k = 0; k < K; ++k)
            for (int64_t j = 0; j < N; ++j) {
              const double g = dyv[(p * M + i) * N + j];
              const int64_t ai = p * M * K + (ta ? k * M + i : i * K + k);
              const int64_t bi = tb ? j * K + k : k * N + j;
              da[ai] += g * bv[bi];
              db[bi] += g * av[ai];
            }
      auto got_db = RunBinary("matmul_shared_b_grad_b", a, dy, ta, tb);
      ASSERT_TRUE(got_db.ok()) << got_db.status();
      EXPECT_TRUE(TensorNear(*got_db, tb ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N}, db, 1e-12));
      std::map<std::string, Tensor> env{{"dy", dy}, {"b", b}};
      auto s = RunOp(ParseOp(absl::StrCat(
                         R"pb(type: "matmul_shared_b_grad_a" input: ["dy", "b"] output: ["da"] )pb", Attrs(ta, tb))),
                     &env);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(TensorNear(env["da"], std::vector<int64_t>(a.shape().begin(), a.shape().end()), da, 1e-12));
    }
  }
}

// acc += op(a) @ op(b), in place: twice into the same buffer equals the
// starting values plus both products, for every transpose (the weight
// gradient of x @ W over two micro-batches is the transpose_a case).
TEST(MatmulAccumulateTest, AddsEachProductIntoTheBuffer) {
  for (DataType dtype : {F64, F32}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ta=", ta, " tb=", tb));
        const int64_t M = 7, K = 5, N = 3;
        Tensor a1 = Make(dtype, ta ? Shape{K, M} : Shape{M, K}, 0.3);
        Tensor b1 = Make(dtype, tb ? Shape{N, K} : Shape{K, N}, 0.8);
        Tensor a2 = Make(dtype, ta ? Shape{K, M} : Shape{M, K}, 1.7);
        Tensor b2 = Make(dtype, tb ? Shape{N, K} : Shape{K, N}, 2.1);
        Tensor acc = Make(dtype, {M, N}, 0.5);
        std::vector<double> want = TensorValues(acc);
        std::vector<int64_t> shape;
        for (auto [a, b] : {std::pair{&a1, &b1}, std::pair{&a2, &b2}}) {
          std::vector<double> product = NaiveMatmul(*a, *b, ta, tb, &shape);
          for (size_t i = 0; i < want.size(); ++i) want[i] += product[i];
          std::map<std::string, Tensor> env{{"a", *a}, {"b", *b}, {"acc", acc}};
          auto s = RunOp(ParseOp(absl::StrCat(
                             R"pb(type: "matmul_accumulate" input: ["a", "b", "acc"] output: ["acc"] )pb",
                             Attrs(ta, tb))),
                         &env);
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_EQ(env["acc"].raw_data(), acc.raw_data()) << "not updated in place";
        }
        EXPECT_TRUE(TensorNear(acc, {M, N}, want, dtype == F64 ? 1e-12 : 1e-5));
      }
    }
  }
}

TEST(MatmulAccumulateTest, EmptyInnerDimLeavesTheBufferAndBadShapesAreErrors) {
  Tensor acc = Make(F64, {3, 4}, 0.9);
  const std::vector<double> before = TensorValues(acc);
  std::map<std::string, Tensor> env{{"a", MakeTensor(F64, {0, 3}, {})}, {"b", MakeTensor(F64, {0, 4}, {})}, {"acc", acc}};
  const std::string text =
      absl::StrCat(R"pb(type: "matmul_accumulate" input: ["a", "b", "acc"] output: ["acc"] )pb", Attrs(true, false));
  ASSERT_TRUE(RunOp(ParseOp(text), &env).ok());
  EXPECT_TRUE(TensorNear(acc, {3, 4}, before, 0));
  env = {{"a", Make(F64, {5, 3}, 0)}, {"b", Make(F64, {5, 2}, 0)}, {"acc", acc}};
  auto s = RunOp(ParseOp(text), &env);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not hold op(a) @ op(b)"));
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

std::string MatmulText(bool ta = false, bool tb = false) {
  return absl::StrCat(R"pb(type: "matmul" input: ["a", "b"] output: ["y"] )pb", Attrs(ta, tb));
}

TEST(MatmulShapeTest, PropagatesTheBatchDim) {
  auto t = Infer(MatmulText(), {{F32, {-1, 784}}, {F32, {784, 256}}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)[0], (TensorType{F32, {-1, 256}}));
  auto batched = Infer(MatmulText(false, true), {{F32, {-1, 8, 5, 16}}, {F32, {-1, 8, 7, 16}}});
  ASSERT_TRUE(batched.ok()) << batched.status();
  EXPECT_EQ((*batched)[0], (TensorType{F32, {-1, 8, 5, 7}}));
  // x^T @ dy contracts over the batch dim: the weight gradient of x @ W.
  auto weight_grad = Infer(MatmulText(true, false), {{F32, {-1, 784}}, {F32, {-1, 256}}});
  ASSERT_TRUE(weight_grad.ok()) << weight_grad.status();
  EXPECT_EQ((*weight_grad)[0], (TensorType{F32, {784, 256}}));
}

TEST(MatmulShapeTest, RejectsMismatchedInnerDims) {
  auto t = Infer(MatmulText(), {{F32, {-1, 784}}, {F32, {256, 10}}});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("inner dims differ"));
  auto batch_vs_static = Infer(MatmulText(true, false), {{F32, {-1, 4}}, {F32, {8, 3}}});
  ASSERT_FALSE(batch_vs_static.ok());
}

TEST(MatmulShapeTest, RejectsBadRanksBatchesAndDtypes) {
  auto vec = Infer(MatmulText(), {{F32, {4}}, {F32, {4, 3}}});
  ASSERT_FALSE(vec.ok());
  EXPECT_THAT(vec.status().message(), HasSubstr("input 'a' must have rank >= 2"));
  auto rank_mismatch = Infer(MatmulText(), {{F32, {2, 3, 4}}, {F32, {5, 2, 4, 3}}});
  ASSERT_FALSE(rank_mismatch.ok());
  EXPECT_THAT(rank_mismatch.status().message(), HasSubstr("needs 'a' of the same rank"));
  auto batch_mismatch = Infer(MatmulText(), {{F32, {2, 3, 4}}, {F32, {5, 4, 3}}});
  ASSERT_FALSE(batch_mismatch.ok());
  EXPECT_THAT(batch_mismatch.status().message(), HasSubstr("differ in dim 0"));
  auto dtypes = Infer(MatmulText(), {{F32, {2, 4}}, {F64, {4, 3}}});
  ASSERT_FALSE(dtypes.ok());
  auto ints = Infer(MatmulText(), {{I64, {2, 4}}, {I64, {4, 3}}});
  ASSERT_FALSE(ints.ok());
  EXPECT_THAT(ints.status().message(), HasSubstr("must be F32, F64, BF16 or F16"));
}

TEST(MatmulAccumulateShapeTest, TheBufferMustHoldTheProduct) {
  const std::string text = absl::StrCat(R"pb(type: "matmul_accumulate" input: ["a", "b", "acc"] output: ["acc"] )pb",
                                        Attrs(true, false));
  auto ok = Infer(text, {{F32, {-1, 784}}, {F32, {-1, 256}}, {F32, {784, 256}}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0], (TensorType{F32, {784, 256}}));
  auto wrong = Infer(text, {{F32, {-1, 784}}, {F32, {-1, 256}}, {F32, {256, 784}}});
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("does not hold op(a) @ op(b)"));
  auto batched = Infer(text, {{F32, {-1, 8, 784}}, {F32, {-1, 8, 256}}, {F32, {784, 256}}});
  ASSERT_FALSE(batched.ok());
  EXPECT_THAT(batched.status().message(), HasSubstr("must be 2-D"));
}

TEST(MatmulGradTest, EmitsTheTransposesForEachLayout) {
  // a [-1, 5, 7] @ b [7, 3]: da is a matmul against b^T, db the shared-weight helper.
  std::map<std::string, TensorType> types{
      {"a", {F32, {-1, 5, 7}}}, {"b", {F32, {7, 3}}}, {"y", {F32, {-1, 5, 3}}}};
  std::vector<std::string> names;
  auto ops = MakeGradOps(ParseOp(MatmulText()), types, {true, true}, &names);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 2u);
  EXPECT_EQ((*ops)[0].type(), "matmul");
  EXPECT_TRUE((*ops)[0].attr().at("transpose_b").b());
  EXPECT_EQ((*ops)[1].type(), "matmul_shared_b_grad_b");
  // Only what is needed.
  auto only_b = MakeGradOps(ParseOp(MatmulText()), types, {false, true}, &names);
  ASSERT_TRUE(only_b.ok()) << only_b.status();
  EXPECT_EQ(only_b->size(), 1u);
}

// matmul_bias (the GPU plans' fused matmul then add): in F32 and F64 the bits
// of matmul then add; with BF16 operands the float product of the widened
// values plus the bias, in F32 (never rounded to bf16); every transpose_b and
// a batched a.
TEST(MatmulBiasTest, EqualsMatmulThenAdd) {
  for (DataType dtype : {F32, F64}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " transpose_b=", tb));
      const Tensor a = Make(dtype, {2, 5, 7}, 1), b = Make(dtype, tb ? Shape{3, 7} : Shape{7, 3}, 2),
                   bias = Make(dtype, {3}, 3);
      std::map<std::string, Tensor> env{{"a", a}, {"b", b}, {"bias", bias}};
      ASSERT_TRUE(RunOp(ParseOp(absl::StrCat(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["y"] )",
                                             "attr { key: \"transpose_b\" value { b: ", tb ? "true" : "false", " } }")),
                        &env)
                      .ok());
      auto xw = RunBinary("matmul", a, b, false, tb);
      ASSERT_TRUE(xw.ok()) << xw.status();
      std::map<std::string, Tensor> add_env{{"x", *xw}, {"b", bias}};
      ASSERT_TRUE(RunOp(ParseOp(R"(type: "add" input: ["x", "b"] output: ["y"])"), &add_env).ok());
      EXPECT_EQ(TensorValues(env["y"]), TensorValues(add_env["y"]));
      EXPECT_EQ(env["y"].shape(), (Shape{2, 5, 3}));
    }
  }
  const Tensor a16 = Make(BF16, {4, 6}, 4), b16 = Make(BF16, {6, 5}, 5), bias = Make(F32, {5}, 6);
  std::map<std::string, Tensor> env{{"a", a16}, {"b", b16}, {"bias", bias}};
  auto s = RunOp(ParseOp(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["y"])"), &env);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(env["y"].dtype(), F32);
  const std::vector<double> av = TensorValues(a16), bv = TensorValues(b16), biasv = TensorValues(bias),
                            got = TensorValues(env["y"]);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 5; ++j) {
      double want = 0;
      for (int k = 0; k < 6; ++k) want += av[i * 6 + k] * bv[k * 5 + j];
      want += biasv[j];
      EXPECT_NEAR(got[i * 5 + j], want, 1e-5 * (std::abs(want) + 1)) << i << ", " << j;
    }
  }
  // The schema: bias [N] of y's dtype; BF16 operands take an F32 bias.
  std::map<std::string, Tensor> bad{{"a", a16}, {"b", b16}, {"bias", Make(F32, {4}, 7)}};
  auto refused = RunOp(ParseOp(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["y"])"), &bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("bias"));
}

// The memory plan counts a 16-bit bias's float result as it counts
// out_dtype's (and matmul_bias_gelu's float z as z_dtype's): the same
// workspace as the op over an F32 bias storing 16 bits, and more than the
// float y's.
TEST(MatmulBiasTest, A16BitBiasCountsItsFloatResultLikeOutDtype) {
  for (const char* type : {"matmul_bias", "matmul_bias_gelu"}) {
    const bool gelu = std::string(type) == "matmul_bias_gelu";
    SCOPED_TRACE(type);
    const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace(type, DEVICE_CPU);
    ASSERT_NE(ws, nullptr);
    const Op op = ParseOp(absl::StrCat(
        "type: \"", type, "\" input: [\"a\", \"b\", \"bias\"] output: ", gelu ? "[\"y\", \"z\"]" : "\"y\""));
    auto bytes = [&](DataType bias, DataType out) {
      KernelDef def;
      def.op = &op;
      def.input_types = {TensorType{BF16, {4, 16}}, TensorType{BF16, {16, 24}}, TensorType{bias, {24}}};
      def.output_types = {TensorType{out, {4, 24}}};
      if (gelu) def.output_types.push_back(TensorType{out, {4, 24}});
      const absl::StatusOr<int64_t> got = (*ws)(def, 1);
      EXPECT_TRUE(got.ok()) << got.status();
      return got.ok() ? *got : -1;
    };
    EXPECT_EQ(bytes(BF16, BF16), bytes(F32, BF16));
    EXPECT_EQ(bytes(BF16, BF16), bytes(F32, F32) + 4 * 24 * 4);
  }
}

// matmul_bias with a residual (the GPU plans' matmul_bias fused with the
// residual connection's add): the bits of matmul_bias then add(r, y), in F32
// and F64 and for BF16 operands into F32, batched a and both transpose_b.
// The schema and the kernel refuse a residual of another shape or dtype, a
// 16-bit y (out_dtype), and the op with a residual has no gradient.
TEST(MatmulBiasTest, WithAResidualEqualsMatmulBiasThenAdd) {
  for (DataType dtype : {F32, F64, BF16}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " transpose_b=", tb));
      const DataType out = dtype == BF16 ? F32 : dtype;
      const Tensor a = Make(dtype, {2, 5, 7}, 1), b = Make(dtype, tb ? Shape{3, 7} : Shape{7, 3}, 2),
                   bias = Make(out, {3}, 3), r = Make(out, {2, 5, 3}, 4);
      const std::string attr = absl::StrCat("attr { key: \"transpose_b\" value { b: ", tb ? "true" : "false", " } }");
      std::map<std::string, Tensor> env{{"a", a}, {"b", b}, {"bias", bias}, {"r", r}};
      auto fused = RunOp(
          ParseOp(absl::StrCat(R"(type: "matmul_bias" input: ["a", "b", "bias", "r"] output: ["h"] )", attr)), &env);
      ASSERT_TRUE(fused.ok()) << fused;
      auto plain = RunOp(ParseOp(absl::StrCat(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["y"] )", attr)),
                         &env);
      ASSERT_TRUE(plain.ok()) << plain;
      ASSERT_TRUE(RunOp(ParseOp(R"(type: "add" input: ["r", "y"] output: ["ry"])"), &env).ok());
      ASSERT_TRUE(RunOp(ParseOp(R"(type: "add" input: ["y", "r"] output: ["yr"])"), &env).ok());
      EXPECT_EQ(env["h"].dtype(), out);
      EXPECT_EQ(env["h"].shape(), (Shape{2, 5, 3}));
      EXPECT_EQ(TensorValues(env["h"]), TensorValues(env["ry"]));
      EXPECT_EQ(TensorValues(env["h"]), TensorValues(env["yr"]));
      EXPECT_NE(TensorValues(env["h"]), TensorValues(env["y"]));  // the residual was added
    }
  }
  const std::string op = R"(type: "matmul_bias" input: ["a", "b", "bias", "r"] output: ["h"])";
  const Tensor a = Make(F32, {4, 6}, 4), b = Make(F32, {6, 5}, 5), bias = Make(F32, {5}, 6);
  for (const Tensor& r : {Make(F32, {5}, 7), Make(F32, {4, 1}, 7), Make(F64, {4, 5}, 7)}) {
    SCOPED_TRACE(absl::StrCat("residual ", DataTypeName(r.dtype()), ShapeString(r.shape())));
    std::map<std::string, Tensor> bad{{"a", a}, {"b", b}, {"bias", bias}, {"r", r}};
    auto refused = RunOp(ParseOp(op), &bad);
    ASSERT_FALSE(refused.ok());
    EXPECT_THAT(refused.message(), HasSubstr("residual"));
    // The kernel itself, without the schema's shape function.
    auto kernel = RunKernelOnly(ParseOp(op), bad);
    ASSERT_FALSE(kernel.ok());
    EXPECT_THAT(kernel.message(), HasSubstr("residual"));
  }
  // BF16 operands stored in BF16 (out_dtype): no residual.
  std::map<std::string, Tensor> low{
      {"a", Make(BF16, {4, 6}, 4)}, {"b", Make(BF16, {6, 5}, 5)}, {"bias", bias}, {"r", Make(F32, {4, 5}, 7)}};
  const std::string stored = absl::StrCat(op, R"( attr { key: "out_dtype" value { s: "BF16" } })");
  auto refused = RunOp(ParseOp(stored), &low);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("out_dtype"));
  auto kernel = RunKernelOnly(ParseOp(stored), low);
  ASSERT_FALSE(kernel.ok());
  EXPECT_THAT(kernel.message(), HasSubstr("out_dtype"));
  // No gradient: the fusion runs after autodiff.
  std::vector<std::string> names;
  const std::map<std::string, TensorType> types{
      {"a", TypeOf(a)}, {"b", TypeOf(b)}, {"bias", TypeOf(bias)}, {"r", {F32, {4, 5}}}, {"h", {F32, {4, 5}}}};
  auto grads = MakeGradOps(ParseOp(op), types, {true, true, true, true}, &names);
  ASSERT_FALSE(grads.ok());
  EXPECT_THAT(grads.status().message(), HasSubstr("residual"));
}

// matmul_bias_gelu (the GPU plans' matmul_bias fused with a tanh-form gelu):
// z has matmul_bias's bits and y the gelu kernel's over z, in F32, F64 and
// with BF16 operands (F32 y and z).
TEST(MatmulBiasGeluTest, EqualsMatmulBiasThenTanhGelu) {
  for (DataType dtype : {F32, F64, BF16}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " transpose_b=", tb));
      const DataType out = dtype == BF16 ? F32 : dtype;
      const Tensor a = Make(dtype, {2, 5, 7}, 1), b = Make(dtype, tb ? Shape{3, 7} : Shape{7, 3}, 2),
                   bias = Make(out, {3}, 3);
      const std::string tb_attr =
          absl::StrCat("attr { key: \"transpose_b\" value { b: ", tb ? "true" : "false", " } }");
      std::map<std::string, Tensor> env{{"a", a}, {"b", b}, {"bias", bias}};
      const std::string fused = R"(type: "matmul_bias_gelu" input: ["a", "b", "bias"] output: ["y", "z"] )";
      ASSERT_TRUE(RunOp(ParseOp(absl::StrCat(fused, tb_attr)), &env).ok());
      std::map<std::string, Tensor> ref{{"a", a}, {"b", b}, {"bias", bias}};
      ASSERT_TRUE(
          RunOp(ParseOp(absl::StrCat(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["z"] )", tb_attr)), &ref)
              .ok());
      ASSERT_TRUE(RunOp(ParseOp(R"(type: "gelu" input: ["z"] output: ["y"]
                                   attr { key: "approximate" value { s: "tanh" } })"),
                        &ref)
                      .ok());
      EXPECT_EQ(env["z"].dtype(), out);
      EXPECT_EQ(env["y"].dtype(), out);
      EXPECT_EQ(env["y"].shape(), (Shape{2, 5, 3}));
      EXPECT_EQ(TensorValues(env["z"]), TensorValues(ref["z"]));
      EXPECT_EQ(TensorValues(env["y"]), TensorValues(ref["y"]));
    }
  }
  // An F16 bias beside F32 operands is refused by the schema.
  std::map<std::string, Tensor> bad{
      {"a", Make(F32, {4, 6}, 4)}, {"b", Make(F32, {6, 5}, 5)}, {"bias", Make(F16, {5}, 6)}};
  auto refused = RunOp(ParseOp(R"(type: "matmul_bias_gelu" input: ["a", "b", "bias"] output: ["y", "z"])"), &bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("input 'bias' is F16, expected F32"));
}

Tensor Cast(const Tensor& x, const std::string& dtype);

// A bias of the 16-bit operands' own type (passes/cast_bias: torch
// autocast's bf16 bias): widened and added in float, y (and matmul_bias_gelu's
// z) stored in that type, each rounded once. The bits of the same op over
// the widened bias with out_dtype (and z_dtype), in BF16 and F16, both
// transpose_b and a batched a. The schema refuses out_dtype and z_dtype
// beside a 16-bit bias (the kernels alone would store 16 bits either way),
// the schema and the kernel a residual (its sum is float), and autodiff a
// gradient for the bias (a's and b's are matmul's).
TEST(MatmulBiasTest, A16BitBiasIsAddedInFloatAndYRoundedOnce) {
  for (DataType low : {BF16, F16}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(low), " transpose_b=", tb));
      const std::string name = DataTypeName(low);
      const Tensor a = Make(low, {2, 5, 7}, 1), b = Make(low, tb ? Shape{16, 7} : Shape{7, 16}, 2),
                   bias = Make(low, {16}, 3);
      const Tensor wide = Cast(bias, "F32");
      const std::string tb_attr =
          absl::StrCat("attr { key: \"transpose_b\" value { b: ", tb ? "true" : "false", " } }");
      const std::string stored = absl::StrCat(R"( attr { key: "out_dtype" value { s: ")", name, R"(" } })");
      const std::string z_stored = absl::StrCat(R"( attr { key: "z_dtype" value { s: ")", name, R"(" } })");
      std::map<std::string, Tensor> env{{"a", a}, {"b", b}, {"bias", bias}, {"wide", wide}};
      auto run = [&](const std::string& text) {
        const absl::Status s = RunOp(ParseOp(text), &env);
        EXPECT_TRUE(s.ok()) << s << " for " << text;
      };
      run(absl::StrCat(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["y"] )", tb_attr));
      run(absl::StrCat(R"(type: "matmul_bias" input: ["a", "b", "wide"] output: ["y_ref"] )", tb_attr, stored));
      run(absl::StrCat(R"(type: "matmul_bias_gelu" input: ["a", "b", "bias"] output: ["g", "z"] )", tb_attr));
      run(absl::StrCat(R"(type: "matmul_bias_gelu" input: ["a", "b", "wide"] output: ["g_ref", "z_ref"] )", tb_attr,
                       stored, z_stored));
      // And the float y of the float bias, which rounding y gives back.
      run(absl::StrCat(R"(type: "matmul_bias" input: ["a", "b", "wide"] output: ["y_float"] )", tb_attr));
      for (const char* out : {"y", "g", "z"}) {
        EXPECT_EQ(env[out].dtype(), low) << out;
        EXPECT_EQ(env[out].shape(), (Shape{2, 5, 16})) << out;
      }
      EXPECT_EQ(TensorValues(env["y"]), TensorValues(env["y_ref"]));
      EXPECT_EQ(TensorValues(env["g"]), TensorValues(env["g_ref"]));
      EXPECT_EQ(TensorValues(env["z"]), TensorValues(env["z_ref"]));
      EXPECT_EQ(TensorValues(env["y"]), TensorValues(Cast(env["y_float"], name)));
      EXPECT_EQ(TensorValues(env["z"]), TensorValues(env["y"]));  // z is matmul_bias's y
    }
  }
  const Tensor a = Make(BF16, {4, 6}, 4), b = Make(BF16, {6, 8}, 5), bias = Make(BF16, {8}, 6);
  // out_dtype (or z_dtype) beside a 16-bit bias: the schema's words.
  const std::string out_dtype_words = "attr 'out_dtype' BF16 needs an F32 'bias', got BF16[8]";
  const std::string z_dtype_words = "attr 'z_dtype' must be \"\" or the 16-bit type of 'a' and 'b' over an F32 'bias'";
  for (const std::string& text :
       {std::string(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["y"]
                       attr { key: "out_dtype" value { s: "BF16" } })"),
        std::string(R"(type: "matmul_bias_gelu" input: ["a", "b", "bias"] output: ["y", "z"]
                       attr { key: "z_dtype" value { s: "BF16" } })")}) {
    std::map<std::string, Tensor> env{{"a", a}, {"b", b}, {"bias", bias}};
    auto refused = RunOp(ParseOp(text), &env);
    ASSERT_FALSE(refused.ok()) << text;
    EXPECT_THAT(refused.message(), HasSubstr(absl::StrContains(text, "out_dtype") ? out_dtype_words : z_dtype_words))
        << text;
  }
  // A residual: the schema and the kernel alone.
  const std::string residual = R"(type: "matmul_bias" input: ["a", "b", "bias", "r"] output: ["h"])";
  std::map<std::string, Tensor> with_r{{"a", a}, {"b", b}, {"bias", bias}, {"r", Make(F32, {4, 8}, 7)}};
  auto refused = RunOp(ParseOp(residual), &with_r);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("residual"));
  auto kernel = RunKernelOnly(ParseOp(residual), with_r);
  ASSERT_FALSE(kernel.ok());
  EXPECT_THAT(kernel.message(), HasSubstr("residual needs an F32 or F64 y"));
  // A bias of neither type, to the kernel alone (the schema refuses it first).
  std::map<std::string, Tensor> f64_bias{{"a", a}, {"b", b}, {"bias", Make(F64, {8}, 6)}};
  auto wrong = RunKernelOnly(ParseOp(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["y"])"), f64_bias);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.message(), HasSubstr("bias is F64, expected F32 or BF16"));
  // No gradient: the pass runs after autodiff.
  std::vector<std::string> names;
  const std::map<std::string, TensorType> types{
      {"a", TypeOf(a)}, {"b", TypeOf(b)}, {"bias", TypeOf(bias)}, {"y", {BF16, {4, 8}}}};
  auto grads = MakeGradOps(ParseOp(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["y"])"), types,
                           {true, true, true}, &names, /*output_has_grad=*/{true});
  ASSERT_FALSE(grads.ok());
  EXPECT_THAT(grads.status().message(), HasSubstr("BF16 bias has no gradient for it: cast-bias makes it after"));
  // A bias that needs none (a cast FEED): a's and b's gradients, matmul's.
  auto without_bias = MakeGradOps(ParseOp(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["y"])"), types,
                                  {true, true, false}, &names, /*output_has_grad=*/{true});
  ASSERT_TRUE(without_bias.ok()) << without_bias.status();
  EXPECT_FALSE(without_bias->empty());
}

// z_dtype (mixed precision's gelu in bf16, fused): z is matmul_bias's
// float z rounded as out_dtype rounds it, and y the gelu of the float z, as
// without z_dtype (cuBLASLt's GELU_AUX_BIAS with D and aux in bf16): the same
// y bits, BF16 with out_dtype and F32 without.
TEST(MatmulBiasGeluTest, ZDtypeStoresTheRoundedPreActivation) {
  const Tensor a = Make(BF16, {2, 5, 7}, 1), b = Make(BF16, {7, 16}, 2), bias = Make(F32, {16}, 3);
  auto run = [&](const std::string& attrs) {
    std::map<std::string, Tensor> env{{"a", a}, {"b", b}, {"bias", bias}};
    const absl::Status s = RunOp(
        ParseOp(absl::StrCat(R"(type: "matmul_bias_gelu" input: ["a", "b", "bias"] output: ["y", "z"] )", attrs)),
        &env);
    EXPECT_TRUE(s.ok()) << s;
    return env;
  };
  const std::string z_bf16 = R"(attr { key: "z_dtype" value { s: "BF16" } })";
  const std::string y_bf16 = R"(attr { key: "out_dtype" value { s: "BF16" } })";
  std::map<std::string, Tensor> rounded{{"a", a}, {"b", b}, {"bias", bias}};
  ASSERT_TRUE(RunOp(ParseOp(absl::StrCat(R"(type: "matmul_bias" input: ["a", "b", "bias"] output: ["z"] )", y_bf16)),
                    &rounded)
                  .ok());
  for (bool stored_y : {true, false}) {
    SCOPED_TRACE(stored_y ? "bf16 y" : "float y");
    auto fused = run(stored_y ? absl::StrCat(z_bf16, " ", y_bf16) : z_bf16);
    auto plain = run(stored_y ? y_bf16 : "");
    EXPECT_EQ(fused["z"].dtype(), BF16);
    EXPECT_EQ(TensorValues(fused["z"]), TensorValues(rounded["z"]));
    EXPECT_EQ(fused["y"].dtype(), stored_y ? BF16 : F32);
    EXPECT_EQ(TensorValues(fused["y"]), TensorValues(plain["y"]));
    EXPECT_EQ(plain["z"].dtype(), F32);
  }
  // Only a's 16-bit type over an F32 bias.
  std::map<std::string, Tensor> bad{{"a", a}, {"b", b}, {"bias", bias}};
  auto refused = RunOp(ParseOp(R"(type: "matmul_bias_gelu" input: ["a", "b", "bias"] output: ["y", "z"]
                                  attr { key: "z_dtype" value { s: "F16" } })"),
                       &bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("attr 'z_dtype'"));
}

// matmul_gelu_grad (a gelu's output-gradient GEMM fused with the tanh-form
// gelu_grad reading it): in F32 and F64 the bits of matmul then gelu_grad;
// with BF16 / F16 operands those of the float ops on the widened operands,
// cast once (the product is never rounded to 16 bits), which is one
// rounding fewer than the unfused 16-bit ops, within a 16-bit spacing of
// them.
std::map<std::string, Tensor> RunMatmulGeluGrad(const Tensor& a, const Tensor& b, const Tensor& z, bool tb) {
  std::map<std::string, Tensor> env{{"a", a}, {"b", b}, {"z", z}};
  const absl::Status s = RunOp(
      ParseOp(absl::StrCat(R"(type: "matmul_gelu_grad" input: ["a", "b", "z"] output: ["dz"] )",
                           "attr { key: \"transpose_b\" value { b: ", tb ? "true" : "false", " } }")),
      &env);
  EXPECT_TRUE(s.ok()) << s;
  return env;
}

Tensor MatmulThenGeluGrad(const Tensor& a, const Tensor& b, const Tensor& z, bool tb) {
  std::map<std::string, Tensor> env{{"a", a}, {"b", b}, {"z", z}};
  EXPECT_TRUE(RunOp(ParseOp(absl::StrCat(R"(type: "matmul" input: ["a", "b"] output: ["g"] )", Attrs(false, tb))), &env)
                  .ok());
  const absl::Status s = RunOp(ParseOp(R"(type: "gelu_grad" input: ["z", "g"] output: ["dz"]
                                          attr { key: "approximate" value { s: "tanh" } })"),
                               &env);
  EXPECT_TRUE(s.ok()) << s;
  return env["dz"];
}

TEST(MatmulGeluGradTest, EqualsMatmulThenTanhGeluGrad) {
  for (DataType dtype : {F32, F64}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " transpose_b=", tb));
      // z spans the derivative's range: negative, near 0, past 3.
      const Tensor a = Make(dtype, {2, 5, 7}, 1), b = Make(dtype, tb ? Shape{16, 7} : Shape{7, 16}, 2);
      std::vector<double> zs(2 * 5 * 16);
      for (size_t i = 0; i < zs.size(); ++i) zs[i] = 4.0 * std::sin(0.91 * i + 0.3);
      const Tensor z = MakeTensor(dtype, {2, 5, 16}, zs);
      std::map<std::string, Tensor> fused = RunMatmulGeluGrad(a, b, z, tb);
      EXPECT_EQ(fused["dz"].dtype(), dtype);
      EXPECT_EQ(fused["dz"].shape(), (Shape{2, 5, 16}));
      EXPECT_EQ(TensorValues(fused["dz"]), TensorValues(MatmulThenGeluGrad(a, b, z, tb)));
    }
  }
  for (const char* half : {"BF16", "F16"}) {
    SCOPED_TRACE(half);
    DataType dtype = DT_INVALID;
    ASSERT_TRUE(DataType_Parse(half, &dtype));
    const Tensor a = Cast(Make(F32, {3, 4, 9}, 1), half), b = Cast(Make(F32, {9, 24}, 2), half);
    std::vector<double> zs(3 * 4 * 24);
    for (size_t i = 0; i < zs.size(); ++i) zs[i] = 4.0 * std::sin(0.91 * i + 0.3);
    const Tensor z = Cast(MakeTensor(F32, {3, 4, 24}, zs), half);
    std::map<std::string, Tensor> fused = RunMatmulGeluGrad(a, b, z, false);
    EXPECT_EQ(fused["dz"].dtype(), dtype);
    const Tensor wide = Cast(MatmulThenGeluGrad(Cast(a, "F32"), Cast(b, "F32"), Cast(z, "F32"), false), half);
    EXPECT_EQ(TensorValues(fused["dz"]), TensorValues(wide));
    // The unfused 16-bit ops round the product first: at most one 16-bit
    // spacing of the value apart (2^-7 relative for BF16, 2^-10 for F16),
    // and not the same bits everywhere.
    const std::vector<double> got = TensorValues(fused["dz"]), unfused = TensorValues(MatmulThenGeluGrad(a, b, z, false));
    const double ulp = dtype == BF16 ? 1.0 / 128 : 1.0 / 1024;
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LE(std::abs(got[i] - unfused[i]), 2 * ulp * std::abs(unfused[i]) + 1e-30) << i;
      differ += got[i] != unfused[i];
    }
    EXPECT_GT(differ, 0);
  }
}

TEST(MatmulGeluGradTest, RefusesMismatchedOperands) {
  const std::string op = R"(type: "matmul_gelu_grad" input: ["a", "b", "z"] output: ["dz"])";
  auto infer = [&](const std::vector<TensorType>& in) { return Infer(op, in); };
  EXPECT_TRUE(infer({{F32, {-1, 5, 7}}, {F32, {7, 3}}, {F32, {-1, 5, 3}}}).ok());
  auto z_shape = infer({{F32, {2, 5, 7}}, {F32, {7, 3}}, {F32, {2, 5, 4}}});
  ASSERT_FALSE(z_shape.ok());
  EXPECT_THAT(z_shape.status().message(), HasSubstr("input 'z'"));
  auto z_dtype = infer({{BF16, {2, 5, 7}}, {BF16, {7, 3}}, {F32, {2, 5, 3}}});
  ASSERT_FALSE(z_dtype.ok());
  EXPECT_THAT(z_dtype.status().message(), HasSubstr("'z'"));
  auto batched_b = infer({{F32, {2, 5, 7}}, {F32, {2, 7, 3}}, {F32, {2, 5, 3}}});
  ASSERT_FALSE(batched_b.ok());
  EXPECT_THAT(batched_b.status().message(), HasSubstr("'b'"));
  // The kernel refuses what the schema does, in its words.
  std::map<std::string, Tensor> bad{{"a", Make(F32, {2, 5, 7}, 1)}, {"b", Make(F32, {7, 3}, 2)},
                                    {"z", Make(F32, {2, 5, 4}, 3)}};
  auto refused = RunKernelOnly(ParseOp(op), bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("matmul_gelu_grad: z"));
}

// matmul_bias_grad_b (the GPU plans' weight-gradient GEMM fused with the
// bias's sum): in F32 and F64 db has the bits of matmul_shared_b_grad_b (and
// of the 2-D transposed matmul autodiff writes for a 2-D a) and dbias those of
// sum_to_like over the same dy. With BF16 a and dy both are F32: db rounded
// to bf16 is the BF16 weight gradient, dbias the sum of the bf16 dy widened.
std::map<std::string, Tensor> RunBiasGradB(const Tensor& a, const Tensor& dy, bool tb) {
  std::map<std::string, Tensor> env{{"a", a}, {"dy", dy}};
  const absl::Status s = RunOp(
      ParseOp(absl::StrCat(R"(type: "matmul_bias_grad_b" input: ["a", "dy"] output: ["db", "dbias"] )",
                           "attr { key: \"transpose_b\" value { b: ", tb ? "true" : "false", " } }")),
      &env);
  EXPECT_TRUE(s.ok()) << s;
  return env;
}

Tensor SumToLike(const Tensor& x, const Tensor& like) {
  std::map<std::string, Tensor> env{{"x", x}, {"like", like}};
  const absl::Status s = RunOp(ParseOp(R"(type: "sum_to_like" input: ["x", "like"] output: ["y"])"), &env);
  EXPECT_TRUE(s.ok()) << s;
  return env["y"];
}

Tensor Cast(const Tensor& x, const std::string& dtype) {
  std::map<std::string, Tensor> env{{"x", x}};
  const absl::Status s = RunOp(
      ParseOp(absl::StrCat(R"(type: "cast" input: ["x"] output: ["y"] attr { key: "dtype" value { s: ")", dtype,
                           R"(" } })")),
      &env);
  EXPECT_TRUE(s.ok()) << s;
  return env["y"];
}

TEST(MatmulBiasGradBTest, EqualsTheUnfusedGemmAndSum) {
  struct Case {
    Shape a, dy;
  };
  // A batched a, a 2-D one, one row (sum_to_like passes dy through), and
  // enough rows that the sum runs in K chunks.
  const std::vector<Case> cases = {{{2, 5, 7}, {2, 5, 3}}, {{6, 7}, {6, 3}}, {{1, 1, 4}, {1, 1, 5}},
                                   {{4, 300, 6}, {4, 300, 2}}};
  for (DataType dtype : {F32, F64}) {
    for (bool tb : {false, true}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " transpose_b=", tb, " a ", ShapeString(c.a)));
        const Tensor a = Make(dtype, c.a, 1), dy = Make(dtype, c.dy, 2);
        const int64_t n = c.dy.back();
        std::map<std::string, Tensor> fused = RunBiasGradB(a, dy, tb);
        auto db = RunBinary("matmul_shared_b_grad_b", a, dy, false, tb);
        ASSERT_TRUE(db.ok()) << db.status();
        EXPECT_EQ(fused["db"].shape(), db->shape());
        EXPECT_EQ(TensorValues(fused["db"]), TensorValues(*db));
        if (c.a.size() == 2) {
          // What autodiff writes for a 2-D a: x^T @ dy, or dy^T @ x.
          auto mm = tb ? RunBinary("matmul", dy, a, true, false) : RunBinary("matmul", a, dy, true, false);
          ASSERT_TRUE(mm.ok()) << mm.status();
          EXPECT_EQ(TensorValues(fused["db"]), TensorValues(*mm));
        }
        const Tensor dbias = SumToLike(dy, Make(dtype, {n}, 3));
        EXPECT_EQ(fused["dbias"].shape(), (Shape{n}));
        EXPECT_EQ(fused["dbias"].dtype(), dtype);
        EXPECT_EQ(TensorValues(fused["dbias"]), TensorValues(dbias));
      }
    }
  }
  for (bool tb : {false, true}) {
    SCOPED_TRACE(absl::StrCat("BF16 transpose_b=", tb));
    const Tensor a = Make(BF16, {2, 9, 7}, 4), dy = Make(BF16, {2, 9, 3}, 5);
    std::map<std::string, Tensor> fused = RunBiasGradB(a, dy, tb);
    ASSERT_EQ(fused["db"].dtype(), F32);
    ASSERT_EQ(fused["dbias"].dtype(), F32);
    auto db16 = RunBinary("matmul_shared_b_grad_b", a, dy, false, tb);
    ASSERT_TRUE(db16.ok()) << db16.status();
    EXPECT_EQ(TensorValues(Cast(fused["db"], "BF16")), TensorValues(*db16));
    EXPECT_EQ(TensorValues(fused["dbias"]), TensorValues(SumToLike(Cast(dy, "F32"), Make(F32, {3}, 6))));
  }
  // The schema: dy's rows must be a's.
  std::map<std::string, Tensor> bad{{"a", Make(F32, {2, 5, 7}, 1)}, {"dy", Make(F32, {2, 4, 3}, 2)}};
  auto refused = RunOp(ParseOp(R"(type: "matmul_bias_grad_b" input: ["a", "dy"] output: ["db", "dbias"])"), &bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("M=5"));
}

}  // namespace
}  // namespace strata
