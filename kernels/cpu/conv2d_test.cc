#include <cmath>
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

// sin(0.37 i + seed): the same inputs the PyTorch snippets below build with
// np.sin(np.arange(n) * 0.37 + seed).
std::vector<double> Values(int64_t n, double seed) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.37 * i + seed);
  return v;
}

Tensor Make(DataType dtype, Shape shape, double seed) {
  return MakeTensor(dtype, shape, Values(NumElements(shape), seed));
}

std::string ConvOp(const std::string& type, const std::string& inputs, const std::string& attrs) {
  return absl::StrCat("type: \"", type, "\" input: [", inputs, "] output: [\"y\"] ", attrs);
}

// y = conv2d(x, w) run through the registry and the CPU kernel.
absl::StatusOr<Tensor> RunConv(const Tensor& x, const Tensor& w, const std::string& attrs) {
  std::map<std::string, Tensor> env{{"x", x}, {"w", w}};
  if (auto s = RunOp(ParseOp(ConvOp("conv2d", "\"x\", \"w\"", attrs)), &env); !s.ok()) return s;
  return env["y"];
}

// Direct 7-loop convolution in double: the plain reference.
struct Conv {
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
};

std::vector<double> NaiveConv(const Conv& c, const Tensor& x, const Tensor& w, Shape* out_shape) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t O = w.dim(0), Cg = w.dim(1), KH = w.dim(2), KW = w.dim(3), Og = O / c.groups;
  const int64_t Ho = (H + 2 * c.ph - c.dh * (KH - 1) - 1) / c.sh + 1;
  const int64_t Wo = (W + 2 * c.pw - c.dw * (KW - 1) - 1) / c.sw + 1;
  *out_shape = {N, O, Ho, Wo};
  std::vector<double> xv = TensorValues(x), wv = TensorValues(w), y(N * O * Ho * Wo, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          double s = 0;
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                const int64_t ih = oh * c.sh - c.ph + i * c.dh, iw = ow * c.sw - c.pw + j * c.dw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t ch = (o / Og) * Cg + ci;
                s += xv[((n * C + ch) * H + ih) * W + iw] * wv[((o * Cg + ci) * KH + i) * KW + j];
              }
          y[((n * O + o) * Ho + oh) * Wo + ow] = s;
        }
  (void)C;
  return y;
}

// dx and dw of sum(y * dy), by the same direct loops.
void NaiveConvGrads(const Conv& c, const Tensor& x, const Tensor& w, const Tensor& dy, std::vector<double>* dx,
                    std::vector<double>* dw) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t O = w.dim(0), Cg = w.dim(1), KH = w.dim(2), KW = w.dim(3), Og = O / c.groups;
  const int64_t Ho = dy.dim(2), Wo = dy.dim(3);
  std::vector<double> xv = TensorValues(x), wv = TensorValues(w), dyv = TensorValues(dy);
  dx->assign(xv.size(), 0.0);
  dw->assign(wv.size(), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          const double g = dyv[((n * O + o) * Ho + oh) * Wo + ow];
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                const int64_t ih = oh * c.sh - c.ph + i * c.dh, iw = ow * c.sw - c.pw + j * c.dw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t xi = ((n * C + (o / Og) * Cg + ci) * H + ih) * W + iw;
                const int64_t wi = ((o * Cg + ci) * KH + i) * KW + j;
                (*dx)[xi] += g * wv[wi];
                (*dw)[wi] += g * xv[xi];
              }
        }
}

