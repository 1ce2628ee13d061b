// Optimizer-family kernels against PyTorch 1.13 (torch.optim, lr_scheduler,
// clip_grad_norm_), run through the op registry and the CPU kernels the way
// the executor runs them.

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/optimizer_math.h"
#include "runtime/float16.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

// |actual - expected| <= rel * |expected| for every element (an expected 0
// must come out exactly 0).
void ExpectRelNear(const Tensor& actual, const std::vector<double>& expected, double rel, const std::string& what) {
  std::vector<double> got = TensorValues(actual);
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - expected[i]), rel * std::abs(expected[i]))
        << what << "[" << i << "]: got " << got[i] << ", torch " << expected[i];
  }
}

Tensor Scalar(DataType dtype, double value) { return MakeTensor(dtype, {}, {value}); }

// ---------------------------------------------------------------------------
// 20 optimizer steps on a 2x3 parameter with gradients that depend on it, the
// same trajectory as this PyTorch program (float64):
//
//   P0 = [0.5, -1.25, 2.0, 0.75, -0.3, 1.5]
//   def grad_of(p, k):
//       i = torch.arange(6, dtype=torch.float64).reshape(2, 3)
//       return p * p * p - 0.5 * p + 0.1 * torch.cos(i + k)
//   p = torch.tensor(P0).reshape(2, 3).requires_grad_(True)
//   opt = make_opt([p])
//   for k in range(20):
//       opt.zero_grad(); p.grad = grad_of(p.detach(), k); opt.step()
//   print(p, opt.state[p])   # "%.17g"
const std::vector<double> kInitialParam = {0.5, -1.25, 2.0, 0.75, -0.3, 1.5};
constexpr int kSteps = 20;

Tensor GradOf(const Tensor& param, int k) {
  std::vector<double> p = TensorValues(param);
  std::vector<double> g(p.size());
  for (size_t i = 0; i < p.size(); ++i) g[i] = p[i] * p[i] * p[i] - 0.5 * p[i] + 0.1 * std::cos(static_cast<double>(i) + k);
  return MakeTensor(param.dtype(), param.shape(), g);
}

// Runs `update` (which reads "p", "g", "lr" and, for adam, "step") kSteps
// times. State vars named in `state` start at zero. Adam-style updates get
// the 1-based step from an increment op run before them, as the compiler emits it.
std::map<std::string, Tensor> Train(DataType dtype, const std::string& update, const std::vector<std::string>& state,
                                    double lr, bool counts_steps) {
  std::map<std::string, Tensor> env;
  env["p"] = MakeTensor(dtype, {2, 3}, kInitialParam);
  for (const auto& name : state) env[name] = Tensor::Zeros(dtype, {2, 3});
  env["lr"] = Scalar(dtype, lr);
  env["step"] = Scalar(I64, 0);
  Op increment = ParseOp(R"pb(type: "increment" input: "step" output: "step")pb");
  Op op = ParseOp(update);
  for (int k = 0; k < kSteps; ++k) {
    env["g"] = GradOf(env["p"], k);
    if (counts_steps) {
      absl::Status s = RunOp(increment, &env);
      EXPECT_TRUE(s.ok()) << s;
    }
    absl::Status s = RunOp(op, &env);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
  }
  return env;
}

constexpr double kTorchTolerance = 1e-9;  // float64 against float64
// float32 against torch's float32 run (which fuses multiply-adds where we do
// not): rounding of O(1) weights over 20 steps, relative to max(|w|, 1).
constexpr double kFloat32Tolerance = 1e-5;

TEST(SgdUpdate, MatchesTorchSgd) {
  // torch.optim.SGD(ps, lr=0.05)
  const std::vector<double> torch_param = {0.6005281804349154,   -0.81361440805405127, 0.83784551230803961,
                                           0.72533467342797264, -0.42866513272945456, 0.82757758452669683};
  const char* op = R"pb(type: "sgd_update" input: ["p", "g", "lr"] output: "p")pb";
  ExpectRelNear(Train(F64, op, {}, 0.05, false)["p"], torch_param, kTorchTolerance, "param");
  // The same in float32: 0.60052824, -0.813614368, 0.837845445, 0.725334704, -0.428665161, 0.827577531
  EXPECT_TRUE(TensorNear(Train(F32, op, {}, 0.05, false)["p"], std::vector<int64_t>({2, 3}),
                     std::vector<double>({0.60052824, -0.813614368, 0.837845445, 0.725334704, -0.428665161,
                                          0.827577531}),
                     kFloat32Tolerance));
}

TEST(SgdUpdate, WeightDecayMatchesTorch) {
  // torch.optim.SGD(ps, lr=0.05, weight_decay=0.1)
  const std::vector<double> torch_param = {0.55696979001497959, -0.77117946992625352, 0.79716897071776116,
                                           0.68058354078576477, -0.39278884214131954, 0.7860076822681108};
  const char* op = R"pb(type: "sgd_update" input: ["p", "g", "lr"] output: "p"
                        attr { key: "weight_decay" value { f: 0.1 } })pb";
  ExpectRelNear(Train(F64, op, {}, 0.05, false)["p"], torch_param, kTorchTolerance, "param");
}

