// Forward values of the shape-op kernels (against hand-written values or an
// index-by-index reference), and the shape functions' handling of the batch
// dim and of bad attrs.

#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

std::vector<double> Iota(int64_t n, double start = 0) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Runs one op on `inputs` and returns the env (fails the test on error).
std::map<std::string, Tensor> RunOne(const std::string& op_text, std::map<std::string, Tensor> inputs) {
  absl::Status s = RunOps({ParseOp(op_text)}, &inputs);
  EXPECT_TRUE(s.ok()) << s.message();
  return inputs;
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

// Expects the shape function to reject the op with a message containing `text`.
void ExpectRejected(const std::string& op_text, std::vector<TensorType> inputs, const std::string& text) {
  auto types = Infer(op_text, std::move(inputs));
  ASSERT_FALSE(types.ok()) << "accepted: " << op_text;
  EXPECT_EQ(types.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(types.status().message(), text)) << types.status().message();
}

std::vector<int64_t> InferredShape(const std::string& op_text, std::vector<TensorType> inputs, int output = 0) {
  auto types = Infer(op_text, std::move(inputs));
  EXPECT_TRUE(types.ok()) << types.status().message();
  if (!types.ok()) return {};
  const Shape& shape = (*types)[output].shape;
  return std::vector<int64_t>(shape.begin(), shape.end());
}

// ---- reshape / flatten -----------------------------------------------------

constexpr char kReshapeCopyInfer[] = R"pb(type: "reshape" input: "x" output: "y"
                                          attr { key: "shape" value { list { i: [0, -1, 2] } } })pb";

TEST(Reshape, CopiesAndInfersDimsAndSharesTheBuffer) {
  for (DataType dtype : {F32, F64, I64}) {
    auto env = RunOne(kReshapeCopyInfer, {{"x", MakeTensor(dtype, {2, 3, 4}, Iota(24))}});
    EXPECT_TRUE(TensorNear(env["y"], {2, 6, 2}, Iota(24), 0)) << DataTypeName(dtype);
    EXPECT_EQ(env["y"].raw_data(), env["x"].raw_data());
  }
}

TEST(Reshape, KeepsTheBatchDimInTheInferredEntry) {
  auto reshape = [](const std::string& dims) {
    return absl::StrCat(R"pb(type: "reshape" input: "x" output: "y" attr { key: "shape" value { list { i: )pb", dims,
                        " } } }");
  };
  EXPECT_EQ(InferredShape(reshape("[-1, 28, 28]"), {{F32, {-1, 784}}}), (std::vector<int64_t>{-1, 28, 28}));
  EXPECT_EQ(InferredShape(reshape("[0, 784]"), {{F32, {-1, 28, 28}}}), (std::vector<int64_t>{-1, 784}));
  EXPECT_EQ(InferredShape(reshape("[4, -1]"), {{F32, {2, 6}}}), (std::vector<int64_t>{4, 3}));
  ExpectRejected(reshape("[-1, 100]"), {{F32, {-1, 784}}}, "must hold 784 elements");
  ExpectRejected(reshape("[-1, 8]"), {{F32, {-1, 4, 8}}}, "must hold 32 elements");
  ExpectRejected(reshape("[784]"), {{F32, {-1, 784}}}, "batch dim (-1) must go to a -1 or 0 entry");
  ExpectRejected(reshape("[-1, 4]"), {{F32, {6}}}, "do not divide");
  ExpectRejected(reshape("[5]"), {{F32, {2, 3}}}, "6 elements into 5");
  ExpectRejected(reshape("[-1, -1]"), {{F32, {2, 3}}}, "more than one -1");
  ExpectRejected(reshape("[-2, 3]"), {{F32, {2, 3}}}, "entry 0 is -2");
  ExpectRejected(reshape("[2, 3, 0]"), {{F32, {6}}}, "entry 2 is 0");
}

