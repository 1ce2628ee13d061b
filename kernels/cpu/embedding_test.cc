#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr char kEmbedding[] = R"pb(type: "embedding" input: ["ids", "table"] output: "y")pb";

// table[v][d] = 10 v + d, so every gathered value names its row.
Tensor Table(DataType dtype, int64_t V, int64_t D) {
  std::vector<double> v(V * D);
  for (int64_t r = 0; r < V; ++r)
    for (int64_t d = 0; d < D; ++d) v[r * D + d] = 10.0 * r + d;
  return MakeTensor(dtype, {V, D}, v);
}

TEST(EmbeddingTest, GathersRowsForAnyIdShape) {
  for (DataType dt : {F32, F64}) {
    std::map<std::string, Tensor> env{{"ids", MakeTensor(I64, {2, 2}, {3, 0, 3, 1})}, {"table", Table(dt, 4, 3)}};
    auto s = RunOp(ParseOp(kEmbedding), &env);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(TensorNear(env["y"], {2, 2, 3}, {30, 31, 32, 0, 1, 2, 30, 31, 32, 10, 11, 12}, 0));
  }
}

TEST(EmbeddingTest, IdsOutsideTheTableAreAnError) {
  for (double bad : {4.0, -1.0}) {
    std::map<std::string, Tensor> env{{"ids", MakeTensor(I64, {3}, {0, bad, 1})}, {"table", Table(F32, 4, 2)}};
    auto s = RunOp(ParseOp(kEmbedding), &env);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("id ", static_cast<int>(bad), " at index 1")));
    EXPECT_THAT(s.message(), HasSubstr("[0, 4)"));
  }
}

TEST(EmbeddingTest, GradientAddsUpRepeatedIds) {
  // ids [1, 3, 1, 0, 1]: row 1 gets dy rows 0, 2 and 4; row 3 dy row 1; row 0 dy row 3; rows 2, 4 nothing.
  std::map<std::string, Tensor> env{
      {"ids", MakeTensor(I64, {5}, {1, 3, 1, 0, 1})},
      {"dy", MakeTensor(F64, {5, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10})}};
  auto s = RunOp(ParseOp(R"pb(type: "embedding_grad" input: ["ids", "dy"] output: "dtable"
                              attr { key: "num_embeddings" value { i: 5 } })pb"),
                 &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["dtable"], {5, 2}, {7, 8, 15, 18, 0, 0, 3, 4, 0, 0}, 0));
}

TEST(EmbeddingTest, GradientOfManyIdsMatchesASerialSum) {
  const int64_t n = 20000, V = 7, D = 33;
  std::vector<double> ids(n), dy(n * D);
  for (int64_t i = 0; i < n; ++i) ids[i] = (i * 5) % V;
  for (int64_t i = 0; i < n * D; ++i) dy[i] = (i % 13) * 0.25;
  std::vector<double> want(V * D, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d) want[static_cast<int64_t>(ids[i]) * D + d] += dy[i * D + d];
  std::map<std::string, Tensor> env{{"ids", MakeTensor(I64, {n}, ids)}, {"dy", MakeTensor(F64, {n, D}, dy)}};
  auto s = RunOp(ParseOp(R"pb(type: "embedding_grad" input: ["ids", "dy"] output: "dtable"
                              attr { key: "num_embeddings" value { i: 7 } })pb"),
                 &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["dtable"], {V, D}, want, 0));
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

TEST(EmbeddingShapeTest, AppendsTheEmbeddingDimAndChecksDtypes) {
  auto ok = Infer(kEmbedding, {{I64, {-1, 16}}, {F32, {1000, 64}}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0], (TensorType{F32, {-1, 16, 64}}));
  auto float_ids = Infer(kEmbedding, {{F32, {-1, 16}}, {F32, {1000, 64}}});
  ASSERT_FALSE(float_ids.ok());
  EXPECT_THAT(float_ids.status().message(), HasSubstr("input 'ids' must be I64"));
  auto table3d = Infer(kEmbedding, {{I64, {-1}}, {F32, {10, 4, 4}}});
  ASSERT_FALSE(table3d.ok());
  EXPECT_THAT(table3d.status().message(), HasSubstr("input 'table' must have rank 2"));
}

TEST(EmbeddingGradTest, OnlyTheTableGetsAGradient) {
  std::map<std::string, TensorType> types{
      {"ids", {I64, {-1, 4}}}, {"table", {F32, {50, 8}}}, {"y", {F32, {-1, 4, 8}}}};
  std::vector<std::string> names;
  auto ops = MakeGradOps(ParseOp(kEmbedding), types, {false, true}, &names);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_EQ(ops->size(), 1u);
  EXPECT_EQ((*ops)[0].type(), "embedding_grad");
  EXPECT_EQ((*ops)[0].attr().at("num_embeddings").i(), 50);
}

}  // namespace
}  // namespace strata