TEST(SgdUpdate, OneStepByHand) {
  // p = [1, -2], g = [0.5, 4], lr = 0.25, wd = 0.5: g' = [1, 3], p' = [0.75, -2.75].
  std::map<std::string, Tensor> env;
  env["p"] = MakeTensor(F64, {2}, {1, -2});
  env["g"] = MakeTensor(F64, {2}, {0.5, 4});
  env["lr"] = Scalar(F64, 0.25);
  ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "sgd_update" input: ["p", "g", "lr"] output: "p"
                                 attr { key: "weight_decay" value { f: 0.5 } })pb"),
                    &env)
                  .ok());
  ExpectRelNear(env["p"], {0.75, -2.75}, 0, "param");
}

TEST(SgdUpdate, UpdatesTheParamBufferInPlace) {
  std::map<std::string, Tensor> env;
  env["p"] = MakeTensor(F32, {3}, {1, 2, 3});
  env["g"] = MakeTensor(F32, {3}, {1, 1, 1});
  env["lr"] = Scalar(F32, 0.5);
  const void* buffer = env["p"].raw_data();
  Tensor alias = env["p"];
  ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "sgd_update" input: ["p", "g", "lr"] output: "p")pb"), &env).ok());
  EXPECT_EQ(env["p"].raw_data(), buffer);
  ExpectRelNear(alias, {0.5, 1.5, 2.5}, 0, "alias of param");
}

TEST(MomentumUpdate, MatchesTorchSgdMomentum) {
  // torch.optim.SGD(ps, lr=0.02, momentum=0.9)
  const std::vector<double> torch_param = {0.7231019207995788,  -0.37613342180499187, -1.0976524203975153,
                                           0.69342342551555669, -0.61456424563307988, 0.011197369084004385};
  const std::vector<double> torch_buffer = {-0.39571411779931587,  -0.045955088117487691, 1.0813207413060657,
                                            -0.0014291124671366034, 0.93999229338905943,  0.97694161363218301};
  const char* op = R"pb(type: "momentum_update" input: ["p", "g", "vel", "lr"] output: ["p", "vel"])pb";
  auto env = Train(F64, op, {"vel"}, 0.02, false);
  ExpectRelNear(env["p"], torch_param, kTorchTolerance, "param");
  ExpectRelNear(env["vel"], torch_buffer, kTorchTolerance, "momentum_buffer");
  // The same in float32: 0.723101974, -0.37613377, -1.0976522, 0.69342345, -0.61456418, 0.0111977942
  EXPECT_TRUE(TensorNear(Train(F32, op, {"vel"}, 0.02, false)["p"], std::vector<int64_t>({2, 3}),
                     std::vector<double>({0.723101974, -0.37613377, -1.0976522, 0.69342345, -0.61456418,
                                          0.0111977942}),
                     kFloat32Tolerance));
}

TEST(MomentumUpdate, NesterovWithWeightDecayMatchesTorch) {
  // torch.optim.SGD(ps, lr=0.02, momentum=0.8, nesterov=True, weight_decay=0.05)
  const std::vector<double> torch_param = {0.62614710534472973, -0.64001486427500953, 0.41034709528300023,
                                           0.67799600161421636, -0.49001269618521021, 0.59258572591169001};
  const std::vector<double> torch_buffer = {-0.17760585565751957, -0.022765375570825128, -0.15427406395635654,
                                            0.01153506203223538,  0.43336014275107959,   -0.035564774415809158};
  const char* op = R"pb(type: "momentum_update" input: ["p", "g", "vel", "lr"] output: ["p", "vel"]
                        attr { key: "momentum" value { f: 0.8 } }
                        attr { key: "nesterov" value { b: true } }
                        attr { key: "weight_decay" value { f: 0.05 } })pb";
  auto env = Train(F64, op, {"vel"}, 0.02, false);
  ExpectRelNear(env["p"], torch_param, kTorchTolerance, "param");
  ExpectRelNear(env["vel"], torch_buffer, kTorchTolerance, "momentum_buffer");
}

TEST(AdamUpdate, MatchesTorchAdam) {
  // torch.optim.Adam(ps, lr=0.01)
  const std::vector<double> torch_param = {0.66289365726809224, -1.0597746429742265, 1.8041841075302103,
                                           0.69660173303841266, -0.48006267134646735, 1.3070557204543498};
  const std::vector<double> torch_m = {-0.058519107663497036, -0.75703880003125734, 4.9729738964676251,
                                       0.0036649961860114131, 0.1068293896055883,   1.685019413080892};
  const std::vector<double> torch_v = {0.00025930489549285567, 0.019894568752182727, 0.71585279106138355,
                                       0.00013202188030532247, 0.00042735619968941181, 0.088941014745295754};
  const char* op = R"pb(type: "adam_update" input: ["p", "g", "m", "v", "lr", "step"] output: ["p", "m", "v"])pb";
  auto env = Train(F64, op, {"m", "v"}, 0.01, true);
  ExpectRelNear(env["p"], torch_param, kTorchTolerance, "param");
  ExpectRelNear(env["m"], torch_m, kTorchTolerance, "exp_avg");
  ExpectRelNear(env["v"], torch_v, kTorchTolerance, "exp_avg_sq");
  ExpectRelNear(env["step"], {kSteps}, 0, "step");
}