// The kernels resolve shapes with their schemas' rules (proto/shape_rules.h):
// a plan that skipped the shape functions is refused in the schemas' words,
// prefixed with the op type.
TEST(ShapeKernels, RefuseWhatTheSchemaRefusesWithItsWords) {
  const std::map<std::string, Tensor> x23{{"x", MakeTensor(F32, {2, 3}, Iota(6))}};
  EXPECT_EQ(RunKernelOnly(ParseOp(R"pb(type: "reshape" input: "x" output: "y"
                                       attr { key: "shape" value { list { i: [5] } } })pb"),
                          x23)
                .message(),
            "reshape: cannot reshape [2, 3] to [5]: 6 elements into 5");
  EXPECT_EQ(RunKernelOnly(ParseOp(R"pb(type: "reshape" input: "x" output: "y"
                                       attr { key: "shape" value { list { i: [-1, 4] } } })pb"),
                          x23)
                .message(),
            "reshape: cannot reshape [2, 3] to [-1, 4]: 6 elements do not divide into dims of 4");
  EXPECT_EQ(RunKernelOnly(ParseOp(R"pb(type: "reshape" input: "x" output: "y"
                                       attr { key: "shape" value { list { i: [-1, -1] } } })pb"),
                          x23)
                .message(),
            "reshape: attr 'shape' [-1, -1] has more than one -1");
  EXPECT_EQ(RunKernelOnly(ParseOp(R"pb(type: "flatten" input: "x" output: "y"
                                       attr { key: "start_axis" value { i: 2 } })pb"),
                          x23)
                .message(),
            "flatten: attr 'start_axis' = 2 is out of range for rank 2 (expected -2 to 1)");
  EXPECT_EQ(RunKernelOnly(ParseOp(R"pb(type: "transpose" input: "x" output: "y"
                                       attr { key: "perm" value { list { i: [1, -1] } } })pb"),
                          x23)
                .message(),
            "transpose: attr 'perm' [1, -1] is not a permutation");
  EXPECT_EQ(RunKernelOnly(ParseOp(R"pb(type: "split" input: "x" output: ["a", "b"]
                                       attr { key: "axis" value { i: 1 } })pb"),
                          x23)
                .message(),
            "split: cannot split a dim of 3 into 2 equal parts; give the sizes in attr 'sections'");
  EXPECT_EQ(RunKernelOnly(ParseOp(R"pb(type: "slice" input: "x" output: "y"
                                       attr { key: "axes" value { list { i: [1, -1] } } }
                                       attr { key: "starts" value { list { i: [0, 0] } } }
                                       attr { key: "ends" value { list { i: [1, 1] } } })pb"),
                          x23)
                .message(),
            "slice: attr 'axes' [1, -1] names axis 1 twice");
}

TEST(Pad, AppendsZerosAlongTheAxis) {
  auto env = RunOne(R"pb(type: "pad" input: "x" output: "y" attr { key: "axis" value { i: 1 } }
                         attr { key: "after" value { i: 2 } })pb",
                    {{"x", MakeTensor(F32, {2, 3}, Iota(6))}});
  EXPECT_TRUE(TensorNear(env["y"], {2, 5}, {0, 1, 2, 0, 0, 3, 4, 5, 0, 0}, 0));
  env = RunOne(R"pb(type: "pad" input: "x" output: "y" attr { key: "after" value { i: 1 } })pb",
               {{"x", MakeTensor(BF16, {2, 2}, Iota(4))}});
  EXPECT_TRUE(TensorNear(env["y"], {3, 2}, {0, 1, 2, 3, 0, 0}, 0));
  EXPECT_EQ(env["y"].dtype(), BF16);
  EXPECT_EQ(InferredShape(R"pb(type: "pad" input: "x" output: "y" attr { key: "axis" value { i: 1 } }
                               attr { key: "after" value { i: 7 } })pb",
                          {{F32, {-1, 50257}}}),
            (std::vector<int64_t>{-1, 50264}));
}

