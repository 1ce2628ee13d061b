#ifndef STRATA_PASSES_TESTING_PASS_TEST_UTIL_H_
#define STRATA_PASSES_TESTING_PASS_TEST_UTIL_H_

// Test programs and helpers shared by passes/*_test.cc. Test code only: parse
// and compile errors are reported as failures of the running test.

#include <string>
#include <vector>

#include "proto/plan.pb.h"
#include "proto/program.pb.h"
#include "proto/strategy.pb.h"

namespace strata {

// The optimizer most pass tests train with.
inline constexpr char kSgdOptimizer[] = R"pb(optimizer { sgd { learning_rate: 0.1 } })pb";

// x @ w + b on stage 0 (gpu:0), the head (w2) and the loss on stage 1 (gpu:1),
// trained with `optimizer` (program text).
std::string TwoStagesProgram(const std::string& optimizer = kSgdOptimizer);

// Three stages: h0 (stage 0) is read on stage 1 and, skipping it, on stage 2
// (h2 = h1 + h0), so it has two receivers and two gradient parts.
inline constexpr char kThreeStagesWithSkip[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w0" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w1" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w2" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w0"] output: ["h0"] device: "gpu:0" }
  op { type: "matmul" input: ["h0", "w1"] output: ["h1"] device: "gpu:1" }
  op { type: "add" input: ["h1", "h0"] output: ["h2"] device: "gpu:2" }
  op { type: "matmul" input: ["h2", "w2"] output: ["z"] device: "gpu:2" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:2" }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// Three stages with a tied weight: w0 is read on stage 0 and again on stage 2,
// so each of the two holds a copy; stage 2 sends its gradient part to stage 0,
// which sends the sum back, both in the optimizer action.
inline constexpr char kThreeStagesWithTiedWeight[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w0" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w1" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w2" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w0"] output: ["h0"] device: "gpu:0" }
  op { type: "matmul" input: ["h0", "w1"] output: ["h1"] device: "gpu:1" }
  op { type: "matmul" input: ["h1", "w0"] output: ["h2"] device: "gpu:2" }
  op { type: "matmul" input: ["h2", "w2"] output: ["z"] device: "gpu:2" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:2" }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// Two stages with a tied weight whose gradient has one path: t is read on
// stage 0 only for a fetched mean (no gradient) and on stage 1 by the
// logits' matmul, so stage 1 makes all of t's gradient and sends it to
// stage 0's replica once an update (a copy of the micro-batches' sum).
inline constexpr char kOnePathTiedWeightOnTwoStages[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w0" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "t" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w0"] output: ["h"] device: "gpu:0" }
  op { type: "reduce_mean" input: ["t"] output: ["tm"] device: "gpu:0" }
  op { type: "matmul" input: ["h", "t"] output: ["z"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
  loss: "loss"
  fetch: "tm"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// Parses program text. On a parse error, fails the running test with it and
// returns an empty program.
Program ParseProgramOrFail(const std::string& text, const std::string& filename = "test.pbtxt");

// The strategy of mixed precision in BF16 (or `dtype`) and nothing else.
Strategy Bf16();
Strategy Mixed(DataType dtype);

// `text` compiled (batch 4, for the CPU) without the optional `disabled`
// passes, as the program was right after `pass` (the compile's dump); an
// empty program, and a test failure, on a compile error.
Program After(const std::string& text, const Strategy& strategy, const std::string& pass,
              std::vector<std::string> disabled = {});

// Micro-batches of 2 examples, `micro_batches` of them per step, run in the
// order of `schedule`.
Strategy PipelineStrategy(int micro_batches, ScheduleKind schedule = ONE_F_ONE_B);

// Parses `text` and compiles it with PipelineStrategy(micro_batches, schedule),
// without the optional `disabled_passes`: one plan per rank (a program
// without devices gives one). On a parse or compile error, fails the running
// test with it and returns no plans.
std::vector<RankPlan> CompilePipeline(const std::string& text, int micro_batches = 1,
                                      ScheduleKind schedule = ONE_F_ONE_B,
                                      std::vector<std::string> disabled_passes = {});

// The ops of `type`, in program order.
std::vector<const Op*> OpsOfType(const Program& p, const std::string& type);
// The transfer ops (`type` "send" or "recv") of `var`, in program order.
std::vector<const Op*> Transfers(const Program& p, const std::string& type, const std::string& var);
// The ops that write `var`, in program order.
std::vector<const Op*> OpsWriting(const Program& p, const std::string& var);
// The position of `op` (a pointer into p's ops) in p, or -1.
int IndexOf(const Program& p, const Op* op);

// The var named `name`, or nullptr.
const Var* FindVar(const Program& p, const std::string& name);
inline bool HasVar(const Program& p, const std::string& name) { return FindVar(p, name) != nullptr; }

// `strata gen gpt` with 2 blocks, d_model 32, 4 heads, vocab 64, float32,
// `seq` tokens and `stages` pipeline stages: the tiny GPT the
// mixed-precision pass tests compile.
inline constexpr int kTinyGptBlocks = 2;
std::string TinyGptText(int64_t seq = 16, int stages = 1);

// The attr `key` of `op`; fails the running test (and returns an empty value)
// when the op has none.
const AttrValue& Attr(const Op& op, const std::string& key);

}  // namespace strata

#endif  // STRATA_PASSES_TESTING_PASS_TEST_UTIL_H_