TEST(AdamUpdate, L2WeightDecayMatchesTorchAdam) {
  // torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
  const std::vector<double> torch_param = {0.60249129691245462, -1.0644595335250653, 1.806980203331414,
                                           0.63429747018069826, -0.46421061615516163, 1.3110806898434992};
  const std::vector<double> torch_m = {-0.0191930388289679,     -0.88091660710497421, 5.555245951208736,
                                       -0.00052554396489535075, 0.068103643456446983, 1.9133634895292997};
  const std::vector<double> torch_v = {0.0014742635015441868, 0.22386037479166632,   6.9496414692598645,
                                       0.0014056780843511587, 0.0024026730085565111, 0.91930375902156403};
  const char* op = R"pb(type: "adam_update" input: ["p", "g", "m", "v", "lr", "step"] output: ["p", "m", "v"]
                        attr { key: "beta1" value { f: 0.8 } }
                        attr { key: "beta2" value { f: 0.99 } }
                        attr { key: "epsilon" value { f: 1e-6 } }
                        attr { key: "weight_decay" value { f: 0.1 } })pb";
  auto env = Train(F64, op, {"m", "v"}, 0.01, true);
  ExpectRelNear(env["p"], torch_param, kTorchTolerance, "param");
  ExpectRelNear(env["m"], torch_m, kTorchTolerance, "exp_avg");
  ExpectRelNear(env["v"], torch_v, kTorchTolerance, "exp_avg_sq");
}

TEST(AdamUpdate, DecoupledMatchesTorchAdamW) {
  // torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1)
  const std::vector<double> torch_param = {0.65290927440076219, -1.0382212870414884, 1.7673618212990838,
                                           0.6896938669883752,  -0.47241297046650282, 1.2803203857444616};
  const std::vector<double> torch_m = {-0.062355223604707515, -0.71732212150173835, 4.76823026860892,
                                       -0.0015410864648371435, 0.10710509278705822, 1.6082280906898796};
  const std::vector<double> torch_v = {0.00026697288467048875, 0.018690024438031923, 0.676341572803147,
                                       0.00012985853891535088, 0.00042760851973812542, 0.083852603964019765};
  const char* op = R"pb(type: "adam_update" input: ["p", "g", "m", "v", "lr", "step"] output: ["p", "m", "v"]
                        attr { key: "weight_decay" value { f: 0.1 } }
                        attr { key: "decoupled" value { b: true } })pb";
  auto env = Train(F64, op, {"m", "v"}, 0.01, true);
  ExpectRelNear(env["p"], torch_param, kTorchTolerance, "param");
  ExpectRelNear(env["m"], torch_m, kTorchTolerance, "exp_avg");
  ExpectRelNear(env["v"], torch_v, kTorchTolerance, "exp_avg_sq");
  // The same in float32: 0.652909398, -1.0382216, 1.76736224, 0.689693987, -0.472413093, 1.28032076
  EXPECT_TRUE(TensorNear(Train(F32, op, {"m", "v"}, 0.01, true)["p"], std::vector<int64_t>({2, 3}),
                     std::vector<double>({0.652909398, -1.0382216, 1.76736224, 0.689693987, -0.472413093,
                                          1.28032076}),
                     kFloat32Tolerance));
}

TEST(AdamUpdate, FirstStepMovesEachWeightByAboutLr) {
  // Step 1: m/bc1 = g and sqrt(v/bc2) = |g|, so p -= lr * g / (|g| + eps).
  std::map<std::string, Tensor> env;
  env["p"] = MakeTensor(F64, {2}, {1, 1});
  env["g"] = MakeTensor(F64, {2}, {3, -0.5});
  env["m"] = Tensor::Zeros(F64, {2});
  env["v"] = Tensor::Zeros(F64, {2});
  env["lr"] = Scalar(F64, 0.1);
  env["step"] = Scalar(I64, 1);
  ASSERT_TRUE(
      RunOp(ParseOp(R"pb(type: "adam_update" input: ["p", "g", "m", "v", "lr", "step"] output: ["p", "m", "v"])pb"),
            &env)
          .ok());
  ExpectRelNear(env["p"], {1 - 0.1 * 3 / (3 + 1e-8), 1 + 0.1 * 0.5 / (0.5 + 1e-8)}, 1e-15, "param");
}