TEST(Flatten, MergesTheGivenAxes) {
  auto env = RunOne(R"pb(type: "flatten" input: "x" output: "y")pb", {{"x", MakeTensor(F32, {2, 3, 4}, Iota(24))}});
  EXPECT_TRUE(TensorNear(env["y"], {2, 12}, Iota(24), 0));
  env = RunOne(R"pb(type: "flatten" input: "x" output: "y" attr { key: "start_axis" value { i: 0 } }
                 attr { key: "end_axis" value { i: 1 } })pb",
            {{"x", MakeTensor(I64, {2, 3, 4}, Iota(24))}});
  EXPECT_TRUE(TensorNear(env["y"], {6, 4}, Iota(24), 0));
  EXPECT_EQ(env["y"].raw_data(), env["x"].raw_data());
}

TEST(Flatten, KeepsTheBatchDimAndRejectsMergingIt) {
  const char* kDefault = R"pb(type: "flatten" input: "x" output: "y")pb";
  EXPECT_EQ(InferredShape(kDefault, {{F32, {-1, 1, 28, 28}}}), (std::vector<int64_t>{-1, 784}));
  EXPECT_EQ(InferredShape(R"pb(type: "flatten" input: "x" output: "y" attr { key: "start_axis" value { i: 0 } }
                               attr { key: "end_axis" value { i: 1 } })pb",
                          {{F32, {-1, 1, 5}}}),
            (std::vector<int64_t>{-1, 5}));
  ExpectRejected(R"pb(type: "flatten" input: "x" output: "y" attr { key: "start_axis" value { i: 0 } })pb",
                 {{F32, {-1, 3, 4}}}, "would merge the batch dim");
  ExpectRejected(R"pb(type: "flatten" input: "x" output: "y" attr { key: "start_axis" value { i: 2 } }
                      attr { key: "end_axis" value { i: 1 } })pb",
                 {{F32, {2, 3, 4}}}, "is after 'end_axis'");
  ExpectRejected(R"pb(type: "flatten" input: "x" output: "y" attr { key: "start_axis" value { i: 3 } })pb",
                 {{F32, {2, 3, 4}}}, "attr 'start_axis' = 3 is out of range");
  ExpectRejected(kDefault, {{F32, {5}}}, "attr 'start_axis' = 1 is out of range for rank 1");
  ExpectRejected(kDefault, {{F32, {}}}, "rank 1 or more");
}

TEST(ReshapeLike, ViewsDyInTheShapeOfLike) {
  auto env = RunOne(R"pb(type: "reshape_like" input: ["dy", "x"] output: "dx")pb",
                 {{"dy", MakeTensor(F64, {6}, Iota(6))}, {"x", MakeTensor(F64, {2, 3}, Iota(6, 10))}});
  EXPECT_TRUE(TensorNear(env["dx"], {2, 3}, Iota(6), 0));
  ExpectRejected(R"pb(type: "reshape_like" input: ["dy", "x"] output: "dx")pb", {{F64, {5}}, {F64, {2, 3}}},
                 "element count");
}

// ---- transpose -------------------------------------------------------------

// y[o] = x[i] with i[perm[k]] = o[k], one element at a time.
std::vector<double> ReferenceTranspose(const std::vector<double>& x, const std::vector<int64_t>& shape,
                                       const std::vector<int64_t>& perm) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> out_shape(rank), x_stride(rank, 1);
  for (int d = rank - 2; d >= 0; --d) x_stride[d] = x_stride[d + 1] * shape[d + 1];
  for (int k = 0; k < rank; ++k) out_shape[k] = shape[perm[k]];
  std::vector<double> y(x.size());
  for (size_t flat = 0; flat < y.size(); ++flat) {
    int64_t rest = static_cast<int64_t>(flat), x_index = 0;
    for (int k = rank - 1; k >= 0; --k) {
      x_index += (rest % out_shape[k]) * x_stride[perm[k]];
      rest /= out_shape[k];
    }
    y[flat] = x[x_index];
  }
  return y;
}

std::string TransposeOp(const std::string& perm) {
  return absl::StrCat(R"pb(type: "transpose" input: "x" output: "y" attr { key: "perm" value { list { i: )pb", perm,
                      " } } }");
}

