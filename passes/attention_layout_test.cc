#include "passes/attention_layout.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "compiler/graph.h"
#include "compiler/validate.h"
#include "gtest/gtest.h"
#include "kernels/attention_budget.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"

namespace strata {
namespace {

constexpr int kBlocks = kTinyGptBlocks;

// The forward program attention-layout sees: after the pass before it.
Program Before(const std::string& text, const Strategy& strategy) {
  const std::vector<std::string> names = CompilePassNames(strategy);
  auto pass = std::find(names.begin(), names.end(), "attention-layout");
  EXPECT_NE(pass, names.end());
  if (pass == names.end() || pass == names.begin()) return Program();
  return After(text, strategy, *(pass - 1));
}

const Op* Writer(const Program& p, const std::string& var) {
  const std::vector<const Op*> ops = OpsWriting(p, var);
  return ops.size() == 1 ? ops[0] : nullptr;
}

std::vector<const Op*> Readers(const Program& p, const std::string& var) {
  std::vector<const Op*> readers;
  for (const Op& op : p.op()) {
    if (std::find(op.input().begin(), op.input().end(), var) != op.input().end()) readers.push_back(&op);
  }
  return readers;
}

std::string Layout(const Op& op) {
  auto it = op.attr().find("layout");
  return it == op.attr().end() ? "" : it->second.s();
}

// One head-split attention (T = 8, H = 2, D = 8), as tests/attention_train_test's
// program: `$EXTRA` ops go before the loss; `$OUT_PERM` is the output transpose's perm.
constexpr char kAttention[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 128] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "wq" dtype: F32 shape: [16, 16] kind: PARAM init { uniform { low: -0.25 high: 0.25 } } }
  var { name: "wk" dtype: F32 shape: [16, 16] kind: PARAM init { uniform { low: -0.25 high: 0.25 } } }
  var { name: "wv" dtype: F32 shape: [16, 16] kind: PARAM init { uniform { low: -0.25 high: 0.25 } } }
  var { name: "wo" dtype: F32 shape: [128, 10] kind: PARAM init { uniform { low: -0.09 high: 0.09 } } }
  op { type: "reshape" input: "x" output: "xt" attr { key: "shape" value { list { i: [-1, 8, 16] } } } }
  op { type: "matmul" input: ["xt", "wq"] output: "q2" }
  op { type: "matmul" input: ["xt", "wk"] output: "k2" }
  op { type: "matmul" input: ["xt", "wv"] output: "v2" }
  op { type: "reshape" input: "q2" output: "q3" attr { key: "shape" value { list { i: [-1, 8, 2, 8] } } } }
  op { type: "reshape" input: "k2" output: "k3" attr { key: "shape" value { list { i: [-1, 8, 2, 8] } } } }
  op { type: "reshape" input: "v2" output: "v3" attr { key: "shape" value { list { i: [-1, 8, 2, 8] } } } }
  op { type: "transpose" input: "q3" output: "q" attr { key: "perm" value { list { i: [0, 2, 1, 3] } } } }
  op { type: "transpose" input: "k3" output: "k" attr { key: "perm" value { list { i: [0, 2, 1, 3] } } } }
  op { type: "transpose" input: "v3" output: "v" attr { key: "perm" value { list { i: [0, 2, 1, 3] } } } }
  op { type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["att", "att_lse"] }
  op { type: "transpose" input: "att" output: "att_t" attr { key: "perm" value { list { i: [$OUT_PERM] } } } }
  op { type: "reshape" input: "att_t" output: "h" attr { key: "shape" value { list { i: [-1, 128] } } } }
  $EXTRA
  op { type: "matmul" input: ["h", "wo"] output: "logits" }
  op { type: "softmax_cross_entropy" input: ["logits", "label"] output: "loss" }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

std::string AttentionText(const std::string& extra = "", const std::string& out_perm = "0, 2, 1, 3") {
  return absl::StrReplaceAll(kAttention, {{"$EXTRA", extra}, {"$OUT_PERM", out_perm}});
}

// On GPU plans only where the tensor-core attention is on (the GEMM path
// would copy the layout through scratch): off by default until it has run
// on a GPU (kernels/attention_budget.h).
TEST(AttentionLayoutTest, OnGpuPlansOnlyWithTheTensorCoreAttention) {
  const ScopedTensorCoreAttention tensor_core(false);
  for (const Strategy& strategy : {Strategy(), Bf16()}) {
    const std::vector<std::string> names = CompilePassNames(strategy, DEVICE_CUDA);
    EXPECT_EQ(std::find(names.begin(), names.end(), "attention-layout"), names.end());
    const std::vector<std::string> cpu = CompilePassNames(strategy, DEVICE_CPU);
    EXPECT_NE(std::find(cpu.begin(), cpu.end(), "attention-layout"), cpu.end());
  }
}

TEST(AttentionLayoutTest, RunsBeforeAutodiffAfterTheCastsOnEveryDeviceAndIsOptional) {
  const ScopedTensorCoreAttention tensor_core(true);
  for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
    for (const Strategy& strategy : {Strategy(), Bf16()}) {
      const std::vector<std::string> names = CompilePassNames(strategy, device);
      auto pass = std::find(names.begin(), names.end(), "attention-layout");
      ASSERT_NE(pass, names.end());
      ASSERT_NE(pass + 1, names.end());
      // pack-qkv comes between (passes/pack_qkv_test).
      const auto next = pass + 2;
      ASSERT_LT(next, names.end());
      EXPECT_EQ(*next, "autodiff");
      // After the casts (on GPU plans pad-vocab sits between).
      if (strategy.has_mixed_precision()) {
        EXPECT_LT(std::find(names.begin(), names.end(), "commute-casts"), pass);
      }
      const std::vector<std::string> optional = OptionalPassNames(strategy, device);
      EXPECT_NE(std::find(optional.begin(), optional.end(), "attention-layout"), optional.end());
    }
  }
}

