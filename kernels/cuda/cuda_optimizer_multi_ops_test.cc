// The multi-tensor optimizer updates on the GPU (sgd_update_multi,
// momentum_update_multi, adam_update_multi: one launch per 64 tensors,
// kernels/cuda/optimizers.cu) against the n single CUDA updates they replace
// and against the CPU's multi kernels. Tagged gpu: without a CUDA device
// every test FAILS (never skips).
//
// Bars: the GPU multi op equals the GPU single ops bit for bit (the same
// element functions and scalars); against the CPU, sgd and momentum are bit
// for bit and adam within the single adam_update's bar (CUDA's pow in the
// bias corrections is within 2 ulp of glibc's). Also attr copy_dtype (the
// 16-bit copy an update writes) on the single ops and the multi ops alike.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_op_test_util.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

using testing::BitEqual;
using testing::CudaOpsTest;
using testing::RandomTensor;

STRATA_CUDA_OPS_TESTED(cuda_optimizer_multi_ops_test, {
                                                          {"adam_update_multi", {F32, F64}},
                                                          {"sgd_update_multi", {F32, F64}},
                                                          {"momentum_update_multi", {F32, F64}},
                                                      });

struct Optimizer {
  std::string type;
  std::vector<std::string> states;
  bool has_step;
  std::string attrs;
};

const std::vector<Optimizer>& Optimizers() {
  static const std::vector<Optimizer>* all = new std::vector<Optimizer>{
      {"sgd_update", {}, false, R"pb(attr { key: "weight_decay" value { f: 0.1 } })pb"},
      {"momentum_update",
       {"vel"},
       false,
       R"pb(attr { key: "nesterov" value { b: true } } attr { key: "weight_decay" value { f: 0.01 } })pb"},
      {"adam_update", {"m", "v"}, true, ""},
      {"adam_update",
       {"m", "v"},
       true,
       R"pb(attr { key: "weight_decay" value { f: 0.01 } } attr { key: "decoupled" value { b: true } })pb"},
  };
  return *all;
}

std::string Quoted(const std::vector<std::string>& names) {
  return absl::StrJoin(names, ", ",
                       [](std::string* out, const std::string& s) { absl::StrAppend(out, "\"", s, "\""); });
}

std::vector<std::string> Scalars(const Optimizer& o, bool found_inf) {
  std::vector<std::string> s = {"lr"};
  if (o.has_step) s.push_back("step");
  if (found_inf) s.push_back("found_inf");
  return s;
}

// Attr copy_dtype's text ("": none).
std::string CopyAttr(const std::string& copy_dtype) {
  return copy_dtype.empty() ? "" : absl::StrCat(R"pb( attr { key: "copy_dtype" value { s: ")pb", copy_dtype, "\" } }");
}

// With copy_dtype, param i's copy is output "c<i>".
std::string SingleText(const Optimizer& o, size_t i, bool found_inf, const std::string& copy_dtype = "") {
  std::vector<std::string> in = {absl::StrCat("p", i), absl::StrCat("g", i)}, out = {absl::StrCat("p", i)};
  for (const std::string& s : o.states) {
    in.push_back(absl::StrCat(s, i));
    out.push_back(absl::StrCat(s, i));
  }
  if (!copy_dtype.empty()) out.push_back(absl::StrCat("c", i));
  for (const std::string& s : Scalars(o, found_inf)) in.push_back(s);
  return absl::StrCat("type: \"", o.type, "\" input: [", Quoted(in), "] output: [", Quoted(out), "] ", o.attrs,
                      CopyAttr(copy_dtype));
}

std::string MultiText(const Optimizer& o, size_t n, bool found_inf, const std::string& copy_dtype = "") {
  std::vector<std::string> roles = {"p", "g"};
  for (const std::string& s : o.states) roles.push_back(s);
  std::vector<std::string> in, out;
  for (const std::string& r : roles) {
    for (size_t i = 0; i < n; ++i) in.push_back(absl::StrCat(r, i));
  }
  for (const std::string& s : Scalars(o, found_inf)) in.push_back(s);
  for (size_t k = 0; k < roles.size(); ++k) {
    if (k == 1) continue;
    for (size_t i = 0; i < n; ++i) out.push_back(absl::StrCat(roles[k], i));
  }
  if (!copy_dtype.empty()) {
    for (size_t i = 0; i < n; ++i) out.push_back(absl::StrCat("c", i));
  }
  return absl::StrCat("type: \"", o.type, "_multi\" input: [", Quoted(in), "] output: [", Quoted(out),
                      "] attr { key: \"n\" value { i: ", n, " } } ", o.attrs, CopyAttr(copy_dtype));
}

