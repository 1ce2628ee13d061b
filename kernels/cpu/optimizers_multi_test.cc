// The multi-tensor updates (sgd_update_multi, momentum_update_multi,
// adam_update_multi, the fuse-optimizer pass's ops) against the single ops
// they replace: the same inputs through n single ops and through one multi
// op must leave every param and state bit for bit the same.

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/testing/op_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

struct Optimizer {
  std::string type;                 // the single op
  std::vector<std::string> states;  // its state inputs, after param and grad
  bool has_step;
  std::string attrs;  // attr { ... } text
};

std::vector<double> Values(int64_t n, uint32_t seed, bool positive) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(positive ? 0.0 : -1.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = positive ? u(rng) * 1e-2 : u(rng);
  return v;
}

const std::vector<Shape>& Shapes() {
  static const std::vector<Shape>* shapes = new std::vector<Shape>{{37, 29}, {10}, {3, 4, 5}, {1}};
  return *shapes;
}

// Every var the ops read, fresh buffers each call (the ops update in place).
std::map<std::string, Tensor> Env(const Optimizer& o, DataType dtype, int64_t step, double found_inf) {
  std::map<std::string, Tensor> env;
  for (size_t i = 0; i < Shapes().size(); ++i) {
    const Shape& shape = Shapes()[i];
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    env[absl::StrCat("p", i)] = MakeTensor(dtype, shape, Values(n, 10 * i + 1, false));
    env[absl::StrCat("g", i)] = MakeTensor(dtype, shape, Values(n, 10 * i + 2, false));
    for (size_t k = 0; k < o.states.size(); ++k) {
      // v (adam's second moment) is nonnegative.
      env[absl::StrCat(o.states[k], i)] = MakeTensor(dtype, shape, Values(n, 10 * i + 3 + k, o.states[k] == "v"));
    }
  }
  env["lr"] = MakeTensor(dtype, {}, {0.0123});
  env["step"] = MakeTensor(I64, {}, {static_cast<double>(step)});
  if (found_inf >= 0) env["found_inf"] = MakeTensor(F32, {}, {found_inf});
  return env;
}

std::string Quoted(const std::vector<std::string>& names) {
  return absl::StrJoin(names, ", ", [](std::string* out, const std::string& s) { absl::StrAppend(out, "\"", s, "\""); });
}

std::vector<std::string> Scalars(const Optimizer& o, bool found_inf) {
  std::vector<std::string> s = {"lr"};
  if (o.has_step) s.push_back("step");
  if (found_inf) s.push_back("found_inf");
  return s;
}

Op SingleOp(const Optimizer& o, size_t i, bool found_inf) {
  std::vector<std::string> in = {absl::StrCat("p", i), absl::StrCat("g", i)}, out = {absl::StrCat("p", i)};
  for (const std::string& s : o.states) {
    in.push_back(absl::StrCat(s, i));
    out.push_back(absl::StrCat(s, i));
  }
  for (const std::string& s : Scalars(o, found_inf)) in.push_back(s);
  return ParseOp(absl::StrCat("type: \"", o.type, "\" input: [", Quoted(in), "] output: [", Quoted(out), "] ", o.attrs));
}

Op MultiOp(const Optimizer& o, bool found_inf) {
  const size_t n = Shapes().size();
  std::vector<std::string> roles = {"p", "g"};
  for (const std::string& s : o.states) roles.push_back(s);
  std::vector<std::string> in, out;
  for (const std::string& r : roles) {
    for (size_t i = 0; i < n; ++i) in.push_back(absl::StrCat(r, i));
  }
  for (const std::string& s : Scalars(o, found_inf)) in.push_back(s);
  for (size_t k = 0; k < roles.size(); ++k) {
    if (k == 1) continue;  // grads are read only
    for (size_t i = 0; i < n; ++i) out.push_back(absl::StrCat(roles[k], i));
  }
  return ParseOp(absl::StrCat("type: \"", o.type, "_multi\" input: [", Quoted(in), "] output: [", Quoted(out),
                              "] attr { key: \"n\" value { i: ", n, " } } ", o.attrs));
}

bool BitEqual(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.num_elements() == b.num_elements() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.num_elements() * DataTypeSize(a.dtype())) == 0;
}

