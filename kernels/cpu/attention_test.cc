// scaled_dot_product_attention(_grad) against PyTorch 1.13 (float64, by hand:
// 1.13 has no F.scaled_dot_product_attention), a plain reference over several
// row blocks, F32 against F64, and the shape checks. The expected values come from:
//
// import torch
// torch.set_printoptions(precision=12)
// def mk(shape, seed, scale=1.0):
//     n = 1
//     for s in shape: n *= s
//     return (scale * torch.sin(0.37 * torch.arange(n, dtype=torch.float64) + seed)).reshape(shape)
// B, H, T, D = 1, 2, 5, 3
// def run(causal, scale, with_dlse):
//     q = mk((B, H, T, D), 0.1).requires_grad_()
//     k = mk((B, H, T, D), 0.5, 1.5).requires_grad_()
//     v = mk((B, H, T, D), 0.9).requires_grad_()
//     s = (q @ k.transpose(-1, -2)) * (scale if scale else D ** -0.5)
//     if causal:
//         s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float('-inf'))
//     lse = torch.logsumexp(s, -1)
//     y = torch.softmax(s, -1) @ v
//     loss = (y * mk((B, H, T, D), 1.3)).sum()
//     if with_dlse:
//         loss = loss + (lse * mk((B, H, T), 2.1)).sum()
//     loss.backward()
//     def p(name, t):
//         vals = ', '.join('%.12g' % x for x in t.detach().flatten().tolist())
//         print('  const std::vector<double> %s = {%s};' % (name, vals))
//     print('// causal=%s scale=%s dlse=%s' % (causal, scale, with_dlse))
//     for n, t in [('y', y), ('lse', lse), ('dq', q.grad), ('dk', k.grad), ('dv', v.grad)]:
//         p(n, t)
// run(True, 0, False)
// run(False, 0.8, True)

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