TEST(Transpose, SwapsMatrixAxes) {
  auto env = RunOne(TransposeOp("[1, 0]"), {{"x", MakeTensor(F32, {2, 3}, {0, 1, 2, 3, 4, 5})}});
  EXPECT_TRUE(TensorNear(env["y"], {3, 2}, {0, 3, 1, 4, 2, 5}, 0));
}

TEST(Transpose, MatchesTheReferenceForEveryDtypeAndPerm) {
  const std::vector<int64_t> shape = {2, 3, 4, 5};
  const std::vector<double> x = Iota(120);
  for (const std::vector<int64_t>& perm : std::vector<std::vector<int64_t>>{
           {0, 1, 2, 3}, {3, 2, 1, 0}, {1, 0, 2, 3}, {2, 0, 3, 1}, {0, 3, 1, 2}}) {
    for (DataType dtype : {F32, F64, I64}) {
      auto env = RunOne(TransposeOp(absl::StrCat("[", absl::StrJoin(perm, ", "), "]")),
                     {{"x", MakeTensor(dtype, Shape(shape.begin(), shape.end()), x)}});
      std::vector<int64_t> out = {shape[perm[0]], shape[perm[1]], shape[perm[2]], shape[perm[3]]};
      EXPECT_TRUE(TensorNear(env["y"], out, ReferenceTranspose(x, shape, perm), 0))
          << DataTypeName(dtype) << " perm " << absl::StrJoin(perm, ",");
    }
  }
}

TEST(Transpose, LargeTensorSplitOverThreads) {
  const std::vector<int64_t> shape = {96, 1000};  // above one thread's chunk
  const std::vector<double> x = Iota(96000);
  auto env = RunOne(TransposeOp("[1, 0]"), {{"x", MakeTensor(F64, {96, 1000}, x)}});
  EXPECT_TRUE(TensorNear(env["y"], {1000, 96}, ReferenceTranspose(x, shape, {1, 0}), 0));
  env = RunOne(TransposeOp("[-1, 0]"), {{"x", MakeTensor(F32, {96, 1000}, x)}});  // negative axes count from the end
  EXPECT_TRUE(TensorNear(env["y"], {1000, 96}, ReferenceTranspose(x, shape, {1, 0}), 0));
}

TEST(Transpose, HandlesScalarsAndEmptyTensors) {
  auto env = RunOne(TransposeOp("[]"), {{"x", MakeTensor(F64, {}, {7})}});
  EXPECT_TRUE(TensorNear(env["y"], {}, {7}, 0));
  env = RunOne(TransposeOp("[1, 0]"), {{"x", MakeTensor(F64, {0, 3}, {})}});
  EXPECT_TRUE(TensorNear(env["y"], {3, 0}, {}, 0));
}

TEST(Transpose, MovesTheBatchDimAndRejectsBadPerms) {
  EXPECT_EQ(InferredShape(TransposeOp("[1, 0, 2]"), {{F32, {-1, 3, 4}}}), (std::vector<int64_t>{3, -1, 4}));
  ExpectRejected(TransposeOp("[0, 0]"), {{F32, {2, 3}}}, "not a permutation");
  ExpectRejected(TransposeOp("[0, 1]"), {{F32, {2, 3, 4}}}, "one entry per input dim (3)");
  ExpectRejected(TransposeOp("[0, 2]"), {{F32, {2, 3}}}, "attr 'perm'[1] = 2 is out of range");
}

// ---- concat / concat_grad ----------------------------------------------------

TEST(Concat, JoinsAlongTheAxis) {
  auto env = RunOne(R"pb(type: "concat" input: ["a", "b"] output: "y" attr { key: "axis" value { i: 1 } })pb",
                 {{"a", MakeTensor(F32, {2, 2}, {1, 2, 3, 4})}, {"b", MakeTensor(F32, {2, 1}, {5, 6})}});
  EXPECT_TRUE(TensorNear(env["y"], {2, 3}, {1, 2, 5, 3, 4, 6}, 0));
  env = RunOne(R"pb(type: "concat" input: ["a", "b", "a"] output: "y")pb",
            {{"a", MakeTensor(I64, {1, 2}, {1, 2})}, {"b", MakeTensor(I64, {2, 2}, {3, 4, 5, 6})}});
  EXPECT_TRUE(TensorNear(env["y"], {4, 2}, {1, 2, 3, 4, 5, 6, 1, 2}, 0));
}

