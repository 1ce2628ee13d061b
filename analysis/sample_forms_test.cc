#include "analysis/sample_forms.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A validated program: `vars_and_ops` after a batch of x [-1, 4] and labels,
// a weight w [4, 3] and a bias b [3]; `loss` names the loss.
Program Validated(const std::string& text) {
  auto program = ParseProgramText(text, "p.pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  if (!program.ok()) return Program();
  const absl::Status s = ValidateAndInferProgram(&*program);
  EXPECT_TRUE(s.ok()) << s;
  return *std::move(program);
}

Program Classifier(const std::string& ops, const std::string& loss = "loss") {
  return Validated(absl::StrCat(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F32 shape: [4, 3] kind: PARAM init { xavier_uniform {} } }
    var { name: "b" dtype: F32 shape: [3] kind: PARAM }
  )pb", ops, "loss: \"", loss, "\"\noptimizer { sgd { learning_rate: 0.1 } }\n"));
}

VarSampleForm Of(const Program& p, const std::string& name) {
  const std::vector<VarSampleForm> forms = SampleForms(p);
  for (int i = 0; i < p.var_size(); ++i) {
    if (p.var(i).name() == name) return forms[i];
  }
  ADD_FAILURE() << "no var " << name;
  return {SampleForm::kMixed};
}

SampleForm FormOf(const Program& p, const std::string& name) { return Of(p, name).form; }

// Whether a split batch averages the program's loss over its parts (a mean
// or a constant); a loss that combines neither way fails the test.
bool Averaged(const Program& p) {
  absl::StatusOr<LossCombine> combine = LossCombination(p);
  EXPECT_TRUE(combine.ok()) << combine.status();
  return combine.ok() && *combine == LossCombine::kAverage;
}

constexpr char kLogits[] = R"pb(
  op { type: "matmul" input: ["x", "w"] output: ["xw"] }
  op { type: "add" input: ["xw", "b"] output: ["logits"] }
)pb";

TEST(SampleFormsTest, CrossEntropyIsAMeanOverSamples) {
  const Program p = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb"));
  EXPECT_EQ(FormOf(p, "w"), SampleForm::kConstant);
  EXPECT_EQ(FormOf(p, "x"), SampleForm::kPerSample);
  EXPECT_EQ(FormOf(p, "logits"), SampleForm::kPerSample);
  EXPECT_EQ(FormOf(p, "loss"), SampleForm::kMean);
  EXPECT_TRUE(Averaged(p));
}

TEST(SampleFormsTest, AMeanPlusAWeightPenaltyIsStillAMean) {
  // An affine function of a mean splits exactly: each part adds the penalty
  // once and the parts are averaged.
  const Program p = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["ce"] }
    op { type: "square" input: ["w"] output: ["w2"] }
    op { type: "reduce_sum" input: ["w2"] output: ["l2"] }
    op { type: "scale" input: ["l2"] output: ["penalty"] attr { key: "scale" value { f: 0.01 } } }
    op { type: "add" input: ["ce", "penalty"] output: ["sum"] }
    op { type: "scale" input: ["sum"] output: ["loss"] attr { key: "scale" value { f: 2 } } attr { key: "bias" value { f: 1 } } }
  )pb"));
  EXPECT_EQ(FormOf(p, "penalty"), SampleForm::kConstant);
  EXPECT_EQ(FormOf(p, "loss"), SampleForm::kMean);
  EXPECT_TRUE(Averaged(p));
}

TEST(SampleFormsTest, AReduceSumOverTheBatchIsASumNamedWithItsOp) {
  const Program p = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "square" input: ["logits"] output: ["sq"] }
    op { type: "reduce_sum" input: ["sq"] output: ["total"] }
    op { type: "scale" input: ["total"] output: ["loss"] attr { key: "scale" value { f: 0.015625 } } }
  )pb"));
  EXPECT_EQ(FormOf(p, "sq"), SampleForm::kPerSample);
  EXPECT_EQ(FormOf(p, "loss"), SampleForm::kSum);
  // Its parts add up to the whole batch's (a scale keeps a sum a sum).
  absl::StatusOr<LossCombine> combine = LossCombination(p);
  ASSERT_TRUE(combine.ok()) << combine.status();
  EXPECT_EQ(*combine, LossCombine::kSum);
}