// scale * sin(0.37 i + seed), as the snippet's mk builds them.
Tensor Make(DataType dtype, Shape shape, double seed, double scale = 1.0) {
  std::vector<double> v(NumElements(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(0.37 * i + seed);
  return MakeTensor(dtype, shape, v);
}

std::map<std::string, Tensor> Qkv(DataType dt) {
  return {{"q", Make(dt, {1, 2, 5, 3}, 0.1)}, {"k", Make(dt, {1, 2, 5, 3}, 0.5, 1.5)}, {"v", Make(dt, {1, 2, 5, 3}, 0.9)}};
}

const std::vector<int64_t> kQkvShape = {1, 2, 5, 3};
const std::vector<int64_t> kLseShape = {1, 2, 5};

TEST(AttentionTest, CausalMatchesTorch) {
  const std::vector<double> y = {0.783326909627, 0.955100855585, 0.997606381319, 0.85520585781, 0.798652027516, 0.634004391943, 0.676592298366, 0.553914099042, 0.35626622494, -0.524815719176, -0.674283775293, -0.732490685632, -0.770014476675, -0.720640959581, -0.573732069288, 0.166042105865, 0.511401322396, 0.787544769033, 0.79308990596, 0.896410670927, 0.878406456836, 0.790380736026, 0.732563860816, 0.575597903657, 0.383148630391, 0.28037018599, 0.13964495219, -0.730409382419, -0.757306908154, -0.681706496558};
  const std::vector<double> lse = {0.951145595164, 2.70361628309, 1.79670058212, 1.71460569597, 2.7456874701, 0.132500727134, 1.96440005869, 2.64399560873, 1.48617262084, 2.38649980231};
  const std::vector<double> dq = {0, 0, 0, -0.000787496806468, -0.000231957385434, 0.000354976379558, -0.0648241942185, -0.24574661838, -0.393408390594, -0.644394838943, -0.750858964238, -0.755697851161, -0.050645739567, -0.0433788278752, -0.0302407953298, 0, 0, 0, 0.184174538132, 0.149506093507, 0.0946027004905, 0.0304716974341, 0.00477535688591, -0.0215673058146, -0.288016647802, -0.588816794709, -0.809923350716, -0.307345284693, -0.36854297399, -0.379860100671};
  const std::vector<double> dk = {-0.077858597259, 0.0132628013892, 0.102589142088, -0.00599309444834, 0.0446956043385, 0.0893349627546, 0.205349247204, 0.175531554184, 0.121956488761, -0.10552835062, -0.217595956964, -0.300212971321, -0.0159692048759, -0.0158940029476, -0.0136676222824, -0.0460700276325, -0.0310823800775, -0.011887878193, -0.059700990458, 0.0764485554115, 0.202251147943, 0.0463048401621, 0.0625865678068, 0.0703974971058, 0.179888934714, 0.0598291188361, -0.0683282876056, -0.120422756786, -0.167781861977, -0.19243247925};
  const std::vector<double> dv = {1.06024682191, 0.869087789423, 0.560301801708, 0.167884541595, -0.157721219955, -0.461980154288, -0.306476867107, -0.346871200507, -0.340318144164, -0.940311971949, -0.749803113921, -0.45781192191, -0.232643095924, -0.077562279416, 0.0880162277499, 0.587294990991, 0.772518954299, 0.853186101192, 0.798120403062, 0.461272590648, 0.0619936970174, -0.104924173, -0.295489217071, -0.446061181814, -0.369890052804, -0.393924449144, -0.364643019276, -0.674305397837, -0.55473179143, -0.360077839417};
  for (DataType dt : {F64, F32}) {
    const double tol = dt == F64 ? 1e-10 : 1e-5;
    std::map<std::string, Tensor> env = Qkv(dt);
    env["dy"] = Make(dt, {1, 2, 5, 3}, 1.3);
    auto s = RunOps({ParseOp(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"]
                                  output: ["y", "lse"])pb"),
                     ParseOp(R"pb(type: "scaled_dot_product_attention_grad"
                                  input: ["q", "k", "v", "y", "lse", "dy"] output: ["dq", "dk", "dv"])pb")},
                    &env);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(TensorNear(env["y"], kQkvShape, y, tol));
    EXPECT_TRUE(TensorNear(env["lse"], kLseShape, lse, tol));
    EXPECT_TRUE(TensorNear(env["dq"], kQkvShape, dq, tol));
    EXPECT_TRUE(TensorNear(env["dk"], kQkvShape, dk, tol));
    EXPECT_TRUE(TensorNear(env["dv"], kQkvShape, dv, tol));
  }
}

TEST(AttentionTest, NotCausalWithScaleAndLseGradientMatchesTorch) {
  const std::vector<double> y = {0.651597356555, 0.611937612717, 0.489454983726, 0.823872154257, 0.744669114728, 0.56467860392, 0.605476578862, 0.495793745537, 0.319007554626, -0.725951056277, -0.718283295934, -0.613399261105, -0.820102201326, -0.758966674688, -0.595108569105, -0.298513869762, -0.288777731272, -0.239956881572, 0.77216919514, 0.738838304737, 0.605509115835, 0.807352183465, 0.741525209347, 0.575336276797, 0.181803568817, 0.0862077935115, -0.0210558022266, -0.852173146237, -0.864840775102, -0.760456262208};
  const std::vector<double> lse = {2.15606705196, 3.52694285502, 2.16126619962, 2.53463526459, 3.46203423165, 1.67851763841, 2.89689477021, 3.34728164247, 1.69501176279, 3.01919502501};
  const std::vector<double> dq = {1.0751833005, 1.37667051686, 1.49183183701, 0.610921109166, 0.658997856925, 0.617882336248, -0.114437354775, -0.342494054258, -0.524195790209, -0.198313262761, -0.294310415243, -0.350474033695, 0.359167704249, 0.396608945226, 0.380371026043, 1.10018792684, 1.50643704995, 1.70879698537, -0.6272970999, -0.576862850376, -0.448352920239, -0.881487628574, -0.975520858302, -0.937521916233, -1.25312295088, -1.55030906864, -1.6376681268, 0.418878357095, 0.517531104466, 0.546138444697};
  const std::vector<double> dk = {0.142950037234, 0.437340669709, 0.672539294197, 0.344215789528, 0.503493713929, 0.594626126146, 0.210757558213, 0.115342471489, 0.00431632234581, 0.151374027947, 0.0100935475637, -0.132553047131, 0.209502134073, 0.21439436137, 0.190269317626, -0.279868355177, -0.138737136419, 0.0211715029083, -0.906846875493, -0.667470831622, -0.337755741938, -0.547165872607, -0.499320830807, -0.383895056977, 0.271781556365, 0.143637307916, -0.00394757632582, 0.71387373554, 0.479788559308, 0.180766252363};
  const std::vector<double> dv = {0.536275672125, 0.348409183598, 0.113387146533, 0.599627927392, 0.275556258233, -0.0858106577843, -0.050512265978, -0.0975911967783, -0.131461616916, -0.761993353282, -0.580090278603, -0.319674706042, -0.574698551727, -0.409153990826, -0.188232356695, 0.10866200688, 0.116333544353, 0.108259882343, 0.718194691975, 0.413412656131, 0.0526771566856, 0.234384117147, 0.0507890492436, -0.139680078213, -0.166194105324, -0.150038993571, -0.113576807904, -0.658750940266, -0.440850168854, -0.16328239521};
  for (DataType dt : {F64, F32}) {
    const double tol = dt == F64 ? 1e-10 : 1e-5;
    std::map<std::string, Tensor> env = Qkv(dt);
    env["dy"] = Make(dt, {1, 2, 5, 3}, 1.3);
    env["dlse"] = Make(dt, {1, 2, 5}, 2.1);
    auto s = RunOps({ParseOp(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"]
                                  output: ["y", "lse"]
                                  attr { key: "causal" value { b: false } }
                                  attr { key: "scale" value { f: 0.8 } })pb"),
                     ParseOp(R"pb(type: "scaled_dot_product_attention_grad"
                                  input: ["q", "k", "v", "y", "lse", "dy", "dlse"] output: ["dq", "dk", "dv"]
                                  attr { key: "causal" value { b: false } }
                                  attr { key: "scale" value { f: 0.8 } })pb")},
                    &env);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(TensorNear(env["y"], kQkvShape, y, tol));
    EXPECT_TRUE(TensorNear(env["lse"], kLseShape, lse, tol));
    EXPECT_TRUE(TensorNear(env["dq"], kQkvShape, dq, tol));
    EXPECT_TRUE(TensorNear(env["dk"], kQkvShape, dk, tol));
    EXPECT_TRUE(TensorNear(env["dv"], kQkvShape, dv, tol));
  }
}

// Plain softmax(scale q k^T + mask) v and logsumexp, one (b, h) at a time.
void Reference(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
               int64_t heads, int64_t T, int64_t D, bool causal, std::vector<double>* y, std::vector<double>* lse) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  y->assign(heads * T * D, 0.0);
  lse->assign(heads * T, 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < T; ++i) {
      const int64_t n = causal ? i + 1 : T;
      std::vector<double> s(n);
      double max = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[(h * T + i) * D + d] * k[(h * T + j) * D + d];
        s[j] = scale * dot;
        max = std::max(max, s[j]);
      }
      for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - max);
      (*lse)[h * T + i] = max + std::log(sum);
      for (int64_t j = 0; j < n; ++j) {
        const double p = std::exp(s[j] - max) / sum;
        for (int64_t d = 0; d < D; ++d) (*y)[(h * T + i) * D + d] += p * v[(h * T + j) * D + d];
      }
    }
  }
}

