#include "compiler/graph_index.h"

#include <string>

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

constexpr char kProgram[] = R"pb(
  var {
    name: "x"
    dtype: F32
    shape: [ -1, 4 ]
    kind: FEED
  }
  var {
    name: "w"
    dtype: F32
    shape: [ 4, 3 ]
    kind: PARAM
  }
  var {
    name: "h"
    dtype: F32
    shape: [ -1, 3 ]
    kind: ACTIVATION
  }
  var {
    name: "r"
    dtype: F32
    shape: [ -1, 3 ]
    kind: ACTIVATION
  }
  op {
    type: "matmul"
    input: [ "x", "w" ]
    output: [ "h" ]
  }
  op {
    type: "relu"
    input: [ "h" ]
    output: [ "r" ]
  }
  op {
    type: "add"
    input: [ "r", "h" ]
    output: [ "s" ]
  }
)pb";

// Everything the index answers, as one comparable string.
std::string Dump(const GraphIndex& index) {
  std::string out;
  for (int id = 0; id < index.num_ids(); ++id) {
    out += std::string(index.name(id)) + ":" + (index.declared(id) ? index.type(id).ToString() : "undeclared") + ":" +
           std::to_string(index.producer(id)) + ":" + std::to_string(static_cast<int>(index.kind(id))) + " ";
  }
  for (int i = 0; i < index.num_ops(); ++i) {
    out += "|";
    for (int id : index.input_ids(i)) out += std::to_string(id) + ",";
    out += ">";
    for (int id : index.output_ids(i)) out += std::to_string(id) + ",";
  }
  return out;
}

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

TEST(GraphIndexTest, ExtendsThePreviousIndexAfterAnAppend) {
  Program p = Parse(std::string(kProgram) + R"pb(var {
                                                   name: "s"
                                                   dtype: F32
                                                   shape: [ -1, 3 ]
                                                 })pb");
  // s is now declared last, so ids match a program that only appended.
  GraphIndex before(p);
  Var* t = p.add_var();
  t->set_name("t");
  t->set_dtype(F32);
  Op* op = p.add_op();
  op->set_type("relu");
  op->add_input("s");
  op->add_output("t");
  GraphIndex extended(p, &before);
  GraphIndex fresh(p);
  EXPECT_EQ(Dump(extended), Dump(fresh));
  EXPECT_EQ(extended.id("t"), 5);
  EXPECT_EQ(extended.producer("t"), 3);
}

TEST(GraphIndexTest, ResolvesRenamedOpsAndReorderedVarsAsAFreshIndexWould) {
  Program p = Parse(std::string(kProgram) + R"pb(var {
                                                   name: "s"
                                                   dtype: F32
                                                   shape: [ -1, 3 ]
                                                 })pb");
  GraphIndex before(p);
  // An op now reads another var, and one gains an input: each is resolved anew.
  p.mutable_op(2)->set_input(1, "x");
  p.mutable_op(1)->add_input("w");
  GraphIndex renamed(p, &before);
  EXPECT_EQ(Dump(renamed), Dump(GraphIndex(p)));
  EXPECT_THAT(renamed.consumers("x"), ElementsAre(0, 2));

  // Vars swapped or removed: the previous numbering no longer holds.
  p.mutable_var()->SwapElements(0, 1);
  GraphIndex swapped(p, &renamed);
  EXPECT_EQ(Dump(swapped), Dump(GraphIndex(p)));
  EXPECT_EQ(swapped.id("w"), 0);
  p.mutable_var()->RemoveLast();
  GraphIndex removed(p, &swapped);
  EXPECT_EQ(Dump(removed), Dump(GraphIndex(p)));
  EXPECT_FALSE(removed.declared(removed.id("s")));
}

TEST(GraphIndexTest, VerifierWithThePreviousIndexStillChecksEveryOp) {
  Program p = Parse(std::string(kProgram) + R"pb(var {
                                                   name: "s"
                                                   dtype: F32
                                                   shape: [ -1, 3 ]
                                                 })pb");
  auto index = VerifyAndIndexProgram(p);
  ASSERT_TRUE(index.ok()) << index.status();
  // An old op changed in place: its new input is checked, not taken on trust.
  p.mutable_op(1)->set_input(0, "s");
  auto again = VerifyAndIndexProgram(p, index->get());
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), ::testing::HasSubstr("input 's' used before definition"));
  // And a type recorded wrongly on an old var.
  p.mutable_op(1)->set_input(0, "h");
  p.mutable_var(3)->set_shape(1, 5);
  again = VerifyAndIndexProgram(p, index->get());
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), ::testing::HasSubstr("output 'r' is recorded as F32[-1, 5]"));
}

}  // namespace
}  // namespace strata
