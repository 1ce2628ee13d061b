#include "passes/fuse_epilogues.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"

namespace strata {
namespace {

// Two linear layers: fc1 (x @ w1 + b1, then relu) and fc2 (h @ w2 + b2, the
// logits). Whatever the test adds goes before the loss.
std::string Mlp(const std::string& extra_vars = "", const std::string& extra_ops = "",
                const std::string& fields = "") {
  return absl::StrCat(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w1" dtype: F32 shape: [4, 6] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b1" dtype: F32 shape: [6] kind: PARAM }
    var { name: "w2" dtype: F32 shape: [6, 3] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b2" dtype: F32 shape: [3] kind: PARAM }
  )pb",
                      extra_vars, R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["xw1"] }
    op { type: "add" input: ["xw1", "b1"] output: ["y1"] }
    op { type: "relu" input: ["y1"] output: ["h"] }
    op { type: "matmul" input: ["h", "w2"] output: ["xw2"] }
    op { type: "add" input: ["b2", "xw2"] output: ["z"] }
  )pb",
                      extra_ops, R"pb(
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb",
                      fields);
}

Program DumpAfter(const std::string& text, const Strategy& strategy, const std::string& pass,
                  DeviceKind device = DEVICE_CUDA) {
  CompileOptions options;
  options.batch_size = 8;
  options.dump_after = pass;
  options.device_kind = device;
  auto result = Compile(ParseProgramOrFail(text), strategy, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->dumped : Program();
}

int Count(const Program& p, const std::string& type) {
  return static_cast<int>(std::count_if(p.op().begin(), p.op().end(), [&](const Op& op) { return op.type() == type; }));
}

const Op* Writer(const Program& p, const std::string& var) {
  for (const Op& op : p.op()) {
    for (const std::string& out : op.output()) {
      if (out == var) return &op;
    }
  }
  return nullptr;
}

bool Declared(const Program& p, const std::string& var) {
  return std::any_of(p.var().begin(), p.var().end(), [&](const Var& v) { return v.name() == var; });
}

// Mlp with fc1's relu replaced by a gelu of the given form ("" for no attr).
std::string GeluMlp(const std::string& approximate, const std::string& extra_ops = "",
                    const std::string& fields = "") {
  std::string text = Mlp("", extra_ops, fields);
  const std::string relu = R"pb(op { type: "relu" input: ["y1"] output: ["h"] })pb";
  const std::string attr =
      approximate.empty() ? "" : absl::StrCat(R"pb( attr { key: "approximate" value { s: ")pb", approximate, "\" } }");
  const std::string gelu = absl::StrCat(R"pb(op { type: "gelu" input: ["y1"] output: ["h"])pb", attr, " }");
  text.replace(text.find(relu), relu.size(), gelu);
  return text;
}

TEST(FuseEpiloguesTest, RunsAfterAutodiffForGpuPlansOnly) {
  const std::vector<std::string> gpu = CompilePassNames(Strategy(), DEVICE_CUDA);
  const auto at = [&](const std::string& n) { return std::find(gpu.begin(), gpu.end(), n) - gpu.begin(); };
  ASSERT_LT(at("fuse-epilogues"), static_cast<long>(gpu.size()));
  EXPECT_LT(at("autodiff"), at("fuse-epilogues"));
  EXPECT_LT(at("fuse-epilogues"), at("pipeline-split"));
  const std::vector<std::string> cpu = CompilePassNames(Strategy());
  EXPECT_EQ(std::find(cpu.begin(), cpu.end(), "fuse-epilogues"), cpu.end());
}

// Both layers (the bias on either side of the add) become matmul_bias
// writing the add's output; the products are gone, and the backward still
// reads what it read (the gradient of y is dy's, the matmul's gradient ops
// read x, w and dy).
TEST(FuseEpiloguesTest, FusesMatmulThenBiasAdd) {
  const Program before = DumpAfter(Mlp(), Strategy(), "autodiff");
  const Program after = DumpAfter(Mlp(), Strategy(), "fuse-epilogues");
  EXPECT_EQ(Count(after, "matmul_bias"), 2);
  // The two weight gradients' GEMMs fused with their bias sums too (below).
  EXPECT_EQ(Count(after, "matmul_bias_grad_b"), 2);
  EXPECT_EQ(Count(after, "matmul"), Count(before, "matmul") - 4);
  EXPECT_EQ(Count(after, "add"), Count(before, "add") - 2);
  const Op* y1 = Writer(after, "y1");
  ASSERT_NE(y1, nullptr);
  EXPECT_EQ(y1->type(), "matmul_bias");
  EXPECT_EQ(std::vector<std::string>(y1->input().begin(), y1->input().end()),
            (std::vector<std::string>{"x", "w1", "b1"}));
  // Every attr of the schema, as the kernels read them.
  EXPECT_FALSE(y1->attr().at("transpose_b").b());
  EXPECT_FALSE(y1->attr().at("allow_tf32").b());
  const Op* z = Writer(after, "z");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(std::vector<std::string>(z->input().begin(), z->input().end()),
            (std::vector<std::string>{"h", "w2", "b2"}));
  EXPECT_FALSE(Declared(after, "xw1"));
  EXPECT_FALSE(Declared(after, "xw2"));
  EXPECT_EQ(after.op_size(), before.op_size() - 4);
}