TEST(Conv2dTest, MatchesTorchWithDefaults) {
  // x = sin(0.37 * arange(120) + 0).reshape(2,3,4,5); w = sin(0.37 * arange(54) + 1).reshape(2,3,3,3)
  // F.conv2d(x, w) in float64:
  const std::vector<double> expected = {
      0.0308129251294,  -0.19278055673,  -0.390282094611, -0.597322878416, -0.506565870467, -0.347247548358,
      -0.186851326895,  -0.205073328173, -0.195539616526, -0.0305580098543, 0.0449682542568, 0.11440827611,
      0.0968610071687,  0.309311245256,  0.479897657343,  0.555482954233,  0.423866240957,  0.234881220413,
      0.20048878902,    0.203107789556,  0.178237103597,  -0.0122242097762, -0.0855501350958, -0.147297250964};
  for (DataType dt : {F64, F32}) {
    auto y = RunConv(Make(dt, {2, 3, 4, 5}, 0.0), Make(dt, {2, 3, 3, 3}, 1.0), "");
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(TensorNear(*y, {2, 2, 2, 3}, expected, dt == F64 ? 1e-10 : 1e-5));
  }
}

TEST(Conv2dTest, MatchesTorchWithStridePaddingDilationAndGroups) {
  // x = sin(0.37 * arange(336) + 0.5).reshape(2,4,6,7); w = sin(0.37 * arange(48) + 2).reshape(4,2,2,3)
  // F.conv2d(x, w, stride=2, padding=1, dilation=2, groups=2) in float64:
  const std::vector<double> expected = {
      0.423995876809,   0.151842566164,   -0.887560904031,  -1.23161307153,  -2.04609496286,   -3.03845897261,
      1.30698462166,    1.70178157585,    0.266644438328,   -1.88818601636,  -3.49476919427,   -2.72138083685,
      0.70541153875,    -0.713249374987,  -0.558759840983,  3.28220757906,   2.59108846569,    1.68288005235,
      0.0840231574809,  0.917189412438,   1.95849153914,    -0.472235027038, 0.746280713681,   2.16378827572,
      -3.7274488176,    -4.33558131809,   -2.53483479197,   0.881420833903,  2.18446326059,    1.37820448453,
      -1.50654716914,   -0.803750119293,  -1.35121088641,   -1.37898638614,  -0.808133454298,  -0.71137987114,
      0.358791257414,   0.837082726392,   -0.339611938036,  0.334512272649,  0.228330031485,   -1.23716635484,
      2.29252931963,    3.29354585476,    2.41120072196,    0.138511835234,  -1.56180564641,   -1.87075218688,
      2.61904918827,    1.47269085376,    0.911759935383,   3.10863112582,   3.33971155328,    2.23570222844,
      -0.902222177293,  -0.911010974732,  0.58341842544,    -2.82030220476,  -2.67364373624,   -0.75408963773,
      -3.75964349323,   -5.27641462529,   -4.28945380597,   -0.702715103521, 0.761230269663,   0.78645372808,
      -1.6671661893,    -0.939951415977,  -1.12889506418,   -0.462212426247, -0.326055028896,  0.161822355358};
  const std::string attrs =
      R"pb(attr { key: "strides" value { list { i: [2, 2] } } }
           attr { key: "paddings" value { list { i: [1, 1] } } }
           attr { key: "dilations" value { list { i: [2, 2] } } }
           attr { key: "groups" value { i: 2 } })pb";
  for (DataType dt : {F64, F32}) {
    auto y = RunConv(Make(dt, {2, 4, 6, 7}, 0.5), Make(dt, {4, 2, 2, 3}, 2.0), attrs);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(TensorNear(*y, {2, 4, 3, 3}, expected, dt == F64 ? 1e-10 : 1e-5));
  }
}

