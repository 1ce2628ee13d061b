#include "passes/pad_vocab.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

// A linear head over `classes` classes from 1024 features: logits = x @ w,
// read by the loss and, with `accuracy`, by the accuracy metric too.
std::string HeadProgram(int classes, bool accuracy) {
  std::string text = "var { name: \"x\" dtype: F32 shape: [-1, 1024] kind: FEED }\n"
                     "var { name: \"label\" dtype: I64 shape: [-1] kind: FEED }\n"
                     "var { name: \"w\" dtype: F32 shape: [1024, " +
                     std::to_string(classes) +
                     "] kind: PARAM init { normal { std: 0.5 } } }\n"
                     "op { type: \"matmul\" input: [\"x\", \"w\"] output: [\"logits\"] }\n"
                     "op { type: \"softmax_cross_entropy\" input: [\"logits\", \"label\"] output: [\"loss\"] }\n"
                     "loss: \"loss\"\n";
  if (accuracy) text += "op { type: \"accuracy\" input: [\"logits\", \"label\"] output: [\"acc\"] }\nfetch: \"acc\"\n";
  return text + kSgdOptimizer;
}

// A one-block GPT whose tied head has vocab x 64 weights.
std::string GptText(int vocab) {
  GenOptions gen;
  gen.blocks = 1;
  gen.d_model = 64;
  gen.heads = 2;
  gen.seq = 8;
  gen.vocab = vocab;
  auto text = GenerateProgram("gpt", gen);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

Program Compiled(const std::string& text, const Strategy& strategy, DeviceKind device) {
  CompileOptions options;
  options.batch_size = 4;
  options.device_kind = device;
  auto r = Compile(ParseProgramOrFail(text), strategy, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->plans[0].program() : Program();
}

const Op* OnlyOp(const Program& p, const std::string& type) {
  const Op* found = nullptr;
  for (const Op& op : p.op()) {
    if (op.type() != type) continue;
    EXPECT_EQ(found, nullptr) << "a second " << type;
    found = &op;
  }
  return found;
}

std::vector<int64_t> VarShape(const Program& p, const std::string& name) {
  for (const Var& v : p.var()) {
    if (v.name() == name) return {v.shape().begin(), v.shape().end()};
  }
  return {};
}

int64_t Classes(const Op& loss) {
  auto it = loss.attr().find("classes");
  return it == loss.attr().end() ? 0 : it->second.i();
}

TEST(PadVocabTest, RunsBeforeAutodiffAndAfterMixedPrecisionOnGpuPlansOnly) {
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  const std::vector<std::string> gpu = CompilePassNames(bf16, DEVICE_CUDA);
  auto pad = std::find(gpu.begin(), gpu.end(), "pad-vocab");
  ASSERT_NE(pad, gpu.end());
  EXPECT_LT(std::find(gpu.begin(), gpu.end(), "commute-casts"), pad);
  EXPECT_LT(pad, std::find(gpu.begin(), gpu.end(), "autodiff"));
  const std::vector<std::string> cpu = CompilePassNames(bf16, DEVICE_CPU);
  EXPECT_EQ(std::find(cpu.begin(), cpu.end(), "pad-vocab"), cpu.end());
  const std::vector<std::string> optional = OptionalPassNames(Strategy(), DEVICE_CUDA);
  EXPECT_NE(std::find(optional.begin(), optional.end(), "pad-vocab"), optional.end());
}

// GPT's tied head (logits = x @ wte^T): wte's rows padded to a multiple of
// 64 (axis 0), the logits' columns with them, the loss reading the first
// V, and the pad's gradient a slice back to V rows.
TEST(PadVocabTest, PadsTheTiedHeadsRowsToAMultipleOfSixtyFour) {
  const Program p = Compiled(GptText(16411), Strategy(), DEVICE_CUDA);
  const Op* pad = OnlyOp(p, "pad");
  ASSERT_NE(pad, nullptr);
  EXPECT_EQ(pad->input(0), "wte");
  EXPECT_EQ(pad->attr().at("axis").i(), 0);
  EXPECT_EQ(pad->attr().at("after").i(), 16448 - 16411);
  EXPECT_EQ(VarShape(p, pad->output(0)), (std::vector<int64_t>{16448, 64}));
  const Op* loss = OnlyOp(p, "softmax_cross_entropy");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(Classes(*loss), 16411);
  EXPECT_EQ(VarShape(p, loss->input(0)).back(), 16448);
  const Op* loss_grad = OnlyOp(p, "softmax_cross_entropy_grad");
  ASSERT_NE(loss_grad, nullptr);
  EXPECT_EQ(Classes(*loss_grad), 16411);
  const Op* slice = OnlyOp(p, "slice");
  ASSERT_NE(slice, nullptr);
  EXPECT_EQ(VarShape(p, slice->output(0)), (std::vector<int64_t>{16411, 64}));
  EXPECT_EQ(PaddedVocab(50257), 50304);  // GPT-2's, nanoGPT's number
}

// A head of [K, V] (no transpose_b) pads its columns; under BF16 the rows
// of 16-bit logits are what must be 16-byte multiples.
TEST(PadVocabTest, PadsWhereTheRowsAreMisalignedForTheirDtype) {
  const Program f32 = Compiled(HeadProgram(1030, false), Strategy(), DEVICE_CUDA);
  const Op* pad = OnlyOp(f32, "pad");
  ASSERT_NE(pad, nullptr);
  EXPECT_EQ(pad->attr().at("axis").i(), 1);
  EXPECT_EQ(pad->attr().at("after").i(), 1088 - 1030);
  // 1028 F32 classes are 4112 bytes a row: aligned, left alone; 1028 BF16
  // ones are 2056 bytes: padded.
  EXPECT_EQ(OnlyOp(Compiled(HeadProgram(1028, false), Strategy(), DEVICE_CUDA), "pad"), nullptr);
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  EXPECT_NE(OnlyOp(Compiled(HeadProgram(1028, false), bf16, DEVICE_CUDA), "pad"), nullptr);
  EXPECT_EQ(OnlyOp(Compiled(GptText(16448), Strategy(), DEVICE_CUDA), "pad"), nullptr);
}

// Logits another op reads (accuracy would see the padding), heads of fewer
// than 2^20 weights (a classifier's), and CPU plans keep their shape.
TEST(PadVocabTest, LeavesLogitsReadElsewhereSmallHeadsAndCpuPlansAlone) {
  const Program read = Compiled(HeadProgram(1030, true), Strategy(), DEVICE_CUDA);
  EXPECT_EQ(OnlyOp(read, "pad"), nullptr);
  EXPECT_EQ(Classes(*OnlyOp(read, "softmax_cross_entropy")), 0);
  EXPECT_EQ(OnlyOp(Compiled(HeadProgram(10, false), Strategy(), DEVICE_CUDA), "pad"), nullptr);
  EXPECT_EQ(OnlyOp(Compiled(GptText(37), Strategy(), DEVICE_CUDA), "pad"), nullptr);
  EXPECT_EQ(OnlyOp(Compiled(GptText(16411), Strategy(), DEVICE_CPU), "pad"), nullptr);
}

}  // namespace
}  // namespace strata