// T = 150: three row blocks of the kernel, the last partial; 6 heads over the threads.
TEST(AttentionTest, ManyRowBlocksMatchThePlainReference) {
  const int64_t B = 2, H = 3, T = 150, D = 8;
  for (bool causal : {true, false}) {
    for (DataType dt : {F64, F32}) {
      std::map<std::string, Tensor> env{{"q", Make(dt, {B, H, T, D}, 0.1, 2.0)},
                                        {"k", Make(dt, {B, H, T, D}, 0.5, 2.0)},
                                        {"v", Make(dt, {B, H, T, D}, 0.9)}};
      Op op = ParseOp(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"])pb");
      (*op.mutable_attr())["causal"].set_b(causal);
      auto s = RunOp(op, &env);
      ASSERT_TRUE(s.ok()) << s;
      std::vector<double> y, lse;
      Reference(TensorValues(env["q"]), TensorValues(env["k"]), TensorValues(env["v"]), B * H, T, D, causal, &y,
                &lse);
      const double tol = dt == F64 ? 1e-10 : 1e-5;
      EXPECT_TRUE(TensorNear(env["y"], {B, H, T, D}, y, tol)) << "causal " << causal;
      EXPECT_TRUE(TensorNear(env["lse"], {B, H, T}, lse, tol)) << "causal " << causal;
    }
  }
}

// The F32 backward over several row blocks agrees with the F64 one.
TEST(AttentionTest, FloatBackwardAgreesWithDoubleOverRowBlocks) {
  const int64_t B = 1, H = 2, T = 130, D = 16;
  std::map<DataType, std::map<std::string, Tensor>> envs;
  for (DataType dt : {F64, F32}) {
    auto& env = envs[dt];
    env = {{"q", Make(dt, {B, H, T, D}, 0.1)}, {"k", Make(dt, {B, H, T, D}, 0.5)},
           {"v", Make(dt, {B, H, T, D}, 0.9)}, {"dy", Make(dt, {B, H, T, D}, 1.3)}};
    auto s = RunOps({ParseOp(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"]
                                  output: ["y", "lse"])pb"),
                     ParseOp(R"pb(type: "scaled_dot_product_attention_grad"
                                  input: ["q", "k", "v", "y", "lse", "dy"] output: ["dq", "dk", "dv"])pb")},
                    &env);
    ASSERT_TRUE(s.ok()) << s;
  }
  for (const char* name : {"y", "lse", "dq", "dk", "dv"}) {
    const Tensor& want = envs[F64][name];
    const std::vector<int64_t> shape(want.shape().begin(), want.shape().end());
    EXPECT_TRUE(TensorNear(envs[F32][name], shape, TensorValues(want), 1e-5)) << name;
  }
}

// Scores near 1e4 in F32: the max subtraction keeps exp finite.
TEST(AttentionTest, LargeScoresStayFinite) {
  std::map<std::string, Tensor> env{{"q", Make(F32, {1, 1, 4, 2}, 0.1, 100)},
                                    {"k", Make(F32, {1, 1, 4, 2}, 0.5, 100)},
                                    {"v", Make(F32, {1, 1, 4, 2}, 0.9)}};
  auto s = RunOp(ParseOp(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"]
                              output: ["y", "lse"])pb"),
                 &env);
  ASSERT_TRUE(s.ok()) << s;
  for (const char* name : {"y", "lse"}) {
    for (double x : TensorValues(env[name])) EXPECT_TRUE(std::isfinite(x)) << name;
  }
}

// BF16 and F16 attention (mixed precision) run the F32 kernels on the widened
// values: y, dq, dk, dv are the F32 results rounded to the low dtype, bit for
// bit, and lse is F32, the F32 kernel's own. T = 70 spans two row blocks.
TEST(AttentionTest, HalfKernelsAreTheF32KernelsRounded) {
  const Shape qkv{2, 2, 70, 8}, rows{2, 2, 70};
  const char* attrs[] = {"", R"pb(attr { key: "causal" value { b: false } } attr { key: "scale" value { f: 0.3 } })pb"};
  for (DataType half : {BF16, F16}) {
    for (int variant = 0; variant < 2; ++variant) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(half), " variant ", variant));
      const bool with_dlse = variant == 1;
      std::map<std::string, Tensor> low{{"q", Make(half, qkv, 0.1, 2.0)},
                                        {"k", Make(half, qkv, 0.5, 1.5)},
                                        {"v", Make(half, qkv, 0.9)},
                                        {"dy", Make(half, qkv, 1.3)}};
      std::map<std::string, Tensor> ref;
      for (const auto& [name, t] : low) ref[name] = As(F32, t);  // the same values, widened
      if (with_dlse) low["dlse"] = ref["dlse"] = Make(F32, rows, 2.1);
      const std::string fwd = absl::StrCat(
          R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"] )pb", attrs[variant]);
      ASSERT_TRUE(RunOps({ParseOp(fwd)}, &low).ok());
      ASSERT_TRUE(RunOps({ParseOp(fwd)}, &ref).ok());
      EXPECT_EQ(low["lse"].dtype(), F32);
      EXPECT_TRUE(SameBits(low["y"], As(half, ref["y"])));
      EXPECT_TRUE(SameBits(low["lse"], ref["lse"]));

      // The backward from the low-precision forward's y (widened for the reference).
      ref["y"] = As(F32, low["y"]);
      const std::string grads = with_dlse ? R"pb("dy", "dlse")pb" : R"pb("dy")pb";
      const std::string bwd = absl::StrCat(R"pb(type: "scaled_dot_product_attention_grad" input: ["q", "k", "v", "y", "lse", )pb",
                                           grads, R"pb(] output: ["dq", "dk", "dv"] )pb", attrs[variant]);
      absl::Status s = RunOps({ParseOp(bwd)}, &low);
      ASSERT_TRUE(s.ok()) << s;
      s = RunOps({ParseOp(bwd)}, &ref);
      ASSERT_TRUE(s.ok()) << s;
      for (const char* g : {"dq", "dk", "dv"}) {
        SCOPED_TRACE(g);
        EXPECT_EQ(low[g].dtype(), half);
        EXPECT_TRUE(SameBits(low[g], As(half, ref[g])));
        double norm = 0;  // and they are gradients, not zeros
        for (double v : TensorValues(low[g])) norm += v * v;
        EXPECT_GT(norm, 1e-4);
      }
    }
  }
}