TEST(Conv2dTest, MatchesTorchWithPerDimStrideAndPadding) {
  // x = sin(0.37 * arange(60) + 0.25).reshape(1,2,5,6); w = sin(0.37 * arange(36) + 1.5).reshape(3,2,3,2)
  // F.conv2d(x, w, stride=(1,2), padding=(2,0)) in float64:
  const std::vector<double> expected = {
      1.23808383788,   0.406761986851,   -0.637321961524, 0.792367523143,  0.347202750474,  -0.279570893684,
      1.16306162192,   1.26223638226,    0.701182142047,  -0.226634450572, -1.03590697419,  -1.30333500985,
      -0.889036878335, -0.00971655455576, 0.874686138258, 0.42393875766,   -0.377825018298, -0.981962551089,
      -1.11824160683,  -2.08373629844,   -1.95930587533,  1.41827581088,   1.89096721063,   1.37456385039,
      0.0526144922327, -0.413525939376,  -0.663366301129, -2.11234780162,  -0.948079300168, 0.712094292906,
      1.99979779249,   2.24148129424,    1.31072912906,   -0.305616792596, -1.76210591376,  -2.29690283633,
      -0.533805905376, -0.340254794316,  0.031270970258,  1.60405972936,   1.41128913339,   0.480325575216,
      -2.00121012283,  -1.42422753999,   -0.102284394683, -0.820677603371, -0.124698417094, 0.636505882677,
      -0.0264786540563, -0.75210695001,  -1.08433601671,  -0.849389160871, -0.170158362145, 0.598075959973,
      1.05347894649,   0.957846198558,   0.361199656979,  -0.136715839288, 0.560904624629,  0.965136698757,
      0.255151273681,  1.32436930853,    1.70085891531};
  const std::string attrs =
      R"pb(attr { key: "strides" value { list { i: [1, 2] } } }
           attr { key: "paddings" value { list { i: [2, 0] } } })pb";
  auto y = RunConv(Make(F64, {1, 2, 5, 6}, 0.25), Make(F64, {3, 2, 3, 2}, 1.5), attrs);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(TensorNear(*y, {1, 3, 7, 3}, expected, 1e-10));
}

// 120 images of 8x32x32 with a 3x3 filter and 32x16 outputs need two im2col
// chunks (the 4M-element column budget holds 113 images of 72x512 columns):
// forward and both backward ops must stitch them right.
TEST(Conv2dTest, ManyImagesSpanSeveralChunksForwardAndBackward) {
  Conv c;
  c.ph = c.pw = 1;
  c.sh = 1;
  c.sw = 2;
  Tensor x = Make(F64, {120, 8, 32, 32}, 0.1), w = Make(F64, {6, 8, 3, 3}, 0.7);
  Shape ys;
  std::vector<double> want = NaiveConv(c, x, w, &ys);
  const std::string attrs =
      R"pb(attr { key: "strides" value { list { i: [1, 2] } } }
           attr { key: "paddings" value { list { i: [1, 1] } } })pb";
  auto y = RunConv(x, w, attrs);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(TensorNear(*y, std::vector<int64_t>(ys.begin(), ys.end()), want, 1e-10));

  Tensor dy = Make(F64, ys, 0.3);
  std::vector<double> dx_want, dw_want;
  NaiveConvGrads(c, x, w, dy, &dx_want, &dw_want);
  std::map<std::string, Tensor> env{{"x", x}, {"w", w}, {"dy", dy}};
  ASSERT_TRUE(RunOp(ParseOp(ConvOp("conv2d_grad_input", "\"dy\", \"w\"",
                                   attrs + R"pb( attr { key: "input_size" value { list { i: [32, 32] } } })pb")),
                    &env)
                  .ok());
  EXPECT_TRUE(TensorNear(env["y"], {120, 8, 32, 32}, dx_want, 1e-10));
  auto s = RunOp(ParseOp(ConvOp("conv2d_grad_filter", "\"x\", \"dy\"",
                                attrs + R"pb( attr { key: "filter_size" value { list { i: [3, 3] } } })pb")),
                 &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["y"], {6, 8, 3, 3}, dw_want, 1e-10));
}