// matmul -> add -> gelu (tanh form) becomes one matmul_bias_gelu writing the
// gelu's output and the pre-activation, which the backward still reads: its
// gelu_grad, fused in turn with the GEMM of dh (matmul_gelu_grad, below).
TEST(FuseEpiloguesTest, FusesMatmulBiasThenTanhGelu) {
  const Program before = DumpAfter(GeluMlp("tanh"), Strategy(), "autodiff");
  const Program after = DumpAfter(GeluMlp("tanh"), Strategy(), "fuse-epilogues");
  EXPECT_EQ(Count(after, "matmul_bias_gelu"), 1);
  EXPECT_EQ(Count(after, "matmul_bias"), 1);  // fc2: no gelu after it
  EXPECT_EQ(Count(after, "gelu"), 0);
  const Op* h = Writer(after, "h");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->type(), "matmul_bias_gelu");
  EXPECT_EQ(std::vector<std::string>(h->input().begin(), h->input().end()),
            (std::vector<std::string>{"x", "w1", "b1"}));
  EXPECT_EQ(std::vector<std::string>(h->output().begin(), h->output().end()), (std::vector<std::string>{"h", "y1"}));
  EXPECT_FALSE(h->attr().at("transpose_b").b());
  EXPECT_FALSE(h->attr().at("allow_tf32").b());
  EXPECT_TRUE(Declared(after, "y1"));
  EXPECT_EQ(Count(after, "gelu_grad"), 0);
  const Op* dy1 = Writer(after, "y1@grad");
  ASSERT_NE(dy1, nullptr);
  EXPECT_EQ(dy1->type(), "matmul_gelu_grad");
  EXPECT_EQ(dy1->input(2), "y1");
  // matmul and add of fc1 and fc2 (4 ops) and the gelu go; one matmul_bias and
  // one matmul_bias_gelu come; the backward's two GEMM + sum pairs fuse too,
  // and dh's GEMM with the gelu_grad.
  EXPECT_EQ(after.op_size(), before.op_size() - 5 + 2 - 2 - 1);
}

// Under BF16 mixed precision runs the gelu in bf16: matmul_bias (BF16
// operands, F32 output) -> cast to BF16 -> gelu, and gelu_grad reading the
// cast's output. The fusion writes the gelu's bf16 output and that bf16
// pre-activation (out_dtype and z_dtype BF16, cuBLASLt's D and aux in one
// type); the float pre-activation and its cast go.
TEST(FuseEpiloguesTest, FusesTheTanhGeluUnderMixedPrecision) {
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  const Program before = DumpAfter(GeluMlp("tanh"), bf16, "autodiff");
  const Op* cast = Writer(before, "y1@bf16");
  ASSERT_NE(cast, nullptr);
  EXPECT_EQ(cast->type(), "cast");
  const Program after = DumpAfter(GeluMlp("tanh"), bf16, "fuse-epilogues");
  EXPECT_EQ(Count(after, "matmul_bias_gelu"), 1);
  EXPECT_EQ(Count(after, "gelu"), 0);
  // y1's cast, fc1's and fc2's casts back (matmul_bias), the weight
  // gradients' casts up (matmul_bias_grad_b writes F32 dW).
  EXPECT_EQ(Count(after, "cast"), Count(before, "cast") - 5);
  const Op* h = Writer(after, "h@bf16");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->type(), "matmul_bias_gelu");
  EXPECT_EQ(std::vector<std::string>(h->input().begin(), h->input().end()),
            (std::vector<std::string>{"x@bf16", "w1@bf16", "b1"}));
  EXPECT_EQ(std::vector<std::string>(h->output().begin(), h->output().end()),
            (std::vector<std::string>{"h@bf16", "y1@bf16"}));
  EXPECT_EQ(h->attr().at("out_dtype").s(), "BF16");
  EXPECT_EQ(h->attr().at("z_dtype").s(), "BF16");
  EXPECT_FALSE(Declared(after, "y1"));
  // The backward reads the bf16 pre-activation: its gelu_grad, fused with
  // the bf16 GEMM of dh (matmul_gelu_grad, z the bf16 y1).
  EXPECT_EQ(Count(after, "gelu_grad"), 0);
  const Op* dy1 = Writer(after, "y1@bf16@grad");
  ASSERT_NE(dy1, nullptr);
  EXPECT_EQ(dy1->type(), "matmul_gelu_grad");
  EXPECT_EQ(dy1->input(2), "y1@bf16");
}

