#include "analysis/memory_plan.h"

#include <algorithm>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/testing/pass_test_util.h"

// Every expected byte count below is worked out by hand from the program's
// shapes, the micro-batch size and the schedule, with the model DESIGN.md
// and docs/design-notes.md ("Memory plan") give: feeds are allocated when a
// forward action starts, an op's outputs while its inputs are still alive,
// each activation is freed after the op that last reads it, the loss lives
// to the end of the step, PARAM/STATE/SCRATCH vars are counted once apart
// from the activations, and a sent buffer lives until the end of the action
// the plan waits for its send at.

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

// The op (by index) after which the plan frees each var; a var freed twice
// fails the test.
std::map<std::string, int> FreedAfter(const RankPlan& plan) {
  std::map<std::string, int> freed;
  const auto& frees = plan.memory().frees_after_op();
  EXPECT_EQ(frees.size(), plan.program().op_size()) << "one entry per op";
  for (int i = 0; i < frees.size(); ++i) {
    for (const std::string& var : frees.Get(i).var()) {
      if (!freed.emplace(var, i).second) ADD_FAILURE() << "'" << var << "' is freed twice, after op " << i;
    }
  }
  return freed;
}

// The index of the one op that writes `var`.
int Writer(const Program& p, const std::string& var) {
  const std::vector<const Op*> ops = OpsWriting(p, var);
  EXPECT_EQ(ops.size(), 1u) << "ops writing '" << var << "'";
  return ops.empty() ? -1 : IndexOf(p, ops.back());
}

// (channel, micro-batch) -> the action at whose end the executor waits for that send.
std::map<std::pair<int64_t, int>, int> SendWaits(const RankPlan& plan) {
  std::map<std::pair<int64_t, int>, int> waits;
  for (const auto& w : plan.memory().send_waits()) waits[{w.channel(), w.micro_batch()}] = w.action();
  return waits;
}

// The hand counts below keep the logits and their gradient apart; the
// in-place loss gradient (passes/in_place_loss_grad), which shares them, has
// its own test.
const std::vector<std::string> kApart = {"in-place-loss-gradient"};

RankPlan CompileOneDevice(const std::string& text, int64_t batch_size,
                          const std::vector<std::string>& disabled = kApart) {
  CompileOptions options;
  options.batch_size = batch_size;
  options.disabled_passes = disabled;
  auto result = Compile(ParseProgramOrFail(text), Strategy(), options);
  if (!result.ok()) {
    ADD_FAILURE() << result.status();
    return RankPlan();
  }
  EXPECT_EQ(result->plans.size(), 1u);
  return result->plans[0];
}