// The planned lse must be F32 for a BF16 q: the kernel refuses a BF16 one.
TEST(AttentionTest, HalfGradKernelRefusesHalfLse) {
  const Shape qkv{1, 1, 4, 2};
  std::map<std::string, Tensor> env{{"q", Make(BF16, qkv, 0.1)}, {"k", Make(BF16, qkv, 0.5)},
                                    {"v", Make(BF16, qkv, 0.9)}, {"y", Make(BF16, qkv, 0.2)},
                                    {"lse", Make(BF16, {1, 1, 4}, 0.3)}, {"dy", Make(BF16, qkv, 1.3)}};
  auto s = RunKernelOnly(ParseOp(R"pb(type: "scaled_dot_product_attention_grad"
                                      input: ["q", "k", "v", "y", "lse", "dy"] output: ["dq", "dk", "dv"])pb"),
                         env);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("input 'lse' is BF16[1, 1, 4], expected F32[1, 1, 4]"));
}

constexpr auto Infer = InferTypes;  // shape inference through the registry (op_test_util)

TEST(AttentionShapeTest, PropagatesTheBatchDimAndRejectsMismatches) {
  const char* text = R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"])pb";
  const TensorType qkv{F32, {-1, 12, 128, 64}};
  auto ok = Infer(text, {qkv, qkv, qkv});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0], qkv);
  EXPECT_EQ((*ok)[1], (TensorType{F32, {-1, 12, 128}}));

  auto bad_k = Infer(text, {qkv, {F32, {-1, 12, 64, 64}}, qkv});
  ASSERT_FALSE(bad_k.ok());
  EXPECT_THAT(bad_k.status().message(), HasSubstr("input 'k' must have the type of 'q'"));
  auto bad_v = Infer(text, {qkv, qkv, {F64, {-1, 12, 128, 64}}});
  ASSERT_FALSE(bad_v.ok());
  EXPECT_THAT(bad_v.status().message(), HasSubstr("input 'v'"));
  auto rank3 = Infer(text, {{F32, {2, 3, 4}}, {F32, {2, 3, 4}}, {F32, {2, 3, 4}}});
  ASSERT_FALSE(rank3.ok());
  EXPECT_THAT(rank3.status().message(), HasSubstr("rank 4 [B, H, T, D]"));
  const TensorType no_d{F32, {2, 3, 4, 0}};
  auto zero_d = Infer(text, {no_d, no_d, no_d});
  ASSERT_FALSE(zero_d.ok());
  EXPECT_THAT(zero_d.status().message(), HasSubstr("known, positive size in dim 3"));
  const TensorType ints{I64, {2, 3, 4, 5}};
  auto int_q = Infer(text, {ints, ints, ints});
  ASSERT_FALSE(int_q.ok());
  EXPECT_THAT(int_q.status().message(), HasSubstr("F32, F64, BF16 or F16"));
  auto bad_scale = Infer(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                              attr { key: "scale" value { f: -1 } })pb",
                         {qkv, qkv, qkv});
  ASSERT_FALSE(bad_scale.ok());
  EXPECT_THAT(bad_scale.status().message(), HasSubstr("attr 'scale'"));
}

