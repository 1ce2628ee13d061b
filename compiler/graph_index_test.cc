#include "compiler/graph_index.h"

#include <memory>
#include <string>
#include <vector>

#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::ElementsAre;

Program Parse(const std::string& text) {
  auto p = ParseProgramText(text, "test.pbtxt");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : Program();
}

// clang-format off
constexpr char kProgram[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "w" dtype: F32 shape: [4, 3] kind: PARAM }
  var { name: "h" dtype: F32 shape: [-1, 3] kind: ACTIVATION }
  var { name: "r" dtype: F32 shape: [-1, 3] kind: ACTIVATION }
  op { type: "matmul" input: ["x", "w"] output: ["h"] }
  op { type: "relu" input: ["h"] output: ["r"] }
  op { type: "add" input: ["r", "h"] output: ["s"] }
)pb";
// clang-format on



TEST(GraphIndexTest, NumbersDeclaredVarsFirstThenUndeclaredNames) {
  const Program p = Parse(kProgram);
  GraphIndex index(p);
  EXPECT_EQ(index.num_ids(), 5);
  EXPECT_EQ(index.id("x"), 0);
  EXPECT_EQ(index.id("r"), 3);
  EXPECT_EQ(index.id("s"), 4);  // written, never declared
  EXPECT_EQ(index.id("nowhere"), -1);
  EXPECT_EQ(index.name(4), "s");
  EXPECT_FALSE(index.declared(4));
  EXPECT_EQ(index.var(4), nullptr);
  EXPECT_EQ(index.var("w"), &p.var(1));
  EXPECT_EQ(index.producer("h"), 0);
  EXPECT_EQ(index.producer("w"), -1);
  EXPECT_THAT(index.consumers("h"), ElementsAre(1, 2));
  EXPECT_THAT(index.input_ids(2), ElementsAre(3, 2));
  EXPECT_EQ(index.kind(1), PARAM);
  EXPECT_EQ(index.type(1).ToString(), "F32[4, 3]");
  EXPECT_TRUE(index.HasType(2, TensorType{F32, {-1, 3}}));
  EXPECT_FALSE(index.HasType(2, TensorType{F32, {-1, 4}}));
  EXPECT_FALSE(index.HasType(4, TensorType{F32, {-1, 3}}));
}

TEST(GraphIndexTest, FindsEveryNameAmongThousands) {
  Program p;
  for (int i = 0; i < 5000; ++i) {
    Var* v = p.add_var();
    v->set_name("v" + std::to_string(i));
    v->set_dtype(F32);
    v->add_shape(i % 7 + 1);
  }
  GraphIndex index(p);
  ASSERT_EQ(index.num_ids(), 5000);
  for (int i = 0; i < 5000; ++i) {
    ASSERT_EQ(index.id("v" + std::to_string(i)), i);
    ASSERT_EQ(index.type(i).shape[0], i % 7 + 1);
  }
  EXPECT_EQ(index.id("v5000"), -1);
}

}  // namespace
}  // namespace strata