TEST(Concat, LargeInputsSplitOverThreads) {
  // [a | b] along axis 1, rows of 3000 + 1000 elements, 40 rows.
  std::vector<double> a = Iota(40 * 3000), b = Iota(40 * 1000, 1e6), want;
  for (int r = 0; r < 40; ++r) {
    want.insert(want.end(), a.begin() + r * 3000, a.begin() + (r + 1) * 3000);
    want.insert(want.end(), b.begin() + r * 1000, b.begin() + (r + 1) * 1000);
  }
  auto env = RunOne(R"pb(type: "concat" input: ["a", "b"] output: "y" attr { key: "axis" value { i: -1 } })pb",
                 {{"a", MakeTensor(F64, {40, 3000}, a)}, {"b", MakeTensor(F64, {40, 1000}, b)}});
  EXPECT_TRUE(TensorNear(env["y"], {40, 4000}, want, 0));
}

TEST(Concat, ShapeFunctionKeepsTheBatchDimAndRejectsMismatches) {
  const char* kAxis1 = R"pb(type: "concat" input: ["a", "b"] output: "y" attr { key: "axis" value { i: 1 } })pb";
  const char* kAxis0 = R"pb(type: "concat" input: ["a", "b"] output: "y")pb";
  EXPECT_EQ(InferredShape(kAxis1, {{F32, {-1, 3}}, {F32, {-1, 2}}}), (std::vector<int64_t>{-1, 5}));
  ExpectRejected(kAxis0, {{F32, {-1, 3}}, {F32, {-1, 3}}}, "batch dim");
  ExpectRejected(kAxis1, {{F32, {2, 3}}, {F32, {3, 3}}}, "differs from input 0 'a' (F32[2, 3]) in dim 0");
  ExpectRejected(kAxis1, {{F32, {2, 3}}, {F64, {2, 3}}}, "another dtype");
  ExpectRejected(kAxis1, {{F32, {2, 3}}, {F32, {2, 3, 1}}}, "another rank");
  ExpectRejected(kAxis1, {{F32, {3}}, {F32, {3}}}, "attr 'axis' = 1 is out of range");
  ExpectRejected(kAxis0, {{F32, {}}, {F32, {}}}, "scalar");
}

TEST(ConcatGrad, CutsDyIntoPiecesShapedLikeTheInputs) {
  auto env = RunOne(R"pb(type: "concat_grad" input: ["dy", "a", "b"] output: ["da", "db"]
                      attr { key: "axis" value { i: 1 } })pb",
                 {{"dy", MakeTensor(F64, {2, 3}, {1, 2, 5, 3, 4, 6})},
                  {"a", MakeTensor(F64, {2, 2}, {0, 0, 0, 0})},
                  {"b", MakeTensor(F64, {2, 1}, {0, 0})}});
  EXPECT_TRUE(TensorNear(env["da"], {2, 2}, {1, 2, 3, 4}, 0));
  EXPECT_TRUE(TensorNear(env["db"], {2, 1}, {5, 6}, 0));
}

// The gradient is built from types with the batch dim and runs on any batch.
TEST(ConcatGrad, GradientOfABatchedConcatRunsOnConcreteBatches) {
  Op op = ParseOp(R"pb(type: "concat" input: ["a", "b"] output: "y" attr { key: "axis" value { i: 1 } })pb");
  std::vector<std::string> names;
  auto grad = MakeGradOps(op, {{"a", {F32, {-1, 2}}}, {"b", {F32, {-1, 1}}}, {"y", {F32, {-1, 3}}}}, {true, true},
                          &names);
  ASSERT_TRUE(grad.ok()) << grad.status().message();
  for (int batch : {1, 3}) {
    std::map<std::string, Tensor> env{{"a", MakeTensor(F32, {batch, 2}, Iota(batch * 2))},
                                      {"b", MakeTensor(F32, {batch, 1}, Iota(batch))},
                                      {"y@grad", MakeTensor(F32, {batch, 3}, Iota(batch * 3))}};
    ASSERT_TRUE(RunOps(*grad, &env).ok());
    std::vector<double> da, db;
    for (int r = 0; r < batch; ++r) {
      da.push_back(3 * r);
      da.push_back(3 * r + 1);
      db.push_back(3 * r + 2);
    }
    EXPECT_TRUE(TensorNear(env[names[0]], {batch, 2}, da, 0));
    EXPECT_TRUE(TensorNear(env[names[1]], {batch, 1}, db, 0));
  }
}