TEST(SampleFormsTest, ASumPlusAConstantIsStillNamedASum) {
  const Program p = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "reduce_sum" input: ["logits"] output: ["total"] }
    op { type: "scale" input: ["total"] output: ["loss"] attr { key: "bias" value { f: 1 } } }
  )pb"));
  EXPECT_EQ(FormOf(p, "loss"), SampleForm::kSum);
  // The parts' total would count the constant once per part.
  EXPECT_EQ(LossCombination(p).status().message(),
            "the loss 'loss' is a sum over the batch's samples (p.pbtxt:10: op #2 'reduce_sum') plus a constant "
            "(p.pbtxt:11: op #3 'scale'), which the parts' total would count once per part: make the sum a mean "
            "(reduce_mean) or leave the constant out");
}

TEST(SampleFormsTest, ASoftmaxAlongTheBatchAxisMixesSamples) {
  const Program p = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "softmax" input: ["logits"] output: ["sm"] attr { key: "axis" value { i: 0 } } }
    op { type: "reduce_mean" input: ["sm"] output: ["loss"] }
  )pb"));
  EXPECT_EQ(FormOf(p, "sm"), SampleForm::kMixed);
  EXPECT_EQ(LossCombination(p).status().message(),
            "the loss 'loss' changes with how the batch is split: p.pbtxt:10: op #2 'softmax' normalizes along the "
            "batch axis");
  // Along the class axis it is per sample.
  const Program ok = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "softmax" input: ["logits"] output: ["sm"] }
    op { type: "reduce_mean" input: ["sm"] output: ["loss"] }
  )pb"));
  EXPECT_TRUE(Averaged(ok));
}

TEST(SampleFormsTest, CenteringOnTheBatchMeanMixesSamples) {
  // x - mean over the batch (a batch norm's first half).
  const Program p = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "reduce_mean" input: ["logits"] output: ["mu"] attr { key: "axis" value { list { i: 0 } } } }
    op { type: "sub" input: ["logits", "mu"] output: ["centered"] }
    op { type: "softmax_cross_entropy" input: ["centered", "label"] output: ["loss"] }
  )pb"));
  EXPECT_EQ(FormOf(p, "mu"), SampleForm::kMean);
  EXPECT_THAT(LossCombination(p).status().message(),
              AllOf(HasSubstr("op #3 'sub'"), HasSubstr("combines per-sample values with a mean or sum")));
}

TEST(SampleFormsTest, ANonlinearityOfAMeanMixesSamples) {
  const Program p = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["ce"] }
    op { type: "square" input: ["ce"] output: ["loss"] }
  )pb"));
  EXPECT_THAT(LossCombination(p).status().message(), HasSubstr("op #3 'square' applies a nonlinearity"));
  const Program product = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["ce"] }
    op { type: "mul" input: ["ce", "ce"] output: ["loss"] }
  )pb"));
  EXPECT_THAT(LossCombination(product).status().message(), HasSubstr("multiplies two means or sums"));
}