// The tiny GPT: each block's attention reads the reshapes' [B, T, H, D]
// outputs and writes the one the merge reshape reads; no transpose is left,
// in the forward or (after autodiff) the backward, whose gradient op is
// "bthd" too. In float32 and under BF16 (after commute-casts the transposes
// move bf16, and the pass sees them so).
TEST(AttentionLayoutTest, TinyGptAttentionReadsAndWritesBthd) {
  const std::string text = TinyGptText();
  for (const Strategy& strategy : {Strategy(), Bf16()}) {
    SCOPED_TRACE(strategy.has_mixed_precision() ? "BF16" : "F32");
    const Program before = Before(text, strategy);
    const Program after = After(text, strategy, "attention-layout");
    EXPECT_EQ(OpsOfType(before, "transpose").size(), static_cast<size_t>(4 * kBlocks));
    EXPECT_EQ(OpsOfType(after, "transpose").size(), 0u);
    EXPECT_EQ(after.op_size() + 4 * kBlocks, before.op_size());
    const std::vector<const Op*> attention = OpsOfType(after, "scaled_dot_product_attention");
    ASSERT_EQ(attention.size(), static_cast<size_t>(kBlocks));
    for (const Op* op : attention) {
      EXPECT_EQ(Layout(*op), "bthd");
      const Var* q = FindVar(after, op->input(0));
      ASSERT_NE(q, nullptr);
      // [B, T, H, D] of the tiny GPT: T = 16, H = 4, D = 8.
      EXPECT_EQ(std::vector<int64_t>(q->shape().begin(), q->shape().end()), (std::vector<int64_t>{-1, 16, 4, 8}));
      for (int k = 0; k < 3; ++k) {
        const Op* writer = Writer(after, op->input(k));
        ASSERT_NE(writer, nullptr) << op->input(k);
        EXPECT_EQ(writer->type(), "reshape");
      }
      const std::vector<const Op*> readers = Readers(after, op->output(0));
      ASSERT_EQ(readers.size(), 1u);
      EXPECT_EQ(readers[0]->type(), "reshape");
      const Var* lse = FindVar(after, op->output(1));
      ASSERT_NE(lse, nullptr);
      EXPECT_EQ(std::vector<int64_t>(lse->shape().begin(), lse->shape().end()), (std::vector<int64_t>{-1, 4, 16}));
    }
    EXPECT_TRUE(VerifyProgram(after).ok()) << VerifyProgram(after);

    // (Without pack-qkv, which would pack the "bthd" attention next.)
    const Program differentiated = After(text, strategy, "autodiff", {"pack-qkv"});
    EXPECT_EQ(OpsOfType(differentiated, "transpose").size(), 0u);
    const std::vector<const Op*> grads = OpsOfType(differentiated, "scaled_dot_product_attention_grad");
    ASSERT_EQ(grads.size(), static_cast<size_t>(kBlocks));
    for (const Op* op : grads) EXPECT_EQ(Layout(*op), "bthd");
    const Program without = After(text, strategy, "autodiff", {"attention-layout"});
    EXPECT_EQ(OpsOfType(without, "transpose").size(), static_cast<size_t>(8 * kBlocks));
  }
}

// A second run changes nothing: the "bthd" ops no longer match.
TEST(AttentionLayoutTest, IsIdempotent) {
  Program once = After(TinyGptText(), Strategy(), "attention-layout");
  const std::string before = once.DebugString();
  auto changed = RunOnProgram(AttentionLayoutPass(), once, CompileContext());
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  EXPECT_EQ(once.DebugString(), before);
}

// The head-split program of tests/attention_train_test matches as well.
TEST(AttentionLayoutTest, RewritesTheHeadSplitProgram) {
  const Program after = After(AttentionText(), Strategy(), "attention-layout");
  const std::vector<const Op*> attention = OpsOfType(after, "scaled_dot_product_attention");
  ASSERT_EQ(attention.size(), 1u);
  EXPECT_EQ(Layout(*attention[0]), "bthd");
  EXPECT_EQ(std::vector<std::string>(attention[0]->input().begin(), attention[0]->input().end()),
            (std::vector<std::string>{"q3", "k3", "v3"}));
  EXPECT_EQ(attention[0]->output(0), "att_t");
  EXPECT_EQ(attention[0]->output(1), "att_lse");
  EXPECT_FALSE(HasVar(after, "q"));
  EXPECT_FALSE(HasVar(after, "att"));
  EXPECT_EQ(OpsOfType(after, "transpose").size(), 0u);
}