// The gelu_grad of the tanh form and the GEMM writing its dy, which only it
// reads, become one matmul_gelu_grad (cuBLASLt's DGELU) in the GEMM's place:
// dh = dz @ w2^T, dy1 = gelu'(y1) dh, dh never written. F32, and under BF16
// mixed precision with the bf16 operands and pre-activation.
TEST(FuseEpiloguesTest, FusesTheGeluGradIntoTheGemmOfItsDy) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    Strategy strategy;
    if (bf16) strategy.mutable_mixed_precision()->set_dtype(BF16);
    const std::string low = bf16 ? "@bf16" : "";
    const Program before = DumpAfter(GeluMlp("tanh"), strategy, "autodiff");
    const Op* dh = Writer(before, absl::StrCat("h", low, "@grad"));
    ASSERT_NE(dh, nullptr);
    ASSERT_EQ(dh->type(), "matmul");
    const Program after = DumpAfter(GeluMlp("tanh"), strategy, "fuse-epilogues");
    EXPECT_EQ(Count(after, "matmul_gelu_grad"), 1);
    EXPECT_EQ(Count(after, "gelu_grad"), 0);
    EXPECT_FALSE(Declared(after, absl::StrCat("h", low, "@grad")));
    const Op* fused = Writer(after, absl::StrCat("y1", low, "@grad"));
    ASSERT_NE(fused, nullptr);
    EXPECT_EQ(fused->type(), "matmul_gelu_grad");
    EXPECT_EQ(std::vector<std::string>(fused->input().begin(), fused->input().end()),
              (std::vector<std::string>{dh->input(0), dh->input(1), absl::StrCat("y1", low)}));
    EXPECT_EQ(fused->attr().at("transpose_b").b(), dh->attr().at("transpose_b").b());
    EXPECT_TRUE(fused->attr().at("transpose_b").b());  // dz @ w2^T
    EXPECT_FALSE(fused->attr().at("allow_tf32").b());
    EXPECT_EQ(fused->role(), BACKWARD);
    // In the GEMM's place: before fc2's weight gradient, which followed it.
    int at_fused = -1, at_dw2 = -1;
    for (int i = 0; i < after.op_size(); ++i) {
      if (&after.op(i) == fused) at_fused = i;
      for (const std::string& out : after.op(i).output()) {
        if (out == "w2@grad") at_dw2 = i;
      }
    }
    ASSERT_GE(at_dw2, 0);
    EXPECT_LT(at_fused, at_dw2);
  }
}

// Under recompute the pre-activation is written again just before its
// first backward reader, the weight gradient after dh's GEMM: the fused op
// takes the gelu_grad's place there (after the GEMM's inputs are written,
// not rewritten), one per block as without recompute, and reads the
// recomputed z.
TEST(FuseEpiloguesTest, FusesTheGeluGradOfARecomputedBlock) {
  Strategy strategy;
  for (int b = 0; b < kTinyGptBlocks; ++b) strategy.mutable_recompute()->add_checkpoints(absl::StrCat("h", b));
  const Program after = DumpAfter(TinyGptText(), strategy, "fuse-epilogues");
  EXPECT_EQ(Count(after, "matmul_gelu_grad"), kTinyGptBlocks);
  EXPECT_EQ(Count(after, "gelu_grad"), 0);
  int recomputed = 0;
  for (int i = 0; i < after.op_size(); ++i) {
    const Op& op = after.op(i);
    if (op.type() != "matmul_gelu_grad") continue;
    recomputed += absl::StrContains(op.input(2), "@recompute");
    // Every input written before it.
    for (const std::string& in : op.input()) {
      for (int j = i; j < after.op_size(); ++j) {
        for (const std::string& out : after.op(j).output()) EXPECT_NE(out, in) << "written at op " << j;
      }
    }
  }
  // Each segment between two checkpoints is recomputed (block 0, h0 -> h1);
  // the last one, from the last checkpoint to the loss, is not.
  EXPECT_EQ(recomputed, kTinyGptBlocks - 1);
}

// Not fused: the erf form's gelu_grad (DGELU is the tanh form's), and a
// gelu_grad whose dy is not a GEMM's output but autodiff's sum of the
// gradients of the gelu's two readers.
TEST(FuseEpiloguesTest, LeavesGeluGradsItCannotFuse) {
  for (const std::string form : {"", "none"}) {
    SCOPED_TRACE(form);
    const Program after = DumpAfter(GeluMlp(form), Strategy(), "fuse-epilogues");
    EXPECT_EQ(Count(after, "matmul_gelu_grad"), 0);
    EXPECT_EQ(Count(after, "gelu_grad"), 1);
  }
  // h read by a second op: its gradient is a sum, add_n(dh from fc2, dh from
  // the mean), which the gelu_grad reads; the GEMM's output is not its dy.
  std::string text = GeluMlp("tanh");
  const std::string logits = R"pb(op { type: "add" input: ["b2", "xw2"] output: ["z"] })pb";
  ASSERT_NE(text.find(logits), std::string::npos);
  text.replace(text.find(logits), logits.size(),
               R"pb(op { type: "add" input: ["b2", "xw2"] output: ["z0"] }
                    op { type: "reduce_mean" input: ["h"] output: ["h_mean"] }
                    op { type: "add" input: ["z0", "h_mean"] output: ["z"] })pb");
  const Program summed = DumpAfter(text, Strategy(), "fuse-epilogues");
  EXPECT_EQ(Count(summed, "matmul_gelu_grad"), 0);
  EXPECT_EQ(Count(summed, "gelu_grad"), 1);
}

