#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

// logits = 4 * sin(0.37 * arange(20) + 0.1).reshape(4,5); label = [0, 4, 2, 2]
Tensor Logits(DataType dtype) {
  std::vector<double> v(20);
  for (int i = 0; i < 20; ++i) v[i] = 4.0 * std::sin(0.37 * i + 0.1);
  return MakeTensor(dtype, {4, 5}, v);
}

constexpr char kCrossEntropy[] =
    R"pb(type: "softmax_cross_entropy" input: ["logits", "label"] output: "loss")pb";
constexpr char kCrossEntropyGrad[] =
    R"pb(type: "softmax_cross_entropy_grad" input: ["logits", "label", "dloss"] output: "dlogits")pb";

TEST(SoftmaxCrossEntropyTest, MatchesTorch) {
  // F.cross_entropy(logits, label) in float64
  for (DataType dt : {F64, F32}) {
    std::map<std::string, Tensor> env{{"logits", Logits(dt)}, {"label", MakeTensor(I64, {4}, {0, 4, 2, 2})}};
    auto s = RunOp(ParseOp(kCrossEntropy), &env);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(TensorNear(env["loss"], {}, {3.74400632936}, dt == F64 ? 1e-11 : 1e-6));
  }
}

TEST(SoftmaxCrossEntropyTest, BackwardMatchesTorch) {
  // loss.backward(torch.tensor(2.5)); logits.grad:
  const std::vector<double> want = {
      -0.617489438281, 0.0308310325819, 0.0990425021318, 0.212605981137, 0.27500992243,
      0.381985892833,  0.173898291078,  0.0532576335194, 0.0128784249305, -0.622020242361,
      0.280802490003,  0.105548567956,  -0.561922004947, 0.0642594961104, 0.111311450878,
      0.002073313349,  0.00780980765959, -0.59113245853, 0.138631072138,  0.442618265384};
  for (DataType dt : {F64, F32}) {
    std::map<std::string, Tensor> env{{"logits", Logits(dt)},
                                      {"label", MakeTensor(I64, {4}, {0, 4, 2, 2})},
                                      {"dloss", MakeTensor(dt, {}, {2.5})}};
    auto s = RunOp(ParseOp(kCrossEntropyGrad), &env);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(TensorNear(env["dlogits"], {4, 5}, want, dt == F64 ? 1e-11 : 1e-6));
  }
}

// BF16 / F16 logits (mixed precision: the loss reads the LM head's 16-bit
// output): the loss is F32 and bit-equal to the F32 kernel's on the widened
// logits; dlogits (from an F32 dloss) has the logits' dtype and is the F32
// kernel's gradient rounded, bit for bit, which is what the cast down after
// an F32 gradient gave. Rows over [3, 2, 37] with labels all over the classes.
TEST(SoftmaxCrossEntropyTest, HalfLogitsAreTheF32KernelsOnWidenedLogits) {
  const Shape shape{3, 2, 37};
  std::vector<double> values(3 * 2 * 37);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 6.0 * std::sin(0.731 * i + 0.2) + 0.01 * i;
  for (DataType half : {BF16, F16}) {
    SCOPED_TRACE(DataTypeName(half));
    const Tensor label = MakeTensor(I64, {3, 2}, {0, 36, 5, 17, 36, 2});
    std::map<std::string, Tensor> low{{"logits", MakeTensor(half, shape, values)}, {"label", label},
                                      {"dloss", MakeTensor(F32, {}, {0.37})}};
    std::map<std::string, Tensor> ref{{"logits", As(F32, low["logits"])}, {"label", label},
                                      {"dloss", low["dloss"]}};
    absl::Status s = RunOps({ParseOp(kCrossEntropy), ParseOp(kCrossEntropyGrad)}, &low);
    ASSERT_TRUE(s.ok()) << s;
    s = RunOps({ParseOp(kCrossEntropy), ParseOp(kCrossEntropyGrad)}, &ref);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(low["loss"].dtype(), F32);
    EXPECT_TRUE(SameBits(low["loss"], ref["loss"]));
    EXPECT_GT(TensorValues(low["loss"])[0], 1.0);
    EXPECT_EQ(low["dlogits"].dtype(), half);
    EXPECT_TRUE(SameBits(low["dlogits"], As(half, ref["dlogits"])));
    double norm = 0;  // a gradient, not zeros
    for (double v : TensorValues(low["dlogits"])) norm += v * v;
    EXPECT_GT(norm, 1e-4);
  }
}

// The schema: 16-bit logits give an F32 loss and take an F32 dloss; a dloss
// of the logits' 16-bit type is refused.
TEST(SoftmaxCrossEntropyTest, HalfLogitsTakeAnF32Dloss) {
  std::map<std::string, Tensor> env{{"logits", MakeTensor(BF16, {2, 3}, {1, 2, 3, 4, 5, 6})},
                                    {"label", MakeTensor(I64, {2}, {0, 2})},
                                    {"dloss", MakeTensor(BF16, {}, {1})}};
  absl::Status s = RunOp(ParseOp(kCrossEntropyGrad), &env);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'dloss' must be a F32 scalar"));
}

TEST(SoftmaxCrossEntropyTest, HugeLogitsStayFinite) {
  // F.cross_entropy(tensor([[1000., 0., -1000.], [-1000., 1000., 999.]]), tensor([0, 2]))
  std::map<std::string, Tensor> env{{"logits", MakeTensor(F32, {2, 3}, {1000, 0, -1000, -1000, 1000, 999})},
                                    {"label", MakeTensor(I64, {2}, {0, 2})}};
  auto s = RunOp(ParseOp(kCrossEntropy), &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["loss"], {}, {0.656630843759}, 1e-6));
}