const std::vector<Optimizer>& Optimizers() {
  static const std::vector<Optimizer>* all = new std::vector<Optimizer>{
      {"sgd_update", {}, false, ""},
      {"sgd_update", {}, false, R"pb(attr { key: "weight_decay" value { f: 0.1 } })pb"},
      {"momentum_update", {"vel"}, false, ""},
      {"momentum_update", {"vel"}, false,
       R"pb(attr { key: "nesterov" value { b: true } } attr { key: "weight_decay" value { f: 0.01 } })pb"},
      {"adam_update", {"m", "v"}, true, ""},
      {"adam_update", {"m", "v"}, true, R"pb(attr { key: "weight_decay" value { f: 0.01 } })pb"},  // Adam, L2
      {"adam_update", {"m", "v"}, true,
       R"pb(attr { key: "weight_decay" value { f: 0.01 } } attr { key: "decoupled" value { b: true } }
            attr { key: "beta1" value { f: 0.8 } })pb"},  // AdamW
  };
  return *all;
}

// found_inf: -1 none, else its value (nonzero: the update is skipped).
void ExpectMultiEqualsSingles(const Optimizer& o, DataType dtype, int64_t step, double found_inf) {
  SCOPED_TRACE(absl::StrCat(o.type, " ", o.attrs, " ", DataTypeName(dtype), " step ", step, " found_inf ", found_inf));
  const bool has_found_inf = found_inf >= 0;
  std::map<std::string, Tensor> single = Env(o, dtype, step, found_inf), multi = Env(o, dtype, step, found_inf);
  const std::map<std::string, Tensor> before = Env(o, dtype, step, found_inf);
  for (size_t i = 0; i < Shapes().size(); ++i) {
    absl::Status s = RunOp(SingleOp(o, i, has_found_inf), &single);
    ASSERT_TRUE(s.ok()) << s;
  }
  absl::Status s = RunOp(MultiOp(o, has_found_inf), &multi);
  ASSERT_TRUE(s.ok()) << s;
  for (const auto& [name, t] : single) {
    EXPECT_TRUE(BitEqual(multi.at(name), t)) << name;
    if (name[0] != 'g' && name != "lr" && name != "step" && name != "found_inf") {
      // The update did (or, skipped, did not) change the state.
      EXPECT_EQ(BitEqual(t, before.at(name)), found_inf > 0) << name;
    }
  }
}

TEST(MultiUpdate, EqualsTheSingleUpdatesBitForBit) {
  for (const Optimizer& o : Optimizers()) {
    for (DataType dtype : {F32, F64}) {
      for (int64_t step : {1, 7}) ExpectMultiEqualsSingles(o, dtype, step, -1);
    }
  }
}

TEST(MultiUpdate, SkipsWithLossScalingsFoundInfAsTheSingleUpdatesDo) {
  for (const Optimizer& o : Optimizers()) {
    for (double found_inf : {0.0, 1.0}) ExpectMultiEqualsSingles(o, F32, 3, found_inf);
  }
}