TEST(AttentionShapeTest, GradChecksLseAndGradients) {
  const char* text = R"pb(type: "scaled_dot_product_attention_grad" input: ["q", "k", "v", "y", "lse", "dy"]
                          output: ["dq", "dk", "dv"])pb";
  const TensorType qkv{F64, {2, 3, 4, 5}}, lse{F64, {2, 3, 4}};
  auto ok = Infer(text, {qkv, qkv, qkv, qkv, lse, qkv});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 3u);
  auto bad_lse = Infer(text, {qkv, qkv, qkv, qkv, qkv, qkv});
  ASSERT_FALSE(bad_lse.ok());
  EXPECT_THAT(bad_lse.status().message(), HasSubstr("input 'lse' must be F64[2, 3, 4]"));
  auto bad_dlse = Infer(R"pb(type: "scaled_dot_product_attention_grad"
                             input: ["q", "k", "v", "y", "lse", "dy", "dlse"] output: ["dq", "dk", "dv"])pb",
                        {qkv, qkv, qkv, qkv, lse, qkv, qkv});
  ASSERT_FALSE(bad_dlse.ok());
  EXPECT_THAT(bad_dlse.status().message(), HasSubstr("dlse"));
}

// Under mixed precision q, k, v, y are BF16 (or F16) and the logsumexp stays F32.
TEST(AttentionShapeTest, HalfQGivesHalfYAndF32Lse) {
  const char* text = R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"])pb";
  for (DataType half : {BF16, F16}) {
    const TensorType qkv{half, {-1, 4, 16, 8}};
    auto ok = Infer(text, {qkv, qkv, qkv});
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ((*ok)[0], qkv);
    EXPECT_EQ((*ok)[1], (TensorType{F32, {-1, 4, 16}}));
  }
  const TensorType mixed{F32, {2, 4, 16, 8}};
  auto bad_k = Infer(text, {{BF16, {2, 4, 16, 8}}, mixed, {BF16, {2, 4, 16, 8}}});
  ASSERT_FALSE(bad_k.ok());
  EXPECT_THAT(bad_k.status().message(), HasSubstr("input 'k' must have the type of 'q'"));
}

TEST(AttentionShapeTest, GradTakesF32LseForHalfQ) {
  const char* text = R"pb(type: "scaled_dot_product_attention_grad" input: ["q", "k", "v", "y", "lse", "dy"]
                          output: ["dq", "dk", "dv"])pb";
  const char* with_dlse = R"pb(type: "scaled_dot_product_attention_grad"
                               input: ["q", "k", "v", "y", "lse", "dy", "dlse"] output: ["dq", "dk", "dv"])pb";
  const TensorType qkv{BF16, {2, 3, 4, 5}}, lse{F32, {2, 3, 4}}, half_lse{BF16, {2, 3, 4}};
  auto ok = Infer(text, {qkv, qkv, qkv, qkv, lse, qkv});
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 3u);
  for (const TensorType& t : *ok) EXPECT_EQ(t, qkv);
  auto ok_dlse = Infer(with_dlse, {qkv, qkv, qkv, qkv, lse, qkv, lse});
  ASSERT_TRUE(ok_dlse.ok()) << ok_dlse.status();

  auto bf16_lse = Infer(text, {qkv, qkv, qkv, qkv, half_lse, qkv});
  ASSERT_FALSE(bf16_lse.ok());
  EXPECT_THAT(bf16_lse.status().message(), HasSubstr("input 'lse' must be F32[2, 3, 4]"));
  EXPECT_THAT(bf16_lse.status().message(), HasSubstr("got BF16[2, 3, 4]"));
  auto bf16_dlse = Infer(with_dlse, {qkv, qkv, qkv, qkv, lse, qkv, half_lse});
  ASSERT_FALSE(bf16_dlse.ok());
  EXPECT_THAT(bf16_dlse.status().message(), HasSubstr("input 'grads[1]' (dlse) must be F32[2, 3, 4]"));
}

// A run-time batch that disagrees between q and k (a plan the compiler never checked).
TEST(AttentionTest, KernelRefusesMismatchedOperands) {
  std::map<std::string, Tensor> env{{"q", Make(F32, {2, 1, 3, 2}, 0.1)},
                                    {"k", Make(F32, {1, 1, 3, 2}, 0.5)},
                                    {"v", Make(F32, {2, 1, 3, 2}, 0.9)}};
  auto s = RunKernelOnly(ParseOp(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"]
                                      output: ["y", "lse"])pb"),
                         env);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("input 'k' is F32[1, 1, 3, 2], expected F32[2, 1, 3, 2]"));
}