TEST(SoftmaxCrossEntropyTest, LabelOutsideTheClassesIsAnError) {
  for (double bad : {5.0, -1.0}) {
    std::map<std::string, Tensor> env{{"logits", Logits(F32)}, {"label", MakeTensor(I64, {4}, {0, 4, bad, 2})},
                                      {"dloss", MakeTensor(F32, {}, {1})}};
    auto s = RunOp(ParseOp(kCrossEntropy), &env);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("label ", static_cast<int>(bad), " at index 2")));
    EXPECT_THAT(s.message(), HasSubstr("[0, 5)"));
    auto g = RunOp(ParseOp(kCrossEntropyGrad), &env);
    EXPECT_EQ(g.code(), absl::StatusCode::kInvalidArgument);
  }
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

TEST(SoftmaxCrossEntropyShapeTest, IsAScalarAndWantsI64LabelsOfTheRows) {
  auto ok = Infer(kCrossEntropy, {{F32, {-1, 10}}, {I64, {-1}}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0], (TensorType{F32, {}}));
  auto float_label = Infer(kCrossEntropy, {{F32, {-1, 10}}, {F32, {-1}}});
  ASSERT_FALSE(float_label.ok());
  EXPECT_THAT(float_label.status().message(), HasSubstr("input 'label' must be I64"));
  auto wrong_rows = Infer(kCrossEntropy, {{F32, {8, 10}}, {I64, {4}}});
  ASSERT_FALSE(wrong_rows.ok());
  EXPECT_THAT(wrong_rows.status().message(), HasSubstr("input 'label' must have shape [8]"));
  auto vector_logits = Infer(kCrossEntropy, {{F32, {10}}, {I64, {}}});
  ASSERT_FALSE(vector_logits.ok());
}

TEST(MseLossTest, MeanOfSquaredDifferencesAndItsGradient) {
  // diffs 1, 0, -2, 0: mean square 5/4; d/dpred = 2 * diff / 4 * dloss with dloss = 2.
  std::map<std::string, Tensor> env{{"pred", MakeTensor(F64, {2, 2}, {1, 2, 3, 4})},
                                    {"target", MakeTensor(F64, {2, 2}, {0, 2, 5, 4})},
                                    {"dloss", MakeTensor(F64, {}, {2})}};
  auto s = RunOp(ParseOp(R"pb(type: "mse_loss" input: ["pred", "target"] output: "loss")pb"), &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["loss"], {}, {1.25}, 1e-15));
  s = RunOp(ParseOp(R"pb(type: "mse_loss_grad" input: ["pred", "target", "dloss"] output: "d")pb"), &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["d"], {2, 2}, {1, 0, -2, 0}, 1e-15));
}

TEST(MseLossTest, LargeInputsSumEveryBlock) {
  const int64_t n = 100000;
  std::vector<double> pred(n), target(n, 0.0);
  for (int64_t i = 0; i < n; ++i) pred[i] = (i % 2 == 0) ? 1.0 : 3.0;  // squares 1 and 9
  std::map<std::string, Tensor> env{{"pred", MakeTensor(F32, {n}, pred)}, {"target", MakeTensor(F32, {n}, target)}};
  auto s = RunOp(ParseOp(R"pb(type: "mse_loss" input: ["pred", "target"] output: "loss")pb"), &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["loss"], {}, {5.0}, 1e-7));
}

TEST(MseLossShapeTest, RejectsDifferentShapes) {
  auto t = Infer(R"pb(type: "mse_loss" input: ["p", "t"] output: "loss")pb", {{F32, {-1, 3}}, {F32, {-1, 4}}});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("input 'target' must have the type of 'pred'"));
}

Tensor AccuracyLogits() {
  return MakeTensor(F32, {4, 3}, {0.1, 0.5, 0.2, 0.9, 0.05, 0.05, 0.3, 0.3, 0.4, 0.2, 0.7, 0.1});
}

TEST(AccuracyTest, CountsLabelsAmongTheTopK) {
  // Row 0: label 1 is the max. Row 1: label 1 ties for last (one logit above it).
  // Row 2: label 0 has one logit above. Row 3: label 2 has two above.
  std::map<std::string, Tensor> env{{"logits", AccuracyLogits()}, {"label", MakeTensor(I64, {4}, {1, 1, 0, 2})}};
  auto s = RunOp(ParseOp(R"pb(type: "accuracy" input: ["logits", "label"] output: "top1")pb"), &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["top1"], {}, {0.25}, 0));
  s = RunOp(ParseOp(R"pb(type: "accuracy" input: ["logits", "label"] output: "top2"
                         attr { key: "k" value { i: 2 } })pb"),
            &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["top2"], {}, {0.75}, 0));
}

TEST(AccuracyTest, LabelOutsideTheClassesIsAnError) {
  std::map<std::string, Tensor> env{{"logits", AccuracyLogits()}, {"label", MakeTensor(I64, {4}, {1, 3, 0, 2})}};
  auto s = RunOp(ParseOp(R"pb(type: "accuracy" input: ["logits", "label"] output: "acc")pb"), &env);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("label 3 at index 1"));
}

TEST(AccuracyShapeTest, RejectsKOutsideTheClasses) {
  for (int k : {0, 4}) {
    auto t = Infer(absl::StrCat(R"pb(type: "accuracy" input: ["l", "y"] output: "acc" attr { key: "k" value { i: )pb",
                                k, " } }"),
                   {{F32, {-1, 3}}, {I64, {-1}}});
    ASSERT_FALSE(t.ok());
    EXPECT_THAT(t.status().message(), HasSubstr("attr 'k' must be in [1, 3]"));
  }
  EXPECT_FALSE(OpRegistry::Global().Find("accuracy")->differentiable);
}

}  // namespace
}  // namespace strata