TEST(Conv2dTest, GroupedDilatedBackwardMatchesDirectLoops) {
  Conv c;
  c.sh = c.sw = 2;
  c.ph = c.pw = 1;
  c.dh = c.dw = 2;
  c.groups = 2;
  Tensor x = Make(F32, {3, 4, 9, 8}, 0.2), w = Make(F32, {6, 2, 3, 2}, 0.9);
  Shape ys;
  NaiveConv(c, x, w, &ys);
  Tensor dy = Make(F32, ys, 1.3);
  std::vector<double> dx_want, dw_want;
  NaiveConvGrads(c, x, w, dy, &dx_want, &dw_want);
  const std::string attrs =
      R"pb(attr { key: "strides" value { list { i: [2, 2] } } }
           attr { key: "paddings" value { list { i: [1, 1] } } }
           attr { key: "dilations" value { list { i: [2, 2] } } }
           attr { key: "groups" value { i: 2 } })pb";
  std::map<std::string, Tensor> env{{"x", x}, {"w", w}, {"dy", dy}};
  auto s = RunOp(ParseOp(ConvOp("conv2d_grad_input", "\"dy\", \"w\"",
                                attrs + R"pb( attr { key: "input_size" value { list { i: [9, 8] } } })pb")),
                 &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["y"], {3, 4, 9, 8}, dx_want, 1e-5));
  s = RunOp(ParseOp(ConvOp("conv2d_grad_filter", "\"x\", \"dy\"",
                           attrs + R"pb( attr { key: "filter_size" value { list { i: [3, 2] } } })pb")),
            &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["y"], {6, 2, 3, 2}, dw_want, 1e-5));
}

TEST(Conv2dTest, EmptyBatchGivesEmptyOutputAndZeroFilterGradient) {
  Tensor x = MakeTensor(F32, {0, 2, 4, 4}, {}), w = Make(F32, {3, 2, 3, 3}, 0.0);
  auto y = RunConv(x, w, "");
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), (Shape{0, 3, 2, 2}));
  std::map<std::string, Tensor> env{{"x", x}, {"dy", *y}};
  auto s = RunOp(ParseOp(ConvOp("conv2d_grad_filter", "\"x\", \"dy\"",
                                R"pb(attr { key: "filter_size" value { list { i: [3, 3] } } })pb")),
                 &env);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(TensorNear(env["y"], {3, 2, 3, 3}, std::vector<double>(54, 0.0), 0));
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

TEST(Conv2dShapeTest, PropagatesTheBatchDim) {
  auto t = Infer(ConvOp("conv2d", "\"x\", \"w\"",
                        R"pb(attr { key: "paddings" value { list { i: [1, 1] } } }
                             attr { key: "strides" value { list { i: [2, 2] } } })pb"),
                 {{F32, {-1, 3, 28, 28}}, {F32, {16, 3, 3, 3}}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)[0], (TensorType{F32, {-1, 16, 14, 14}}));
}

TEST(Conv2dShapeTest, RejectsChannelMismatch) {
  auto t = Infer(ConvOp("conv2d", "\"x\", \"w\"", ""), {{F32, {-1, 3, 8, 8}}, {F32, {4, 2, 3, 3}}});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("'x' has 3 channels"));
}

TEST(Conv2dShapeTest, RejectsGroupsThatDoNotDivideOutputChannels) {
  auto t = Infer(ConvOp("conv2d", "\"x\", \"w\"", R"pb(attr { key: "groups" value { i: 2 } })pb"),
                 {{F32, {-1, 4, 8, 8}}, {F32, {3, 2, 3, 3}}});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("must divide the 3 output channels"));
}

TEST(Conv2dShapeTest, RejectsAnEmptyOutput) {
  auto t = Infer(ConvOp("conv2d", "\"x\", \"w\"", R"pb(attr { key: "dilations" value { list { i: [3, 1] } } })pb"),
                 {{F32, {-1, 1, 6, 6}}, {F32, {1, 1, 3, 3}}});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("output would be empty"));
}