// Shapes: one over several chunks (16384 elements each), an empty one, and
// enough tensors for two launches (64 a launch) when `many`.
std::vector<Shape> Shapes(bool many) {
  std::vector<Shape> shapes = {{37, 29}, {40000}, {0}, {1}, {3, 4, 5}};
  if (many) {
    for (int i = 0; i < 70; ++i) shapes.push_back({1 + 13 * i});
  }
  return shapes;
}

std::map<std::string, Tensor> Inputs(const Optimizer& o, DataType dtype, const std::vector<Shape>& shapes,
                                     double found_inf) {
  std::map<std::string, Tensor> env;
  uint32_t seed = 100;
  for (size_t i = 0; i < shapes.size(); ++i) {
    env[absl::StrCat("p", i)] = RandomTensor(dtype, shapes[i], seed++);
    env[absl::StrCat("g", i)] = RandomTensor(dtype, shapes[i], seed++);
    for (const std::string& s : o.states) {
      Tensor t = RandomTensor(dtype, shapes[i], seed++);
      if (s == "v") t = MakeTensor(dtype, shapes[i], [&] {
          std::vector<double> v = TensorValues(t);
          for (double& e : v) e = e * e * 1e-3;  // a second moment is nonnegative
          return v;
        }());
      env[absl::StrCat(s, i)] = t;
    }
  }
  env["lr"] = MakeTensor(dtype, {}, {1e-3});
  env["step"] = MakeTensor(I64, {}, {7});
  if (found_inf >= 0) env["found_inf"] = MakeTensor(F32, {}, {found_inf});
  return env;
}

class CudaMultiUpdateTest : public CudaOpsTest {
 protected:
  // Runs the ops in order on the GPU from host `inputs`; every var back on the host.
  std::map<std::string, Tensor> RunOnGpu(const std::vector<std::string>& op_texts,
                                         const std::map<std::string, Tensor>& inputs) {
    std::map<std::string, Tensor> env, host;
    for (const auto& [name, t] : inputs) env[name] = *t.CopyTo(device_.get());
    for (const std::string& text : op_texts) {
      const absl::Status s = RunOp(ParseOp(text), &env, gpu_);
      EXPECT_TRUE(s.ok()) << text << ": " << s;
      if (!s.ok()) return {};
    }
    for (const auto& [name, t] : env) host[name] = t.Clone(GetCpuAllocator());
    const absl::Status sync = device_->Synchronize();
    EXPECT_TRUE(sync.ok()) << sync;
    return host;
  }
};