// Layout "bthd" ([B, T, H, D] q, k, v, y and gradients) gives the bits of
// transposing to [B, H, T, D], running "bhtd" and transposing back: the
// kernels read a head's rows H * D apart and do the same sums in the same
// order. T = 70 spans two row blocks; F64, F32 and the BF16 / F16 storage
// variants, causal and not, with and without dlse.
TEST(AttentionTest, BthdLayoutIsBhtdBetweenTransposesBitForBit) {
  const int64_t B = 2, T = 70, H = 3, D = 8;
  const Shape bthd{B, T, H, D}, rows{B, H, T};
  const char* attrs[] = {"", R"pb(attr { key: "causal" value { b: false } } attr { key: "scale" value { f: 0.3 } })pb"};
  const std::string to_bhtd = R"pb(type: "transpose" attr { key: "perm" value { list { i: [0, 2, 1, 3] } } })pb";
  const auto transpose = [&](const std::string& in, const std::string& out) {
    Op op = ParseOp(to_bhtd);
    op.add_input(in);
    op.add_output(out);
    return op;
  };
  for (DataType dt : {F64, F32, BF16, F16}) {
    const DataType lse_dt = IsHalfFloating(dt) ? F32 : dt;
    for (int variant = 0; variant < 2; ++variant) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dt), " variant ", variant));
      const bool with_dlse = variant == 1;
      std::map<std::string, Tensor> env{{"q", Make(dt, bthd, 0.1, 2.0)},
                                        {"k", Make(dt, bthd, 0.5, 1.5)},
                                        {"v", Make(dt, bthd, 0.9)},
                                        {"dy", Make(dt, bthd, 1.3)}};
      if (with_dlse) env["dlse"] = Make(lse_dt, rows, 2.1);
      const std::string grads = with_dlse ? R"pb(, "dlse")pb" : "";
      const std::string bthd_attr = R"pb(attr { key: "layout" value { s: "bthd" } } )pb";
      // Directly in [B, T, H, D].
      const std::vector<Op> direct = {
          ParseOp(absl::StrCat(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"]
                                    output: ["y", "lse"] )pb",
                               bthd_attr, attrs[variant])),
          ParseOp(absl::StrCat(R"pb(type: "scaled_dot_product_attention_grad"
                                    input: ["q", "k", "v", "y", "lse", "dy")pb",
                               grads, R"pb(] output: ["dq", "dk", "dv"] )pb", bthd_attr, attrs[variant]))};
      // Through [B, H, T, D] and back (perm (0, 2, 1, 3) is its own inverse).
      std::vector<Op> around = {transpose("q", "tq"), transpose("k", "tk"), transpose("v", "tv"),
                                transpose("dy", "tdy"),
                                ParseOp(absl::StrCat(R"pb(type: "scaled_dot_product_attention"
                                                          input: ["tq", "tk", "tv"] output: ["ty", "rlse"] )pb",
                                                     attrs[variant])),
                                ParseOp(absl::StrCat(R"pb(type: "scaled_dot_product_attention_grad"
                                                          input: ["tq", "tk", "tv", "ty", "rlse", "tdy")pb",
                                                     grads, R"pb(] output: ["tdq", "tdk", "tdv"] )pb",
                                                     attrs[variant]))};
      for (const char* name : {"y", "dq", "dk", "dv"}) around.push_back(transpose(absl::StrCat("t", name),
                                                                                   absl::StrCat("r", name)));
      absl::Status s = RunOps(direct, &env);
      ASSERT_TRUE(s.ok()) << s;
      s = RunOps(around, &env);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(env["y"].shape(), bthd);
      EXPECT_EQ(env["lse"].shape(), rows);
      EXPECT_EQ(env["lse"].dtype(), lse_dt);
      EXPECT_TRUE(SameBits(env["lse"], env["rlse"]));
      for (const char* name : {"y", "dq", "dk", "dv"}) {
        SCOPED_TRACE(name);
        EXPECT_EQ(env[name].dtype(), dt);
        EXPECT_TRUE(SameBits(env[name], env[absl::StrCat("r", name)]));
        double norm = 0;  // and they are results, not zeros
        for (double v : TensorValues(env[name])) norm += v * v;
        EXPECT_GT(norm, 1e-4);
      }
    }
  }
}