TEST(SampleFormsTest, AReshapeKeepsSamplesApartWhileTheBatchDimLeadsAsBefore) {
  // [B, 4] -> [B, 2, 2] -> [B, 4]: entry b is still sample b's.
  const Program apart = Classifier(R"pb(
    op { type: "reshape" input: ["x"] output: ["halves"] attr { key: "shape" value { list { i: [-1, 2, 2] } } } }
    op { type: "reshape" input: ["halves"] output: ["x2"] attr { key: "shape" value { list { i: [-1, 4] } } } }
    op { type: "matmul" input: ["x2", "w"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  EXPECT_EQ(FormOf(apart, "halves"), SampleForm::kPerSample);
  EXPECT_TRUE(Averaged(apart));
  // [B, 4] -> [2, B, 2]: entry b holds halves of samples 2b/... and others.
  const Program interleaved = Classifier(R"pb(
    var { name: "w2" dtype: F32 shape: [2, 3] kind: PARAM }
    op { type: "reshape" input: ["x"] output: ["split"] attr { key: "shape" value { list { i: [2, -1, 2] } } } }
    op { type: "matmul" input: ["split", "w2"] output: ["z"] }
    op { type: "reduce_mean" input: ["z"] output: ["loss"] }
  )pb");
  EXPECT_THAT(LossCombination(interleaved).status().message(),
              HasSubstr("op #0 'reshape' reshapes so that entries of the batch dimension hold parts of several samples"));
}

TEST(SampleFormsTest, AContractionOverTheBatchIsASum) {
  // x^T x: [4, 4], summed over samples.
  const Program p = Classifier(R"pb(
    op { type: "matmul" input: ["x", "x"] output: ["gram"] attr { key: "transpose_a" value { b: true } } }
    op { type: "matmul" input: ["gram", "w"] output: ["gw"] }
    op { type: "reduce_mean" input: ["gw"] output: ["loss"] }
  )pb");
  EXPECT_EQ(FormOf(p, "gram"), SampleForm::kSum);
  // A mean over its entries is linear in the sum: the parts add up.
  EXPECT_EQ(FormOf(p, "loss"), SampleForm::kSum);
  absl::StatusOr<LossCombine> combine = LossCombination(p);
  ASSERT_TRUE(combine.ok()) << combine.status();
  EXPECT_EQ(*combine, LossCombine::kSum);
}

TEST(SampleFormsTest, ASoftmaxAlongTheBatchAxisAfterATransposeMixesSamples) {
  for (const std::string op : {"softmax", "log_softmax"}) {
    SCOPED_TRACE(op);
    const std::string norm = absl::StrCat("op { type: \"", op, "\" input: [\"t\"] output: [\"n\"] }");
    const Program p = Classifier(absl::StrCat(kLogits, R"pb(
      op { type: "transpose" input: ["logits"] output: ["t"] attr { key: "perm" value { list { i: [1, 0] } } } }
    )pb", norm, R"pb(
      op { type: "reduce_mean" input: ["n"] output: ["loss"] }
    )pb"));
    EXPECT_EQ(FormOf(p, "t"), SampleForm::kPerSample);
    EXPECT_THAT(LossCombination(p).status().message(),
                HasSubstr(absl::StrCat("op #3 '", op, "' normalizes along the batch axis")));
  }
}

TEST(SampleFormsTest, DropoutNumbersItsMaskByTheRowsOfDimZero) {
  // The kernel keys the mask on (part's first sample + row along dim 0):
  // per sample only where dim 0 is the batch.
  const Program batch_first = Classifier(R"pb(
    op { type: "dropout" input: ["x"] output: ["d"] }
    op { type: "matmul" input: ["d", "w"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  EXPECT_TRUE(Averaged(batch_first));
  const Program transposed = Classifier(R"pb(
    op { type: "transpose" input: ["x"] output: ["xt"] attr { key: "perm" value { list { i: [1, 0] } } } }
    op { type: "dropout" input: ["xt"] output: ["dt"] }
    op { type: "transpose" input: ["dt"] output: ["d"] attr { key: "perm" value { list { i: [1, 0] } } } }
    op { type: "matmul" input: ["d", "w"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  EXPECT_THAT(LossCombination(transposed).status().message(),
              HasSubstr("op #1 'dropout' reads the batch dimension as another axis"));
  // On a weight (DropConnect) each part would draw another mask.
  const Program weight = Classifier(R"pb(
    op { type: "dropout" input: ["w"] output: ["wd"] }
    op { type: "matmul" input: ["x", "wd"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  EXPECT_THAT(LossCombination(weight).status().message(),
              HasSubstr("op #0 'dropout' draws its mask by sample on a value without the batch dim"));
  const Program no_drop = Classifier(R"pb(
    op { type: "dropout" input: ["w"] output: ["wd"] attr { key: "p" value { f: 0 } } }
    op { type: "matmul" input: ["x", "wd"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  EXPECT_EQ(FormOf(no_drop, "wd"), SampleForm::kConstant);
}

TEST(SampleFormsTest, ACastToAnIntegerIsNotLinear) {
  const Program p = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["ce"] }
    op { type: "cast" input: ["ce"] output: ["ci"] attr { key: "dtype" value { s: "I64" } } }
    op { type: "cast" input: ["ci"] output: ["loss"] attr { key: "dtype" value { s: "F32" } } }
  )pb"));
  EXPECT_EQ(FormOf(p, "ci"), SampleForm::kMixed);
  const Program wide = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["ce"] }
    op { type: "cast" input: ["ce"] output: ["loss"] attr { key: "dtype" value { s: "F64" } } }
  )pb"));
  EXPECT_EQ(FormOf(wide, "loss"), SampleForm::kMean);
}

TEST(SampleFormsTest, ALossOverTimeMajorRowsIsAMean) {
  // [T, B, C] logits: every sample owns T of the rows the loss averages.
  const Program p = Classifier(R"pb(
    var { name: "w6" dtype: F32 shape: [4, 6] kind: PARAM }
    op { type: "matmul" input: ["x", "w6"] output: ["h"] }
    op { type: "reshape" input: ["h"] output: ["h3"] attr { key: "shape" value { list { i: [-1, 2, 3] } } } }
    op { type: "transpose" input: ["h3"] output: ["logits"] attr { key: "perm" value { list { i: [1, 0, 2] } } } }
    op { type: "reshape" input: ["label"] output: ["l1"] attr { key: "shape" value { list { i: [1, -1] } } } }
    op { type: "concat" input: ["l1", "l1"] output: ["labels"] attr { key: "axis" value { i: 0 } } }
    op { type: "softmax_cross_entropy" input: ["logits", "labels"] output: ["loss"] }
  )pb");
  EXPECT_TRUE(Averaged(p));
}

TEST(SampleFormsTest, BroadcastLikeRepeatsPerSampleValues) {
  // Each sample centred on its own mean over features.
  const Program p = Classifier(R"pb(
    op { type: "reduce_mean" input: ["x"] output: ["mu"] attr { key: "axis" value { list { i: [1] } } } }
    op { type: "broadcast_like" input: ["mu", "x"] output: ["mub"] attr { key: "axis" value { list { i: [1] } } } }
    op { type: "sub" input: ["x", "mub"] output: ["xc"] }
    op { type: "matmul" input: ["xc", "w"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  EXPECT_EQ(FormOf(p, "mub"), SampleForm::kPerSample);
  EXPECT_TRUE(Averaged(p));
}

TEST(SampleFormsTest, BroadcastLikeWithMeanOverTheBatchDividesByThePartsSize) {
  // mean: true divides by the count of the dims repeated over: a constant
  // spread over the batch axis becomes c / (B x 3), which each part has
  // its own of (a fuzzing helper's loss, 0.8 apart under dp2).
  const Program p = Classifier(absl::StrCat(kLogits, R"pb(
    var { name: "c" dtype: F32 shape: [] kind: PARAM }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["ce"] }
    op { type: "broadcast_like" input: ["c", "logits"] output: ["per"] attr { key: "mean" value { b: true } } }
    op { type: "mul" input: ["per", "logits"] output: ["prod"] }
    op { type: "reduce_mean" input: ["prod"] output: ["pen"] }
    op { type: "add" input: ["ce", "pen"] output: ["loss"] }
  )pb"));
  EXPECT_EQ(FormOf(p, "per"), SampleForm::kMixed);
  EXPECT_THAT(LossCombination(p).status().message(),
              HasSubstr("op #3 'broadcast_like' divides by the number of samples (mean: true over the batch axis)"));
  // Over the class axis alone it divides by 3 on every layout; without mean
  // it repeats.
  const Program classes = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "reduce_mean" input: ["logits"] output: ["row"] attr { key: "axis" value { list { i: [1] } } } attr { key: "keepdim" value { b: true } } }
    op { type: "broadcast_like" input: ["row", "logits"] output: ["per"] attr { key: "axis" value { list { i: [1] } } } attr { key: "keepdim" value { b: true } } attr { key: "mean" value { b: true } } }
    op { type: "reduce_mean" input: ["per"] output: ["loss"] }
  )pb"));
  EXPECT_EQ(FormOf(classes, "per"), SampleForm::kPerSample);
  EXPECT_TRUE(Averaged(classes));
  const Program repeated = Classifier(absl::StrCat(kLogits, R"pb(
    var { name: "c" dtype: F32 shape: [] kind: PARAM }
    op { type: "broadcast_like" input: ["c", "logits"] output: ["per"] }
    op { type: "mul" input: ["per", "logits"] output: ["prod"] }
    op { type: "reduce_mean" input: ["prod"] output: ["loss"] }
  )pb"));
  EXPECT_EQ(FormOf(repeated, "per"), SampleForm::kPerSample);
  EXPECT_TRUE(Averaged(repeated));
}

TEST(SampleFormsTest, ASumBesideAConstantInAConcatOrABiasedMatmulCarriesItsOffset) {
  // Found by a fuzzing helper: the replicas' total counted the bias (the
  // concatenated constant) once per replica, 222.13 against one device's
  // 122.13.
  auto with_ce = [](const std::string& ops) {
    return Classifier(absl::StrCat(kLogits, R"pb(
      op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
      op { type: "reduce_sum" input: ["x"] output: ["colsum"] attr { key: "axis" value { list { i: [0] } } } attr { key: "keepdim" value { b: true } } }
    )pb", ops));
  };
  const Program biased = with_ce(R"pb(
    var { name: "v" dtype: F32 shape: [4, 1] kind: PARAM }
    var { name: "bias" dtype: F32 shape: [1] kind: PARAM }
    op { type: "matmul_bias" input: ["colsum", "v", "bias"] output: ["proj"] }
    op { type: "reduce_sum" input: ["proj"] output: ["total"] }
    fetch: "total"
  )pb");
  EXPECT_EQ(FormOf(biased, "total"), SampleForm::kSum);
  EXPECT_THAT(Of(biased, "total").offset_at, HasSubstr("op #4 'matmul_bias'"));
  EXPECT_THAT(CheckFetchesCombine(biased).message(), HasSubstr("op #4 'matmul_bias'), which the parts' total would count"));
  // Without the bias the product stays a sum.
  const Program plain = with_ce(R"pb(
    var { name: "v" dtype: F32 shape: [4, 1] kind: PARAM }
    op { type: "matmul" input: ["colsum", "v"] output: ["proj"] }
  )pb");
  EXPECT_EQ(FormOf(plain, "proj"), SampleForm::kSum);
  EXPECT_EQ(Of(plain, "proj").offset_at, "");
  // A contraction over the batch with a bias: a sum plus the bias.
  const Program contracted = with_ce(R"pb(
    var { name: "bias4" dtype: F32 shape: [4] kind: PARAM }
    op { type: "transpose" input: ["x"] output: ["xt"] attr { key: "perm" value { list { i: [1, 0] } } } }
    op { type: "matmul_bias" input: ["xt", "x", "bias4"] output: ["gram"] }
  )pb");
  EXPECT_EQ(FormOf(contracted, "gram"), SampleForm::kSum);
  EXPECT_THAT(Of(contracted, "gram").offset_at, HasSubstr("op #5 'matmul_bias'"));
  // A concat of a sum and a constant, then of two sums.
  const Program joined = with_ce(R"pb(
    var { name: "c" dtype: F32 shape: [1, 2] kind: PARAM }
    op { type: "concat" input: ["colsum", "c"] output: ["joined"] attr { key: "axis" value { i: 1 } } }
    op { type: "concat" input: ["colsum", "colsum"] output: ["sums"] attr { key: "axis" value { i: 1 } } }
  )pb");
  EXPECT_EQ(FormOf(joined, "joined"), SampleForm::kSum);
  EXPECT_THAT(Of(joined, "joined").offset_at, HasSubstr("op #4 'concat'"));
  EXPECT_EQ(FormOf(joined, "sums"), SampleForm::kSum);
  EXPECT_EQ(Of(joined, "sums").offset_at, "");
}

TEST(SampleFormsTest, ADivisionByASumSaysItDivides) {
  const Program p = Classifier(absl::StrCat(kLogits, R"pb(
    op { type: "reduce_sum" input: ["logits"] output: ["s"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["ce"] }
    op { type: "div" input: ["ce", "s"] output: ["loss"] }
  )pb"));
  EXPECT_THAT(LossCombination(p).status().message(),
              HasSubstr("op #4 'div' divides by a mean or sum over the batch's samples"));
}

TEST(SampleFormsTest, EveryGeneratedModelsLossIsAMean) {
  GenOptions gpt;
  gpt.blocks = 2;
  gpt.d_model = 64;
  gpt.heads = 4;
  gpt.seq = 16;
  gpt.vocab = 256;
  gpt.dropout = 0.1;
  for (const std::string model : {"mlp", "convnet", "resmlp", "gpt"}) {
    SCOPED_TRACE(model);
    auto text = GenerateProgram(model, model == "gpt" ? gpt : GenOptions());
    ASSERT_TRUE(text.ok()) << text.status();
    const Program p = Validated(*text);
    EXPECT_EQ(FormOf(p, p.loss()), SampleForm::kMean);
    // Their fetches (accuracy) are means too: averaged, and never refused.
    EXPECT_TRUE(SummedFetches(p).empty());
    EXPECT_TRUE(CheckFetchesCombine(p).ok()) << CheckFetchesCombine(p);
  }
}

// A split batch adds up the parts' values of a fetch that is a sum over
// samples, averages means and constants, and refuses any other fetch.
TEST(SampleFormsTest, FetchesThatAreSumsAreSummedAndOthersThatMixAreRefused) {
  const std::string ops = absl::StrCat(kLogits, R"pb(
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
    op { type: "accuracy" input: ["logits", "label"] output: ["acc"] }
    op { type: "square" input: ["logits"] output: ["sq"] }
    op { type: "reduce_sum" input: ["sq"] output: ["energy"] }
    op { type: "square" input: ["w"] output: ["w2"] }
    op { type: "reduce_sum" input: ["w2"] output: ["l2"] }
    op { type: "square" input: ["loss"] output: ["loss2"] }
  )pb");
  const Program combine = Classifier(absl::StrCat(ops, "fetch: \"acc\"\nfetch: \"energy\"\nfetch: \"l2\"\n"));
  EXPECT_THAT(SummedFetches(combine), ::testing::ElementsAre("energy"));
  EXPECT_TRUE(CheckFetchesCombine(combine).ok()) << CheckFetchesCombine(combine);

  // A sum plus a constant neither averages nor adds up over parts.
  for (const std::string shift : {R"pb(op { type: "scale" input: ["energy"] output: ["shifted"]
                                         attr { key: "bias" value { f: 1 } } })pb",
                                  R"pb(op { type: "add" input: ["energy", "l2"] output: ["shifted"] })pb"}) {
    const Program offset = Classifier(absl::StrCat(ops, shift, "\nfetch: \"energy\"\nfetch: \"shifted\"\n"));
    EXPECT_THAT(SummedFetches(offset), ::testing::ElementsAre("energy"));
    const absl::Status s = CheckFetchesCombine(offset);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("the fetch 'shifted' is a sum over the batch's samples (p.pbtxt:"),
                                   HasSubstr("plus a constant (p.pbtxt:"),
                                   HasSubstr("which the parts' total would count once per part")));
  }
  // Scaled without a bias, it is still a sum.
  const Program scaled = Classifier(absl::StrCat(
      ops, R"pb(op { type: "scale" input: ["energy"] output: ["half"] attr { key: "scale" value { f: 0.5 } } })pb",
      "\nfetch: \"half\"\n"));
  EXPECT_THAT(SummedFetches(scaled), ::testing::ElementsAre("half"));

  const Program mixed = Classifier(absl::StrCat(ops, "fetch: \"energy\"\nfetch: \"loss2\"\n"));
  const absl::Status s = CheckFetchesCombine(mixed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("the fetch 'loss2' changes with how the batch is split: p.pbtxt:"),
                                 HasSubstr("'square'"), HasSubstr("fetch a mean or a sum over samples")));
}

}  // namespace
}  // namespace strata