TEST_F(CudaMultiUpdateTest, EqualsTheSingleGpuUpdatesBitForBit) {
  for (const Optimizer& o : Optimizers()) {
    for (DataType dtype : {F32, F64}) {
      for (double found_inf : {-1.0, 0.0, 1.0}) {
        for (bool many : {false, true}) {
          SCOPED_TRACE(absl::StrCat(o.type, " ", o.attrs, " ", DataTypeName(dtype), " found_inf ", found_inf,
                                    many ? " many" : ""));
          const std::vector<Shape> shapes = Shapes(many);
          const std::map<std::string, Tensor> inputs = Inputs(o, dtype, shapes, found_inf);
          std::vector<std::string> singles;
          for (size_t i = 0; i < shapes.size(); ++i) singles.push_back(SingleText(o, i, found_inf >= 0));
          const auto single = RunOnGpu(singles, inputs);
          const auto multi = RunOnGpu({MultiText(o, shapes.size(), found_inf >= 0)}, inputs);
          ASSERT_EQ(single.size(), multi.size());
          for (const auto& [name, t] : single) {
            EXPECT_TRUE(BitEqual(multi.at(name), t)) << name;
            if (found_inf > 0) {
              EXPECT_TRUE(BitEqual(t, inputs.at(name))) << name << " changed on a skipped step";
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaMultiUpdateTest, MatchesTheCpuMultiKernels) {
  for (const Optimizer& o : Optimizers()) {
    for (DataType dtype : {F32, F64}) {
      SCOPED_TRACE(absl::StrCat(o.type, " ", o.attrs, " ", DataTypeName(dtype)));
      const std::vector<Shape> shapes = Shapes(true);
      std::vector<std::string> outputs;
      for (size_t i = 0; i < shapes.size(); ++i) {
        outputs.push_back(absl::StrCat("p", i));
        for (const std::string& s : o.states) outputs.push_back(absl::StrCat(s, i));
      }
      auto out = RunBothNamed(MultiText(o, shapes.size(), false), Inputs(o, dtype, shapes, -1), outputs);
      ASSERT_EQ(out.size(), outputs.size());
      const double tol = o.type != "adam_update" ? 0 : dtype == F32 ? 1e-6 : 1e-13;
      for (const auto& [cpu, gpu] : out) {
        if (tol == 0) {
          EXPECT_TRUE(BitEqual(gpu, cpu));
        } else {
          EXPECT_TENSOR_NEAR(gpu, cpu, tol);
        }
      }
    }
  }
}

// attr grad_scale (global-norm clipping's coefficient folded into the
// update): the GPU's single and multi updates with it leave every param and
// state bit for bit as the GPU's mul (the clipped copy the optimizer pass
// made before) then the plain updates do; also on a skipped step.
TEST_F(CudaMultiUpdateTest, GradScaleIsTheGpuMulFirstBitForBit) {
  for (const Optimizer& o : Optimizers()) {
    for (DataType dtype : {F32, F64}) {
      for (double found_inf : {-1.0, 0.0, 1.0}) {
        SCOPED_TRACE(absl::StrCat(o.type, " ", o.attrs, " ", DataTypeName(dtype), " found_inf ", found_inf));
        const std::vector<Shape> shapes = Shapes(true);
        std::map<std::string, Tensor> inputs = Inputs(o, dtype, shapes, found_inf);
        inputs["scale"] = MakeTensor(dtype, {}, {0.3719});
        const bool has_found_inf = found_inf >= 0;
        const std::string scaled = R"pb( attr { key: "grad_scale" value { b: true } })pb";
        // With the scale after the op's scalars, before found_inf.
        const auto with_scale = [&](const std::string& text) {
          std::string out = text;
          const std::string flag = has_found_inf ? R"(, "found_inf"])" : "]";
          const size_t at = out.find(flag);
          out.replace(at, flag.size(), has_found_inf ? R"(, "scale", "found_inf"])" : R"(, "scale"])");
          return absl::StrCat(out, scaled);
        };
        std::vector<std::string> reference, singles;
        for (size_t i = 0; i < shapes.size(); ++i) {
          const std::string g = absl::StrCat("g", i);
          reference.push_back(absl::StrCat(R"(type: "mul" input: [")", g, R"(", "scale"] output: ")", g, "\""));
          reference.push_back(SingleText(o, i, has_found_inf));
          singles.push_back(with_scale(SingleText(o, i, has_found_inf)));
        }
        const auto want = RunOnGpu(reference, inputs);
        const auto single = RunOnGpu(singles, inputs);
        const auto multi = RunOnGpu({with_scale(MultiText(o, shapes.size(), has_found_inf))}, inputs);
        for (const auto& [name, t] : single) {
          if (name[0] == 'g') continue;  // the reference scaled its gradients in place
          EXPECT_TRUE(BitEqual(t, want.at(name))) << "single " << name;
          EXPECT_TRUE(BitEqual(multi.at(name), want.at(name))) << "multi " << name;
        }
      }
    }
  }
}

// attr copy_dtype (mixed precision's 16-bit weight copy, written by the
// update): the GPU's single and multi updates with it leave every param and
// state bit for bit as the plain GPU updates do, and each copy is what the
// GPU's cast of the updated param makes, bit for bit; also on a skipped
// step (the copy of the unchanged param, as the CPU defines an output not
// handed in). Param 3 (shape [1]) at 70000: past F16's largest finite.
TEST_F(CudaMultiUpdateTest, CopyDtypeIsTheGpuCastOfTheUpdatedParamBitForBit) {
  for (const Optimizer& o : Optimizers()) {
    for (DataType dtype : {F32, F64}) {
      for (const char* copy_dtype : {"BF16", "F16"}) {
        for (double found_inf : {-1.0, 0.0, 1.0}) {
          SCOPED_TRACE(
              absl::StrCat(o.type, " ", o.attrs, " ", DataTypeName(dtype), " ", copy_dtype, " found_inf ", found_inf));
          const std::vector<Shape> shapes = Shapes(true);
          std::map<std::string, Tensor> inputs = Inputs(o, dtype, shapes, found_inf);
          inputs["p3"] = MakeTensor(dtype, {1}, {70000.0});
          const bool has_found_inf = found_inf >= 0;
          std::vector<std::string> reference, singles;
          for (size_t i = 0; i < shapes.size(); ++i) {
            reference.push_back(SingleText(o, i, has_found_inf));
            reference.push_back(absl::StrCat(R"(type: "cast" input: "p)", i, R"(" output: "c)", i,
                                             R"(" attr { key: "dtype" value { s: ")", copy_dtype, R"(" } })"));
            singles.push_back(SingleText(o, i, has_found_inf, copy_dtype));
          }
          const auto want = RunOnGpu(reference, inputs);
          const auto single = RunOnGpu(singles, inputs);
          const auto multi = RunOnGpu({MultiText(o, shapes.size(), has_found_inf, copy_dtype)}, inputs);
          ASSERT_EQ(single.size(), want.size());
          ASSERT_EQ(multi.size(), want.size());
          for (const auto& [name, t] : want) {
            EXPECT_TRUE(BitEqual(single.at(name), t)) << "single " << name;
            EXPECT_TRUE(BitEqual(multi.at(name), t)) << "multi " << name;
          }
        }
      }
    }
  }
}

// The same ops against the CPU kernels (kernels/cpu/optimizers.cc), copies
// included: sgd and momentum bit for bit; adam's params and states within
// its bar, and its copies bit for bit where the params are (else within the
// copy type's rounding step: a param an ulp off may round the other way).
TEST_F(CudaMultiUpdateTest, CopyDtypeMatchesTheCpu) {
  for (const Optimizer& o : Optimizers()) {
    for (DataType dtype : {F32, F64}) {
      for (const char* copy_dtype : {"BF16", "F16"}) {
        for (double found_inf : {-1.0, 0.0, 1.0}) {
          SCOPED_TRACE(
              absl::StrCat(o.type, " ", o.attrs, " ", DataTypeName(dtype), " ", copy_dtype, " found_inf ", found_inf));
          const std::vector<Shape> shapes = Shapes(false);
          std::map<std::string, Tensor> inputs = Inputs(o, dtype, shapes, found_inf);
          inputs["p3"] = MakeTensor(dtype, {1}, {70000.0});
          const bool has_found_inf = found_inf >= 0;
          const double tol = o.type != "adam_update" ? 0 : dtype == F32 ? 1e-6 : 1e-13;
          const double copy_step = std::string(copy_dtype) == "BF16" ? 0x1p-7 : 0x1p-10;
          // Each op's outputs: (cpu, gpu) of param, the states, the copy.
          const auto check = [&](const std::vector<std::pair<Tensor, Tensor>>& out, size_t first, size_t n) {
            const size_t per_tensor = 2 + o.states.size();
            ASSERT_EQ(out.size(), per_tensor * n);
            for (size_t i = 0; i < n; ++i) {
              SCOPED_TRACE(absl::StrCat("tensor ", first + i));
              for (size_t k = 0; k < per_tensor; ++k) {
                const auto& [cpu, gpu] = out[k * n + i];
                const bool copy = k + 1 == per_tensor;
                if (tol == 0 || (copy && BitEqual(out[i].second, out[i].first))) {
                  EXPECT_TRUE(BitEqual(gpu, cpu)) << "output " << k;
                } else {
                  EXPECT_TENSOR_NEAR(gpu, cpu, copy ? copy_step : tol);
                }
              }
            }
          };
          const auto names = [&](size_t first, size_t n) {
            std::vector<std::string> out;
            std::vector<std::string> roles = {"p"};
            for (const std::string& s : o.states) roles.push_back(s);
            roles.push_back("c");
            for (const std::string& r : roles) {
              for (size_t i = first; i < first + n; ++i) out.push_back(absl::StrCat(r, i));
            }
            return out;
          };
          for (size_t i = 0; i < shapes.size(); ++i) {
            check(RunBothNamed(SingleText(o, i, has_found_inf, copy_dtype), inputs, names(i, 1)), i, 1);
          }
          check(RunBothNamed(MultiText(o, shapes.size(), has_found_inf, copy_dtype), inputs, names(0, shapes.size())),
                0, shapes.size());
        }
      }
    }
  }
}

// Runs the registered CUDA kernel of `op_text` on the device tensors of
// `env` with `outputs` as given, as the executor runs it: a PARAM_COPY's
// buffer handed in at its copy's output (KernelContext::AllocateOutput).
absl::Status RunHandedIn(const std::string& op_text, DataType dtype, const std::map<std::string, Tensor>& env,
                         std::vector<Tensor>* outputs, const RunContext& run) {
  Op op = ParseOp(op_text);
  const OpSchema* schema = OpRegistry::Global().Find(op.type());
  if (schema == nullptr) return absl::NotFoundError(op.type());
  if (absl::Status s = CanonicalizeOp(*schema, &op); !s.ok()) return s;
  const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), DEVICE_CUDA, dtype);
  if (factory == nullptr) return absl::NotFoundError(absl::StrCat("no CUDA kernel for ", op.type()));
  KernelDef def;
  def.op = &op;
  auto kernel = (*factory)(def);
  if (!kernel.ok()) return kernel.status();
  std::vector<const Tensor*> inputs;
  for (const std::string& name : op.input()) inputs.push_back(&env.at(name));
  KernelContext ctx(&run, inputs, absl::MakeSpan(*outputs));
  return (*kernel)->Compute(ctx);
}

// A copy's buffer handed in (the executor's PARAM_COPY, rewritten in place
// so that a captured CUDA graph keeps writing it): the single and multi
// updates write the copy into that buffer, no other, the same bits as into
// a new one; a skipped update (found_inf 1) leaves it as it was.
TEST_F(CudaMultiUpdateTest, CopyDtypeWritesTheBufferHandedIn) {
  const std::vector<Shape> shapes = {{37, 29}, {40000}};
  for (const Optimizer& o : Optimizers()) {
    for (const char* copy_dtype : {"BF16", "F16"}) {
      for (double found_inf : {0.0, 1.0}) {
        SCOPED_TRACE(absl::StrCat(o.type, " ", o.attrs, " ", copy_dtype, " found_inf ", found_inf));
        DataType copy_type = DT_INVALID;
        ASSERT_TRUE(DataType_Parse(copy_dtype, &copy_type));
        const std::map<std::string, Tensor> inputs = Inputs(o, F32, shapes, found_inf);
        for (bool multi : {false, true}) {
          SCOPED_TRACE(multi ? "multi" : "single");
          std::vector<std::string> texts;
          if (multi) {
            texts.push_back(MultiText(o, shapes.size(), true, copy_dtype));
          } else {
            for (size_t i = 0; i < shapes.size(); ++i) texts.push_back(SingleText(o, i, true, copy_dtype));
          }
          // Into new buffers (RunOp hands none in).
          const auto fresh = RunOnGpu(texts, inputs);
          std::map<std::string, Tensor> env;
          for (const auto& [name, t] : inputs) env[name] = *t.CopyTo(device_.get());
          std::map<std::string, Tensor> handed_in, unwritten;
          for (size_t i = 0; i < shapes.size(); ++i) {
            const std::string c = absl::StrCat("c", i);
            unwritten[c] = MakeTensor(copy_type, shapes[i], std::vector<double>(NumElements(shapes[i]), 3.0));
            handed_in[c] = *unwritten[c].CopyTo(device_.get());
          }
          for (const std::string& text : texts) {
            const Op op = ParseOp(text);
            std::vector<Tensor> outputs(op.output_size());
            for (int k = 0; k < op.output_size(); ++k) {
              if (handed_in.count(op.output(k))) outputs[k] = handed_in.at(op.output(k));
            }
            const absl::Status s = RunHandedIn(text, F32, env, &outputs, gpu_);
            ASSERT_TRUE(s.ok()) << s;
            for (int k = 0; k < op.output_size(); ++k) {
              if (!handed_in.count(op.output(k))) continue;
              EXPECT_EQ(outputs[k].raw_data(), handed_in.at(op.output(k)).raw_data()) << op.output(k);
            }
          }
          for (const auto& [name, t] : handed_in) {
            const Tensor host = t.Clone(GetCpuAllocator());
            EXPECT_TRUE(BitEqual(host, found_inf == 0 ? fresh.at(name) : unwritten.at(name))) << name;
          }
          const absl::Status sync = device_->Synchronize();
          EXPECT_TRUE(sync.ok()) << sync;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata
