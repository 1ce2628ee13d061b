#include "passes/mixed_precision.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/attention_budget.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

// A two-layer MLP whose first weight is read twice (h = x @ w1, g = x @ w1
// again, summed), a layer_norm and a softmax loss that stay in float32.
constexpr char kMlp[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w1" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w2" dtype: F32 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w1"] output: ["a"] }
  op { type: "matmul" input: ["x", "w1"] output: ["b"] }
  op { type: "add" input: ["a", "b"] output: ["s"] }
  op { type: "relu" input: ["s"] output: ["h"] }
  op { type: "matmul" input: ["h", "w2"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

Program DumpAfter(const Strategy& strategy, const std::string& pass, const std::string& program = kMlp,
                  bool fold_losses = true) {
  CompileOptions options;
  options.batch_size = 8;
  options.dump_after = pass;
  options.mixed_precision_fold_losses = fold_losses;
  auto result = Compile(ParseProgramOrFail(program), strategy, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->dumped : Program();
}

TEST(MixedPrecisionTest, RunsBetweenPlacementAndAutodiff) {
  std::vector<std::string> names = CompilePassNames(Bf16());
  auto at = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  ASSERT_LT(at("mixed-precision"), static_cast<long>(names.size()));
  EXPECT_LT(at("placement"), at("mixed-precision"));
  EXPECT_LT(at("mixed-precision"), at("autodiff"));
  std::vector<std::string> plain = CompilePassNames(Strategy());
  EXPECT_EQ(std::find(plain.begin(), plain.end(), "mixed-precision"), plain.end());
}

TEST(MixedPrecisionTest, CastsAroundEveryMatmul) {
  const Program p = DumpAfter(Bf16(), "mixed-precision");
  // Each matmul reads BF16 copies and writes a BF16 var.
  for (const Op* m : OpsOfType(p, "matmul")) {
    for (const auto& in : m->input()) {
      ASSERT_TRUE(HasVar(p, in)) << in;
      EXPECT_EQ(FindVar(p, in)->dtype(), BF16) << in;
    }
    EXPECT_EQ(FindVar(p, m->output(0))->dtype(), BF16) << m->output(0);
  }
  // One cast per var: x, w1 (read twice), h, w2 to BF16; a, b back. z's
  // only reader is the loss, which reads z@bf16 itself: no cast, no F32 z.
  std::vector<std::string> to_bf16, to_f32;
  for (const Op* c : OpsOfType(p, "cast")) {
    (Attr(*c, "dtype").s() == "BF16" ? to_bf16 : to_f32).push_back(c->input(0));
  }
  EXPECT_EQ(to_bf16, (std::vector<std::string>{"x", "w1", "h", "w2"}));
  EXPECT_EQ(to_f32, (std::vector<std::string>{"a@bf16", "b@bf16"}));
  EXPECT_EQ(OpsWriting(p, "w1@bf16").size(), 1u);
  EXPECT_FALSE(HasVar(p, "z"));
  ASSERT_EQ(OpsOfType(p, "softmax_cross_entropy").size(), 1u);
  EXPECT_EQ(OpsOfType(p, "softmax_cross_entropy")[0]->input(0), "z@bf16");
  EXPECT_EQ(FindVar(p, "loss")->dtype(), F32);
  // The outputs keep their names and float32, written by the casts back.
  for (const std::string name : {"a", "b"}) {
    EXPECT_EQ(FindVar(p, name)->dtype(), F32) << name;
    ASSERT_EQ(OpsWriting(p, name).size(), 1u) << name;
    EXPECT_EQ(OpsWriting(p, name)[0]->type(), "cast") << name;
    EXPECT_LT(IndexOf(p, OpsWriting(p, absl::StrCat(name, "@bf16"))[0]), IndexOf(p, OpsWriting(p, name)[0]));
  }
  // Every other op as it was, in float32; the params stay F32.
  for (const std::string type : {"add", "relu"}) {
    ASSERT_EQ(OpsOfType(p, type).size(), 1u) << type;
    for (const auto& in : OpsOfType(p, type)[0]->input()) EXPECT_NE(FindVar(p, in)->dtype(), BF16) << type;
  }
  EXPECT_EQ(FindVar(p, "w1")->dtype(), F32);
  EXPECT_EQ(FindVar(p, "w2")->dtype(), F32);
}

TEST(MixedPrecisionTest, WeightGradientsArriveInFloat32) {
  const Program p = DumpAfter(Bf16(), "autodiff");
  ASSERT_EQ(p.param_grad().size(), 2);
  for (const auto& [param, grad] : p.param_grad()) {
    EXPECT_EQ(FindVar(p, param)->dtype(), F32) << param;
    EXPECT_EQ(FindVar(p, grad)->dtype(), F32) << grad;
  }
  // The shared cast's gradient parts are summed in BF16, then cast once.
  bool summed = false;
  for (const Op* s : OpsOfType(p, "add_n")) summed |= FindVar(p, s->output(0))->dtype() == BF16;
  EXPECT_TRUE(summed);
}

// gelu runs in the low dtype as torch autocast runs it: the bias add's F32
// output is cast down, the gelu writes bf16 and the next matmul reads that
// bf16 output itself (the cast back goes: nothing reads the F32 h). After
// autodiff gelu_grad reads the bf16 pre-activation and a bf16 dy and writes
// a bf16 dx. relu (kMlp's) stays F32.
TEST(MixedPrecisionTest, GeluRunsInTheLowDtype) {
  const std::string gelu_mlp = R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w1" dtype: F32 shape: [4, 8] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b1" dtype: F32 shape: [8] kind: PARAM init { constant { value: 0.1 } } }
    var { name: "w2" dtype: F32 shape: [8, 3] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "matmul" input: ["x", "w1"] output: ["xw"] }
    op { type: "add" input: ["xw", "b1"] output: ["z1"] }
    op { type: "gelu" input: ["z1"] output: ["h"] attr { key: "approximate" value { s: "tanh" } } }
    op { type: "matmul" input: ["h", "w2"] output: ["z"] }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  for (DataType low : {BF16, F16}) {
    SCOPED_TRACE(DataTypeName(low));
    Strategy strategy;
    strategy.mutable_mixed_precision()->set_dtype(low);
    const std::string suffix = low == BF16 ? "@bf16" : "@f16";
    const Program p = DumpAfter(strategy, "mixed-precision", gelu_mlp);
    const std::vector<const Op*> gelus = OpsOfType(p, "gelu");
    ASSERT_EQ(gelus.size(), 1u);
    EXPECT_EQ(gelus[0]->input(0), "z1" + suffix);
    EXPECT_EQ(gelus[0]->output(0), "h" + suffix);
    EXPECT_EQ(FindVar(p, "h" + suffix)->dtype(), low);
    EXPECT_EQ(Attr(*gelus[0], "approximate").s(), "tanh");
    EXPECT_FALSE(HasVar(p, "h"));  // only the matmul read it: the cast back went
    const std::vector<const Op*> second = OpsWriting(p, "z" + suffix);
    ASSERT_EQ(second.size(), 1u);
    EXPECT_EQ(second[0]->input(0), "h" + suffix);
    const Program grads = DumpAfter(strategy, "autodiff", gelu_mlp);
    const std::vector<const Op*> gelu_grads = OpsOfType(grads, "gelu_grad");
    ASSERT_EQ(gelu_grads.size(), 1u);
    EXPECT_EQ(gelu_grads[0]->input(0), "z1" + suffix);
    for (const std::string& v : {gelu_grads[0]->input(1), gelu_grads[0]->output(0)}) {
      EXPECT_EQ(FindVar(grads, v)->dtype(), low) << v;
    }
  }
  // kMlp's relu keeps F32.
  const Program relu = DumpAfter(Bf16(), "mixed-precision");
  ASSERT_EQ(OpsOfType(relu, "relu").size(), 1u);
  EXPECT_EQ(FindVar(relu, OpsOfType(relu, "relu")[0]->input(0))->dtype(), F32);
}

TEST(MixedPrecisionTest, CompilesAndPlansWithMicroBatches) {
  Strategy s = Bf16();
  s.mutable_pipeline()->set_micro_batch_size(4);
  s.mutable_pipeline()->set_accumulate_steps(2);
  CompileOptions options;
  auto result = Compile(ParseProgramOrFail(kMlp), s, options);
  ASSERT_TRUE(result.ok()) << result.status();
  // matmul_accumulate is F32/F64 only: the weight gradients come from casts.
  for (const RankPlan& plan : result->plans) {
    for (const Op& op : plan.program().op()) {
      if (op.type() == "matmul_accumulate") ADD_FAILURE() << "fused a mixed-precision gradient";
    }
  }
}

TEST(MixedPrecisionTest, NoOpWithoutTheSection) {
  const Program p = DumpAfter(Strategy(), "autodiff");
  EXPECT_TRUE(OpsOfType(p, "cast").empty());
  for (const auto& v : p.var()) EXPECT_NE(v.dtype(), BF16) << v.name();
}

TEST(MixedPrecisionTest, RefusesOtherDtypes) {
  const Program program = ParseProgramOrFail(kMlp);
  Strategy s;
  s.mutable_mixed_precision()->set_dtype(F64);
  absl::Status st = ValidateStrategy(s, program, 0, "s.pbtxt");
  EXPECT_EQ(st.message(), "s.pbtxt: mixed_precision.dtype: F64 is not a mixed-precision dtype; use BF16 or F16");
  EXPECT_TRUE(ValidateStrategy(Bf16(), program, 0, "s.pbtxt").ok());
  s.mutable_mixed_precision()->set_dtype(F16);
  EXPECT_TRUE(ValidateStrategy(s, program, 0, "s.pbtxt").ok());
}

TEST(MixedPrecisionTest, F16CastsAroundEveryMatmul) {
  Strategy s;
  s.mutable_mixed_precision()->set_dtype(F16);
  const Program p = DumpAfter(s, "mixed-precision");
  std::vector<std::string> to_f16;
  for (const Op* c : OpsOfType(p, "cast")) {
    if (Attr(*c, "dtype").s() == "F16") to_f16.push_back(c->output(0));
  }
  EXPECT_EQ(to_f16, (std::vector<std::string>{"x@f16", "w1@f16", "h@f16", "w2@f16"}));
  for (const Op* m : OpsOfType(p, "matmul")) EXPECT_EQ(FindVar(p, m->output(0))->dtype(), F16) << m->output(0);
  ASSERT_EQ(OpsOfType(p, "softmax_cross_entropy").size(), 1u);
  EXPECT_EQ(OpsOfType(p, "softmax_cross_entropy")[0]->input(0), "z@f16");
  EXPECT_FALSE(HasVar(p, "z"));
}

// The loss's backward under the fold: softmax_cross_entropy_grad reads the
// BF16 logits and the F32 seed and writes the BF16 gradient the matmul's
// backward reads; no cast touches the logits or their gradient.
TEST(MixedPrecisionTest, TheLossGradientIsBf16WithoutCasts) {
  const Program p = DumpAfter(Bf16(), "autodiff");
  const std::vector<const Op*> grads = OpsOfType(p, "softmax_cross_entropy_grad");
  ASSERT_EQ(grads.size(), 1u);
  const Op& g = *grads[0];
  EXPECT_EQ(g.input(0), "z@bf16");
  EXPECT_EQ(FindVar(p, g.input(2))->dtype(), F32) << g.input(2);
  EXPECT_EQ(g.output(0), "z@bf16@grad");
  EXPECT_EQ(FindVar(p, g.output(0))->dtype(), BF16);
  EXPECT_FALSE(HasVar(p, "z@grad"));
  for (const Op* c : OpsOfType(p, "cast")) {
    EXPECT_FALSE(absl::StartsWith(c->input(0), "z@") || absl::StartsWith(c->output(0), "z@")) << c->input(0);
  }
  bool read = false;  // by the matmul's backward
  for (const Op& op : p.op()) {
    if (&op == &g) continue;
    for (const auto& in : op.input()) read |= in == "z@bf16@grad";
  }
  EXPECT_TRUE(read);
}

// The F32 logits stay, with their cast, when anything but the loss reads
// them: another op (accuracy, F32 only, fetched as a metric; a softmax), or
// the loss on another pipeline stage than the matmul; and when the fold is
// off (the compile option the end-to-end bit-identity test uses), or when
// they are a recompute checkpoint. (A fetch is a scalar, so logits [N, C]
// are never fetched themselves.)
TEST(MixedPrecisionTest, LogitsReadElsewhereKeepTheirCast) {
  const std::string softmax = absl::StrCat(
      kMlp, R"pb(op { type: "softmax" input: ["z"] output: ["p"] }
                 op { type: "reduce_mean" input: ["p"] output: ["pm"] }
                 fetch: "pm")pb");
  const std::string metric = absl::StrCat(
      kMlp, R"pb(op { type: "accuracy" input: ["z", "label"] output: ["acc"] } fetch: "acc")pb");
  // Every op on stage 0 but the loss, on stage 1.
  std::string staged = kMlp;
  for (size_t at = staged.find("] }"); at != std::string::npos; at = staged.find("] }", at + 1)) {
    const bool loss = staged.rfind("softmax_cross_entropy", at) > staged.rfind("op {", at) &&
                      staged.rfind("softmax_cross_entropy", at) != std::string::npos;
    staged.replace(at, 3, loss ? R"(] device: "gpu:1" })" : R"(] device: "gpu:0" })");
  }
  const std::vector<std::tuple<std::string, std::string, bool>> cases = {
      {"softmax", softmax, true}, {"metric", metric, true}, {"other stage", staged, true}, {"fold off", kMlp, false}};
  for (const auto& [what, text, fold] : cases) {
    SCOPED_TRACE(what);
    const Program p = DumpAfter(Bf16(), "mixed-precision", text, fold);
    ASSERT_TRUE(HasVar(p, "z"));
    EXPECT_EQ(FindVar(p, "z")->dtype(), F32);
    ASSERT_EQ(OpsWriting(p, "z").size(), 1u);
    EXPECT_EQ(OpsWriting(p, "z")[0]->type(), "cast");
    ASSERT_EQ(OpsOfType(p, "softmax_cross_entropy").size(), 1u);
    EXPECT_EQ(OpsOfType(p, "softmax_cross_entropy")[0]->input(0), "z");
  }
  // A recompute checkpoint on the logits: the strategy names z, which stays.
  Strategy checkpointed = Bf16();
  checkpointed.mutable_recompute()->add_checkpoints("z");
  const Program p = DumpAfter(checkpointed, "mixed-precision");
  ASSERT_TRUE(HasVar(p, "z"));
  EXPECT_EQ(OpsOfType(p, "softmax_cross_entropy")[0]->input(0), "z");
}

// A small GPT: attention runs in the low dtype too (q, k, v cast, y written
// in BF16 and cast back), its logsumexp stays F32, and the compiled program's
// attention gradient (packed by pack-qkv) reads the BF16 qkv.
Program SmallGpt(int64_t seq = 16) { return ParseProgramOrFail(TinyGptText(seq)); }

TEST(MixedPrecisionTest, AttentionRunsInBf16WithF32Lse) {
  CompileOptions options;
  options.batch_size = 8;
  options.dump_after = "mixed-precision";
  auto dumped = Compile(SmallGpt(), Bf16(), options);
  ASSERT_TRUE(dumped.ok()) << dumped.status();
  const Program& p = dumped->dumped;
  const std::vector<const Op*> attention = OpsOfType(p, "scaled_dot_product_attention");
  ASSERT_EQ(attention.size(), 2u);
  for (const Op* a : attention) {
    ASSERT_EQ(a->input_size(), 3);
    for (const auto& in : a->input()) {
      EXPECT_EQ(FindVar(p, in)->dtype(), BF16) << in;
      EXPECT_TRUE(absl::EndsWith(in, "@bf16")) << in;
      ASSERT_EQ(OpsWriting(p, in).size(), 1u) << in;
      EXPECT_EQ(OpsWriting(p, in)[0]->type(), "cast") << in;
    }
    ASSERT_EQ(a->output_size(), 2);
    const std::string& y = a->output(0);
    EXPECT_EQ(FindVar(p, y)->dtype(), BF16) << y;
    ASSERT_TRUE(absl::EndsWith(y, "@bf16")) << y;
    EXPECT_EQ(FindVar(p, a->output(1))->dtype(), F32) << a->output(1);
    EXPECT_FALSE(absl::StrContains(a->output(1), "@bf16")) << a->output(1);
    // The cast back writes the original name, in F32, right after the op.
    const std::string f32_y = y.substr(0, y.size() - std::string("@bf16").size());
    EXPECT_EQ(FindVar(p, f32_y)->dtype(), F32) << f32_y;
    ASSERT_EQ(OpsWriting(p, f32_y).size(), 1u) << f32_y;
    const Op* back = OpsWriting(p, f32_y)[0];
    EXPECT_EQ(back->type(), "cast");
    EXPECT_EQ(back->input(0), y);
    EXPECT_EQ(IndexOf(p, back), IndexOf(p, a) + 1);
  }
  // The matmuls are still cast as before.
  for (const Op* m : OpsOfType(p, "matmul")) EXPECT_EQ(FindVar(p, m->output(0))->dtype(), BF16) << m->output(0);
  // The loss reads the LM head's bf16 logits: no F32 logits, no cast up.
  ASSERT_EQ(OpsOfType(p, "softmax_cross_entropy").size(), 1u);
  EXPECT_EQ(OpsOfType(p, "softmax_cross_entropy")[0]->input(0), "logits@bf16");
  EXPECT_FALSE(HasVar(p, "logits"));
  for (const Op& op : p.op()) {
    for (const auto& in : op.input()) EXPECT_NE(in, "logits") << op.type();
  }

  options.dump_after.clear();
  auto compiled = Compile(SmallGpt(), Bf16(), options);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  int grads = 0;
  for (const RankPlan& plan : compiled->plans) {
    const Program& rank = plan.program();
    for (const Op& op : rank.op()) {
      // The packed form (passes/pack_qkv): qkv, y, lse, dy in; dqkv out.
      if (op.type() != "scaled_dot_product_attention_qkv_grad") continue;
      ++grads;
      EXPECT_EQ(FindVar(rank, op.input(0))->dtype(), BF16) << op.input(0);
      EXPECT_EQ(FindVar(rank, op.input(2))->dtype(), F32) << op.input(2);  // lse
      for (const auto& out : op.output()) EXPECT_EQ(FindVar(rank, out)->dtype(), BF16) << out;
    }
    // The loss's gradient is written in bf16 for the LM head's backward: no
    // F32 logits gradient, no cast down after it.
    EXPECT_FALSE(HasVar(rank, "logits"));
    EXPECT_FALSE(HasVar(rank, "logits@grad"));
    int loss_grads = 0;
    for (const Op& op : rank.op()) {
      if (op.type() == "cast") {
        EXPECT_NE(op.input(0), "logits@grad");
        EXPECT_NE(op.output(0), "logits@bf16@grad");
      }
      if (op.type() != "softmax_cross_entropy_grad") continue;
      ++loss_grads;
      EXPECT_EQ(op.input(0), "logits@bf16");
      EXPECT_EQ(op.output(0), "logits@bf16@grad");
      EXPECT_EQ(FindVar(rank, op.output(0))->dtype(), BF16);
    }
    EXPECT_EQ(loss_grads, 1);
  }
  EXPECT_EQ(grads, 2);
}

TEST(MixedPrecisionTest, F16AttentionKeepsF32Lse) {
  Strategy s;
  s.mutable_mixed_precision()->set_dtype(F16);
  CompileOptions options;
  options.batch_size = 8;
  options.dump_after = "mixed-precision";
  auto dumped = Compile(SmallGpt(), s, options);
  ASSERT_TRUE(dumped.ok()) << dumped.status();
  for (const Op* a : OpsOfType(dumped->dumped, "scaled_dot_product_attention")) {
    for (const auto& in : a->input()) EXPECT_EQ(FindVar(dumped->dumped, in)->dtype(), F16) << in;
    EXPECT_EQ(FindVar(dumped->dumped, a->output(0))->dtype(), F16);
    EXPECT_EQ(FindVar(dumped->dumped, a->output(1))->dtype(), F32);
  }
}

// On GPU plans, a sequence whose 16-bit scores the GPU kernels cannot hold
// (kernels/attention_budget.h: the gradient's 10 T^2 bytes a head over four
// 256 MiB budgets, T > 10362) keeps attention in float32 and its matmuls in
// bf16; at 10362 it is cast; CPU plans cast any length.
TEST(MixedPrecisionTest, GpuPlansKeepAttentionTooLongFor16BitInFloat32) {
  EXPECT_TRUE(HalfAttentionFitsOnGpu(10362));
  EXPECT_FALSE(HalfAttentionFitsOnGpu(10363));
  for (const auto& [seq, device, want] : {std::tuple{10363, DEVICE_CUDA, F32}, std::tuple{10362, DEVICE_CUDA, BF16},
                                          std::tuple{10363, DEVICE_CPU, BF16}}) {
    SCOPED_TRACE(absl::StrCat("seq ", seq, ", ", DeviceKind_Name(device)));
    CompileOptions options;
    options.batch_size = 1;
    options.device_kind = device;
    options.dump_after = "mixed-precision";
    auto dumped = Compile(SmallGpt(seq), Bf16(), options);
    ASSERT_TRUE(dumped.ok()) << dumped.status();
    const Program& p = dumped->dumped;
    const std::vector<const Op*> attention = OpsOfType(p, "scaled_dot_product_attention");
    ASSERT_EQ(attention.size(), 2u);
    for (const Op* a : attention) {
      for (const auto& in : a->input()) EXPECT_EQ(FindVar(p, in)->dtype(), want) << in;
    }
    for (const Op* m : OpsOfType(p, "matmul")) EXPECT_EQ(FindVar(p, m->output(0))->dtype(), BF16) << m->output(0);
  }
}

// The generated convnet (two conv2d layers, each with a bias add, relu and
// max pooling, then two matmuls): conv2d runs in the low dtype like matmul.
Program SmallConvnet() {
  GenOptions gen;
  gen.dtype = "F32";
  auto text = GenerateProgram("convnet", gen);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? ParseProgramOrFail(*text) : Program();
}

TEST(MixedPrecisionTest, ConvnetRunsItsConvolutionsInBf16) {
  CompileOptions options;
  options.batch_size = 8;
  options.dump_after = "mixed-precision";
  auto dumped = Compile(SmallConvnet(), Bf16(), options);
  ASSERT_TRUE(dumped.ok()) << dumped.status();
  const Program& p = dumped->dumped;
  const std::vector<const Op*> convs = OpsOfType(p, "conv2d");
  ASSERT_EQ(convs.size(), 2u);
  for (const Op* c : convs) {
    // x and w read BF16 casts; the output is written in BF16 as `<y>@bf16`.
    ASSERT_EQ(c->input_size(), 2);
    for (const auto& in : c->input()) {
      EXPECT_EQ(FindVar(p, in)->dtype(), BF16) << in;
      EXPECT_TRUE(absl::EndsWith(in, "@bf16")) << in;
      ASSERT_EQ(OpsWriting(p, in).size(), 1u) << in;
      EXPECT_EQ(OpsWriting(p, in)[0]->type(), "cast") << in;
      EXPECT_LT(IndexOf(p, OpsWriting(p, in)[0]), IndexOf(p, c)) << in;
    }
    const std::string& y = c->output(0);
    EXPECT_EQ(FindVar(p, y)->dtype(), BF16) << y;
    ASSERT_TRUE(absl::EndsWith(y, "@bf16")) << y;
    // The cast back writes the original name, in F32, right after the op.
    const std::string f32_y = y.substr(0, y.size() - std::string("@bf16").size());
    EXPECT_EQ(FindVar(p, f32_y)->dtype(), F32) << f32_y;
    ASSERT_EQ(OpsWriting(p, f32_y).size(), 1u) << f32_y;
    const Op* back = OpsWriting(p, f32_y)[0];
    EXPECT_EQ(back->type(), "cast");
    EXPECT_EQ(back->input(0), y);
    EXPECT_EQ(Attr(*back, "dtype").s(), "F32");
    EXPECT_EQ(IndexOf(p, back), IndexOf(p, c) + 1);
  }
  EXPECT_EQ(convs[0]->input(0), "image@bf16");
  EXPECT_EQ(convs[0]->input(1), "conv1.w@bf16");
  EXPECT_EQ(convs[1]->input(1), "conv2.w@bf16");
  // The bias adds, relus, pools and the loss stay float32; the params stay F32 masters.
  for (const std::string type : {"add", "relu", "max_pool2d", "softmax_cross_entropy"}) {
    ASSERT_FALSE(OpsOfType(p, type).empty()) << type;
    for (const Op* op : OpsOfType(p, type)) {
      for (const auto& in : op->input()) EXPECT_NE(FindVar(p, in)->dtype(), BF16) << type << " reads " << in;
    }
  }
  for (const Var& v : p.var()) {
    if (v.kind() == PARAM) {
      EXPECT_EQ(v.dtype(), F32) << v.name();
    }
  }
  // The matmuls are still cast as before.
  for (const Op* m : OpsOfType(p, "matmul")) EXPECT_EQ(FindVar(p, m->output(0))->dtype(), BF16) << m->output(0);

  // After autodiff: the conv gradients run in BF16 on the BF16 copies, and
  // every weight gradient arrives as an F32 master gradient.
  options.dump_after = "autodiff";
  auto diffed = Compile(SmallConvnet(), Bf16(), options);
  ASSERT_TRUE(diffed.ok()) << diffed.status();
  const Program& d = diffed->dumped;
  const std::vector<const Op*> grad_filter = OpsOfType(d, "conv2d_grad_filter");
  const std::vector<const Op*> grad_input = OpsOfType(d, "conv2d_grad_input");
  EXPECT_EQ(grad_filter.size(), 2u);
  EXPECT_EQ(grad_input.size(), 1u);  // the image needs no gradient
  for (const std::vector<const Op*>* ops : {&grad_filter, &grad_input}) {
    for (const Op* g : *ops) {
      for (const auto& in : g->input()) EXPECT_EQ(FindVar(d, in)->dtype(), BF16) << g->type() << " reads " << in;
      EXPECT_EQ(FindVar(d, g->output(0))->dtype(), BF16) << g->type() << " writes " << g->output(0);
    }
  }
  ASSERT_EQ(d.param_grad().size(), 8);  // two convs' w and b, two linear layers' w and b
  for (const auto& [param, grad] : d.param_grad()) {
    EXPECT_EQ(FindVar(d, param)->dtype(), F32) << param;
    EXPECT_EQ(FindVar(d, grad)->dtype(), F32) << grad;
  }

  // And the whole pipeline compiles and plans (the CPU has BF16 conv kernels).
  options.dump_after.clear();
  auto compiled = Compile(SmallConvnet(), Bf16(), options);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  int bf16_convs = 0;
  for (const RankPlan& plan : compiled->plans) {
    for (const Op& op : plan.program().op()) {
      if (absl::StartsWith(op.type(), "conv2d")) bf16_convs += FindVar(plan.program(), op.output(0))->dtype() == BF16;
    }
  }
  EXPECT_EQ(bf16_convs, 5);
}

TEST(MixedPrecisionTest, F16ConvnetCastsItsConvolutions) {
  Strategy s;
  s.mutable_mixed_precision()->set_dtype(F16);
  CompileOptions options;
  options.batch_size = 8;
  options.dump_after = "mixed-precision";
  auto dumped = Compile(SmallConvnet(), s, options);
  ASSERT_TRUE(dumped.ok()) << dumped.status();
  const std::vector<const Op*> convs = OpsOfType(dumped->dumped, "conv2d");
  ASSERT_EQ(convs.size(), 2u);
  for (const Op* c : convs) {
    for (const auto& in : c->input()) EXPECT_EQ(FindVar(dumped->dumped, in)->dtype(), F16) << in;
    EXPECT_EQ(FindVar(dumped->dumped, c->output(0))->dtype(), F16);
    EXPECT_TRUE(absl::EndsWith(c->output(0), "@f16")) << c->output(0);
  }
  options.dump_after.clear();
  auto compiled = Compile(SmallConvnet(), s, options);  // with loss scaling
  ASSERT_TRUE(compiled.ok()) << compiled.status();
}

}  // namespace
}  // namespace strata
