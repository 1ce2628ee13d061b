// kernel_math.h compiled for the host against the CPU kernels it mirrors
// (kernels/cpu/optimizers.cc): the schedule and the update formulas must
// agree bit for bit when both run on the CPU, so what the GPU test sees
// beyond that is the device's own rounding (pow, cos). Needs no CUDA.

#include "kernels/cuda/kernel_math.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace cuda {
namespace {

std::vector<double> Uniform(int64_t n, uint32_t seed, double low, double high) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(low, high);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

struct ScheduleCase {
  std::string attrs;  // of the op
  LrSchedule schedule;
  int64_t total_steps;
};

TEST(KernelMathTest, LearningRateEqualsTheCpuLrScheduleBitForBit) {
  auto make = [](LrScheduleKind kind, double base, int64_t warmup, int64_t decay, double alpha, int64_t step_size,
                 double gamma) {
    LrSchedule s;
    s.kind = kind;
    s.base_lr = base;
    s.warmup_steps = warmup;
    s.decay_steps = decay;
    s.alpha = alpha;
    s.step_size = step_size;
    s.gamma = gamma;
    return s;
  };
  const std::vector<ScheduleCase> cases = {
      {R"pb(attr { key: "kind" value { s: "constant" } } attr { key: "warmup_steps" value { i: 5 } })pb",
       make(LrScheduleKind::kConstant, 0.003, 5, 0, 0, 1, 0.1), 0},
      {R"pb(attr { key: "kind" value { s: "cosine" } } attr { key: "warmup_steps" value { i: 5 } }
            attr { key: "decay_steps" value { i: 100 } } attr { key: "alpha" value { f: 0.1 } })pb",
       make(LrScheduleKind::kCosine, 0.003, 5, 100, 0.1, 1, 0.1), 0},
      {R"pb(attr { key: "kind" value { s: "cosine" } })pb", make(LrScheduleKind::kCosine, 0.003, 0, 0, 0, 1, 0.1),
       120},
      {R"pb(attr { key: "kind" value { s: "cosine" } })pb", make(LrScheduleKind::kCosine, 0.003, 0, 0, 0, 1, 0.1), 0},
      {R"pb(attr { key: "kind" value { s: "step" } } attr { key: "warmup_steps" value { i: 3 } }
            attr { key: "step_size" value { i: 7 } } attr { key: "gamma" value { f: 0.5 } })pb",
       make(LrScheduleKind::kStep, 0.003, 3, 0, 0, 7, 0.5), 0},
  };
  for (const ScheduleCase& c : cases) {
    for (const char* dtype : {"F32", "F64"}) {
      const Op op = ParseOp(absl::StrCat(R"pb(type: "lr_schedule" input: "step" output: "lr"
                                              attr { key: "base_lr" value { f: 0.003 } }
                                              attr { key: "dtype" value { s: ")pb",
                                         dtype, "\" } } ", c.attrs));
      for (int64_t step : {0, 1, 2, 4, 5, 9, 10, 57, 99, 100, 119, 150}) {
        SCOPED_TRACE(absl::StrCat(c.attrs, " ", dtype, " step ", step));
        RunContext run;
        run.total_steps = c.total_steps;
        std::map<std::string, Tensor> env = {{"step", MakeTensor(I64, {}, {static_cast<double>(step)})}};
        ASSERT_TRUE(RunOp(op, &env, run).ok());
        const double want = env.at("lr").ValueAt(0);
        const double got = LearningRate(c.schedule, step, c.total_steps);
        if (std::string(dtype) == "F32") {
          EXPECT_EQ(static_cast<float>(got), static_cast<float>(want));
        } else {
          EXPECT_EQ(got, want);
        }
      }
    }
  }
}

template <typename T>
void ExpectBitEqual(const Tensor& cpu, const std::vector<T>& mine, const char* what) {
  ASSERT_EQ(cpu.num_elements(), static_cast<int64_t>(mine.size())) << what;
  for (size_t i = 0; i < mine.size(); ++i) {
    ASSERT_EQ(cpu.data<T>()[i], mine[i]) << what << " element " << i;
  }
}

template <typename T>
void CheckAdam(const std::string& attrs, int64_t step) {
  SCOPED_TRACE(absl::StrCat(DataTypeName(DataTypeOf<T>::value), " ", attrs, " step ", step));
  const int64_t n = 257;
  const DataType dt = DataTypeOf<T>::value;
  std::vector<double> p = Uniform(n, 1, -1, 1), g = Uniform(n, 2, -1, 1), m = Uniform(n, 3, -0.1, 0.1),
                      v = Uniform(n, 4, 0, 0.01);
  std::map<std::string, Tensor> env = {{"p", MakeTensor(dt, {n}, p)},   {"g", MakeTensor(dt, {n}, g)},
                                       {"m", MakeTensor(dt, {n}, m)},   {"v", MakeTensor(dt, {n}, v)},
                                       {"lr", MakeTensor(dt, {}, {1e-3})}, {"step", MakeTensor(I64, {}, {double(step)})}};
  const Op op = ParseOp(absl::StrCat(
      R"pb(type: "adam_update" input: [ "p", "g", "m", "v", "lr", "step" ] output: [ "p", "m", "v" ] )pb", attrs));
  // Mine, from the same rounded inputs, before the CPU updates them in place.
  std::vector<T> mp(n), mm(n), mv(n), mg(n);
  for (int64_t i = 0; i < n; ++i) {
    mp[i] = env.at("p").data<T>()[i];
    mm[i] = env.at("m").data<T>()[i];
    mv[i] = env.at("v").data<T>()[i];
    mg[i] = env.at("g").data<T>()[i];
  }
  AdamAttrs a;
  const Op canonical = ParseOp(absl::StrCat(R"pb(type: "adam_update" )pb", attrs));
  a.beta1 = 0.9;
  a.beta2 = 0.999;
  a.epsilon = 1e-8;
  a.weight_decay = canonical.attr().count("weight_decay") ? canonical.attr().at("weight_decay").f() : 0.0;
  a.decoupled = canonical.attr().count("decoupled") ? canonical.attr().at("decoupled").b() : false;
  const AdamScalars<T> s = MakeAdamScalars<T>(a, env.at("lr").data<T>()[0], step);
  for (int64_t i = 0; i < n; ++i) AdamElement(s, mg[i], &mp[i], &mm[i], &mv[i]);
  ASSERT_TRUE(RunOp(op, &env).ok());
  ExpectBitEqual(env.at("p"), mp, "param");
  ExpectBitEqual(env.at("m"), mm, "m");
  ExpectBitEqual(env.at("v"), mv, "v");
}

TEST(KernelMathTest, AdamElementEqualsTheCpuAdamUpdateBitForBit) {
  for (const char* attrs :
       {"", R"pb(attr { key: "weight_decay" value { f: 0.01 } })pb",
        R"pb(attr { key: "weight_decay" value { f: 0.01 } } attr { key: "decoupled" value { b: true } })pb"}) {
    for (int64_t step : {1, 2, 7, 1000}) {
      CheckAdam<float>(attrs, step);
      CheckAdam<double>(attrs, step);
    }
  }
}

template <typename T>
void CheckSgdAndMomentum(double weight_decay, bool nesterov) {
  SCOPED_TRACE(absl::StrCat(DataTypeName(DataTypeOf<T>::value), " wd ", weight_decay, " nesterov ", nesterov));
  const int64_t n = 129;
  const DataType dt = DataTypeOf<T>::value;
  std::map<std::string, Tensor> env = {{"p", MakeTensor(dt, {n}, Uniform(n, 5, -1, 1))},
                                       {"q", MakeTensor(dt, {n}, Uniform(n, 5, -1, 1))},
                                       {"g", MakeTensor(dt, {n}, Uniform(n, 6, -1, 1))},
                                       {"vel", MakeTensor(dt, {n}, Uniform(n, 7, -1, 1))},
                                       {"lr", MakeTensor(dt, {}, {0.05})}};
  std::vector<T> sp(n), mp(n), mvel(n);
  const T lr = env.at("lr").data<T>()[0];
  for (int64_t i = 0; i < n; ++i) {
    sp[i] = env.at("p").data<T>()[i];
    mp[i] = env.at("q").data<T>()[i];
    mvel[i] = env.at("vel").data<T>()[i];
    SgdElement(lr, static_cast<T>(weight_decay), env.at("g").data<T>()[i], &sp[i]);
    MomentumElement(lr, static_cast<T>(0.9), static_cast<T>(weight_decay), nesterov, env.at("g").data<T>()[i], &mp[i],
                    &mvel[i]);
  }
  const std::string wd = absl::StrCat(R"pb(attr { key: "weight_decay" value { f: )pb", weight_decay, " } }");
  ASSERT_TRUE(RunOp(ParseOp(absl::StrCat(R"pb(type: "sgd_update" input: [ "p", "g", "lr" ] output: "p" )pb", wd)),
                    &env)
                  .ok());
  ASSERT_TRUE(RunOp(ParseOp(absl::StrCat(
                        R"pb(type: "momentum_update" input: [ "q", "g", "vel", "lr" ] output: [ "q", "vel" ] )pb", wd,
                        R"pb( attr { key: "nesterov" value { b: )pb", nesterov ? "true" : "false", " } }")),
                    &env)
                  .ok());
  ExpectBitEqual(env.at("p"), sp, "sgd param");
  ExpectBitEqual(env.at("q"), mp, "momentum param");
  ExpectBitEqual(env.at("vel"), mvel, "velocity");
}

TEST(KernelMathTest, SgdAndMomentumElementsEqualTheCpuKernelsBitForBit) {
  for (double wd : {0.0, 0.1}) {
    for (bool nesterov : {false, true}) {
      CheckSgdAndMomentum<float>(wd, nesterov);
      CheckSgdAndMomentum<double>(wd, nesterov);
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace strata
