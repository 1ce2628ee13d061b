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

// sin(0.37 i + seed), as the PyTorch snippets build with np.sin(np.arange(n) * 0.37 + seed).
Tensor Make(DataType dtype, Shape shape, double seed) {
  std::vector<double> v(NumElements(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * i + seed);
  return MakeTensor(dtype, shape, v);
}

absl::StatusOr<Tensor> RunPool(const std::string& op_text, std::map<std::string, Tensor> env) {
  if (auto s = RunOp(ParseOp(op_text), &env); !s.ok()) return s;
  return env["out"];
}

constexpr char kMaxPool3x3[] = R"pb(
  type: "max_pool2d" input: "x" output: "out"
  attr { key: "kernel_size" value { list { i: [3, 3] } } }
  attr { key: "strides" value { list { i: [2, 1] } } }
  attr { key: "paddings" value { list { i: [1, 1] } } })pb";

TEST(MaxPool2dTest, MatchesTorchWithOverlappingPaddedWindows) {
  // x = sin(0.37 * arange(60) + 0.3).reshape(1,2,5,6)
  // y = F.max_pool2d(x, kernel_size=3, stride=(2,1), padding=1)
  const std::vector<double> y = {
      0.620985987037, 0.862404227243, 0.987100101014, 0.987100101014, 0.987100101014, 0.978196606808,
      0.86583391113,  0.988168233877, 0.988168233877, 0.988168233877, 0.976758621876, 0.833149312585,
      0.86583391113,  0.988168233877, 0.988168233877, 0.988168233877, 0.976758621876, 0.833149312585,
      0.989190476347, 0.989190476347, 0.989190476347, 0.975275276411, 0.829361143036, 0.631610987718,
      0.989190476347, 0.989190476347, 0.989190476347, 0.975275276411, 0.872572493883, 0.872572493883,
      0.990166780952, 0.990166780952, 0.973746639301, 0.825534458073, 0.872572493883, 0.872572493883};
  for (DataType dt : {F64, F32}) {
    auto out = RunPool(kMaxPool3x3, {{"x", Make(dt, {1, 2, 5, 6}, 0.3)}});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(TensorNear(*out, {1, 2, 3, 6}, y, dt == F64 ? 1e-11 : 1e-6));
  }
}

TEST(MaxPool2dTest, BackwardMatchesTorch) {
  // dy = sin(0.37 * arange(36) + 1.1).reshape(1,2,3,6); y.backward(dy); x.grad:
  const std::vector<double> dx = {
      0, 0.891207360061, 0.994924349778, 2.29908896995, 0.190422647361, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
      -0.854099160972, -2.28548181807, -0.324232363153, -0.00283276225323, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
      -0.184164779401, 0, 0.46806678718, -0.46879062791, 0.183728278587, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
      0.32782776686, -0.354599904564, 0.364996818341, 0.676963651924, 0, 0, 0};
  std::string grad_text = kMaxPool3x3;
  grad_text.replace(grad_text.find("max_pool2d"), 10, "max_pool2d_grad");
  grad_text.replace(grad_text.find("input: \"x\""), 10, "input: [\"x\", \"dy\"]");
  auto out = RunPool(grad_text, {{"x", Make(F64, {1, 2, 5, 6}, 0.3)}, {"dy", Make(F64, {1, 2, 3, 6}, 1.1)}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(TensorNear(*out, {1, 2, 5, 6}, dx, 1e-11));
}

TEST(MaxPool2dTest, StridesDefaultToTheKernel) {
  // F.max_pool2d(sin(0.37 * arange(32)).reshape(2,1,4,4), 2)
  const std::vector<double> y = {0.995880844538, 0.89569868568,  0.180596267894, -0.529836140908,
                                 0.996475614741, 0.959374833893, 0.518228205921, -0.193984361254};
  auto out = RunPool(R"pb(type: "max_pool2d" input: "x" output: "out"
                          attr { key: "kernel_size" value { list { i: [2, 2] } } })pb",
                     {{"x", Make(F32, {2, 1, 4, 4}, 0.0)}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(TensorNear(*out, {2, 1, 2, 2}, y, 1e-6));
}

TEST(MaxPool2dTest, TiesGoToTheFirstMaximum) {
  std::map<std::string, Tensor> env{{"x", MakeTensor(F64, {1, 1, 2, 2}, {3, 3, 3, 3})},
                                    {"dy", MakeTensor(F64, {1, 1, 1, 1}, {5})}};
  auto out = RunPool(R"pb(type: "max_pool2d_grad" input: ["x", "dy"] output: "out"
                          attr { key: "kernel_size" value { list { i: [2, 2] } } })pb",
                     env);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(TensorNear(*out, {1, 1, 2, 2}, {5, 0, 0, 0}, 0));
}

constexpr char kAvgPoolInclusive[] = R"pb(
  type: "avg_pool2d" input: "x" output: "out"
  attr { key: "kernel_size" value { list { i: [3, 2] } } }
  attr { key: "strides" value { list { i: [2, 1] } } }
  attr { key: "paddings" value { list { i: [1, 1] } } })pb";

constexpr char kAvgPoolExclusive[] = R"pb(
  type: "avg_pool2d" input: "x" output: "out"
  attr { key: "kernel_size" value { list { i: [3, 3] } } }
  attr { key: "strides" value { list { i: [2, 2] } } }
  attr { key: "paddings" value { list { i: [1, 1] } } }
  attr { key: "exclusive" value { b: true } })pb";