// Under BF16 too, not fused: the erf form (its cast and bf16 gelu stay), an
// F32 pre-activation that a reduce_mean reads beside its cast, and a bf16
// copy that a second gelu reads too (mixed precision casts y1 once for both).
TEST(FuseEpiloguesTest, LeavesBf16GelusItCannotFuse) {
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  const Program erf = DumpAfter(GeluMlp("none"), bf16, "fuse-epilogues");
  EXPECT_EQ(Count(erf, "matmul_bias_gelu"), 0);
  EXPECT_EQ(Count(erf, "gelu"), 1);
  const Op* y1 = Writer(erf, "y1");
  ASSERT_NE(y1, nullptr);
  EXPECT_EQ(y1->type(), "matmul_bias");
  for (const std::string& extra :
       {std::string(R"pb(op { type: "reduce_mean" input: ["y1"] output: ["y1_mean"] })pb"),
        std::string(R"pb(op { type: "gelu" input: ["y1"] output: ["y1_again"]
                          attr { key: "approximate" value { s: "tanh" } } }
                         op { type: "reduce_mean" input: ["y1_again"] output: ["y1_mean"] })pb")}) {
    SCOPED_TRACE(extra);
    const Program read = DumpAfter(GeluMlp("tanh", extra, R"pb(fetch: "y1_mean")pb"), bf16, "fuse-epilogues");
    EXPECT_EQ(Count(read, "matmul_bias_gelu"), 0);
    EXPECT_GE(Count(read, "gelu"), 1);
    const Op* kept = Writer(read, "y1");
    ASSERT_NE(kept, nullptr);
    EXPECT_EQ(kept->type(), "matmul_bias");
  }
}

// Not fused: the erf form (cuBLASLt's GELU is the tanh one), a pre-activation
// with a reader other than the gelu and its gelu_grad.
TEST(FuseEpiloguesTest, LeavesGelusItCannotFuse) {
  for (const std::string form : {"", "none"}) {
    SCOPED_TRACE(form);
    const Program after = DumpAfter(GeluMlp(form), Strategy(), "fuse-epilogues");
    EXPECT_EQ(Count(after, "matmul_bias_gelu"), 0);
    EXPECT_EQ(Count(after, "matmul_bias"), 2);
    EXPECT_EQ(Count(after, "gelu"), 1);
  }
  const Program read = DumpAfter(
      GeluMlp("tanh", R"pb(op { type: "reduce_mean" input: ["y1"] output: ["y1_mean"] })pb", R"pb(fetch: "y1_mean")pb"),
      Strategy(), "fuse-epilogues");
  EXPECT_EQ(Count(read, "matmul_bias_gelu"), 0);
  EXPECT_EQ(Count(read, "gelu"), 1);
  const Op* y1 = Writer(read, "y1");
  ASSERT_NE(y1, nullptr);
  EXPECT_EQ(y1->type(), "matmul_bias");
}

// Under BF16 mixed precision: matmul (BF16) -> cast to F32 -> add becomes
// one matmul_bias of the BF16 operands into the F32 output.
TEST(FuseEpiloguesTest, FusesThroughTheMixedPrecisionCast) {
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  const Program before = DumpAfter(Mlp(), bf16, "autodiff");
  const Program after = DumpAfter(Mlp(), bf16, "fuse-epilogues");
  EXPECT_EQ(Count(after, "matmul_bias"), 2);
  const Op* y1 = Writer(after, "y1");
  ASSERT_NE(y1, nullptr);
  EXPECT_EQ(y1->type(), "matmul_bias");
  EXPECT_EQ(std::vector<std::string>(y1->input().begin(), y1->input().end()),
            (std::vector<std::string>{"x@bf16", "w1@bf16", "b1"}));
  EXPECT_FALSE(Declared(after, "xw1"));
  EXPECT_FALSE(Declared(after, "xw1@bf16"));
  // The two forward casts back to F32 are gone, and the two weight
  // gradients' (fused with the bias sums); the input casts stay.
  EXPECT_EQ(Count(after, "matmul_bias_grad_b"), 2);
  EXPECT_EQ(Count(after, "cast"), Count(before, "cast") - 4);
}

// What must stay: a product a second op reads, a
// bias that is not [N], a transposed a, and plans for the CPU.
TEST(FuseEpiloguesTest, LeavesWhatItCannotFuse) {
  // xw1 and xw2 each read by a second op (a fetched mean of xw1).
  const std::string fetched = Mlp("",
                                  R"pb(op { type: "reduce_mean" input: ["xw1"] output: ["m1"] }
                                       op { type: "relu" input: ["xw2"] output: ["r2"] })pb",
                                  R"pb(fetch: "m1")pb");
  const Program p = DumpAfter(fetched, Strategy(), "fuse-epilogues");
  EXPECT_EQ(Count(p, "matmul_bias"), 0);
  // A 2-D bias [1, 6].
  std::string wide = Mlp();
  wide.replace(wide.find(R"(name: "b1" dtype: F32 shape: [6])"), std::string(R"(name: "b1" dtype: F32 shape: [6])").size(),
               R"(name: "b1" dtype: F32 shape: [1, 6])");
  const Program q = DumpAfter(wide, Strategy(), "fuse-epilogues");
  EXPECT_EQ(Writer(q, "y1")->type(), "add");
  EXPECT_EQ(Writer(q, "z")->type(), "matmul_bias");
  // transpose_a (a square feed, so x^T @ w has the shape of x @ w).
  const std::string transposed = R"pb(
    var { name: "x" dtype: F32 shape: [4, 4] kind: FEED }
    var { name: "w" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b" dtype: F32 shape: [4] kind: PARAM }
    op { type: "matmul" input: ["x", "w"] output: ["xw"] attr { key: "transpose_a" value { b: true } } }
    op { type: "add" input: ["xw", "b"] output: ["y"] }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  CompileOptions options;
  options.dump_after = "fuse-epilogues";
  options.device_kind = DEVICE_CUDA;
  options.batch_size = 4;
  auto r = Compile(ParseProgramOrFail(transposed), Strategy(), options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Count(r->dumped, "matmul_bias"), 0);
  // CPU plans are not fused at all.
  CompileOptions cpu;
  cpu.batch_size = 8;
  auto plain = Compile(ParseProgramOrFail(Mlp()), Strategy(), cpu);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(Count(plain->plans[0].program(), "matmul_bias"), 0);
}