// scaled_dot_product_attention_qkv reads q, k, v in place from qkv
// [B, T, 3, H, D] and writes dq, dk, dv into dqkv's slots: the bits of
// splitting qkv's [B, T, 3 * H * D] view into three, running the "bthd" ops
// and concatenating the gradients (what the pass rewrites). T = 70 spans two
// row blocks; F64, F32, BF16, F16, causal and not, with and without dlse.
TEST(AttentionTest, PackedQkvIsTheSplitAndConcatBitForBit) {
  const int64_t B = 2, T = 70, H = 3, D = 8, C = H * D;
  const Shape packed{B, T, 3, H, D}, flat{B, T, 3 * C}, bthd{B, T, H, D}, rows{B, H, T};
  const char* attrs[] = {"", R"pb(attr { key: "causal" value { b: false } } attr { key: "scale" value { f: 0.3 } })pb"};
  const auto reshape = [](const std::string& in, const std::string& out, const Shape& shape) {
    return ParseOp(absl::StrCat("type: \"reshape\" input: \"", in, "\" output: \"", out,
                                "\" attr { key: \"shape\" value { list { i: [", absl::StrJoin(shape, ", "),
                                "] } } }"));
  };
  for (DataType dt : {F64, F32, BF16, F16}) {
    const DataType lse_dt = IsHalfFloating(dt) ? F32 : dt;
    for (int variant = 0; variant < 2; ++variant) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dt), " variant ", variant));
      const bool with_dlse = variant == 1;
      std::map<std::string, Tensor> env{{"qkv", Make(dt, packed, 0.1, 2.0)}, {"dy", Make(dt, bthd, 1.3)}};
      if (with_dlse) env["dlse"] = Make(lse_dt, rows, 2.1);
      const std::string grads = with_dlse ? R"pb(, "dlse")pb" : "";
      const std::vector<Op> direct = {
          ParseOp(absl::StrCat(R"pb(type: "scaled_dot_product_attention_qkv" input: ["qkv"]
                                    output: ["y", "lse"] )pb",
                               attrs[variant])),
          ParseOp(absl::StrCat(R"pb(type: "scaled_dot_product_attention_qkv_grad" input: ["qkv", "y", "lse", "dy")pb",
                               grads, R"pb(] output: ["dqkv"] )pb", attrs[variant]))};
      const std::string bthd_attr = R"pb(attr { key: "layout" value { s: "bthd" } } )pb";
      std::vector<Op> split = {
          reshape("qkv", "flat", flat),
          ParseOp(absl::StrCat(R"pb(type: "split" input: ["flat"] output: ["q2", "k2", "v2"]
                                    attr { key: "axis" value { i: 2 } }
                                    attr { key: "sections" value { list { i: [)pb",
                               C, ", ", C, ", ", C, "] } } }")),
          reshape("q2", "q", bthd), reshape("k2", "k", bthd), reshape("v2", "v", bthd),
          ParseOp(absl::StrCat(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"]
                                    output: ["ry", "rlse"] )pb",
                               bthd_attr, attrs[variant])),
          ParseOp(absl::StrCat(R"pb(type: "scaled_dot_product_attention_grad"
                                    input: ["q", "k", "v", "ry", "rlse", "dy")pb",
                               grads, R"pb(] output: ["dq", "dk", "dv"] )pb", bthd_attr, attrs[variant])),
          reshape("dq", "dq2", Shape{B, T, C}), reshape("dk", "dk2", Shape{B, T, C}),
          reshape("dv", "dv2", Shape{B, T, C}),
          ParseOp(R"pb(type: "concat" input: ["dq2", "dk2", "dv2"] output: ["dflat"]
                       attr { key: "axis" value { i: 2 } })pb"),
          reshape("dflat", "rdqkv", packed)};
      absl::Status st = RunOps(direct, &env);
      ASSERT_TRUE(st.ok()) << st;
      st = RunOps(split, &env);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(env["y"].shape(), bthd);
      EXPECT_EQ(env["lse"].shape(), rows);
      EXPECT_EQ(env["lse"].dtype(), lse_dt);
      EXPECT_EQ(env["dqkv"].shape(), packed);
      EXPECT_TRUE(SameBits(env["lse"], env["rlse"]));
      for (const auto& [name, ref] : {std::pair<std::string, std::string>{"y", "ry"}, {"dqkv", "rdqkv"}}) {
        SCOPED_TRACE(name);
        EXPECT_EQ(env[name].dtype(), dt);
        EXPECT_TRUE(SameBits(env[name], env[ref]));
        double norm = 0;  // and they are results, not zeros
        for (double v : TensorValues(env[name])) norm += v * v;
        EXPECT_GT(norm, 1e-4);
      }
    }
  }
}

// The packed ops' shapes: y [B, T, H, D], lse [B, H, T] (F32 for 16-bit
// qkv), dqkv qkv's type; a qkv without 3 in dim 2, or a y, lse or dy of the
// wrong type, is refused naming the op and the input.
TEST(AttentionShapeTest, PackedQkvShapesAndRefusals) {
  auto fwd = InferTypes(R"pb(type: "scaled_dot_product_attention_qkv" input: ["qkv"] output: ["y", "lse"])pb",
                        {{BF16, {-1, 16, 3, 4, 8}}});
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ((*fwd)[0], (TensorType{BF16, {-1, 16, 4, 8}}));
  EXPECT_EQ((*fwd)[1], (TensorType{F32, {-1, 4, 16}}));
  auto two = InferTypes(R"pb(type: "scaled_dot_product_attention_qkv" input: ["qkv"] output: ["y", "lse"])pb",
                        {{F32, {2, 16, 2, 4, 8}}});
  ASSERT_FALSE(two.ok());
  EXPECT_THAT(two.status().message(), HasSubstr("input 'qkv' must be [B, T, 3, H, D]"));
  const std::string grad = R"pb(type: "scaled_dot_product_attention_qkv_grad" input: ["qkv", "y", "lse", "dy"]
                                output: ["dqkv"])pb";
  auto ok = InferTypes(grad, {{F32, {2, 16, 3, 4, 8}}, {F32, {2, 16, 4, 8}}, {F32, {2, 4, 16}}, {F32, {2, 16, 4, 8}}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0], (TensorType{F32, {2, 16, 3, 4, 8}}));
  auto bad_lse =
      InferTypes(grad, {{F32, {2, 16, 3, 4, 8}}, {F32, {2, 16, 4, 8}}, {F32, {2, 16, 4}}, {F32, {2, 16, 4, 8}}});
  ASSERT_FALSE(bad_lse.ok());
  EXPECT_THAT(bad_lse.status().message(), HasSubstr("input 'lse' must be F32[2, 4, 16]"));
  std::map<std::string, Tensor> env{{"qkv", Make(F32, {1, 5, 3, 2, 4}, 0.1)},
                                    {"y", Make(F32, {1, 5, 2, 4}, 0.2)},
                                    {"lse", Make(F32, {1, 5, 2}, 0.3)},
                                    {"dy", Make(F32, {1, 5, 2, 4}, 0.4)}};
  const absl::Status run = RunOp(ParseOp(grad), &env);
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(run.message(), HasSubstr("scaled_dot_product_attention_qkv_grad"));
  EXPECT_THAT(run.message(), HasSubstr("input 'lse' must be F32[1, 2, 5]"));
}