// The kernel's loop (vectorized, compiled per ISA) against Adam's formula
// worked one element at a time in float: Adam, Adam with L2 decay and
// AdamW, over more elements than one thread's chunk, three steps, with zero
// gradients, tiny and large ones. Every bit of param, m and v must agree.
TEST(AdamUpdate, AdamLoopEqualsTheElementFormulaBitForBit) {
  struct Case {
    const char* name;
    double weight_decay;
    bool decoupled;
  };
  for (const Case& c : {Case{"adam", 0.0, false}, Case{"adam, L2", 0.05, false}, Case{"adamw", 0.1, true}}) {
    SCOPED_TRACE(c.name);
    constexpr int64_t n = 40007;
    std::vector<double> p(n), g(n), zeros(n, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      p[i] = std::sin(0.37 * static_cast<double>(i));
      g[i] = i % 97 == 0 ? 0.0 : std::cos(0.11 * static_cast<double>(i)) * std::pow(10.0, static_cast<double>(i % 9) - 6);
    }
    std::map<std::string, Tensor> env{{"p", MakeTensor(F32, {n}, p)},      {"g", MakeTensor(F32, {n}, g)},
                                      {"m", MakeTensor(F32, {n}, zeros)},  {"v", MakeTensor(F32, {n}, zeros)},
                                      {"lr", Scalar(F32, 0.003)}};
    std::vector<float> want_p(n), want_m(n, 0.0f), want_v(n, 0.0f);
    for (int64_t i = 0; i < n; ++i) want_p[i] = env["p"].data<float>()[i];
    const kernel_math::AdamAttrs attrs{0.9, 0.999, 1e-8, c.weight_decay, c.decoupled};
    const std::string op = absl::StrCat(
        R"pb(type: "adam_update" input: ["p", "g", "m", "v", "lr", "step"] output: ["p", "m", "v"]
             attr { key: "weight_decay" value { f: )pb",
        c.weight_decay, R"pb( } } attr { key: "decoupled" value { b: )pb", c.decoupled ? "true" : "false", " } }");
    for (int64_t step = 1; step <= 3; ++step) {
      env["step"] = Scalar(I64, static_cast<double>(step));
      ASSERT_TRUE(RunOp(ParseOp(op), &env).ok());
      const kernel_math::AdamScalars<float> s = kernel_math::MakeAdamScalars<float>(attrs, 0.003f, step);
      for (int64_t i = 0; i < n; ++i) {
        float pi = want_p[i];
        if (c.decoupled) pi *= s.decay_factor;
        float gi = env["g"].data<float>()[i];
        if (!c.decoupled && c.weight_decay != 0) gi += s.l2 * pi;
        want_m[i] = want_m[i] * s.beta1 + s.one_minus_beta1 * gi;
        want_v[i] = want_v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
        const float denom = std::sqrt(want_v[i]) / s.bias_correction2_sqrt + s.epsilon;
        want_p[i] = pi - s.step_size * (want_m[i] / denom);
      }
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(FloatBits(env["p"].data<float>()[i]), FloatBits(want_p[i])) << "step " << step << ", p[" << i << "]";
        ASSERT_EQ(FloatBits(env["m"].data<float>()[i]), FloatBits(want_m[i])) << "step " << step << ", m[" << i << "]";
        ASSERT_EQ(FloatBits(env["v"].data<float>()[i]), FloatBits(want_v[i])) << "step " << step << ", v[" << i << "]";
      }
    }
  }
}

TEST(AdamUpdate, RejectsAStepBelowOne) {
  std::map<std::string, Tensor> env;
  env["p"] = MakeTensor(F64, {1}, {1});
  env["g"] = MakeTensor(F64, {1}, {1});
  env["m"] = Tensor::Zeros(F64, {1});
  env["v"] = Tensor::Zeros(F64, {1});
  env["lr"] = Scalar(F64, 0.1);
  env["step"] = Scalar(I64, 0);
  absl::Status s =
      RunOp(ParseOp(R"pb(type: "adam_update" input: ["p", "g", "m", "v", "lr", "step"] output: ["p", "m", "v"])pb"),
            &env);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'step'"));
}

TEST(Increment, AddsByInPlace) {
  std::map<std::string, Tensor> env;
  env["n"] = Scalar(I64, 41);
  ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "increment" input: "n" output: "n")pb"), &env).ok());
  ExpectRelNear(env["n"], {42}, 0, "counter");
  ASSERT_TRUE(
      RunOp(ParseOp(R"pb(type: "increment" input: "n" output: "n" attr { key: "by" value { i: 8 } })pb"), &env).ok());
  ExpectRelNear(env["n"], {50}, 0, "counter");
}

// ---------------------------------------------------------------------------
// lr_schedule against torch.optim.lr_scheduler, reading the lr of each of the
// first n updates:
//
//   def lrs(make_sched, n, base):
//       p = torch.zeros(1, requires_grad=True)
//       opt = torch.optim.SGD([p], lr=base); s = make_sched(opt); out = []
//       for t in range(n):
//           out.append(opt.param_groups[0]["lr"]); opt.step(); s.step()
//       return out
std::vector<double> Schedule(const std::string& attrs, int64_t n, int64_t total_steps = 0, DataType dtype = F64) {
  Op op = ParseOp(absl::StrCat(R"pb(type: "lr_schedule" input: "t" output: "lr")pb", " ", attrs,
                               dtype == F64 ? R"pb( attr { key: "dtype" value { s: "F64" } })pb" : ""));
  RunContext run;
  run.total_steps = total_steps;
  std::vector<double> out;
  for (int64_t t = 0; t < n; ++t) {
    std::map<std::string, Tensor> env;
    env["t"] = Scalar(I64, t);
    absl::Status s = RunOp(op, &env, run);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return out;
    EXPECT_EQ(env["lr"].dtype(), dtype);
    out.push_back(TensorValues(env["lr"])[0]);
  }
  return out;
}