std::vector<std::string> Inputs(const Op& op) { return {op.input().begin(), op.input().end()}; }
std::vector<std::string> Outputs(const Op& op) { return {op.output().begin(), op.output().end()}; }

// The weight gradient's GEMM and the bias's sum over the same dy become one
// matmul_bias_grad_b writing both: for a 2-D x (autodiff's x^T @ dy matmul),
// both layers; no sum_to_like is left.
TEST(FuseEpiloguesTest, FusesTheBiasGradientIntoTheWeightGradient) {
  const Program before = DumpAfter(Mlp(), Strategy(), "autodiff");
  const Program after = DumpAfter(Mlp(), Strategy(), "fuse-epilogues");
  EXPECT_EQ(Count(before, "sum_to_like"), 2);
  EXPECT_EQ(Count(after, "sum_to_like"), 0);
  const Op* w1 = Writer(after, "w1@grad");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->type(), "matmul_bias_grad_b");
  EXPECT_EQ(Inputs(*w1)[0], "x");
  EXPECT_EQ(Outputs(*w1), (std::vector<std::string>{"w1@grad", "b1@grad"}));
  EXPECT_FALSE(w1->attr().at("transpose_b").b());
  EXPECT_FALSE(w1->attr().at("allow_tf32").b());
  EXPECT_EQ(w1->role(), BACKWARD);
  // dy is what the sum read and the GEMM read.
  const Op* sum = nullptr;
  for (const Op& op : before.op()) {
    if (op.type() == "sum_to_like" && op.output(0) == "b1@grad") sum = &op;
  }
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(Inputs(*w1)[1], sum->input(0));
  const Op* w2 = Writer(after, "w2@grad");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->type(), "matmul_bias_grad_b");
  EXPECT_EQ(Outputs(*w2), (std::vector<std::string>{"w2@grad", "b2@grad"}));
}

// A batched x (matmul_shared_b_grad_b) and a transposed weight [N, K] (the
// GEMM dy^T @ x: transpose_b on the fused op).
TEST(FuseEpiloguesTest, FusesBatchedAndTransposedWeightGradients) {
  const std::string batched = R"pb(
    var { name: "x" dtype: F32 shape: [-1, 5, 4] kind: FEED }
    var { name: "w" dtype: F32 shape: [4, 6] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b" dtype: F32 shape: [6] kind: PARAM }
    var { name: "v" dtype: F32 shape: [3, 6] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "c" dtype: F32 shape: [3] kind: PARAM }
    op { type: "matmul" input: ["x", "w"] output: ["xw"] }
    op { type: "add" input: ["xw", "b"] output: ["y"] }
    op { type: "relu" input: ["y"] output: ["h"] }
    op { type: "matmul" input: ["h", "v"] output: ["hv"] attr { key: "transpose_b" value { b: true } } }
    op { type: "add" input: ["hv", "c"] output: ["z"] }
    op { type: "reduce_mean" input: ["z"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  const Program after = DumpAfter(batched, Strategy(), "fuse-epilogues");
  EXPECT_EQ(Count(after, "matmul_shared_b_grad_b"), 0);
  EXPECT_EQ(Count(after, "sum_to_like"), 0);
  const Op* w = Writer(after, "w@grad");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->type(), "matmul_bias_grad_b");
  EXPECT_EQ(Outputs(*w), (std::vector<std::string>{"w@grad", "b@grad"}));
  EXPECT_FALSE(w->attr().at("transpose_b").b());
  const Op* v = Writer(after, "v@grad");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->type(), "matmul_bias_grad_b");
  EXPECT_EQ(Inputs(*v)[0], "h");
  EXPECT_EQ(Outputs(*v), (std::vector<std::string>{"v@grad", "c@grad"}));
  EXPECT_TRUE(v->attr().at("transpose_b").b());
}

// Under BF16 mixed precision the GEMM reads dy's BF16 cast and its product is
// cast to F32: the fused op takes the BF16 x and dy to the F32 gradients, the
// product and its cast gone (dy's cast stays: the input gradient's GEMM
// reads it too).
TEST(FuseEpiloguesTest, FusesTheBiasGradientThroughTheMixedPrecisionCasts) {
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  const Program after = DumpAfter(Mlp(), bf16, "fuse-epilogues");
  const Op* w2 = Writer(after, "w2@grad");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->type(), "matmul_bias_grad_b");
  EXPECT_EQ(Inputs(*w2)[0], "h@bf16");
  EXPECT_EQ(Outputs(*w2), (std::vector<std::string>{"w2@grad", "b2@grad"}));
  const Op* dy = Writer(after, Inputs(*w2)[1]);
  ASSERT_NE(dy, nullptr);
  EXPECT_EQ(dy->type(), "cast");
  EXPECT_FALSE(Declared(after, "w2@bf16@grad"));
  EXPECT_EQ(Count(after, "sum_to_like"), 0);
}

