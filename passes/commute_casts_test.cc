#include "passes/commute_casts.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

constexpr int kBlocks = kTinyGptBlocks;

const Op* Writer(const Program& p, const std::string& var) {
  const std::vector<const Op*> ops = OpsWriting(p, var);
  return ops.size() == 1 ? ops[0] : nullptr;
}

TEST(CommuteCastsTest, RunsRightAfterMixedPrecisionOnly) {
  const std::vector<std::string> names = CompilePassNames(Bf16());
  auto mp = std::find(names.begin(), names.end(), "mixed-precision");
  ASSERT_NE(mp, names.end());
  ASSERT_NE(mp + 1, names.end());
  EXPECT_EQ(*(mp + 1), "commute-casts");
  const std::vector<std::string> f32 = CompilePassNames(Strategy());
  EXPECT_EQ(std::find(f32.begin(), f32.end(), "commute-casts"), f32.end());
}

// q, k and v: one cast of the qkv projection's output, then the split and
// transposes in bf16; the attention output goes to the projection through
// a bf16 transpose and reshape, with no cast at all. Four casts fewer a
// block, and every value the same (the train test checks the bits).
TEST(CommuteCastsTest, AttentionMovesItsInputsAndOutputInBf16) {
  const std::string text = TinyGptText();
  const Program before = After(text, Bf16(), "mixed-precision");
  const Program after = After(text, Bf16(), "commute-casts");
  EXPECT_EQ(OpsOfType(after, "cast").size() + 4 * kBlocks, OpsOfType(before, "cast").size());
  const std::vector<const Op*> attention = OpsOfType(after, "scaled_dot_product_attention");
  ASSERT_EQ(attention.size(), static_cast<size_t>(kBlocks));
  for (const Op* op : attention) {
    for (int k = 0; k < 3; ++k) {
      SCOPED_TRACE(op->input(k));
      EXPECT_EQ(FindVar(after, op->input(k))->dtype(), BF16);
      const Op* writer = Writer(after, op->input(k));
      ASSERT_NE(writer, nullptr);
      EXPECT_EQ(writer->type(), "transpose");
      const Op* reshape = Writer(after, writer->input(0));
      ASSERT_NE(reshape, nullptr);
      EXPECT_EQ(reshape->type(), "reshape");
      const Op* split = Writer(after, reshape->input(0));
      ASSERT_NE(split, nullptr);
      EXPECT_EQ(split->type(), "split");
      EXPECT_EQ(FindVar(after, split->input(0))->dtype(), BF16);
      const Op* cast = Writer(after, split->input(0));
      ASSERT_NE(cast, nullptr);
      EXPECT_EQ(cast->type(), "cast");
      EXPECT_EQ(FindVar(after, cast->input(0))->dtype(), F32);
    }
    // y@bf16 -> transpose -> reshape -> the projection's matmul, all bf16.
    const std::string y = op->output(0);
    std::vector<const Op*> readers;
    for (const Op& o : after.op()) {
      for (const std::string& in : o.input()) {
        if (in == y) readers.push_back(&o);
      }
    }
    ASSERT_EQ(readers.size(), 1u) << y;
    EXPECT_EQ(readers[0]->type(), "transpose");
    EXPECT_EQ(FindVar(after, readers[0]->output(0))->dtype(), BF16);
  }
  for (const Var& v : after.var()) {
    if (v.kind() == PARAM) {
      EXPECT_EQ(v.dtype(), F32) << v.name();
    }
  }
}

// A moved value something else also reads is left where it is: here the
// transpose's F32 output feeds a fetched mean besides the matmul's cast.
TEST(CommuteCastsTest, AValueWithAnotherReaderKeepsItsCast) {
  const std::string text = R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4, 3] kind: FEED }
    var { name: "w" dtype: F32 shape: [4, 5] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "transpose" input: "x" output: "t" attr { key: "perm" value { list { i: [ 0, 2, 1 ] } } } }
    op { type: "matmul" input: [ "t", "w" ] output: "y" }
    op { type: "reduce_mean" input: "y" output: "loss" }
    op { type: "reduce_mean" input: "t" output: "tm" }
    loss: "loss"
    fetch: "tm"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  const Program after = After(text, Bf16(), "commute-casts");
  const Op* transpose = Writer(after, "t");
  ASSERT_NE(transpose, nullptr);
  EXPECT_EQ(transpose->input(0), "x");
  EXPECT_EQ(FindVar(after, "t")->dtype(), F32);
  EXPECT_EQ(Writer(after, "t@bf16")->type(), "cast");
}

TEST(CommuteCastsTest, OnlyOptionalPassesCanBeDisabled) {
  const std::string text = TinyGptText();
  const Program off = After(text, Bf16(), "autodiff", {"commute-casts"});
  const Program on = After(text, Bf16(), "autodiff");
  // Four casts fewer a block in the forward and four in the backward (q, k
  // and v's gradients concatenated in bf16 and cast once; the attention
  // output's gradient moved in bf16 without its cast up and down).
  EXPECT_EQ(OpsOfType(off, "cast").size(), OpsOfType(on, "cast").size() + 8 * kBlocks);
  CompileOptions options;
  options.batch_size = 4;
  options.disabled_passes = {"autodiff"};
  auto r = Compile(ParseProgramOrFail(text), Bf16(), options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot disable pass 'autodiff': it is required; the optional passes here are commute-casts"),
            std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace strata