// The layout attr is checked where it is read: the schema and the kernels
// refuse another string naming the two, and a "bthd" q's lse is [B, H, T].
TEST(AttentionShapeTest, LayoutAttrPicksTheDimsAndRefusesOtherStrings) {
  const TensorType qkv{F32, {-1, 128, 12, 64}};
  auto ok = Infer(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "layout" value { s: "bthd" } })pb",
                  {qkv, qkv, qkv});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0], qkv);
  EXPECT_EQ((*ok)[1], (TensorType{F32, {-1, 12, 128}}));
  const TensorType lse{F32, {-1, 12, 128}};
  auto grad = Infer(R"pb(type: "scaled_dot_product_attention_grad" input: ["q", "k", "v", "y", "lse", "dy", "dlse"]
                         output: ["dq", "dk", "dv"] attr { key: "layout" value { s: "bthd" } })pb",
                    {qkv, qkv, qkv, qkv, lse, qkv, lse});
  ASSERT_TRUE(grad.ok()) << grad.status();
  for (const TensorType& t : *grad) EXPECT_EQ(t, qkv);
  // A [B, T, H] lse is the wrong way round for "bthd".
  auto bad_lse = Infer(R"pb(type: "scaled_dot_product_attention_grad" input: ["q", "k", "v", "y", "lse", "dy"]
                            output: ["dq", "dk", "dv"] attr { key: "layout" value { s: "bthd" } })pb",
                       {qkv, qkv, qkv, qkv, {F32, {-1, 128, 12}}, qkv});
  ASSERT_FALSE(bad_lse.ok());
  EXPECT_THAT(bad_lse.status().message(), HasSubstr("input 'lse' must be F32[-1, 12, 128]"));
  auto rank3 = Infer(R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                          attr { key: "layout" value { s: "bthd" } })pb",
                     {{F32, {2, 3, 4}}, {F32, {2, 3, 4}}, {F32, {2, 3, 4}}});
  ASSERT_FALSE(rank3.ok());
  EXPECT_THAT(rank3.status().message(), HasSubstr("rank 4 [B, T, H, D]"));
  for (const char* op : {"scaled_dot_product_attention", "scaled_dot_product_attention_grad"}) {
    const bool grad_op = std::string(op) == "scaled_dot_product_attention_grad";
    Op bad = ParseOp(grad_op ? R"pb(input: ["q", "k", "v", "y", "lse", "dy"] output: ["dq", "dk", "dv"])pb"
                             : R"pb(input: ["q", "k", "v"] output: ["y", "lse"])pb");
    bad.set_type(op);
    (*bad.mutable_attr())["layout"].set_s("tbhd");
    std::vector<TensorType> types = {qkv, qkv, qkv};
    if (grad_op) types = {qkv, qkv, qkv, qkv, lse, qkv};
    auto refused = Infer(bad.DebugString(), types);
    ASSERT_FALSE(refused.ok()) << op;
    EXPECT_THAT(refused.status().message(), HasSubstr(R"(attr 'layout' must be "bhtd")"));
    EXPECT_THAT(refused.status().message(), HasSubstr(R"(got "tbhd")"));
    // The kernel, given such an op directly, refuses it at Init.
    const Shape shape{1, 2, 3, 4};
    std::map<std::string, Tensor> env{{"q", Make(F32, shape, 0.1)}, {"k", Make(F32, shape, 0.5)},
                                      {"v", Make(F32, shape, 0.9)}, {"y", Make(F32, shape, 0.2)},
                                      {"lse", Make(F32, {1, 3, 2}, 0.3)}, {"dy", Make(F32, shape, 1.3)}};
    absl::Status s = RunKernelOnly(bad, env);
    ASSERT_FALSE(s.ok()) << op;
    EXPECT_THAT(s.message(), HasSubstr(R"(attr 'layout' must be "bhtd")"));
  }
}

// A "bthd" kernel given a [B, T, H] lse (the plan's would be [B, H, T])
// refuses it naming both.
TEST(AttentionTest, BthdGradKernelRefusesALseOfTheWrongOrder) {
  const Shape qkv{1, 4, 2, 3};
  std::map<std::string, Tensor> env{{"q", Make(F32, qkv, 0.1)}, {"k", Make(F32, qkv, 0.5)},
                                    {"v", Make(F32, qkv, 0.9)}, {"y", Make(F32, qkv, 0.2)},
                                    {"lse", Make(F32, {1, 4, 2}, 0.3)}, {"dy", Make(F32, qkv, 1.3)}};
  auto s = RunKernelOnly(ParseOp(R"pb(type: "scaled_dot_product_attention_grad"
                                      input: ["q", "k", "v", "y", "lse", "dy"] output: ["dq", "dk", "dv"]
                                      attr { key: "layout" value { s: "bthd" } })pb"),
                         env);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("input 'lse' is F32[1, 4, 2], expected F32[1, 2, 4]"));
}

}  // namespace
}  // namespace strata