// What must stay: a bias that is not 1-D, CPU plans, a reader of the sum
// before the GEMM (the fused op would take the GEMM's place), and a 2-D
// matmul's weight gradient when the plan sums gradients over micro-batches
// (matmul_accumulate's).
TEST(FuseEpiloguesTest, LeavesTheBiasGradientsItCannotFuse) {
  std::string wide = Mlp();
  wide.replace(wide.find(R"(name: "b1" dtype: F32 shape: [6])"), std::string(R"(name: "b1" dtype: F32 shape: [6])").size(),
               R"(name: "b1" dtype: F32 shape: [1, 6])");
  const Program q = DumpAfter(wide, Strategy(), "fuse-epilogues");
  EXPECT_EQ(Writer(q, "b1@grad")->type(), "sum_to_like");
  EXPECT_NE(Writer(q, "w1@grad")->type(), "matmul_bias_grad_b");
  EXPECT_EQ(Writer(q, "w2@grad")->type(), "matmul_bias_grad_b");

  CompileOptions cpu;
  cpu.batch_size = 8;
  auto plain = Compile(ParseProgramOrFail(Mlp()), Strategy(), cpu);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(Count(plain->plans[0].program(), "matmul_bias_grad_b"), 0);

  // A forward sum and GEMM over the same feed h: fused when the sum's reader
  // comes after the GEMM, not when it comes before.
  const auto ordered = [](bool reader_first) {
    const std::string reader = R"pb(op { type: "reduce_mean" input: ["s"] output: ["rs"] })pb";
    return absl::StrCat(R"pb(
      var { name: "x" dtype: F32 shape: [8, 4] kind: FEED }
      var { name: "h" dtype: F32 shape: [8, 6] kind: FEED }
      var { name: "b" dtype: F32 shape: [6] kind: FEED }
      var { name: "w" dtype: F32 shape: [4, 6] kind: PARAM init { normal { std: 0.5 } } }
      op { type: "sum_to_like" input: ["h", "b"] output: ["s"] }
    )pb",
                        reader_first ? reader : "", R"pb(
      op { type: "matmul" input: ["x", "h"] output: ["g"] attr { key: "transpose_a" value { b: true } } }
    )pb",
                        reader_first ? "" : reader, R"pb(
      op { type: "add" input: ["g", "w"] output: ["z"] }
      op { type: "reduce_mean" input: ["z"] output: ["loss"] }
      loss: "loss"
      fetch: "rs"
      optimizer { sgd { learning_rate: 0.1 } }
    )pb");
  };
  EXPECT_EQ(Writer(DumpAfter(ordered(false), Strategy(), "fuse-epilogues"), "s")->type(), "matmul_bias_grad_b");
  EXPECT_EQ(Writer(DumpAfter(ordered(true), Strategy(), "fuse-epilogues"), "s")->type(), "sum_to_like");

  Strategy pipelined;
  pipelined.mutable_pipeline()->set_micro_batch_size(4);
  pipelined.mutable_pipeline()->set_accumulate_steps(2);
  const Program p = DumpAfter(Mlp(), pipelined, "fuse-epilogues");
  EXPECT_EQ(Count(p, "matmul_bias_grad_b"), 0);
  EXPECT_EQ(Count(p, "sum_to_like"), 2);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A layer norm on a residual connection, h = x + layer_norm(x) with x itself
