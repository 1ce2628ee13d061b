#include "passes/testing/pass_test_util.h"

#include "tools/model_gen.h"

#include "passes/compile.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"

namespace strata {

std::string TwoStagesProgram(const std::string& optimizer) {
  return R"pb(
    var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F64 shape: [4, 5] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b" dtype: F64 shape: [5] kind: PARAM }
    var { name: "w2" dtype: F64 shape: [5, 3] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "matmul" input: ["x", "w"] output: ["xw"] device: "gpu:0" }
    op { type: "add" input: ["xw", "b"] output: ["h"] device: "gpu:0" }
    op { type: "matmul" input: ["h", "w2"] output: ["z"] device: "gpu:1" }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
  )pb" + optimizer;
}

Program ParseProgramOrFail(const std::string& text, const std::string& filename) {
  auto program = ParseProgramText(text, filename);
  if (!program.ok()) {
    ADD_FAILURE() << program.status();
    return Program();
  }
  return *std::move(program);
}

Strategy PipelineStrategy(int micro_batches, ScheduleKind schedule) {
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(2);
  strategy.mutable_pipeline()->set_accumulate_steps(micro_batches);
  strategy.mutable_pipeline()->set_schedule(schedule);
  return strategy;
}

Strategy Bf16() { return Mixed(BF16); }

Strategy Mixed(DataType dtype) {
  Strategy s;
  s.mutable_mixed_precision()->set_dtype(dtype);
  return s;
}

Program After(const std::string& text, const Strategy& strategy, const std::string& pass,
              std::vector<std::string> disabled) {
  CompileOptions options;
  options.batch_size = 4;
  options.dump_after = pass;
  options.disabled_passes = std::move(disabled);
  auto r = Compile(ParseProgramOrFail(text), strategy, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->dumped : Program();
}

std::vector<RankPlan> CompilePipeline(const std::string& text, int micro_batches, ScheduleKind schedule,
                                      std::vector<std::string> disabled_passes) {
  auto program = ParseProgramText(text, "pipeline.pbtxt");
  if (!program.ok()) {
    ADD_FAILURE() << program.status();
    return {};
  }
  CompileOptions options;
  options.disabled_passes = std::move(disabled_passes);
  auto result = Compile(*program, PipelineStrategy(micro_batches, schedule), options);
  if (!result.ok()) {
    ADD_FAILURE() << result.status();
    return {};
  }
  return std::move(result->plans);
}

std::vector<const Op*> OpsOfType(const Program& p, const std::string& type) {
  std::vector<const Op*> ops;
  for (const Op& op : p.op()) {
    if (op.type() == type) ops.push_back(&op);
  }
  return ops;
}

std::vector<const Op*> Transfers(const Program& p, const std::string& type, const std::string& var) {
  std::vector<const Op*> ops;
  for (const Op* op : OpsOfType(p, type)) {
    if (op->channel().var() == var) ops.push_back(op);
  }
  return ops;
}

std::vector<const Op*> OpsWriting(const Program& p, const std::string& var) {
  std::vector<const Op*> ops;
  for (const Op& op : p.op()) {
    for (const auto& out : op.output()) {
      if (out == var) ops.push_back(&op);
    }
  }
  return ops;
}

int IndexOf(const Program& p, const Op* op) {
  for (int i = 0; i < p.op_size(); ++i) {
    if (&p.op(i) == op) return i;
  }
  return -1;
}

const Var* FindVar(const Program& p, const std::string& name) {
  for (const Var& v : p.var()) {
    if (v.name() == name) return &v;
  }
  return nullptr;
}

const AttrValue& Attr(const Op& op, const std::string& key) {
  auto it = op.attr().find(key);
  if (it == op.attr().end()) {
    ADD_FAILURE() << op.type() << " has no attr '" << key << "'";
    return AttrValue::default_instance();
  }
  return it->second;
}

std::string TinyGptText(int64_t seq, int stages) {
  GenOptions gen;
  gen.stages = stages;
  gen.blocks = kTinyGptBlocks;
  gen.d_model = 32;
  gen.heads = 4;
  gen.seq = seq;
  gen.vocab = 64;
  gen.dtype = "F32";
  auto text = GenerateProgram("gpt", gen);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

}  // namespace strata