TEST(MultiUpdate, ShapeFunctionChecksEveryMemberAsItsSingleOp) {
  // A grad of the wrong shape for its param (tensor #1).
  auto r = InferTypes(R"pb(type: "sgd_update_multi" input: [ "p0", "p1", "g0", "g1", "lr" ]
                           output: [ "p0", "p1" ] attr { key: "n" value { i: 2 } })pb",
                      {TensorType{F32, {3}}, TensorType{F32, {4}}, TensorType{F32, {3}}, TensorType{F32, {5}},
                       TensorType{F32, {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("tensor #1 of 2"));
  EXPECT_THAT(r.status().message(), HasSubstr("'grad'"));
  // Inputs that do not fit n.
  r = InferTypes(R"pb(type: "sgd_update_multi" input: [ "p0", "p1", "g0", "lr" ]
                      output: [ "p0", "p1" ] attr { key: "n" value { i: 2 } })pb",
                 {TensorType{F32, {3}}, TensorType{F32, {4}}, TensorType{F32, {3}}, TensorType{F32, {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("inputs"));
  // Good: outputs typed like the params and states.
  r = InferTypes(R"pb(type: "momentum_update_multi" input: [ "p0", "p1", "g0", "g1", "v0", "v1", "lr" ]
                      output: [ "p0", "p1", "v0", "v1" ] attr { key: "n" value { i: 2 } })pb",
                 {TensorType{F64, {3}}, TensorType{F64, {4, 2}}, TensorType{F64, {3}}, TensorType{F64, {4, 2}},
                  TensorType{F64, {3}}, TensorType{F64, {4, 2}}, TensorType{F64, {}}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[1], (TensorType{F64, {4, 2}}));
  EXPECT_EQ((*r)[2], (TensorType{F64, {3}}));
}

TEST(MultiUpdate, AdamRejectsAStepBelowOneLikeTheSingleOp) {
  const Optimizer& adam = Optimizers()[4];
  std::map<std::string, Tensor> env = Env(adam, F32, 0, -1);
  absl::Status s = RunOp(MultiOp(adam, false), &env);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("must be >= 1"));
}

// attr grad_scale (global-norm clipping's coefficient folded into the
// update): each single op and the multi op read grad * scale, rounded to the
// param's dtype, and leave every param and state bit for bit as `mul`
// (the clipped copy the optimizer pass made before) then the plain op do;
// with found_inf 1 nothing changes. The schema wants the scale's scalar
// of the param's dtype.
TEST(MultiUpdate, GradScaleIsAMulOfTheGradientFirst) {
  for (const Optimizer& o : Optimizers()) {
    for (DataType dtype : {F32, F64}) {
      for (double found_inf : {-1.0, 0.0, 1.0}) {
        SCOPED_TRACE(absl::StrCat(o.type, " ", o.attrs, " ", DataTypeName(dtype), " found_inf ", found_inf));
        const bool has_found_inf = found_inf >= 0;
        std::map<std::string, Tensor> ref = Env(o, dtype, 3, found_inf), single = Env(o, dtype, 3, found_inf),
                                      multi = Env(o, dtype, 3, found_inf);
        for (auto* env : {&ref, &single, &multi}) (*env)["scale"] = MakeTensor(dtype, {}, {0.3719});
        const std::string scaled = R"pb( attr { key: "grad_scale" value { b: true } })pb";
        for (size_t i = 0; i < Shapes().size(); ++i) {
          // The reference: the clipped copy, then the plain update reading it.
          const std::string g = absl::StrCat("g", i);
          ASSERT_TRUE(RunOp(ParseOp(absl::StrCat(R"pb(type: "mul" input: [")pb", g, R"pb(", "scale"] output: ")pb", g,
                                                 R"pb(@clipped")pb")),
                            &ref)
                          .ok());
          Op plain = SingleOp(o, i, has_found_inf);
          plain.set_input(1, g + "@clipped");
          absl::Status s = RunOp(plain, &ref);
          ASSERT_TRUE(s.ok()) << s;
          // The single op with the scale after its scalars, before found_inf.
          Op op = SingleOp(o, i, false);
          op.add_input("scale");
          if (has_found_inf) op.add_input("found_inf");
          op.MergeFrom(ParseOp(scaled));
          s = RunOp(op, &single);
          ASSERT_TRUE(s.ok()) << s;
        }
        Op op = MultiOp(o, false);
        op.add_input("scale");
        if (has_found_inf) op.add_input("found_inf");
        op.MergeFrom(ParseOp(scaled));
        absl::Status s = RunOp(op, &multi);
        ASSERT_TRUE(s.ok()) << s;
        int changed = 0;
        const std::map<std::string, Tensor> before = Env(o, dtype, 3, found_inf);
        for (const auto& [name, t] : single) {
          EXPECT_TRUE(BitEqual(t, ref.at(name))) << "single " << name;
          EXPECT_TRUE(BitEqual(multi.at(name), ref.at(name))) << "multi " << name;
          if (before.count(name) > 0) changed += !BitEqual(t, before.at(name));
        }
        EXPECT_EQ(changed > 0, found_inf <= 0);
      }
    }
  }
  // The scale's dtype, and the scale itself, are checked.
  auto r = InferTypes(R"pb(type: "sgd_update" input: [ "p", "g", "lr", "scale" ] output: "p"
                           attr { key: "grad_scale" value { b: true } })pb",
                      {TensorType{F32, {3}}, TensorType{F32, {3}}, TensorType{F32, {}}, TensorType{F64, {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("input 'grad_scale' must be a F32 scalar"));
  r = InferTypes(R"pb(type: "adam_update_multi" input: [ "p", "g", "m", "v", "lr", "step" ]
                      output: [ "p", "m", "v" ] attr { key: "n" value { i: 1 } }
                      attr { key: "grad_scale" value { b: true } })pb",
                 {TensorType{F32, {3}}, TensorType{F32, {3}}, TensorType{F32, {3}}, TensorType{F32, {3}},
                  TensorType{F32, {}}, TensorType{I64, {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("inputs"));
}

// attr copy_dtype (mixed precision's 16-bit weight copy written by the
// update, passes/hoist_param_casts.h): each single op and the multi op leave
// param and states as the op without the attr does, and the copy holds what
// a `cast` of the updated param makes, bit for bit; a skipped update
// (found_inf 1) copies the unchanged param. Values include halfway cases of
// both 16-bit types and an F16 overflow.
TEST(MultiUpdate, CopyDtypeWritesTheCastOfTheUpdatedParam) {
  for (const Optimizer& o : Optimizers()) {
    for (DataType dtype : {F32, F64}) {
      for (const char* copy_dtype : {"BF16", "F16"}) {
        for (double found_inf : {-1.0, 0.0, 1.0}) {
          SCOPED_TRACE(
              absl::StrCat(o.type, " ", o.attrs, " ", DataTypeName(dtype), " ", copy_dtype, " found_inf ", found_inf));
          const bool has_found_inf = found_inf >= 0;
          std::map<std::string, Tensor> ref = Env(o, dtype, 2, found_inf), single = Env(o, dtype, 2, found_inf),
                                        multi = Env(o, dtype, 2, found_inf);
          // Param 3 (shape [1]) at 1 + 2^-8 + 2^-30 (just past a BF16 tie) and param 1's first
          // elements at 70000 (past F16's largest finite) and 1 + 2^-11 (an F16 tie, once updated
          // by lr 0.0123 no longer exactly: the cast decides as the copy must).
          for (auto* env : {&ref, &single, &multi}) {
            (*env)["p3"] = MakeTensor(dtype, {1}, {1.0 + 1.0 / 256 + 1.0 / (1 << 30)});
            std::vector<double> p1 = Values(10, 11, false);
            p1[0] = 70000.0;
            p1[1] = 1.0 + 1.0 / 2048;
            (*env)["p1"] = MakeTensor(dtype, {10}, p1);
          }
          const std::string attr =
              absl::StrCat(R"pb( attr { key: "copy_dtype" value { s: ")pb", copy_dtype, R"pb(" } })pb");
          Op multi_op = MultiOp(o, has_found_inf);
          multi_op.MergeFrom(ParseOp(attr));
          for (size_t i = 0; i < Shapes().size(); ++i) {
            absl::Status s = RunOp(SingleOp(o, i, has_found_inf), &ref);
            ASSERT_TRUE(s.ok()) << s;
            const std::string p = absl::StrCat("p", i);
            s = RunOp(
                ParseOp(absl::StrCat(R"pb(type: "cast" input: ")pb", p, R"pb(" output: ")pb", p,
                                     R"pb(@copy" attr { key: "dtype" value { s: ")pb", copy_dtype, R"pb(" } })pb")),
                &ref);
            ASSERT_TRUE(s.ok()) << s;
            Op op = SingleOp(o, i, has_found_inf);
            op.MergeFrom(ParseOp(attr));
            op.add_output(p + "@copy");
            s = RunOp(op, &single);
            ASSERT_TRUE(s.ok()) << s;
            multi_op.add_output(p + "@copy");
          }
          absl::Status s = RunOp(multi_op, &multi);
          ASSERT_TRUE(s.ok()) << s;
          for (const auto& [name, t] : ref) {
            EXPECT_TRUE(BitEqual(single.at(name), t)) << "single " << name;
            EXPECT_TRUE(BitEqual(multi.at(name), t)) << "multi " << name;
          }
        }
      }
    }
  }
  // The copy's type is the attr's; other dtypes and a missing output are refused.
  auto r = InferTypes(R"pb(type: "sgd_update" input: [ "p", "g", "lr" ] output: [ "p", "c" ]
                           attr { key: "copy_dtype" value { s: "BF16" } })pb",
                      {TensorType{F32, {3, 2}}, TensorType{F32, {3, 2}}, TensorType{F32, {}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[1], (TensorType{BF16, {3, 2}}));
  r = InferTypes(R"pb(type: "sgd_update" input: [ "p", "g", "lr" ] output: [ "p", "c" ]
                      attr { key: "copy_dtype" value { s: "F64" } })pb",
                 {TensorType{F32, {3}}, TensorType{F32, {3}}, TensorType{F32, {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("attr 'copy_dtype' must be \"\", \"BF16\" or \"F16\", got \"F64\""));
  r = InferTypes(R"pb(type: "adam_update_multi" input: [ "p", "g", "m", "v", "lr", "step" ]
                      output: [ "p", "m", "v" ] attr { key: "n" value { i: 1 } }
                      attr { key: "copy_dtype" value { s: "F16" } })pb",
                 {TensorType{F32, {3}}, TensorType{F32, {3}}, TensorType{F32, {3}}, TensorType{F32, {3}},
                  TensorType{F32, {}}, TensorType{I64, {}}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("copy[n]"));
}

}  // namespace
}  // namespace strata
