#include "passes/fold_casts.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

constexpr int kBlocks = kTinyGptBlocks;

// The rank's program after compiling for `device`, with `disabled` passes
// off, and on GPU plans cast-bias (which reads the GEMMs' 16-bit stores this
// pass makes and drops their out_dtype: passes/cast_bias_test) off too.
Program Compiled(const Strategy& strategy, DeviceKind device, std::vector<std::string> disabled = {}) {
  CompileOptions options;
  options.batch_size = 4;
  options.device_kind = device;
  if (device == DEVICE_CUDA && strategy.has_mixed_precision()) disabled.push_back("cast-bias");
  options.disabled_passes = std::move(disabled);
  auto r = Compile(ParseProgramOrFail(TinyGptText()), strategy, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->plans[0].program() : Program();
}

int Count(const Program& p, const std::string& type) {
  return static_cast<int>(std::count_if(p.op().begin(), p.op().end(), [&](const Op& op) { return op.type() == type; }));
}

DataType VarDtype(const Program& p, const std::string& name) {
  for (const Var& v : p.var()) {
    if (v.name() == name) return v.dtype();
  }
  return DT_INVALID;
}

std::string OutDtype(const Op& op) {
  auto it = op.attr().find("out_dtype");
  return it == op.attr().end() ? "" : it->second.s();
}

TEST(FoldCastsTest, RunsAfterTheBackwardRewritesUnderMixedPrecisionOnly) {
  for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
    const std::vector<std::string> names = CompilePassNames(Mixed(BF16), device);
    auto fold = std::find(names.begin(), names.end(), "fold-casts");
    ASSERT_NE(fold, names.end());
    const char* before = device == DEVICE_CUDA ? "commute-casts-backward" : "autodiff";
    EXPECT_LT(std::find(names.begin(), names.end(), before), fold) << before;
    const std::vector<std::string> f32 = CompilePassNames(Strategy(), device);
    EXPECT_EQ(std::find(f32.begin(), f32.end(), "fold-casts"), f32.end());
  }
}

// Every layer_norm (two a block and the final one) writes its 16-bit output
// and every layer_norm_grad reads its 16-bit dy. The gelu runs in the low
// dtype (mixed precision), so its gelu_grad reads and writes 16 bits with no
// casts to fold. On GPU plans the qkv projection's matmul_bias stores its
// 16-bit output, and the MLP's matmul_bias_gelu (fused so by
// fuse-epilogues) writes its 16-bit y and z; the attention and MLP output
// projections' float results feed the float residual adds and keep their
// type. A layer_norm_grad whose float dx is cast for the GEMMs and read in
// float too (the residual stream's gradient) writes the 16-bit copy as well
// (out_dtype, dx_low): on GPU plans, where fuse-epilogues gave the
// layer_norm_grads their residual sums, every one but the first block's
// first layer norm's (whose dx goes to the embeddings); on the CPU only the
// final layer norm's (the others' dx feeds an add_n alone).
TEST(FoldCastsTest, GptBlocksLoseTheirLayerNormAndGemmCasts) {
  for (DataType low : {BF16, F16}) {
    for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(low), " ", DeviceKind_Name(device)));
      const Program folded = Compiled(Mixed(low), device);
      const Program plain = Compiled(Mixed(low), device, {"fold-casts"});
      const int per_block = device == DEVICE_CUDA ? 5 : 4;
      const int dx_low = device == DEVICE_CUDA ? 2 * kBlocks : 1;
      // And the final layer_norm's forward and backward, and the dx_low stores.
      const int folds = per_block * kBlocks + 2 + dx_low;
      EXPECT_EQ(Count(plain, "cast") - Count(folded, "cast"), folds);
      EXPECT_EQ(folded.op_size(), plain.op_size() - folds);
      int layer_norms = 0, low_dy = 0, gelu_grads = 0, fused_gelu_grads = 0, low_gemms = 0, float_gemms = 0,
          low_dx = 0;
      for (const Op& op : folded.op()) {
        if (op.type() == "matmul_bias" || op.type() == "matmul_bias_gelu") {
          const bool stored = !OutDtype(op).empty();
          (stored ? low_gemms : float_gemms) += 1;
          EXPECT_EQ(VarDtype(folded, op.output(0)), stored ? low : F32) << op.output(0);
          if (stored) {
            EXPECT_EQ(OutDtype(op), DataTypeName(low)) << op.output(0);
            const bool qkv = absl::StrContains(op.output(0), ".attn.qkv.");
            EXPECT_TRUE(qkv || op.type() == "matmul_bias_gelu") << op.output(0);
          }
          if (op.type() == "matmul_bias_gelu") {
            EXPECT_EQ(VarDtype(folded, op.output(1)), low) << op.output(1);
          }
        }
        if (op.type() == "layer_norm") {
          ++layer_norms;
          EXPECT_EQ(OutDtype(op), DataTypeName(low)) << op.output(0);
          EXPECT_EQ(VarDtype(folded, op.output(0)), low) << op.output(0);
        }
        if (op.type() == "layer_norm_grad") {
          low_dy += VarDtype(folded, op.input(2)) == low;
          EXPECT_EQ(OutDtype(op), op.output_size() == 4 ? DataTypeName(low) : "") << op.output(0);
          if (op.output_size() == 4) {
            ++low_dx;
            EXPECT_EQ(VarDtype(folded, op.output(0)), F32) << op.output(0);
            EXPECT_EQ(VarDtype(folded, op.output(3)), low) << op.output(3);
          }
        }
        if (op.type() == "gelu_grad") {
          ++gelu_grads;
          EXPECT_EQ(VarDtype(folded, op.input(0)), low);
          EXPECT_EQ(VarDtype(folded, op.input(1)), low);
          EXPECT_EQ(OutDtype(op), "");
          EXPECT_EQ(VarDtype(folded, op.output(0)), low);
        }
        // On GPU plans fused with the GEMM of its dy (fuse-epilogues): the
        // 16-bit operands and z, the 16-bit dz.
        if (op.type() == "matmul_gelu_grad") {
          ++fused_gelu_grads;
          for (const std::string& in : op.input()) EXPECT_EQ(VarDtype(folded, in), low) << in;
          EXPECT_EQ(VarDtype(folded, op.output(0)), low);
        }
      }
      EXPECT_EQ(layer_norms, 2 * kBlocks + 1);
      EXPECT_EQ(low_dy, 2 * kBlocks + 1);
      EXPECT_EQ(low_dx, dx_low);
      EXPECT_EQ(gelu_grads, device == DEVICE_CUDA ? 0 : kBlocks);
      EXPECT_EQ(fused_gelu_grads, device == DEVICE_CUDA ? kBlocks : 0);
      EXPECT_EQ(low_gemms, device == DEVICE_CUDA ? 2 * kBlocks : 0);
      EXPECT_EQ(float_gemms, device == DEVICE_CUDA ? 2 * kBlocks : 0);
      // The float32 copies are gone from the plan.
      EXPECT_LT(folded.var_size(), plain.var_size());
    }
  }
}