// computed (so it has a gradient): backward sums x's two gradients, and that
// add_n becomes the layer_norm_grad's residual. With `branch_first`, x also
// feeds a matmul that runs before the layer norm, so its gradient part is
// written after the layer_norm_grad: that sum cannot move into it.
std::string ResidualLayerNorm(bool branch_first) {
  const std::string branch = R"pb(op { type: "matmul" input: ["x", "wb"] output: ["b"] })pb";
  return absl::StrCat(R"pb(
    var { name: "in" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w0" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "wb" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "g" dtype: F32 shape: [4] kind: PARAM init { constant { value: 1 } } }
    var { name: "beta" dtype: F32 shape: [4] kind: PARAM }
    op { type: "matmul" input: ["in", "w0"] output: ["x"] }
  )pb",
                      branch_first ? branch : "", R"pb(
    op { type: "layer_norm" input: ["x", "g", "beta"] output: ["y"] }
  )pb",
                      branch_first ? R"pb(op { type: "add" input: ["b", "y"] output: ["h"] })pb"
                                   : R"pb(op { type: "add" input: ["x", "y"] output: ["h"] })pb",
                      R"pb(
    op { type: "softmax_cross_entropy" input: ["h", "label"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
}

TEST(FuseEpiloguesTest, FusesTheResidualGradientSumIntoTheLayerNormGradient) {
  const Program before = DumpAfter(ResidualLayerNorm(false), Strategy(), "autodiff");
  const Program after = DumpAfter(ResidualLayerNorm(false), Strategy(), "fuse-epilogues");
  ASSERT_EQ(Count(before, "add_n"), 1);
  EXPECT_EQ(Count(after, "add_n"), 0);
  const Op* dx = Writer(after, "x@grad");
  ASSERT_NE(dx, nullptr);
  EXPECT_EQ(dx->type(), "layer_norm_grad");
  ASSERT_EQ(dx->input_size(), 4);
  EXPECT_EQ(dx->input(3), "h@grad");  // the add's gradient of x is h's
  EXPECT_EQ(after.op_size(), before.op_size() - 1);
  // The layer norm's own part is gone.
  for (const Op& op : before.op()) {
    if (op.type() == "layer_norm_grad") {
      EXPECT_FALSE(Declared(after, op.output(0))) << op.output(0);
    }
  }
}

TEST(FuseEpiloguesTest, LeavesAResidualSumWhosePartComesAfterTheLayerNormGradient) {
  const Program before = DumpAfter(ResidualLayerNorm(true), Strategy(), "autodiff");
  const Program after = DumpAfter(ResidualLayerNorm(true), Strategy(), "fuse-epilogues");
  ASSERT_EQ(Count(before, "add_n"), 1);
  EXPECT_EQ(Count(after, "add_n"), 1);
  for (const Op& op : after.op()) {
    if (op.type() == "layer_norm_grad") {
      EXPECT_EQ(op.input_size(), 3);
    }
  }
}

// A layer_norm_grad that writes dx_low too (out_dtype; fold-casts makes
// them, after this pass, and a program may write one) keeps its residual sum
// apart: taking the residual would make dx_low the sum's copy, not dx's.
TEST(FuseEpiloguesTest, LeavesTheResidualSumOfALayerNormGradientWritingDxLow) {
  constexpr char kProgram[] = R"pb(
    var { name: "x" dtype: F32 shape: [-1, 8] kind: FEED }
    var { name: "dyf" dtype: F32 shape: [-1, 8] kind: FEED }
    var { name: "gam" dtype: F32 shape: [8] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w2" dtype: F32 shape: [8, 4] kind: PARAM init { normal { std: 0.1 } } }
    op { type: "relu" input: ["x"] output: ["r"] }
    op { type: "tanh" input: ["x"] output: ["h"] }
    op {
      type: "layer_norm_grad"
      input: ["h", "gam", "dyf"]
      output: ["dx", "dg", "db", "dxl"]
      attr { key: "out_dtype" value { s: "BF16" } }
    }
    op { type: "add_n" input: ["r", "dx"] output: ["s"] }
    op { type: "cast" input: ["dxl"] output: ["q"] attr { key: "dtype" value { s: "F32" } } }
    op { type: "add" input: ["s", "q"] output: ["t"] }
    op { type: "matmul" input: ["t", "w2"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  const Program after = DumpAfter(kProgram, Strategy(), "fuse-epilogues");
  const Op* ln = Writer(after, "dxl");
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(ln->type(), "layer_norm_grad");
  EXPECT_EQ(ln->input_size(), 3);
  EXPECT_EQ(Count(after, "add_n"), 1);
}

// Every block of the tiny GPT: both layer norms' gradients take the
// residual stream's gradient, and the only add_n left sums the tied
// embedding's two parts.
TEST(FuseEpiloguesTest, EveryGptLayerNormGradientTakesTheResidualSum) {
  for (bool mixed : {false, true}) {
    Strategy strategy;
    if (mixed) strategy.mutable_mixed_precision()->set_dtype(BF16);
    const Program after = DumpAfter(TinyGptText(), strategy, "fuse-epilogues");
    int with_residual = 0;
    for (const Op& op : after.op()) with_residual += op.type() == "layer_norm_grad" && op.input_size() == 4;
    EXPECT_EQ(with_residual, 2 * kTinyGptBlocks) << (mixed ? "BF16" : "F32");
    EXPECT_EQ(Count(after, "add_n"), 1) << (mixed ? "BF16" : "F32");
  }
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A linear layer on a residual connection, h = x + (x @ w1 + b1) with x
// itself computed (written before the linear layer): the add of the
// residual goes into the matmul_bias that the bias add made. `residual_op`
// replaces that add (its output must be "h").
std::string ResidualLinear(const std::string& residual_op = R"pb(op { type: "add" input: ["x", "y"] output: ["h"] })pb",
                           const std::string& extra_ops = "") {
  return absl::StrCat(R"pb(
    var { name: "in" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w0" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "w1" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b1" dtype: F32 shape: [4] kind: PARAM }
    op { type: "matmul" input: ["in", "w0"] output: ["x"] }
    op { type: "matmul" input: ["x", "w1"] output: ["xw"] }
    op { type: "add" input: ["xw", "b1"] output: ["y"] }
  )pb",
                      extra_ops, residual_op, R"pb(
    op { type: "softmax_cross_entropy" input: ["h", "label"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
}

TEST(FuseEpiloguesTest, FusesTheResidualAddIntoTheMatmulBias) {
  for (const char* order : {R"pb(op { type: "add" input: ["x", "y"] output: ["h"] })pb",
                            R"pb(op { type: "add" input: ["y", "x"] output: ["h"] })pb"}) {
    SCOPED_TRACE(order);
    const Program before = DumpAfter(ResidualLinear(order), Strategy(), "autodiff");
    const Program after = DumpAfter(ResidualLinear(order), Strategy(), "fuse-epilogues");
    ASSERT_EQ(Count(before, "add"), 2);
    EXPECT_EQ(Count(after, "add"), 0);
    const Op* h = Writer(after, "h");
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->type(), "matmul_bias");
    ASSERT_EQ(h->input_size(), 4);
    EXPECT_EQ(h->input(0), "x");
    EXPECT_EQ(h->input(2), "b1");
    EXPECT_EQ(h->input(3), "x");
    EXPECT_FALSE(Declared(after, "y"));
    EXPECT_FALSE(Declared(after, "xw"));
    // The backward is autodiff's: x's two gradient parts still summed, the bias's still one.
    EXPECT_EQ(Count(after, "add_n"), Count(before, "add_n"));
    EXPECT_EQ(Count(after, "matmul_bias_grad_b"), 1);
  }
}

// A parallel residual block (GPT-J's, PaLM's): out = y2 + (y1 + x), two
// linear layers on x. The inner add goes into y1's matmul_bias, whose
// output r the outer add then reads: it goes into y2's, r's writer being
// the first fused GEMM (an earlier version of the scan still saw the erased
// add as r's writer and left the outer add unfused).
TEST(FuseEpiloguesTest, FusesBothAddsOfAParallelResidualBlock) {
  const std::string text = R"pb(
    var { name: "in" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w0" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "w1" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b1" dtype: F32 shape: [4] kind: PARAM }
    var { name: "w2" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b2" dtype: F32 shape: [4] kind: PARAM }
    op { type: "matmul" input: ["in", "w0"] output: ["x"] }
    op { type: "matmul" input: ["x", "w1"] output: ["p1"] }
    op { type: "add" input: ["p1", "b1"] output: ["y1"] }
    op { type: "matmul" input: ["x", "w2"] output: ["p2"] }
    op { type: "add" input: ["p2", "b2"] output: ["y2"] }
    op { type: "add" input: ["y1", "x"] output: ["r"] }
    op { type: "add" input: ["y2", "r"] output: ["out"] }
    op { type: "softmax_cross_entropy" input: ["out", "label"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  const Program after = DumpAfter(text, Strategy(), "fuse-epilogues");
  EXPECT_EQ(Count(after, "add"), 0);
  const Op* r = Writer(after, "r");
  const Op* out = Writer(after, "out");
  ASSERT_NE(r, nullptr);
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(r->type(), "matmul_bias");
  EXPECT_EQ(out->type(), "matmul_bias");
  ASSERT_EQ(out->input_size(), 4);
  EXPECT_EQ(out->input(3), "r");
}

TEST(FuseEpiloguesTest, LeavesTheResidualAddsItCannotFuse) {
  struct Case {
    const char* what;
    std::string text;
  };
  const Case cases[] = {
      // r written after the matmul_bias: the fused op could not read it where it stands.
      {"residual written after",
       ResidualLinear(R"pb(op { type: "relu" input: ["x"] output: ["r"] }
                           op { type: "add" input: ["y", "r"] output: ["h"] })pb")},
      // A broadcast residual: not y's shape.
      {"broadcast residual", ResidualLinear(R"pb(op { type: "add" input: ["y", "b1"] output: ["h"] })pb")},
      // y read by another op too.
      {"y read twice", ResidualLinear(R"pb(op { type: "add" input: ["x", "y"] output: ["s"] }
                                          op { type: "add" input: ["s", "y"] output: ["h"] })pb")},
      // y + y.
      {"y + y", ResidualLinear(R"pb(op { type: "add" input: ["y", "y"] output: ["h"] })pb")},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Program p = DumpAfter(c.text, Strategy(), "fuse-epilogues");
    for (const Op& op : p.op()) {
      if (op.type() == "matmul_bias") {
        EXPECT_EQ(op.input_size(), 3);
      }
    }
    EXPECT_EQ(Count(p, "matmul_bias"), 1);  // the bias add still fused
  }
  // Not on CPU plans.
  const Program cpu = DumpAfter(ResidualLinear(), Strategy(), "fuse-epilogues", DEVICE_CPU);
  EXPECT_EQ(Count(cpu, "matmul_bias"), 0);
}

// Every block of the tiny GPT: the attention projection's and the MLP
// projection's residual adds go into their matmul_bias, in F32 and under
// BF16 mixed precision (the F32 y of BF16 operands), and the only add left
// sums the token and position embeddings; fold-casts (BF16) leaves them
// float.
TEST(FuseEpiloguesTest, EveryGptProjectionTakesItsResidualAdd) {
  for (bool mixed : {false, true}) {
    SCOPED_TRACE(mixed ? "BF16" : "F32");
    Strategy strategy;
    if (mixed) strategy.mutable_mixed_precision()->set_dtype(BF16);
    const Program before = DumpAfter(TinyGptText(), strategy, "autodiff");
    const Program after = DumpAfter(TinyGptText(), strategy, mixed ? "fold-casts" : "fuse-epilogues");
    int with_residual = 0;
    for (const Op& op : after.op()) {
      if (op.type() != "matmul_bias" || op.input_size() != 4) continue;
      ++with_residual;
      const auto out_dtype = op.attr().find("out_dtype");
      EXPECT_TRUE(out_dtype == op.attr().end() || out_dtype->second.s().empty()) << op.output(0);
    }
    EXPECT_EQ(with_residual, 2 * kTinyGptBlocks);
    EXPECT_EQ(Count(after, "add"), 1);
    EXPECT_GE(Count(before, "add"), 2 * kTinyGptBlocks);
  }
}

}  // namespace
}  // namespace strata
