#include "passes/tf32.h"

#include <set>
#include <string>

#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/testing/pass_test_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

const std::set<std::string> kFamily = {"matmul",
                                       "matmul_shared_b_grad_a",
                                       "matmul_shared_b_grad_b",
                                       "matmul_accumulate",
                                       "matmul_bias",
                                       "matmul_bias_gelu",
                                       "matmul_gelu_grad",
                                       "matmul_bias_grad_b",
                                       "scaled_dot_product_attention",
                                       "scaled_dot_product_attention_grad"};

// (GEMMs marked allow_tf32, GEMMs not) over every rank's program.
std::pair<int, int> Marked(const CompileResult& r) {
  int marked = 0, plain = 0;
  for (const RankPlan& plan : r.plans) {
    for (const Op& op : plan.program().op()) {
      if (kFamily.count(op.type()) == 0) continue;
      auto it = op.attr().find("allow_tf32");
      (it != op.attr().end() && it->second.b() ? marked : plain)++;
    }
  }
  return {marked, plain};
}

CompileResult CompileGenerated(const std::string& model, const Strategy& strategy, DeviceKind device,
                               int stages = 1) {
  GenOptions gen;
  gen.layers = {24, 32, 10};
  gen.blocks = 2;
  gen.stages = stages;
  gen.dtype = "F32";
  gen.d_model = 32;
  gen.heads = 4;
  gen.seq = 16;
  gen.vocab = 64;
  auto text = GenerateProgram(model, gen);
  EXPECT_TRUE(text.ok()) << text.status();
  CompileOptions options;
  options.batch_size = 32;
  options.device_kind = device;
  auto r = Compile(ParseProgramOrFail(*text), strategy, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : CompileResult();
}

CompileResult CompileResMlp(const Strategy& strategy, DeviceKind device, int stages = 1) {
  return CompileGenerated("resmlp", strategy, device, stages);
}

// Attention and its gradient too (their F32 products), with the GEMMs of
// a GPT's blocks.
TEST(Tf32Test, MarksAttentionOfGpuPlansWhenAsked) {
  Strategy tf32;
  tf32.set_allow_tf32(true);
  const CompileResult r = CompileGenerated("gpt", tf32, DEVICE_CUDA);
  ASSERT_FALSE(r.plans.empty());
  int attention = 0;
  for (const Op& op : r.plans[0].program().op()) {
    if (op.type().rfind("scaled_dot_product_attention", 0) != 0) continue;
    ++attention;
    EXPECT_TRUE(op.attr().at("allow_tf32").b()) << op.ShortDebugString();
  }
  EXPECT_EQ(attention, 4);  // two blocks, forward and gradient
  EXPECT_EQ(Marked(r).second, 0);
  EXPECT_EQ(Marked(CompileGenerated("gpt", Strategy(), DEVICE_CUDA)).first, 0);
}

// Every F32 GEMM of a GPU plan, the gradients and, under a pipeline's
// micro-batches, the weight gradients' matmul_accumulate included.
TEST(Tf32Test, MarksEveryFloatGemmOfGpuPlansWhenAsked) {
  Strategy tf32;
  tf32.set_allow_tf32(true);
  auto [marked, plain] = Marked(CompileResMlp(tf32, DEVICE_CUDA));
  EXPECT_GT(marked, 0);
  EXPECT_EQ(plain, 0);
  Strategy pipelined = tf32;
  pipelined.mutable_pipeline()->set_micro_batch_size(8);
  pipelined.mutable_pipeline()->set_accumulate_steps(4);
  const CompileResult pp = CompileResMlp(pipelined, DEVICE_CUDA, 2);
  int accumulates = 0;
  for (const RankPlan& plan : pp.plans) {
    for (const Op& op : plan.program().op()) {
      if (op.type() != "matmul_accumulate") continue;
      ++accumulates;
      EXPECT_TRUE(op.attr().at("allow_tf32").b());
    }
  }
  EXPECT_GT(accumulates, 0);
  EXPECT_EQ(Marked(pp).second, 0);
}

// Not asked, a CPU plan, or a BF16 GEMM: nothing marked.
TEST(Tf32Test, LeavesOtherPlansAlone) {
  EXPECT_EQ(Marked(CompileResMlp(Strategy(), DEVICE_CUDA)).first, 0);
  Strategy tf32;
  tf32.set_allow_tf32(true);
  EXPECT_EQ(Marked(CompileResMlp(tf32, DEVICE_CPU)).first, 0);
  Strategy bf16 = tf32;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  const CompileResult r = CompileResMlp(bf16, DEVICE_CUDA);
  for (const Op& op : r.plans[0].program().op()) {
    if (kFamily.count(op.type()) == 0) continue;
    const bool marked = op.attr().at("allow_tf32").b();
    // The BF16 matmuls and matmul_bias of BF16 operands stay as they are;
    // float32 ones (the weight gradients of F32 master weights) are marked.
    bool bf16_operand = false;
    for (const Var& v : r.plans[0].program().var()) {
      if (v.name() == op.input(0)) bf16_operand = v.dtype() == BF16;
    }
    EXPECT_EQ(marked, !bf16_operand) << op.ShortDebugString();
  }
}

}  // namespace
}  // namespace strata