// A float32 value anything else reads keeps its cast; the same value read
// by the cast alone is folded. (Fetches are scalars, never such a value.)
TEST(FoldCastsTest, KeepsCastsOfValuesReadElsewhere) {
  const std::string head = R"pb(
    name: "ln"
    var { name: "x" dtype: F32 shape: [-1, 8] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "g" dtype: F32 shape: [8] kind: PARAM init { constant { value: 1 } } }
    var { name: "b" dtype: F32 shape: [8] kind: PARAM init { constant { value: 0 } } }
    var { name: "w" dtype: F32 shape: [8, 8] kind: PARAM init { uniform { low: -0.3 high: 0.3 } } }
    op { type: "layer_norm" input: ["x", "g", "b"] output: ["y"] }
    op { type: "matmul" input: ["y", "w"] output: ["z"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  struct Case {
    std::string tail;
    bool folds;
  };
  const Case cases[] = {
      // The residual add reads y in float32 too.
      {R"pb(op { type: "add" input: ["z", "y"] output: ["s"] }
            op { type: "softmax_cross_entropy" input: ["s", "label"] output: ["loss"] })pb",
       false},
      // Only the matmul's cast reads y.
      {R"pb(op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] })pb", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tail);
    CompileOptions options;
    options.batch_size = 4;
    auto r = Compile(ParseProgramOrFail(head + c.tail), Mixed(BF16), options);
    ASSERT_TRUE(r.ok()) << r.status();
    int layer_norms = 0;
    for (const Op& op : r->plans[0].program().op()) {
      if (op.type() != "layer_norm") continue;
      ++layer_norms;
      EXPECT_EQ(OutDtype(op), c.folds ? "BF16" : "");
      EXPECT_EQ(op.output(0), c.folds ? "y@bf16" : "y");
    }
    EXPECT_EQ(layer_norms, 1);
  }
}

// A matmul_bias with a residual (passes/fuse_epilogues) keeps its float
// output even where a cast down is its only reader: its sum is float
// (cuBLASLt's C and D of one type), so the cast stays, and on a GPU plan
// the program compiles with it.
TEST(FoldCastsTest, LeavesTheCastOfAMatmulBiasWithAResidual) {
  const std::string text = R"pb(
    name: "residual"
    var { name: "in" dtype: F32 shape: [-1, 8] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w0" dtype: F32 shape: [8, 8] kind: PARAM init { uniform { low: -0.3 high: 0.3 } } }
    var { name: "w1" dtype: F32 shape: [8, 8] kind: PARAM init { uniform { low: -0.3 high: 0.3 } } }
    var { name: "b1" dtype: F32 shape: [8] kind: PARAM }
    var { name: "w2" dtype: F32 shape: [8, 8] kind: PARAM init { uniform { low: -0.3 high: 0.3 } } }
    op { type: "matmul" input: ["in", "w0"] output: ["x0"] }
    op { type: "relu" input: ["x0"] output: ["x"] }
    op { type: "matmul" input: ["x", "w1"] output: ["xw"] }
    op { type: "add" input: ["xw", "b1"] output: ["y"] }
    op { type: "add" input: ["x", "y"] output: ["h"] }
    op { type: "matmul" input: ["h", "w2"] output: ["z"] }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  CompileOptions options;
  options.batch_size = 4;
  options.device_kind = DEVICE_CUDA;
  auto r = Compile(ParseProgramOrFail(text), Mixed(BF16), options);
  ASSERT_TRUE(r.ok()) << r.status();
  const Program& p = r->plans[0].program();
  int with_residual = 0, casts_of_h = 0;
  for (const Op& op : p.op()) {
    if (op.type() == "matmul_bias" && op.input_size() == 4) {
      ++with_residual;
      EXPECT_EQ(OutDtype(op), "");
      EXPECT_EQ(op.output(0), "h");
      EXPECT_EQ(VarDtype(p, "h"), F32);
    }
    casts_of_h += op.type() == "cast" && op.input(0) == "h";
  }
  EXPECT_EQ(with_residual, 1);
  EXPECT_EQ(casts_of_h, 1);
}

}  // namespace
}  // namespace strata