// ---- split / split_grad ------------------------------------------------------

TEST(Split, CutsIntoEqualParts) {
  auto env = RunOne(R"pb(type: "split" input: "x" output: ["y0", "y1", "y2"])pb",
                 {{"x", MakeTensor(I64, {3, 2}, Iota(6))}});
  EXPECT_TRUE(TensorNear(env["y0"], {1, 2}, {0, 1}, 0));
  EXPECT_TRUE(TensorNear(env["y1"], {1, 2}, {2, 3}, 0));
  EXPECT_TRUE(TensorNear(env["y2"], {1, 2}, {4, 5}, 0));
}

TEST(Split, CutsBySectionsWithTheRestInferred) {
  auto env = RunOne(R"pb(type: "split" input: "x" output: ["y0", "y1", "y2"]
                      attr { key: "axis" value { i: -1 } }
                      attr { key: "sections" value { list { i: [1, -1, 0] } } })pb",
                 {{"x", MakeTensor(F32, {2, 4}, Iota(8))}});
  EXPECT_TRUE(TensorNear(env["y0"], {2, 1}, {0, 4}, 0));
  EXPECT_TRUE(TensorNear(env["y1"], {2, 3}, {1, 2, 3, 5, 6, 7}, 0));
  EXPECT_TRUE(TensorNear(env["y2"], {2, 0}, {}, 0));
}

TEST(Split, ShapeFunctionKeepsTheBatchDimAndRejectsBadSections) {
  const char* kTwoOnAxis1 = R"pb(type: "split" input: "x" output: ["a", "b"] attr { key: "axis" value { i: 1 } })pb";
  EXPECT_EQ(InferredShape(kTwoOnAxis1, {{F32, {-1, 6}}}, 1), (std::vector<int64_t>{-1, 3}));
  ExpectRejected(R"pb(type: "split" input: "x" output: ["a", "b"])pb", {{F32, {-1, 6}}}, "batch dim");
  ExpectRejected(R"pb(type: "split" input: "x" output: ["a", "b", "c"])pb", {{F32, {10}}}, "3 equal parts");
  ExpectRejected(R"pb(type: "split" input: "x" output: ["a", "b"]
                      attr { key: "sections" value { list { i: [3, 4] } } })pb",
                 {{F32, {6}}}, "adds up to 7, not to the dim (6)");
  ExpectRejected(R"pb(type: "split" input: "x" output: ["a", "b"]
                      attr { key: "sections" value { list { i: [3] } } })pb",
                 {{F32, {6}}}, "1 entries for 2 outputs");
  ExpectRejected(R"pb(type: "split" input: "x" output: ["a", "b"]
                      attr { key: "sections" value { list { i: [-1, -1] } } })pb",
                 {{F32, {6}}}, "at most one -1");
  ExpectRejected(R"pb(type: "split" input: "x" output: ["a", "b"]
                      attr { key: "sections" value { list { i: [7, -1] } } })pb",
                 {{F32, {6}}}, "more than the dim");
}

TEST(SplitGrad, FillsMissingPiecesWithZeros) {
  auto env = RunOne(R"pb(type: "split_grad" input: ["x", "d2"] output: "dx"
                      attr { key: "axis" value { i: 1 } }
                      attr { key: "sections" value { list { i: [1, 1, 2] } } }
                      attr { key: "grad_outputs" value { list { i: [2] } } })pb",
                 {{"x", MakeTensor(F64, {2, 4}, Iota(8))}, {"d2", MakeTensor(F64, {2, 2}, {1, 2, 3, 4})}});
  EXPECT_TRUE(TensorNear(env["dx"], {2, 4}, {0, 0, 1, 2, 0, 0, 3, 4}, 0));
}