TEST(AvgPool2dTest, PaddingCountsInTheDivisorByDefaultLikeTorch) {
  // F.avg_pool2d(x, kernel_size=(3,2), stride=(2,1), padding=1)  (count_include_pad=True)
  const std::vector<double> y = {
      0.146308476031,   0.291297271649,   0.26903435751,    0.210358905179,   0.123212361871,  0.0193896033984,
      -0.017509415185,  0.0348374733053,  0.066969476681,   0.0572096209032,  0.0397067113186, 0.0168296846297,
      -0.00832516092232, -0.0105257517608, 0.144775656765,  0.2682654691,     0.208980013459,  0.121410093366,
      0.0174078866965,  -0.0889503957734, -0.0704383902275, -0.00835085664213, 0.037377097005, 0.139345653577,
      0.222454429637,   0.275455042227,   0.29117410707,    0.14455579455,    0.00458822128963, 0.0213588218075,
      0.0434537581584,  0.0596674321933,  0.0678053991934,  0.0667662235022,  0.0319450988616, 0.0466876901852,
      0.141086308446,   0.22373175446,    0.276096157081,   0.291092240066,   0.266690353934,  0.12236113475};
  auto out = RunPool(kAvgPoolInclusive, {{"x", Make(F64, {1, 2, 5, 6}, 0.3)}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(TensorNear(*out, {1, 2, 3, 7}, y, 1e-11));
}

TEST(AvgPool2dTest, BackwardMatchesTorch) {
  // dy = sin(0.37 * arange(42) + 1.1).reshape(1,2,3,7); y.backward(dy); x.grad:
  const std::vector<double> dx = {
      0.314355284973,  0.326484557655,  0.294425677067,  0.2225176623,     0.120492925819,  0.00216003708669,
      0.0950278616212, 0.0339798513228, -0.0316671724454, -0.0930281929805, -0.141798284011, -0.171376642506,
      -0.219327423352, -0.292504706332, -0.326092849512, -0.315545855281,  -0.26229120983,  -0.173536679593,
      -0.160084331402, -0.120742023136, -0.0650578484654, -0.00056839920487, 0.0639979802215, 0.119902533253,
      0.0592430919499, 0.171762683196,  0.261035001047,  0.314977456076,   0.326289190052,  0.293439212846,
      0.118413809094,  -7.27501356817e-05, -0.118549462975, -0.220981062142, -0.293503911217, -0.326302382798,
      -0.142533229433, -0.171711512063, -0.177649447069, -0.159543362807,  -0.11984383284,  -0.0639240023106,
      -0.260947038527, -0.171638761927, -0.059099984094, 0.0614376993356,  0.173660078377,  0.262378380487,
      0.0651316310975, 0.120800359422,  0.160119325799,  0.177766892583,   0.171354544398,  0.141750162489,
      0.326078669625,  0.292439121349,  0.219219309893,  0.116329193247,   -0.00230553397955, -0.120628217998};
  std::string grad_text = kAvgPoolInclusive;
  grad_text.replace(grad_text.find("avg_pool2d"), 10, "avg_pool2d_grad");
  grad_text.replace(grad_text.find("input: \"x\""), 10, "input: \"dy\"");
  grad_text += R"pb( attr { key: "input_size" value { list { i: [5, 6] } } })pb";
  auto out = RunPool(grad_text, {{"dy", Make(F64, {1, 2, 3, 7}, 1.1)}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(TensorNear(*out, {1, 2, 5, 6}, dx, 1e-11));
}

TEST(AvgPool2dTest, ExclusiveDividesByTheRealElementsLikeTorch) {
  // F.avg_pool2d(x, kernel_size=3, stride=2, padding=1, count_include_pad=False)
  const std::vector<double> y = {0.436945907474,  0.355347700798, 0.105702946686, 0.066969476681,  0.0478924764629,
                                 0.00420262191258, 0.40239820365,  0.244899905702, -0.0530305035309, 0.0560656455076,
                                 0.268182383284,  0.420010836777, 0.0213588218075, 0.0509586884741, 0.0665003320367,
                                 0.211629462669,  0.370494775342, 0.413453374816};
  auto out = RunPool(kAvgPoolExclusive, {{"x", Make(F32, {1, 2, 5, 6}, 0.3)}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(TensorNear(*out, {1, 2, 3, 3}, y, 1e-6));

  // dy = sin(0.37 * arange(18) + 1.1).reshape(1,2,3,3); x.grad:
  const std::vector<double> dx = {
      0.222801840015,  0.388622564978,  0.165820724963,  0.326484557655,   0.160663832692,  0.160663832692,
      0.35656368439,   0.581554954637,  0.224991270247,  0.406813174868,   0.181821904621,  0.181821904621,
      0.133761844374,  0.192932389658,  0.059170545284,  0.080328617213,   0.021158071929,  0.021158071929,
      0.0893962381642, 0.0616786517225, -0.0277175864418, -0.138998806139, -0.111281219697, -0.111281219697,
      -0.0443656062102, -0.131253737936, -0.0868881317257, -0.219327423352, -0.132439291626, -0.132439291626,
      -0.240098122059, -0.406125556865, -0.166027434806, -0.315545855281,  -0.149518420475, -0.149518420475,
      -0.352870911414, -0.559407606378, -0.206536694964, -0.356409037861,  -0.149872342896, -0.149872342896,
      -0.112772789355, -0.153282049513, -0.0405092601583, -0.0408631825797, -0.00035392242146, -0.00035392242146,
      -0.023111825982, 0.0483676214735, 0.0714794474556, 0.220171818467,   0.148692371011,  0.148692371011,
      0.0896609633732, 0.201649670987,  0.111988707614,  0.261035001047,   0.149046293433,  0.149046293433};
  std::string grad_text = kAvgPoolExclusive;
  grad_text.replace(grad_text.find("avg_pool2d"), 10, "avg_pool2d_grad");
  grad_text.replace(grad_text.find("input: \"x\""), 10, "input: \"dy\"");
  grad_text += R"pb( attr { key: "input_size" value { list { i: [5, 6] } } })pb";
  auto grad = RunPool(grad_text, {{"dy", Make(F64, {1, 2, 3, 3}, 1.1)}});
  ASSERT_TRUE(grad.ok()) << grad.status();
  EXPECT_TRUE(TensorNear(*grad, {1, 2, 5, 6}, dx, 1e-11));
}

TEST(Pool2dTest, ManyPlanesRunInParallelLikeOne) {
  // 64 x 32 planes: each output plane must equal the same plane pooled alone.
  Tensor x = Make(F32, {64, 32, 6, 6}, 0.0);
  auto all = RunPool(R"pb(type: "max_pool2d" input: "x" output: "out"
                          attr { key: "kernel_size" value { list { i: [2, 2] } } })pb",
                     {{"x", x}});
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<double> xv = TensorValues(x), got = TensorValues(*all);
  for (int64_t plane = 0; plane < 64 * 32; plane += 97) {
    for (int oh = 0; oh < 3; ++oh) {
      for (int ow = 0; ow < 3; ++ow) {
        double m = -INFINITY;
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j) m = std::max(m, xv[plane * 36 + (2 * oh + i) * 6 + 2 * ow + j]);
        EXPECT_EQ(got[plane * 9 + oh * 3 + ow], m);
      }
    }
  }
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

TEST(Pool2dShapeTest, PropagatesTheBatchDim) {
  auto t = Infer(kMaxPool3x3, {{F32, {-1, 2, 5, 6}}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)[0], (TensorType{F32, {-1, 2, 3, 6}}));
}

TEST(Pool2dShapeTest, RejectsBadAttrsAndShapes) {
  auto missing = Infer(R"pb(type: "max_pool2d" input: "x" output: "out")pb", {{F32, {1, 1, 4, 4}}});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("missing required attr 'kernel_size'"));
  auto too_much_padding = Infer(R"pb(type: "avg_pool2d" input: "x" output: "out"
                                     attr { key: "kernel_size" value { list { i: [2, 2] } } }
                                     attr { key: "paddings" value { list { i: [2, 0] } } })pb",
                                {{F32, {1, 1, 4, 4}}});
  ASSERT_FALSE(too_much_padding.ok());
  EXPECT_THAT(too_much_padding.status().message(), HasSubstr("at most half"));
  auto too_big = Infer(R"pb(type: "max_pool2d" input: "x" output: "out"
                            attr { key: "kernel_size" value { list { i: [5, 5] } } })pb",
                       {{F32, {1, 1, 4, 4}}});
  ASSERT_FALSE(too_big.ok());
  EXPECT_THAT(too_big.status().message(), HasSubstr("output would be empty"));
  auto one_stride = Infer(R"pb(type: "max_pool2d" input: "x" output: "out"
                               attr { key: "kernel_size" value { list { i: [2, 2] } } }
                               attr { key: "strides" value { list { i: [2] } } })pb",
                          {{F32, {1, 1, 4, 4}}});
  ASSERT_FALSE(one_stride.ok());
  EXPECT_THAT(one_stride.status().message(), HasSubstr("attr 'strides' must hold 2 ints"));
  auto rank2 = Infer(R"pb(type: "max_pool2d" input: "x" output: "out"
                          attr { key: "kernel_size" value { list { i: [2, 2] } } })pb",
                     {{F32, {4, 4}}});
  ASSERT_FALSE(rank2.ok());
  EXPECT_THAT(rank2.status().message(), HasSubstr("rank 4"));
  auto ints = Infer(R"pb(type: "max_pool2d" input: "x" output: "out"
                         attr { key: "kernel_size" value { list { i: [2, 2] } } })pb",
                    {{I64, {1, 1, 4, 4}}});
  ASSERT_FALSE(ints.ok());
}

}  // namespace
}  // namespace strata