// x @ w, then the loss; F32, trained with momentum (a STATE velocity).
// Bytes per batch row: x 4*4 = 16, label (I64) 8, z 3*4 = 12, z@grad 12.
// Autodiff writes, in program order:
//   matmul(x, w) -> z                                  FORWARD
//   softmax_cross_entropy(z, label) -> loss            LOSS
//   fill_like(loss) -> loss@grad                       BACKWARD
//   softmax_cross_entropy_grad(z, label, loss@grad) -> z@grad
//   matmul(x, z@grad) -> w@grad  (x read a second time)
//   lr_schedule(@step) -> @lr.F32                      OPTIMIZE action
//   increment(@step); momentum_update(w, w@grad, w@velocity, @lr.F32)
constexpr char kOneLayer[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w" dtype: F32 shape: [4, 3] kind: PARAM }
  op { type: "matmul" input: ["x", "w"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { momentum { learning_rate: 0.1 momentum: 0.9 } }
)pb";

TEST(MemoryPlanTest, FreesEachActivationAfterItsLastReaderAndNeverThePersistentVars) {
  const RankPlan plan = CompileOneDevice(kOneLayer, 8);
  const Program& p = plan.program();
  const int loss_grad = Writer(p, "z@grad");  // softmax_cross_entropy_grad: last reader of z, label, loss@grad
  const int weight_grad = Writer(p, "w@grad");  // matmul(x, z@grad): x's second reader, after the forward matmul
  const int update = Writer(p, "w@velocity");   // momentum_update: the only reader of w@grad and @lr.F32
  ASSERT_GT(weight_grad, Writer(p, "z"));
  // Each var once, at its last reader. Not freed: w (PARAM), w@velocity and
  // @step (STATE), and the loss, which is reported at the end of the step.
  EXPECT_EQ(FreedAfter(plan), (std::map<std::string, int>{{"z", loss_grad},
                                                           {"label", loss_grad},
                                                           {"loss@grad", loss_grad},
                                                           {"x", weight_grad},
                                                           {"z@grad", weight_grad},
                                                           {"w@grad", update},
                                                           {"@lr.F32", update}}));
}

TEST(MemoryPlanTest, OneDevicePeakIsTheLiveSetAtTheLossGradient) {
  const RankPlan plan = CompileOneDevice(kOneLayer, 8);
  const MemoryPlan& m = plan.memory();
  // Batch 8. Forward: x 128 + label 64 (both allocated as the action starts),
  // z 96, loss 4 -> 292. Backward: loss@grad 4 -> 296, then z@grad 96 while z,
  // label and loss@grad are still read by that op -> 392, the peak; then 228,
  // w@grad 48 -> 276, x and z@grad go -> 52. Optimize: @lr.F32 4 -> 56.
  // Peak = x 128 + label 64 + z 96 + loss 4 + loss@grad 4 + z@grad 96 = 392.
  EXPECT_EQ(m.activation_peak_bytes(), 392);
  EXPECT_EQ(m.param_bytes(), 48);        // w F32[4, 3]
  EXPECT_EQ(m.state_bytes(), 48 + 8);    // w@velocity F32[4, 3], @step I64[]
  EXPECT_EQ(m.peak_bytes(), 392 + 48 + 56);
  EXPECT_EQ(m.planned_batch_size(), 8);
  EXPECT_TRUE(m.send_waits().empty());
}

// An evaluation runs the forward alone (Executor::Evaluate) and frees each
// activation after its last forward use, not the backward's: x after the
// matmul, z and label after the loss. Batch 8: x 128 + label 64 as it
// starts, z 96 -> 288, the peak; x goes -> 160; the loss op's output 4
// beside its F64 row sums (scratch, 8 a row) 64 -> 228.
TEST(MemoryPlanTest, AnEvaluationFreesEachActivationAfterItsLastForwardUse) {
  const RankPlan plan = CompileOneDevice(kOneLayer, 8);
  const MemoryPlan& m = plan.memory();
  EXPECT_EQ(m.eval_peak_bytes(), 288 + 48 + 56);
  EXPECT_LT(m.eval_peak_bytes(), m.peak_bytes());
  const Program& p = plan.program();
  const int matmul = Writer(p, "z"), loss = Writer(p, "loss");
  std::map<std::string, int> freed;
  const auto& frees = m.eval_frees_after_op();
  ASSERT_EQ(frees.size(), p.op_size());
  for (int i = 0; i < frees.size(); ++i) {
    for (const std::string& var : frees.Get(i).var()) EXPECT_TRUE(freed.emplace(var, i).second) << var;
  }
  EXPECT_EQ(freed, (std::map<std::string, int>{{"x", matmul}, {"z", loss}, {"label", loss}}));
}

// Off training dropout is the identity and hands on its input's buffer
// (its kernels do), so an evaluation counts its output as x's (a review
// helper measured the MLP with dropout 4.2% under the prediction before).
// Batch 8: x 128 + label 64 as the forward starts; xd shares x's buffer
// (a new one would make 320); x's name goes, the buffer stays with xd; z 96
// -> 288, the peak; xd goes -> 160; the loss beside its row sums -> 228.
constexpr char kDropoutFirst[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w" dtype: F32 shape: [4, 3] kind: PARAM }
  op { type: "dropout" input: ["x"] output: ["xd"] attr { key: "p" value { f: 0.5 } } }
  op { type: "matmul" input: ["xd", "w"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

TEST(MemoryPlanTest, AnEvaluationsDropoutSharesItsInputsBuffer) {
  const RankPlan plan = CompileOneDevice(kDropoutFirst, 8);
  const MemoryPlan& m = plan.memory();
  EXPECT_EQ(m.eval_peak_bytes(), 288 + m.param_bytes() + m.state_bytes());
}

// [B, T, V] logits (a GPT's): the CPU loss's F64 row sums are a double for
// each of the B x T rows (the plan counted B of them, a review helper
// found). Batch 2, T 4, V 3: x 32 + label 64 as the forward starts, z 96
// -> 192; x goes -> 160; the loss op's output 4 beside 8 row sums 64 ->
// 228, the evaluation's peak (with B's 2 row sums it was z's 192).
constexpr char kTokenLogits[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4, 1] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1, 4] kind: FEED }
  var { name: "w" dtype: F32 shape: [1, 3] kind: PARAM }
  op { type: "matmul" input: ["x", "w"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

TEST(MemoryPlanTest, TheLossRowSumsOfTokenLogitsCountEveryRow) {
  const RankPlan plan = CompileOneDevice(kTokenLogits, 2);
  const MemoryPlan& m = plan.memory();
  EXPECT_EQ(m.eval_peak_bytes(), 228 + m.param_bytes() + m.state_bytes());
}

// With the loss gradient written over the logits, z@grad takes z's buffer:
// the gradient's live set is x 128 + label 64 + z (= z@grad) 96 + loss 4 +
// loss@grad 4 = 296 at batch 8, below the forward loss's x 128 + label 64
// + z 96 + loss 4 + its F64 row sums (8 a row) 64 = 356, now the peak; at
// batch 1000 that is 44 a row + 4.
TEST(MemoryPlanTest, TheInPlaceLossGradientSharesTheLogitsBuffer) {
  const RankPlan plan = CompileOneDevice(kOneLayer, 8, /*disabled=*/{});
  const MemoryPlan& m = plan.memory();
  EXPECT_EQ(m.activation_peak_bytes(), 356);
  EXPECT_EQ(m.peak_bytes(), 356 + 48 + 56);
  EXPECT_EQ(CompileOneDevice(kOneLayer, 1000, {}).memory().activation_peak_bytes(), 44 * 1000 + 4);
  // z is freed after the gradient as before; its buffer lives on as z@grad
  // to the weight gradient.
  const std::map<std::string, int> freed = FreedAfter(plan);
  EXPECT_EQ(freed.at("z"), Writer(plan.program(), "z@grad"));
  EXPECT_EQ(freed.at("z@grad"), Writer(plan.program(), "w@grad"));
}

// The in_place gradient must stay the logits' last reader: a plan where a
// later op reads z (here the weight gradient, made to read z for z@grad) is
// refused naming both ops, rather than planned with z's buffer reused.
TEST(MemoryPlanTest, AReaderAfterTheInPlaceGradientIsRefused) {
  RankPlan plan = CompileOneDevice(kOneLayer, 8, /*disabled=*/{});
  const int grad = Writer(plan.program(), "z@grad"), weight_grad = Writer(plan.program(), "w@grad");
  ASSERT_GE(grad, 0);
  ASSERT_GT(weight_grad, grad);
  Op* late = plan.mutable_program()->mutable_op(weight_grad);
  for (std::string& in : *late->mutable_input()) {
    if (in == "z@grad") in = "z";
  }
  auto graph = Graph::FromProgram(plan.program());
  ASSERT_TRUE(graph.ok()) << graph.status();
  const auto replanned = PlanMemory(**graph, plan.schedule(), 8);
  ASSERT_FALSE(replanned.ok());
  EXPECT_THAT(replanned.status().message(),
              ::testing::HasSubstr(absl::StrCat("op #", grad, " 'softmax_cross_entropy_grad' writes over 'z' (in_place), "
                                                "but op #", weight_grad, " 'matmul' reads it after")));
}

// And a view of the logits: identity(z) -> zv (sharing z's buffer) made
// before the gradient, read by the weight gradient after it.
TEST(MemoryPlanTest, AViewReadAfterTheInPlaceGradientIsRefused) {
  RankPlan plan = CompileOneDevice(kOneLayer, 8, /*disabled=*/{});
  const int grad = Writer(plan.program(), "z@grad");
  ASSERT_GE(grad, 0);
  Program* p = plan.mutable_program();
  Op view;
  view.set_type("identity");
  view.add_input("z");
  view.add_output("zv");
  view.set_role(p->op(grad).role());
  p->mutable_op()->Add(std::move(view));
  for (int i = p->op_size() - 1; i > grad; --i) p->mutable_op()->SwapElements(i, i - 1);  // just before the gradient
  Var* zv = p->add_var();
  *zv = *std::find_if(p->var().begin(), p->var().end(), [](const Var& v) { return v.name() == "z"; });
  zv->set_name("zv");
  const int weight_grad = Writer(*p, "w@grad");
  for (std::string& in : *p->mutable_op(weight_grad)->mutable_input()) {
    if (in == "z@grad") in = "zv";
  }
  auto graph = Graph::FromProgram(*p);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const auto replanned = PlanMemory(**graph, plan.schedule(), 8);
  ASSERT_FALSE(replanned.ok());
  EXPECT_THAT(replanned.status().message(),
              ::testing::HasSubstr(absl::StrCat("op #", grad + 1, " 'softmax_cross_entropy_grad' writes over 'z' "
                                                "(in_place), but op #", weight_grad, " 'matmul' reads 'zv', a view of "
                                                "it, after")));
}

TEST(MemoryPlanTest, OneDevicePeakMovesToTheWeightGradientForTinyBatches) {
  // At softmax_cross_entropy_grad the live set is 48 bytes a row (x 16 +
  // label 8 + z 12 + z@grad 12) plus loss and loss@grad (8); at the weight
  // gradient's matmul it is x 16 + z@grad 12 a row, plus loss 4 and w@grad
  // 48. Batch 1000: 8 + 48000 against 52 + 28000. Batch 1: 56 against 80.
  EXPECT_EQ(CompileOneDevice(kOneLayer, 1000).memory().activation_peak_bytes(), 8 + 48 * 1000);
  EXPECT_EQ(CompileOneDevice(kOneLayer, 1).memory().activation_peak_bytes(), 16 + 12 + 4 + 48);
}

// Two micro-batches of 2 rows on one device (PipelineStrategy, no devices:
// one rank). Per micro-batch: x 32, label 16, z 24, loss 4, loss@grad 4,
// z@grad 24. The weight gradient goes into the SCRATCH accumulator
// w@grad@acc (matmul_accumulate), persistent like the optimizer state.
TEST(MemoryPlanTest, MicroBatchesOneFOneBHoldOneMicroBatchAndTheEarlierLoss) {
  const std::vector<RankPlan> plans = CompilePipeline(kOneLayer, 2, ONE_F_ONE_B, kApart);
  ASSERT_EQ(plans.size(), 1u);
  const MemoryPlan& m = plans[0].memory();
  // F0 B0 F1 B1 OPT. After B0 only loss(0) 4 is left (the loss lives to the
  // end of the step). B1's softmax_cross_entropy_grad: loss(0) 4 + x 32 +
  // label 16 + z 24 + loss 4 + loss@grad 4 + z@grad 24 = 108.
  EXPECT_EQ(m.activation_peak_bytes(), 108);
  EXPECT_EQ(m.param_bytes(), 48);
  EXPECT_EQ(m.state_bytes(), 48 + 8 + 48);  // w@velocity, @step, w@grad@acc
  EXPECT_EQ(m.peak_bytes(), 108 + 48 + 104);
  EXPECT_EQ(m.planned_batch_size(), 4);
  // The same program order in every micro-batch; the accumulator is never freed.
  const Program& p = plans[0].program();
  const int loss_grad = Writer(p, "z@grad");
  const int accumulate = IndexOf(p, OpsOfType(p, "matmul_accumulate").at(0));
  EXPECT_EQ(FreedAfter(plans[0]), (std::map<std::string, int>{{"z", loss_grad},
                                                               {"label", loss_grad},
                                                               {"loss@grad", loss_grad},
                                                               {"x", accumulate},
                                                               {"z@grad", accumulate},
                                                               {"@lr.F32", Writer(p, "w@velocity")}}));
}

TEST(MemoryPlanTest, MicroBatchesFThenBHoldEveryForwardUntilTheBackwards) {
  const std::vector<RankPlan> plans = CompilePipeline(kOneLayer, 2, F_THEN_B, kApart);
  ASSERT_EQ(plans.size(), 1u);
  // F0 F1 B0 B1 OPT. At B0's softmax_cross_entropy_grad both forwards are
  // alive: micro-batch 1's x 32 + label 16 + z 24 + loss 4 = 76, micro-batch
  // 0's 76 + loss@grad 4 + z@grad 24 = 104: 180.
  EXPECT_EQ(plans[0].memory().activation_peak_bytes(), 180);
  EXPECT_EQ(plans[0].memory().peak_bytes(), 180 + 48 + 104);
}

// Two stages, F64, x @ w on stage 0 and the head on stage 1: h crosses the
// cut forward, h@grad back. Per micro-batch of 2 rows: x 64, h 80, h@grad 80,
// z 48, z@grad 48, label 16, loss 8, loss@grad 8.
constexpr char kTwoStages[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w" dtype: F64 shape: [4, 5] kind: PARAM }
  var { name: "w2" dtype: F64 shape: [5, 3] kind: PARAM }
  op { type: "matmul" input: ["x", "w"] output: ["h"] device: "gpu:0" }
  op { type: "matmul" input: ["h", "w2"] output: ["z"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

TEST(MemoryPlanTest, PipelineStageHoldsSentActivationsUntilTheirSendWaits) {
  const std::vector<RankPlan> plans = CompilePipeline(kTwoStages, 2, ONE_F_ONE_B);
  ASSERT_EQ(plans.size(), 2u);
  const RankPlan& first = plans[0];
  ASSERT_THAT(first.schedule().action(), testing::SizeIs(5));  // F0 F1 B0 B1 OPT
  // Rank 1 takes h(0) as soon as rank 0 sends it (its F0 is waiting), so rank
  // 0 waits for that send at the end of its F0 (action 0); rank 1 takes h(1)
  // only in its F1, after its B0, so rank 0 holds h(1) to the end of its B0
  // (action 2). Channel 0 carries h.
  EXPECT_THAT(SendWaits(first), ElementsAre(Pair(std::make_pair(int64_t{0}, 0), 0),
                                            Pair(std::make_pair(int64_t{0}, 1), 2)));
  // F0: x(0) 64, h(0) 80 -> 144; h(0) goes at F0's end -> 64. F1: x(1) 64,
  // h(1) 80 -> 208 (h(1) held by its send). B0: recv h@grad(0) 80 -> 288,
  // the peak; matmul_accumulate writes the SCRATCH accumulator; x(0) and
  // h@grad(0) go -> 144; h(1) at B0's end -> 64. B1: 144, then 0.
  // Peak = x(0) 64 + x(1) 64 + h(1) 80 + h@grad(0) 80 = 288. label: no reader here, never allocated.
  EXPECT_EQ(first.memory().activation_peak_bytes(), 288);
  EXPECT_EQ(first.memory().param_bytes(), 160);        // w F64[4, 5]
  EXPECT_EQ(first.memory().state_bytes(), 8 + 160);    // @step, w@grad@acc
  EXPECT_EQ(first.memory().peak_bytes(), 288 + 160 + 168);
  // An evaluation holds no send of an earlier forward when one starts (F0's
  // is waited for at F0's end): x 64 + h 80 at the matmul, then x goes.
  EXPECT_EQ(first.memory().eval_peak_bytes(), 144 + 160 + 168);
  const Program& p0 = first.program();
  const int accumulate0 = IndexOf(p0, OpsOfType(p0, "matmul_accumulate").at(0));
  const int send_h = IndexOf(p0, Transfers(p0, "send", "h").at(0));
  // h's last reader on stage 0 is its send: the plan frees the name there,
  // the send keeps the buffer.
  EXPECT_EQ(FreedAfter(first), (std::map<std::string, int>{{"h", send_h},
                                                            {"x", accumulate0},
                                                            {"h@grad", accumulate0},
                                                            {"@lr.F64", Writer(p0, "w")}}));

  const RankPlan& last = plans[1];  // F0 B0 F1 B1 OPT
  // Rank 0 takes h@grad(mb) in its B(mb), which starts as soon as this
  // rank's B(mb) sends it: waited for at the end of B0 (action 1) and B1 (3).
  EXPECT_THAT(SendWaits(last), ElementsAre(Pair(std::make_pair(int64_t{1}, 0), 1),
                                           Pair(std::make_pair(int64_t{1}, 1), 3)));
  // F0: label 16, recv h 80, z 48, loss 8 -> 152. B0: loss@grad 8, z@grad 48
  // -> 208; label, z, loss@grad go -> 136; h@grad 80 -> 216 (held by its
  // send); h and z@grad go -> 88; h@grad at B0's end -> 8, loss(0) is left.
  // F1 -> 160. B1: 168, 216, 144, then h@grad 80 -> 224, the peak:
  // loss(0) 8 + h 80 + loss 8 + z@grad 48 + h@grad 80 = 224.
  EXPECT_EQ(last.memory().activation_peak_bytes(), 224);
  EXPECT_EQ(last.memory().param_bytes(), 120);      // w2 F64[5, 3]
  EXPECT_EQ(last.memory().state_bytes(), 8 + 120);  // @step, w2@grad@acc
  EXPECT_EQ(last.memory().peak_bytes(), 224 + 120 + 128);
  // Its evaluation: label 16 and the received h 80 as it starts, z 48 ->
  // 144, the peak; h goes after the matmul (the backward's matmul_accumulate
  // would read it again) -> 64; loss 8 beside the loss op's F64 row sums
  // (scratch, 8 a row) 16 -> 88.
  EXPECT_EQ(last.memory().eval_peak_bytes(), 144 + 120 + 128);
  const Program& p1 = last.program();
  const int accumulate1 = IndexOf(p1, OpsOfType(p1, "matmul_accumulate").at(0));
  const int send_grad = IndexOf(p1, Transfers(p1, "send", "h@grad").at(0));
  const int loss_grad = Writer(p1, "z@grad");
  // h is read by the forward matmul and again by matmul_accumulate: freed after the second.
  EXPECT_EQ(FreedAfter(last), (std::map<std::string, int>{{"label", loss_grad},
                                                           {"loss@grad", loss_grad},
                                                           {"z", loss_grad},
                                                           {"h@grad", send_grad},
                                                           {"h", accumulate1},
                                                           {"z@grad", accumulate1},
                                                           {"@lr.F64", Writer(p1, "w2")}}));
}

// reshape, flatten, reshape_like and identity return a view of their input
// (kernels/cpu/shape_ops.cc, utility.cc), and the memory plan shares a buffer
// between an op and its input when the op's schema says AliasesInput. None
// of them said so, and the plan counted every view as a new buffer; they
// declare it now.
// Batch 8, F32: every [-1, 4] or [-1, 2, 2] activation is 128 bytes.
//   matmul(x, w) -> h; relu(h) -> r; reshape(r) -> flat (a view of r);
//   reduce_mean(flat) -> loss; fill_like -> loss@grad;
//   broadcast_like(loss@grad, flat) -> flat@grad;
//   reshape_like(flat@grad, r) -> r@grad (a view of flat@grad);
//   relu_grad(r, r@grad) -> h@grad; matmul(x, h@grad) -> w@grad.
// Views shared: the peak is at relu_grad, x 128 + r/flat 128 + loss 4 +
// flat@grad/r@grad 128 + h@grad 128 = 516, which `strata run` measures
// (588 = 516 + w 64 + @step 8). Without the aliasing the plan predicted 520:
// at broadcast_like it counted flat as its own 128 bytes (x + r + flat +
// loss + loss@grad + flat@grad).
TEST(MemoryPlanTest, ViewsShareTheirInputsBuffer) {
  const RankPlan plan = CompileOneDevice(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "w" dtype: F32 shape: [4, 4] kind: PARAM }
    op { type: "matmul" input: ["x", "w"] output: ["h"] }
    op { type: "relu" input: ["h"] output: ["r"] }
    op { type: "reshape" input: ["r"] output: ["flat"] attr { key: "shape" value { list { i: [-1, 2, 2] } } } }
    op { type: "reduce_mean" input: ["flat"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb", 8);
  EXPECT_EQ(plan.memory().activation_peak_bytes(), 516);
}

// A recv's buffer is allocated when its action starts (RecvKernel::Prefetch
// posts the receive there), not where the recv op sits; the plan allocates it
// at the op. Stage 0 sends two activations (h = x w0 and u = x w1), and its
// backward receives their gradients where each is read:
//   recv u@grad; matmul(x, u@grad) -> w1@grad; recv h@grad; matmul(x, h@grad) -> w0@grad.
// One micro-batch of 16 rows, F64: x 512, u@grad 512, h@grad 512, each
// weight's gradient [4, 4] 128. Both recv buffers exist from the backward's
// start, so at the first matmul: 512 + 512 + 512 + 128 = 1664, which
// `strata run --nproc 2` measures (1928 = 1664 + w0 128 + w1 128 + @step 8).
// Counting the second recv only where it sits, the plan would predict 1280
// (at the second matmul), below the measured peak, which broke the memory
// rule's upper bound; it allocates an action's receives at its start.
TEST(MemoryPlanTest, RecvBuffersLiveFromTheirActionsStart) {
  constexpr char kTwoGradientsBack[] = R"pb(
    var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w0" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "w1" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "t0" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "t1" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "matmul" input: ["x", "w0"] output: ["h"] device: "gpu:0" }
    op { type: "matmul" input: ["x", "w1"] output: ["u"] device: "gpu:0" }
    op { type: "matmul" input: ["h", "t0"] output: ["a"] device: "gpu:1" }
    op { type: "matmul" input: ["u", "t1"] output: ["b"] device: "gpu:1" }
    op { type: "add" input: ["a", "b"] output: ["z"] device: "gpu:1" }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(16);
  strategy.mutable_pipeline()->set_accumulate_steps(1);
  auto result = Compile(ParseProgramOrFail(kTwoGradientsBack), strategy, CompileOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->plans[0].memory().activation_peak_bytes(), 1664);
  EXPECT_EQ(result->plans[0].memory().peak_bytes(), 1928);
}

}  // namespace
}  // namespace strata