// q, k and v one transposed var (attention of a projection with itself):
// its one transpose goes, and the "bthd" op reads the input three times.
TEST(AttentionLayoutTest, RewritesQkvReadFromOneTranspose) {
  const Program after = After(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 128] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "wq" dtype: F32 shape: [16, 16] kind: PARAM init { uniform { low: -0.25 high: 0.25 } } }
    var { name: "wo" dtype: F32 shape: [128, 10] kind: PARAM init { uniform { low: -0.09 high: 0.09 } } }
    op { type: "reshape" input: "x" output: "xt" attr { key: "shape" value { list { i: [-1, 8, 16] } } } }
    op { type: "matmul" input: ["xt", "wq"] output: "q2" }
    op { type: "reshape" input: "q2" output: "q3" attr { key: "shape" value { list { i: [-1, 8, 2, 8] } } } }
    op { type: "transpose" input: "q3" output: "q" attr { key: "perm" value { list { i: [0, 2, 1, 3] } } } }
    op { type: "scaled_dot_product_attention" input: ["q", "q", "q"] output: ["att", "att_lse"] }
    op { type: "transpose" input: "att" output: "att_t" attr { key: "perm" value { list { i: [0, 2, 1, 3] } } } }
    op { type: "reshape" input: "att_t" output: "h" attr { key: "shape" value { list { i: [-1, 128] } } } }
    op { type: "matmul" input: ["h", "wo"] output: "logits" }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: "loss" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb",
                              Strategy(), "attention-layout");
  const std::vector<const Op*> attention = OpsOfType(after, "scaled_dot_product_attention");
  ASSERT_EQ(attention.size(), 1u);
  EXPECT_EQ(Layout(*attention[0]), "bthd");
  EXPECT_EQ(std::vector<std::string>(attention[0]->input().begin(), attention[0]->input().end()),
            (std::vector<std::string>{"q3", "q3", "q3"}));
  EXPECT_EQ(attention[0]->output(0), "att_t");
  EXPECT_EQ(OpsOfType(after, "transpose").size(), 0u);
  EXPECT_TRUE(VerifyProgram(after).ok()) << VerifyProgram(after);
}

// What it leaves alone: a transposed input another op reads too, an output
// transpose of another perm, an output another op reads. The program is
// then exactly the one before the pass.
TEST(AttentionLayoutTest, LeavesOtherReadersAndOtherPermsAlone) {
  struct Case {
    const char* name;
    std::string text;
  };
  const std::vector<Case> cases = {
      {"k read by another op",
       AttentionText(R"pb(op { type: "add" input: ["k", "v"] output: "kv" }
                          op { type: "reduce_sum" input: "kv" output: "kv_sum" })pb")},
      {"att read by another op", AttentionText(R"pb(op { type: "reduce_sum" input: "att" output: "att_sum" })pb")},
      // [B, H, T, D] -> [B, T, D, H]: a merge of another order.
      {"output perm (0, 2, 3, 1)", AttentionText("", "0, 2, 3, 1")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Program with = After(c.text, Strategy(), "attention-layout");
    const Program without = Before(c.text, Strategy());
    EXPECT_EQ(with.DebugString(), without.DebugString());
    const std::vector<const Op*> attention = OpsOfType(with, "scaled_dot_product_attention");
    ASSERT_EQ(attention.size(), 1u);
    EXPECT_EQ(Layout(*attention[0]), "bhtd");
    EXPECT_EQ(OpsOfType(with, "transpose").size(), 4u);
  }
}

// A transposed q of another perm ([B, T, H, D] -> [B, H, D, T] is not
// attention's input order, but the op accepts any [.., .., .., D]) stays.
TEST(AttentionLayoutTest, LeavesAnInputTransposeOfAnotherPermAlone) {
  // q3 [B, 8, 2, 8] with perm (0, 2, 3, 1) is [B, 2, 8, 8] too (T = D = 8).
  const std::string text =
      absl::StrReplaceAll(AttentionText(), {{R"(output: "q" attr { key: "perm" value { list { i: [0, 2, 1, 3])",
                                              R"(output: "q" attr { key: "perm" value { list { i: [0, 2, 3, 1])"}});
  ASSERT_NE(text, AttentionText());
  const Program with = After(text, Strategy(), "attention-layout");
  const std::vector<const Op*> attention = OpsOfType(with, "scaled_dot_product_attention");
  ASSERT_EQ(attention.size(), 1u);
  EXPECT_EQ(Layout(*attention[0]), "bhtd");
  EXPECT_EQ(OpsOfType(with, "transpose").size(), 4u);
}

}  // namespace
}  // namespace strata