TEST(SplitGrad, GradientWithAMissingPieceUsesSplitGrad) {
  Op op = ParseOp(R"pb(type: "split" input: "x" output: ["a", "b"])pb");
  std::vector<std::string> names;
  auto grad = MakeGradOps(op, {{"x", {F64, {4, 3}}}, {"a", {F64, {2, 3}}}, {"b", {F64, {2, 3}}}}, {true}, &names,
                          {false, true});
  ASSERT_TRUE(grad.ok()) << grad.status().message();
  ASSERT_EQ(grad->size(), 1u);
  EXPECT_EQ((*grad)[0].type(), "split_grad");
  std::map<std::string, Tensor> env{{"x", MakeTensor(F64, {4, 3}, Iota(12))},
                                    {"b@grad", MakeTensor(F64, {2, 3}, Iota(6, 1))}};
  ASSERT_TRUE(RunOps(*grad, &env).ok());
  EXPECT_TRUE(TensorNear(env[names[0]], {4, 3}, {0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6}, 0));
}

// ---- slice / slice_grad ------------------------------------------------------

constexpr char kSliceTwoAxes[] = R"pb(type: "slice" input: "x" output: "y"
                                      attr { key: "axes" value { list { i: [0, 1] } } }
                                      attr { key: "starts" value { list { i: [1, -3] } } }
                                      attr { key: "ends" value { list { i: [3, 100] } } })pb";

TEST(Slice, CutsAWindowNumpyStyle) {
  // x = arange(20).reshape(4, 5); x[1:3, -3:100] = [[7, 8, 9], [12, 13, 14]].
  for (DataType dtype : {F32, F64, I64}) {
    auto env = RunOne(kSliceTwoAxes, {{"x", MakeTensor(dtype, {4, 5}, Iota(20))}});
    EXPECT_TRUE(TensorNear(env["y"], {2, 3}, {7, 8, 9, 12, 13, 14}, 0)) << DataTypeName(dtype);
  }
  // x[:, :, 1:-1] of arange(12).reshape(2, 1, 6); and an empty window x[..., 4:2].
  auto env = RunOne(R"pb(type: "slice" input: "x" output: "y" attr { key: "axes" value { list { i: [-1] } } }
                      attr { key: "starts" value { list { i: [1] } } }
                      attr { key: "ends" value { list { i: [-1] } } })pb",
                 {{"x", MakeTensor(F64, {2, 1, 6}, Iota(12))}});
  EXPECT_TRUE(TensorNear(env["y"], {2, 1, 4}, {1, 2, 3, 4, 7, 8, 9, 10}, 0));
  env = RunOne(R"pb(type: "slice" input: "x" output: "y" attr { key: "axes" value { list { i: [1] } } }
                 attr { key: "starts" value { list { i: [4] } } }
                 attr { key: "ends" value { list { i: [2] } } })pb",
            {{"x", MakeTensor(F64, {2, 6}, Iota(12))}});
  EXPECT_TRUE(TensorNear(env["y"], {2, 0}, {}, 0));
  // Starts below -dim clamp to 0.
  env = RunOne(R"pb(type: "slice" input: "x" output: "y" attr { key: "axes" value { list { i: [0] } } }
                 attr { key: "starts" value { list { i: [-10] } } }
                 attr { key: "ends" value { list { i: [1] } } })pb",
            {{"x", MakeTensor(F64, {3}, {4, 5, 6})}});
  EXPECT_TRUE(TensorNear(env["y"], {1}, {4}, 0));
}