TEST(Conv2dShapeTest, RejectsBadAttrsRanksAndDtypes) {
  const std::vector<TensorType> ok_inputs = {{F32, {2, 1, 6, 6}}, {F32, {1, 1, 3, 3}}};
  auto bad_stride = Infer(ConvOp("conv2d", "\"x\", \"w\"", R"pb(attr { key: "strides" value { list { i: [1] } } })pb"),
                          ok_inputs);
  ASSERT_FALSE(bad_stride.ok());
  EXPECT_THAT(bad_stride.status().message(), HasSubstr("attr 'strides' must hold 2 ints"));
  auto zero_stride = Infer(
      ConvOp("conv2d", "\"x\", \"w\"", R"pb(attr { key: "strides" value { list { i: [1, 0] } } })pb"), ok_inputs);
  ASSERT_FALSE(zero_stride.ok());
  EXPECT_THAT(zero_stride.status().message(), HasSubstr("attr 'strides' values must be >= 1"));
  auto neg_pad = Infer(
      ConvOp("conv2d", "\"x\", \"w\"", R"pb(attr { key: "paddings" value { list { i: [-1, 0] } } })pb"), ok_inputs);
  ASSERT_FALSE(neg_pad.ok());
  auto groups0 = Infer(ConvOp("conv2d", "\"x\", \"w\"", R"pb(attr { key: "groups" value { i: 0 } })pb"), ok_inputs);
  ASSERT_FALSE(groups0.ok());
  EXPECT_THAT(groups0.status().message(), HasSubstr("'groups' must be >= 1"));
  auto rank3 = Infer(ConvOp("conv2d", "\"x\", \"w\"", ""), {{F32, {1, 6, 6}}, {F32, {1, 1, 3, 3}}});
  ASSERT_FALSE(rank3.ok());
  EXPECT_THAT(rank3.status().message(), HasSubstr("input 'x' must have rank 4"));
  auto mixed = Infer(ConvOp("conv2d", "\"x\", \"w\"", ""), {{F32, {2, 1, 6, 6}}, {F64, {1, 1, 3, 3}}});
  ASSERT_FALSE(mixed.ok());
  EXPECT_THAT(mixed.status().message(), HasSubstr("'w'"));
  auto unknown_channels = Infer(ConvOp("conv2d", "\"x\", \"w\"", ""), {{F32, {2, -1, 6, 6}}, {F32, {1, 1, 3, 3}}});
  ASSERT_FALSE(unknown_channels.ok());
  EXPECT_THAT(unknown_channels.status().message(), HasSubstr("known, positive size in dim 1"));
}

TEST(Conv2dShapeTest, GradientOpsCheckTheirShapes) {
  auto gi = Infer(ConvOp("conv2d_grad_input", "\"dy\", \"w\"",
                         R"pb(attr { key: "input_size" value { list { i: [8, 8] } } })pb"),
                  {{F32, {-1, 4, 5, 5}}, {F32, {4, 2, 3, 3}}});
  ASSERT_FALSE(gi.ok());
  EXPECT_THAT(gi.status().message(), HasSubstr("is not the output shape"));
  auto gi_ok = Infer(ConvOp("conv2d_grad_input", "\"dy\", \"w\"",
                            R"pb(attr { key: "input_size" value { list { i: [8, 8] } } })pb"),
                     {{F32, {-1, 4, 6, 6}}, {F32, {4, 2, 3, 3}}});
  ASSERT_TRUE(gi_ok.ok()) << gi_ok.status();
  EXPECT_EQ((*gi_ok)[0], (TensorType{F32, {-1, 2, 8, 8}}));
  auto gf = Infer(ConvOp("conv2d_grad_filter", "\"x\", \"dy\"",
                         R"pb(attr { key: "filter_size" value { list { i: [3, 3] } } }
                              attr { key: "groups" value { i: 2 } })pb"),
                  {{F32, {-1, 4, 8, 8}}, {F32, {-1, 6, 6, 6}}});
  ASSERT_TRUE(gf.ok()) << gf.status();
  EXPECT_EQ((*gf)[0], (TensorType{F32, {6, 2, 3, 3}}));
}

}  // namespace
}  // namespace strata
