#include "passes/pack_qkv.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/validate.h"
#include "gtest/gtest.h"
#include "kernels/attention_budget.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

// A tiny GPT whose heads are 32 wide (d_model 64, 2 heads: the tensor-core
// flash kernels' size), or `heads` heads.
std::string Gpt(int heads = 2) {
  GenOptions gen;
  gen.blocks = 2;
  gen.d_model = 64;
  gen.heads = heads;
  gen.seq = 16;
  gen.vocab = 64;
  auto text = GenerateProgram("gpt", gen);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

// The program after `pass` of a plan for `device` (batch 4).
Program DumpAfter(const std::string& text, const Strategy& strategy, const std::string& pass,
                  DeviceKind device = DEVICE_CUDA, std::vector<std::string> disabled = {}) {
  CompileOptions options;
  options.batch_size = 4;
  options.dump_after = pass;
  options.device_kind = device;
  options.disabled_passes = std::move(disabled);
  auto result = Compile(ParseProgramOrFail(text), strategy, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->dumped : Program();
}

TEST(PackQkvTest, RunsAfterAttentionLayoutWhereThatRuns) {
  {
    const ScopedTensorCoreAttention tensor_core(true);
    for (DeviceKind device : {DEVICE_CUDA, DEVICE_CPU}) {
      const std::vector<std::string> names = CompilePassNames(Bf16(), device);
      auto pass = std::find(names.begin(), names.end(), "pack-qkv");
      ASSERT_NE(pass, names.end());
      ASSERT_NE(pass, names.begin());
      EXPECT_EQ(*(pass - 1), "attention-layout");
      EXPECT_LT(pass, std::find(names.begin(), names.end(), "autodiff"));
      const std::vector<std::string> optional = OptionalPassNames(Bf16(), device);
      EXPECT_NE(std::find(optional.begin(), optional.end(), "pack-qkv"), optional.end());
    }
  }
  const ScopedTensorCoreAttention off(false);
  const std::vector<std::string> names = CompilePassNames(Bf16(), DEVICE_CUDA);
  EXPECT_EQ(std::find(names.begin(), names.end(), "pack-qkv"), names.end());
  const std::vector<std::string> cpu = CompilePassNames(Bf16(), DEVICE_CPU);
  EXPECT_NE(std::find(cpu.begin(), cpu.end(), "pack-qkv"), cpu.end());
}

// Each block's split of the qkv projection and the three reshapes become
// one reshape to [B, T, 3, H, D] and the packed attention, which writes the
// same y and lse; after autodiff its gradient writes the projection's
// gradient through one reshape_like, with no concat.
TEST(PackQkvTest, GptAttentionReadsTheProjectionInPlace) {
  const ScopedTensorCoreAttention tensor_core(true);
  const std::string text = Gpt();
  const Program before = DumpAfter(text, Bf16(), "attention-layout");
  const Program after = DumpAfter(text, Bf16(), "pack-qkv");
  EXPECT_EQ(OpsOfType(before, "split").size(), 2u);
  EXPECT_EQ(OpsOfType(after, "split").size(), 0u);
  EXPECT_EQ(OpsOfType(after, "scaled_dot_product_attention").size(), 0u);
  const std::vector<const Op*> packed = OpsOfType(after, "scaled_dot_product_attention_qkv");
  ASSERT_EQ(packed.size(), 2u);
  // The split and 3 reshapes become a reshape: 3 ops fewer a block.
  EXPECT_EQ(after.op_size() + 6, before.op_size());
  const std::vector<const Op*> attention = OpsOfType(before, "scaled_dot_product_attention");
  ASSERT_EQ(attention.size(), 2u);
  for (int b = 0; b < 2; ++b) {
    const Op& op = *packed[b];
    EXPECT_EQ(std::vector<std::string>(op.output().begin(), op.output().end()),
              std::vector<std::string>(attention[b]->output().begin(), attention[b]->output().end()));
    EXPECT_EQ(Attr(op, "causal").b(), true);
    const Var* qkv = FindVar(after, op.input(0));
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(qkv->dtype(), BF16);
    EXPECT_EQ(std::vector<int64_t>(qkv->shape().begin(), qkv->shape().end()),
              (std::vector<int64_t>{-1, 16, 3, 2, 32}));
    const std::vector<const Op*> view = OpsWriting(after, op.input(0));
    ASSERT_EQ(view.size(), 1u);
    EXPECT_EQ(view[0]->type(), "reshape");
    EXPECT_EQ(view[0]->input(0), absl::StrCat("block", b, ".attn.qkv.y@bf16"));  // the projection's bf16 copy
  }
  EXPECT_TRUE(VerifyProgram(after).ok()) << VerifyProgram(after);

  const Program grads = DumpAfter(text, Bf16(), "autodiff");
  EXPECT_EQ(OpsOfType(grads, "scaled_dot_product_attention_qkv_grad").size(), 2u);
  EXPECT_EQ(OpsOfType(grads, "scaled_dot_product_attention_grad").size(), 0u);
  EXPECT_EQ(OpsOfType(grads, "concat").size(), 0u);
  const Program unpacked = DumpAfter(text, Bf16(), "autodiff", DEVICE_CUDA, {"pack-qkv"});
  EXPECT_EQ(OpsOfType(unpacked, "concat").size(), 2u);
  EXPECT_EQ(grads.op_size() + 12, unpacked.op_size());  // and the backward's 3 reshape_likes and concat
}

// Left alone on GPU plans: heads the tensor-core kernels do not take (16
// wide) and float32 attention (no mixed precision), both of which a CPU
// plan packs (its kernel reads any packed qkv in place); and anywhere, a k
// whose split output something else reads too (under BF16), and a
// recompute checkpoint.
TEST(PackQkvTest, LeavesWhatTheFlashKernelsWouldNotReadInPlace) {
  const ScopedTensorCoreAttention tensor_core(true);
  EXPECT_EQ(OpsOfType(DumpAfter(Gpt(/*heads=*/4), Bf16(), "pack-qkv"), "split").size(), 2u);
  EXPECT_EQ(OpsOfType(DumpAfter(Gpt(), Strategy(), "pack-qkv"), "split").size(), 2u);
  EXPECT_EQ(OpsOfType(DumpAfter(Gpt(/*heads=*/4), Bf16(), "pack-qkv", DEVICE_CPU), "split").size(), 0u);
  EXPECT_EQ(OpsOfType(DumpAfter(Gpt(), Strategy(), "pack-qkv", DEVICE_CPU), "scaled_dot_product_attention_qkv").size(),
            2u);
  // Block 0's k2 also read by a fetched mean: that block keeps its split,
  // block 1 packs.
  std::string text = Gpt();
  text += "\nop { type: \"reduce_mean\" input: [\"block0.k2\"] output: [\"k2_mean\"] }\nfetch: \"k2_mean\"\n";
  const Program low = DumpAfter(text, Bf16(), "pack-qkv");
  EXPECT_EQ(OpsOfType(low, "split").size(), 1u);
  EXPECT_EQ(OpsOfType(low, "scaled_dot_product_attention_qkv").size(), 1u);
  // Block 1's q a recompute checkpoint: it stays, and so does that split.
  Program kept = DumpAfter(Gpt(), Bf16(), "attention-layout");
  ASSERT_NE(FindVar(kept, "block1.q3@bf16"), nullptr);
  CompileContext ctx;
  ctx.strategy = Bf16();
  ctx.strategy.mutable_recompute()->add_checkpoints("block1.q3@bf16");
  auto changed = RunOnProgram(PackQkvPass(), kept, ctx);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(OpsOfType(kept, "split").size(), 1u);
  EXPECT_EQ(OpsOfType(kept, "scaled_dot_product_attention_qkv").size(), 1u);
  EXPECT_NE(FindVar(kept, "block1.q3@bf16"), nullptr);
}

// Hand-made variants of the program the pass sees: block 1's attention
// reading k and v the other way round (the split's outputs out of order:
// left alone), block 0's split without `sections` (equal thirds: packed).
TEST(PackQkvTest, ChecksTheSplitsOrderAndSections) {
  const ScopedTensorCoreAttention tensor_core(true);
  Program variant = DumpAfter(Gpt(), Bf16(), "attention-layout");
  int swapped = 0, unsectioned = 0;
  for (Op& op : *variant.mutable_op()) {
    if (op.type() == "scaled_dot_product_attention" && op.input(1) == "block1.k3@bf16") {
      op.set_input(1, "block1.v3@bf16");
      op.set_input(2, "block1.k3@bf16");
      ++swapped;
    }
    if (op.type() == "split" && op.input(0) == "block0.attn.qkv.y@bf16") {
      op.mutable_attr()->erase("sections");
      ++unsectioned;
    }
  }
  ASSERT_EQ(swapped, 1);
  ASSERT_EQ(unsectioned, 1);
  CompileContext ctx;
  ctx.strategy = Bf16();
  auto changed = RunOnProgram(PackQkvPass(), variant, ctx);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  const std::vector<const Op*> packed = OpsOfType(variant, "scaled_dot_product_attention_qkv");
  ASSERT_EQ(packed.size(), 1u);
  EXPECT_EQ(packed[0]->input(0), "block0.attn.qkv.y@bf16@qkv");
  const std::vector<const Op*> splits = OpsOfType(variant, "split");
  ASSERT_EQ(splits.size(), 1u);
  EXPECT_EQ(splits[0]->input(0), "block1.attn.qkv.y@bf16");
}

// A second run changes nothing.
TEST(PackQkvTest, IsIdempotent) {
  const ScopedTensorCoreAttention tensor_core(true);
  Program once = DumpAfter(Gpt(), Bf16(), "pack-qkv");
  ASSERT_EQ(OpsOfType(once, "scaled_dot_product_attention_qkv").size(), 2u);
  const std::string before = once.DebugString();
  auto changed = RunOnProgram(PackQkvPass(), once, CompileContext());
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  EXPECT_EQ(once.DebugString(), before);
}

}  // namespace
}  // namespace strata