TEST(Slice, ShapeFunctionKeepsTheBatchDimAndRejectsBadAttrs) {
  EXPECT_EQ(InferredShape(R"pb(type: "slice" input: "x" output: "y" attr { key: "axes" value { list { i: [1] } } }
                               attr { key: "starts" value { list { i: [1] } } }
                               attr { key: "ends" value { list { i: [3] } } })pb",
                          {{F32, {-1, 5}}}),
            (std::vector<int64_t>{-1, 2}));
  EXPECT_EQ(InferredShape(R"pb(type: "slice" input: "x" output: "y" attr { key: "axes" value { list { i: [0] } } }
                               attr { key: "starts" value { list { i: [0] } } }
                               attr { key: "ends" value { list { i: [9223372036854775807] } } })pb",
                          {{F32, {-1, 5}}}),
            (std::vector<int64_t>{-1, 5}));
  ExpectRejected(R"pb(type: "slice" input: "x" output: "y" attr { key: "axes" value { list { i: [0] } } }
                      attr { key: "starts" value { list { i: [0] } } }
                      attr { key: "ends" value { list { i: [2] } } })pb",
                 {{F32, {-1, 5}}}, "the batch dim");
  ExpectRejected(R"pb(type: "slice" input: "x" output: "y" attr { key: "axes" value { list { i: [0, 1] } } }
                      attr { key: "starts" value { list { i: [0] } } }
                      attr { key: "ends" value { list { i: [1, 2] } } })pb",
                 {{F32, {4, 5}}}, "same length");
  ExpectRejected(R"pb(type: "slice" input: "x" output: "y" attr { key: "axes" value { list { i: [1, -1] } } }
                      attr { key: "starts" value { list { i: [0, 0] } } }
                      attr { key: "ends" value { list { i: [1, 1] } } })pb",
                 {{F32, {4, 5}}}, "names axis 1 twice");
  ExpectRejected(R"pb(type: "slice" input: "x" output: "y" attr { key: "axes" value { list { i: [2] } } }
                      attr { key: "starts" value { list { i: [0] } } }
                      attr { key: "ends" value { list { i: [1] } } })pb",
                 {{F32, {4, 5}}}, "attr 'axes'[0] = 2 is out of range");
  ExpectRejected(R"pb(type: "slice" input: "x" output: "y")pb", {{F32, {4, 5}}}, "missing required attr 'axes'");
}

TEST(SliceGrad, PadsDyWithZeros) {
  auto env = RunOne(R"pb(type: "slice_grad" input: ["dy", "x"] output: "dx"
                      attr { key: "axes" value { list { i: [0, 1] } } }
                      attr { key: "starts" value { list { i: [1, -3] } } }
                      attr { key: "ends" value { list { i: [3, 100] } } })pb",
                 {{"dy", MakeTensor(F32, {2, 3}, {1, 2, 3, 4, 5, 6})}, {"x", MakeTensor(F32, {4, 5}, Iota(20))}});
  EXPECT_TRUE(TensorNear(env["dx"], {4, 5}, {0, 0, 0, 0, 0,  //
                                             0, 0, 1, 2, 3,  //
                                             0, 0, 4, 5, 6,  //
                                             0, 0, 0, 0, 0},
                         0));
  ExpectRejected(R"pb(type: "slice_grad" input: ["dy", "x"] output: "dx"
                      attr { key: "axes" value { list { i: [0] } } }
                      attr { key: "starts" value { list { i: [1] } } }
                      attr { key: "ends" value { list { i: [3] } } })pb",
                 {{F32, {3, 5}}, {F32, {4, 5}}}, "not shaped like the slice");
}

TEST(Slice, LargeWindowSplitOverThreads) {
  // x[:, 10:1010] of a [64, 1024] tensor: 64000 elements, several chunks.
  std::vector<double> x = Iota(64 * 1024), want;
  for (int r = 0; r < 64; ++r) {
    for (int c = 10; c < 1010; ++c) want.push_back(x[r * 1024 + c]);
  }
  auto env = RunOne(R"pb(type: "slice" input: "x" output: "y" attr { key: "axes" value { list { i: [1] } } }
                      attr { key: "starts" value { list { i: [10] } } }
                      attr { key: "ends" value { list { i: [1010] } } })pb",
                 {{"x", MakeTensor(F32, {64, 1024}, x)}});
  EXPECT_TRUE(TensorNear(env["y"], {64, 1000}, want, 0));
}

}  // namespace
}  // namespace strata
