// Every op of the plans Strata compiles for a GPU has a CUDA kernel for its
// dtype, and the kernel builds from the op (its attrs read): what a GPU run
// would otherwise find at its first step, checked on the CPU. Links the
// CUDA kernels (//kernels/cuda:cuda_ops) and queries their registry; no
// device is touched, so the test runs wherever the CUDA toolkit is
// installed, GPU or not. The plans: the generated models (GPT with a
// vocabulary pad-vocab pads and one it does not, GPT with heads the
// tensor-core attention packs, the MLP with dropout, the
// residual MLP) in F32, BF16 and F16 (loss scaling), alone and with
// recompute, a 1F1B pipeline, data parallelism and gradient merge.

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "runtime/kernel.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

struct Model {
  std::string name;
  GenOptions gen;
};

std::vector<Model> Models() {
  std::vector<Model> models;
  for (int64_t vocab : {256, 16411}) {
    GenOptions gpt;
    gpt.blocks = 2;
    gpt.d_model = 64;
    gpt.heads = 4;
    gpt.seq = 32;
    gpt.vocab = vocab;
    gpt.dropout = 0.1;
    models.push_back({"gpt", gpt});
  }
  // Heads of 32, the tensor-core flash kernels' size: under BF16 and F16 its
  // attention reads the qkv projection packed (passes/pack_qkv).
  GenOptions gpt32;
  gpt32.blocks = 2;
  gpt32.d_model = 64;
  gpt32.heads = 2;
  gpt32.seq = 32;
  gpt32.vocab = 256;
  models.push_back({"gpt", gpt32});
  GenOptions mlp;
  mlp.layers = {784, 64, 10};
  mlp.dropout = 0.2;
  models.push_back({"mlp", mlp});
  GenOptions resmlp;
  resmlp.layers = {32, 64, 10};
  resmlp.blocks = 2;
  models.push_back({"resmlp", resmlp});
  // Not the convnet: cuDNN sizes a convolution's workspace only with a GPU
  // (the memory plan asks it), and this test runs without one.
  return models;
}

std::vector<std::pair<std::string, Strategy>> Strategies(const std::string& model, int stages) {
  std::vector<std::pair<std::string, Strategy>> out;
  for (const char* dtype : {"F32", "BF16", "F16"}) {
    Strategy base;
    if (std::string(dtype) != "F32") {
      DataType low = DT_INVALID;
      DataType_Parse(dtype, &low);
      base.mutable_mixed_precision()->set_dtype(low);
    }
    out.push_back({dtype, base});
    Strategy recompute = base;
    recompute.mutable_recompute()->add_checkpoints("h1");
    if (model == "gpt") out.push_back({absl::StrCat(dtype, " recompute"), recompute});
    Strategy dp = base;
    dp.mutable_data_parallel()->set_degree(2);
    out.push_back({absl::StrCat(dtype, " dp2"), dp});
    Strategy merge = base;
    merge.mutable_gradient_merge()->set_k_steps(2);
    out.push_back({absl::StrCat(dtype, " merge2"), merge});
    if (stages > 1) {
      Strategy pipeline = base;
      pipeline.mutable_pipeline()->set_micro_batch_size(2);
      pipeline.mutable_pipeline()->set_accumulate_steps(2);
      pipeline.mutable_pipeline()->set_schedule(ONE_F_ONE_B);
      out.push_back({absl::StrCat(dtype, " 1f1b"), pipeline});
    }
  }
  return out;
}

TEST(GpuPlanKernelsTest, EveryOpOfEveryGpuPlanHasACudaKernel) {
  std::set<std::string> missing;
  int plans = 0, ops = 0, packed = 0;
  for (const Model& model : Models()) {
    for (int stages : {1, 2}) {
      GenOptions gen = model.gen;
      gen.stages = stages;
      auto text = GenerateProgram(model.name, gen);
      ASSERT_TRUE(text.ok()) << model.name << ": " << text.status();
      auto program = ParseProgramText(*text, model.name + ".pbtxt");
      ASSERT_TRUE(program.ok()) << program.status();
      for (const auto& [label, strategy] : Strategies(model.name, stages)) {
        if (stages > 1 && strategy.has_data_parallel()) continue;  // dp x pp: covered by the parity tests' meshes
        const std::string where = absl::StrCat(model.name, " vocab/layers ", gen.vocab, ", ", stages, " stage(s), ",
                                               label);
        CompileOptions options;
        options.batch_size = strategy.has_pipeline() ? 0 : 8;  // a pipeline's is its own
        options.device_kind = DEVICE_CUDA;
        auto compiled = Compile(*program, strategy, options);
        if (!compiled.ok()) {
          ADD_FAILURE() << where << ": " << compiled.status();
          continue;
        }
        for (const RankPlan& plan : compiled->plans) {
          ++plans;
          const Program& p = plan.program();
          std::map<std::string, const Var*> vars;
          for (const Var& v : p.var()) vars[v.name()] = &v;
          for (const Op& op : p.op()) {
            ++ops;
            packed += op.type() == "scaled_dot_product_attention_qkv_grad";
            KernelDef def;
            def.op = &op;
            for (const std::string& in : op.input()) {
              const Var& v = *vars.at(in);
              def.input_types.push_back(TensorType{v.dtype(), Shape(v.shape().begin(), v.shape().end())});
            }
            for (const std::string& out : op.output()) {
              const Var& v = *vars.at(out);
              def.output_types.push_back(TensorType{v.dtype(), Shape(v.shape().begin(), v.shape().end())});
            }
            const DataType dtype = KernelDtype(def);
            const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), DEVICE_CUDA, dtype);
            if (factory == nullptr) {
              missing.insert(absl::StrCat(op.type(), " ", DataTypeName(dtype), " (first in ", where, ")"));
              continue;
            }
            auto kernel = (*factory)(def);
            EXPECT_TRUE(kernel.ok()) << where << ": op '" << op.name() << "' (" << op.type() << "): "
                                     << kernel.status();
          }
        }
      }
    }
  }
  EXPECT_TRUE(missing.empty()) << "no CUDA kernel for:\n  " << absl::StrJoin(missing, "\n  ");
  EXPECT_GT(packed, 0) << "no plan packed its attention's q, k and v";
  EXPECT_GT(plans, 50);
  EXPECT_GT(ops, 5000);
}

}  // namespace
}  // namespace strata