void ExpectScheduleNear(const std::vector<double>& got, const std::vector<double>& torch, double rel) {
  ASSERT_EQ(got.size(), torch.size());
  for (size_t t = 0; t < got.size(); ++t) {
    EXPECT_LE(std::abs(got[t] - torch[t]), rel * std::abs(torch[t])) << "step " << t << ": got " << got[t]
                                                                       << ", torch " << torch[t];
  }
}

TEST(LrSchedule, CosineMatchesTorchCosineAnnealing) {
  // lrs(lambda o: CosineAnnealingLR(o, T_max=10, eta_min=0.05 * 0.1), 11, 0.1)
  const std::vector<double> torch = {
      0.10000000000000001,  0.097675184524019798, 0.090928307232810007, 0.080419799483892482,
      0.06717830723281,     0.052499999999999991, 0.037821692767189996, 0.024580200516107528,
      0.014071692767190001, 0.0073248154759802077, 0.005000000000000001};
  ExpectScheduleNear(Schedule(R"pb(attr { key: "base_lr" value { f: 0.1 } }
                                   attr { key: "kind" value { s: "cosine" } }
                                   attr { key: "decay_steps" value { i: 10 } }
                                   attr { key: "alpha" value { f: 0.05 } })pb",
                              11),
                     torch, 1e-12);
}

TEST(LrSchedule, CosineTakesTheRunLengthWhenDecayStepsIsZeroAndStaysAtTheFloor) {
  const std::string attrs = R"pb(attr { key: "base_lr" value { f: 0.1 } }
                                 attr { key: "kind" value { s: "cosine" } }
                                 attr { key: "alpha" value { f: 0.05 } })pb";
  // Same torch numbers as above, the 10 steps now coming from RunContext::total_steps.
  std::vector<double> lr = Schedule(attrs, 14, /*total_steps=*/10);
  ASSERT_EQ(lr.size(), 14u);
  EXPECT_NEAR(lr[3], 0.080419799483892482, 1e-12 * 0.08);
  // Past the decay period the rate stays at alpha * base_lr (torch's would rise again).
  for (int t = 10; t < 14; ++t) EXPECT_NEAR(lr[t], 0.005, 1e-15) << t;
  // Run length unknown: no decay.
  for (double v : Schedule(attrs, 3, /*total_steps=*/0)) EXPECT_EQ(v, 0.1);
}

TEST(LrSchedule, StepDecayMatchesTorchStepLR) {
  // lrs(lambda o: StepLR(o, step_size=3, gamma=0.5), 10, 0.1)
  const std::vector<double> torch = {0.10000000000000001,  0.10000000000000001,  0.10000000000000001,
                                     0.050000000000000003, 0.050000000000000003, 0.050000000000000003,
                                     0.025000000000000001, 0.025000000000000001, 0.025000000000000001,
                                     0.012500000000000001};
  ExpectScheduleNear(Schedule(R"pb(attr { key: "base_lr" value { f: 0.1 } }
                                   attr { key: "kind" value { s: "step" } }
                                   attr { key: "step_size" value { i: 3 } }
                                   attr { key: "gamma" value { f: 0.5 } })pb",
                              10),
                     torch, 1e-12);
}

TEST(LrSchedule, WarmupMatchesTorchLinearLR) {
  // lrs(lambda o: LinearLR(o, start_factor=1/4, end_factor=1.0, total_iters=3), 7, 0.2)
  const std::vector<double> torch = {0.050000000000000003, 0.10000000000000001, 0.15000000000000002,
                                     0.20000000000000001,  0.20000000000000001, 0.20000000000000001,
                                     0.20000000000000001};
  ExpectScheduleNear(Schedule(R"pb(attr { key: "base_lr" value { f: 0.2 } }
                                   attr { key: "warmup_steps" value { i: 4 } })pb",
                              7),
                     torch, 1e-12);
}

TEST(LrSchedule, WarmupThenCosineMatchesTorchSequentialLR) {
  // W, D = 3, 8
  // lrs(lambda o: SequentialLR(o, [LinearLR(o, start_factor=1/W, end_factor=1.0, total_iters=W-1),
  //                                CosineAnnealingLR(o, T_max=D)], milestones=[W]), 12, 0.01)
  const std::vector<double> torch = {
      0.0033333333333333331, 0.0066666666666666662, 0.0099999999999999985, 0.01,
      0.0096193976625564333, 0.0085355339059327365, 0.0069134171618254487, 0.0049999999999999992,
      0.0030865828381745511, 0.0014644660940672624, 0.00038060233744356627, 0};
  ExpectScheduleNear(Schedule(R"pb(attr { key: "base_lr" value { f: 0.01 } }
                                   attr { key: "kind" value { s: "cosine" } }
                                   attr { key: "warmup_steps" value { i: 3 } }
                                   attr { key: "decay_steps" value { i: 11 } })pb",
                              12),
                     torch, 1e-12);
}

TEST(LrSchedule, WarmupThenStepDecayMatchesTorchSequentialLR) {
  // lrs(lambda o: SequentialLR(o, [LinearLR(o, start_factor=1/2, end_factor=1.0, total_iters=1),
  //                                StepLR(o, step_size=2, gamma=0.1)], milestones=[2]), 8, 0.5)
  const std::vector<double> torch = {0.25, 0.5, 0.5, 0.5, 0.050000000000000003, 0.050000000000000003,
                                     0.005000000000000001, 0.005000000000000001};
  ExpectScheduleNear(Schedule(R"pb(attr { key: "base_lr" value { f: 0.5 } }
                                   attr { key: "kind" value { s: "step" } }
                                   attr { key: "warmup_steps" value { i: 2 } }
                                   attr { key: "step_size" value { i: 2 } }
                                   attr { key: "gamma" value { f: 0.1 } })pb",
                              8),
                     torch, 1e-12);
}

TEST(LrSchedule, DefaultsToAConstantF32Rate) {
  std::vector<double> lr = Schedule(R"pb(attr { key: "base_lr" value { f: 0.05 } })pb", 3, 0, F32);
  ASSERT_EQ(lr.size(), 3u);
  for (double v : lr) EXPECT_EQ(v, static_cast<double>(0.05f));
}

// ---------------------------------------------------------------------------
// Gradient clipping against torch.nn.utils.clip_grad_norm_ (float64):
//
//   a = [[0.3, -1.2, 0.7], [2.0, 0.1, -0.4]];  b = [1.5, -0.25];  c = [[[0.05]], [[-3.0]]]
//   (as the .grad of three parameters)
//   total = clip_grad_norm_([a, b, c], max_norm);  coef = a.grad[1, 0] / 2.0
//   total_norm 4.1838977042944059; coef 0.23901152266750328 (max_norm 1),
//   0.59752880666875818 (2.5), 1 (100)
TEST(ClipCoefficient, MatchesTorchClipGradNorm) {
  for (DataType dtype : {F64, F32}) {
    std::map<std::string, Tensor> env;
    env["a"] = MakeTensor(dtype, {2, 3}, {0.3, -1.2, 0.7, 2.0, 0.1, -0.4});
    env["b"] = MakeTensor(dtype, {2}, {1.5, -0.25});
    env["c"] = MakeTensor(dtype, {2, 1, 1}, {0.05, -3.0});
    // Two partial sums, as two pipeline stages would compute them.
    ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "sum_squares" input: ["a", "b"] output: "s0")pb"), &env).ok());
    ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "sum_squares" input: "c" output: "s1")pb"), &env).ok());
    const double rel = dtype == F64 ? 1e-12 : 1e-6;
    const double sum = TensorValues(env["s0"])[0] + TensorValues(env["s1"])[0];
    EXPECT_LE(std::abs(std::sqrt(sum) - 4.1838977042944059), rel * 4.2);
    const std::vector<std::pair<double, double>> torch_coef = {
        {1.0, 0.23901152266750328}, {2.5, 0.59752880666875818}, {100.0, 1.0}};
    for (const auto& [max_norm, coef] : torch_coef) {
      Op op = ParseOp(R"pb(type: "clip_coefficient" input: ["s0", "s1"] output: "coef")pb");
      (*op.mutable_attr())["max_norm"] = FloatAttr(max_norm);
      ASSERT_TRUE(RunOp(op, &env).ok());
      ASSERT_EQ(env["coef"].dtype(), dtype);
      ExpectRelNear(env["coef"], {coef}, rel, absl::StrCat("coef at max_norm ", max_norm));
    }
  }
}

TEST(SumSquares, ReducesLargeInputsOverManyBlocks) {
  // x_k = (k mod 7) - 3 over 100003 elements (several reduction blocks);
  // the exact sum is an integer count, summed here in int64.
  const int64_t n = 100003;
  std::vector<double> values(n);
  int64_t expected = 0;
  for (int64_t k = 0; k < n; ++k) {
    int64_t x = k % 7 - 3;
    values[k] = static_cast<double>(x);
    expected += x * x;
  }
  for (DataType dtype : {F64, F32}) {
    std::map<std::string, Tensor> env;
    env["x"] = MakeTensor(dtype, {n}, values);
    env["y"] = MakeTensor(dtype, {1, 3}, {0.5, 0.25, 1});
    ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "sum_squares" input: ["x", "y"] output: "s")pb"), &env).ok());
    ExpectRelNear(env["s"], {static_cast<double>(expected) + 1.3125}, 0, "sum of squares");
  }
}

TEST(SumSquares, EmptyInputsAddNothing) {
  std::map<std::string, Tensor> env;
  env["e"] = Tensor::Zeros(F32, {0, 3});
  env["s"] = Scalar(F32, -1.5);
  ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "sum_squares" input: ["e", "s"] output: "y")pb"), &env).ok());
  ExpectRelNear(env["y"], {2.25}, 0, "sum of squares");
  env["lr"] = Scalar(F32, 0.1);
  ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "sgd_update" input: ["e", "e", "lr"] output: "e")pb"), &env).ok());
  EXPECT_EQ(env["e"].num_elements(), 0);
}

TEST(SumSquaresGrad, IsTwiceXTimesDy) {
  std::map<std::string, Tensor> env;
  env["x"] = MakeTensor(F64, {3}, {1, -2, 0.5});
  env["dy"] = Scalar(F64, 0.25);
  ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "sum_squares_grad" input: ["x", "dy"] output: "dx")pb"), &env).ok());
  ExpectRelNear(env["dx"], {0.5, -1, 0.25}, 0, "dx");
}

// ---------------------------------------------------------------------------
// Shape functions reject what the kernels must never see.
absl::Status Infer(const std::string& text, const std::vector<TensorType>& inputs) {
  Op op = ParseOp(text);
  const OpSchema* schema = OpRegistry::Global().Find(op.type());
  if (schema == nullptr) return absl::NotFoundError(op.type());
  if (absl::Status s = CanonicalizeOp(*schema, &op); !s.ok()) return s;
  return InferOutputTypes(*schema, op, inputs).status();
}

TEST(OptimizerShapes, RejectBadTypesAndAttrs) {
  const TensorType p{F32, {4, 3}}, lr{F32, {}}, step{I64, {}};
  const char* sgd = R"pb(type: "sgd_update" input: ["p", "g", "lr"] output: "p")pb";
  EXPECT_TRUE(Infer(sgd, {p, p, lr}).ok());
  EXPECT_THAT(Infer(sgd, {p, TensorType{F32, {3, 4}}, lr}).message(), HasSubstr("'grad'"));
  EXPECT_THAT(Infer(sgd, {p, TensorType{F64, {4, 3}}, lr}).message(), HasSubstr("'grad'"));
  EXPECT_THAT(Infer(sgd, {p, p, TensorType{F32, {1}}}).message(), HasSubstr("'lr'"));
  EXPECT_THAT(Infer(sgd, {p, p, TensorType{F64, {}}}).message(), HasSubstr("'lr'"));
  EXPECT_THAT(Infer(sgd, {TensorType{F32, {-1, 3}}, TensorType{F32, {-1, 3}}, lr}).message(), HasSubstr("static"));
  EXPECT_THAT(Infer(sgd, {TensorType{I64, {4}}, TensorType{I64, {4}}, TensorType{I64, {}}}).message(),
              HasSubstr("F32 or F64"));
  EXPECT_THAT(Infer(R"pb(type: "sgd_update" input: ["p", "g", "lr"] output: "p"
                         attr { key: "weight_decay" value { f: -0.1 } })pb",
                    {p, p, lr})
                  .message(),
              HasSubstr("weight_decay"));

  EXPECT_THAT(Infer(R"pb(type: "momentum_update" input: ["p", "g", "v", "lr"] output: ["p", "v"]
                         attr { key: "momentum" value { f: 0 } } attr { key: "nesterov" value { b: true } })pb",
                    {p, p, p, lr})
                  .message(),
              HasSubstr("nesterov"));
  EXPECT_THAT(Infer(R"pb(type: "momentum_update" input: ["p", "g", "v", "lr"] output: ["p", "v"])pb",
                    {p, p, TensorType{F32, {4}}, lr})
                  .message(),
              HasSubstr("'velocity'"));

  const char* adam = R"pb(type: "adam_update" input: ["p", "g", "m", "v", "lr", "t"] output: ["p", "m", "v"])pb";
  EXPECT_TRUE(Infer(adam, {p, p, p, p, lr, step}).ok());
  EXPECT_THAT(Infer(adam, {p, p, p, p, lr, TensorType{F32, {}}}).message(), HasSubstr("'step'"));
  EXPECT_THAT(Infer(R"pb(type: "adam_update" input: ["p", "g", "m", "v", "lr", "t"] output: ["p", "m", "v"]
                         attr { key: "beta2" value { f: 1.0 } })pb",
                    {p, p, p, p, lr, step})
                  .message(),
              HasSubstr("beta2"));

  EXPECT_THAT(Infer(R"pb(type: "increment" input: "n" output: "n")pb", {TensorType{I64, {1}}}).message(),
              HasSubstr("'counter'"));
}

// The updates' two trailing optional inputs (attr grad_scale's scalar, then
// loss scaling's found_inf): the arity check takes 3 to 5 inputs for sgd,
// the shape function says which are which from the attr, and an error
// names the trailing inputs by both candidates where not all are given.
TEST(OptimizerShapes, TwoTrailingOptionalInputs) {
  const TensorType p{F32, {4, 3}}, lr{F32, {}}, flag{F32, {}};
  const char* sgd = R"pb(type: "sgd_update" input: ["p", "g", "lr", "x", "y"] output: "p")pb";
  const char* scaled = R"pb(type: "sgd_update" input: ["p", "g", "lr", "x", "y"] output: "p"
                            attr { key: "grad_scale" value { b: true } })pb";
  EXPECT_TRUE(Infer(scaled, {p, p, lr, flag, flag}).ok());  // scale, found_inf
  EXPECT_THAT(Infer(sgd, {p, p, lr, flag, flag}).message(),
              HasSubstr("expects 3 inputs, plus an optional found_inf, got 5 (a grad_scale input needs attr"));
  EXPECT_THAT(Infer(R"pb(type: "sgd_update" input: ["p", "g", "lr", "x", "y", "z"] output: "p")pb",
                    {p, p, lr, flag, flag, flag})
                  .message(),
              HasSubstr("expects 3 to 5 inputs (param, grad, lr, grad_scale?, found_inf?), got 6"));
  // A found_inf of the wrong type, alone after lr: named by both candidates.
  EXPECT_THAT(
      Infer(R"pb(type: "sgd_update" input: ["p", "g", "lr", "x"] output: "p")pb", {p, p, lr, TensorType{F64, {}}})
          .message(),
      HasSubstr("input 'grad_scale or found_inf' is var 'x'"));
  // A one-optional op keeps its words.
  EXPECT_THAT(
      Infer(R"pb(type: "increment" input: ["n", "f", "g"] output: "n")pb", {TensorType{I64, {}}, flag, flag}).message(),
      HasSubstr("expects 1 or 2 inputs (counter, found_inf?), got 3"));
}

TEST(OptimizerShapes, RejectBadScheduleAndClipAttrs) {
  const TensorType step{I64, {}};
  EXPECT_THAT(Infer(R"pb(type: "lr_schedule" input: "t" output: "lr")pb", {step}).message(), HasSubstr("base_lr"));
  auto schedule = [&](const std::string& attrs) {
    return Infer(absl::StrCat(R"pb(type: "lr_schedule" input: "t" output: "lr"
                                   attr { key: "base_lr" value { f: 0.1 } } )pb",
                              attrs),
                 {step});
  };
  EXPECT_TRUE(schedule("").ok());
  EXPECT_THAT(schedule(R"pb(attr { key: "kind" value { s: "linear" } })pb").message(), HasSubstr("'kind'"));
  EXPECT_THAT(schedule(R"pb(attr { key: "dtype" value { s: "I64" } })pb").message(), HasSubstr("'dtype'"));
  EXPECT_THAT(schedule(R"pb(attr { key: "warmup_steps" value { i: -1 } })pb").message(), HasSubstr("warmup_steps"));
  EXPECT_THAT(schedule(R"pb(attr { key: "kind" value { s: "step" } } attr { key: "step_size" value { i: 0 } })pb")
                  .message(),
              HasSubstr("step_size"));
  EXPECT_THAT(schedule(R"pb(attr { key: "kind" value { s: "cosine" } } attr { key: "decay_steps" value { i: 5 } }
                            attr { key: "warmup_steps" value { i: 5 } })pb")
                  .message(),
              HasSubstr("decay_steps"));
  EXPECT_THAT(schedule(R"pb(attr { key: "kind" value { s: "cosine" } } attr { key: "alpha" value { f: 1.5 } })pb")
                  .message(),
              HasSubstr("alpha"));
  EXPECT_THAT(Infer(R"pb(type: "lr_schedule" input: "t" output: "lr" attr { key: "base_lr" value { f: 0.1 } })pb",
                    {TensorType{F32, {}}})
                  .message(),
              HasSubstr("'step'"));

  EXPECT_THAT(Infer(R"pb(type: "clip_coefficient" input: "s" output: "c")pb", {TensorType{F32, {}}}).message(),
              HasSubstr("max_norm"));
  EXPECT_THAT(Infer(R"pb(type: "clip_coefficient" input: "s" output: "c" attr { key: "max_norm" value { f: 0 } })pb",
                    {TensorType{F32, {}}})
                  .message(),
              HasSubstr("max_norm"));
  EXPECT_THAT(Infer(R"pb(type: "clip_coefficient" input: ["s", "t"] output: "c"
                         attr { key: "max_norm" value { f: 1 } })pb",
                    {TensorType{F32, {}}, TensorType{F64, {}}})
                  .message(),
              HasSubstr("#1"));
  EXPECT_THAT(Infer(R"pb(type: "sum_squares" input: ["a", "b"] output: "s")pb",
                    {TensorType{F32, {-1, 3}}, TensorType{I64, {2}}})
                  .message(),
              HasSubstr("#1"));
  EXPECT_TRUE(Infer(R"pb(type: "sum_squares" input: ["a"] output: "s")pb", {TensorType{F32, {-1, 3}}}).ok());
}

}  // namespace
}  // namespace strata
