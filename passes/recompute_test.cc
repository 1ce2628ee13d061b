#include "passes/recompute.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "compiler/pass.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"
#include "proto/mesh.h"

namespace strata {
namespace {

using ::google::protobuf::util::MessageDifferencer;

// Four layers on one device: a_k = h_{k-1} @ w_k, h_k = relu(a_k), the
// head z = h3 @ w4 and the loss. Backward reads h1, h2, h3 (each twice: the
// next matmul's weight gradient and relu_grad, which reads the output) and x;
// never a1, a2, a3.
constexpr char kChain[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w1" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w2" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w3" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w4" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w1"] output: ["a1"] }
  op { type: "relu" input: ["a1"] output: ["h1"] }
  op { type: "matmul" input: ["h1", "w2"] output: ["a2"] }
  op { type: "relu" input: ["a2"] output: ["h2"] }
  op { type: "matmul" input: ["h2", "w3"] output: ["a3"] }
  op { type: "relu" input: ["a3"] output: ["h3"] }
  op { type: "matmul" input: ["h3", "w4"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// Two stages. Stage 0: h1 = relu(x @ w1) (the checkpoint), r2 =
// relu(h1 @ w2), h2 = r2 @ w3, which stage 1 reads. Stage 1: r3 =
// relu(h2), h4 = r3 @ w4 (the checkpoint), r5 = relu(h4), z = r5 @ w5 and
// the loss. Segments: [a1, h1] | [a2, r2, h2] (ended by the stage change) |
// [r3, h4] | [r5, z, loss].
constexpr char kTwoStages[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w1" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w2" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w3" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w4" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w5" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w1"] output: ["a1"] device: "gpu:0" }
  op { type: "relu" input: ["a1"] output: ["h1"] device: "gpu:0" }
  op { type: "matmul" input: ["h1", "w2"] output: ["a2"] device: "gpu:0" }
  op { type: "relu" input: ["a2"] output: ["r2"] device: "gpu:0" }
  op { type: "matmul" input: ["r2", "w3"] output: ["h2"] device: "gpu:0" }
  op { type: "relu" input: ["h2"] output: ["r3"] device: "gpu:1" }
  op { type: "matmul" input: ["r3", "w4"] output: ["h4"] device: "gpu:1" }
  op { type: "relu" input: ["h4"] output: ["r5"] device: "gpu:1" }
  op { type: "matmul" input: ["r5", "w5"] output: ["z"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// A second input's branch joins after the checkpoint c: s = x2 @ ws is made
// in c's segment (before c in program order) and read in the next one
// (e = d + s). c still cuts the graph: the feeds it depends on (x) reach the
// loss only through it. The next segment [d, e, r, h] is recomputed to give
// back r, and its re-emitted add reads s from the earlier segment.
constexpr char kSideInput[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "x2" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w1" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "ws" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w2" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w3" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w4" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w1"] output: ["a"] }
  op { type: "matmul" input: ["x2", "ws"] output: ["s"] }
  op { type: "relu" input: ["a"] output: ["c"] }
  op { type: "matmul" input: ["c", "w2"] output: ["d"] }
  op { type: "add" input: ["d", "s"] output: ["e"] }
  op { type: "relu" input: ["e"] output: ["r"] }
  op { type: "matmul" input: ["r", "w3"] output: ["h"] }
  op { type: "matmul" input: ["h", "w4"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// A residual block: h1 = h0 + relu(h0 @ w1). Its inner var r is bypassed by
// the skip, so it does not cut; h0 and h1 do. `side` feeds nothing.
constexpr char kResidual[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w0" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w1" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w2" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w0"] output: ["h0"] }
  op { type: "matmul" input: ["h0", "w1"] output: ["a"] }
  op { type: "relu" input: ["a"] output: ["r"] }
  op { type: "add" input: ["h0", "r"] output: ["h1"] }
  op { type: "relu" input: ["h0"] output: ["side"] }
  op { type: "matmul" input: ["h1", "w2"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

Strategy Recompute(const std::vector<std::string>& checkpoints, Strategy strategy = Strategy()) {
  for (const std::string& c : checkpoints) strategy.mutable_recompute()->add_checkpoints(c);
  return strategy;
}

// The whole program after `pass` (recompute and the passes before it run on
// the whole program, before the per-rank split).
Program After(const std::string& pass, const std::string& text, const Strategy& strategy) {
  CompileOptions options;
  if (!strategy.has_pipeline()) options.batch_size = 8;
  options.dump_after = pass;
  auto result = Compile(ParseProgramOrFail(text), strategy, options);
  if (!result.ok()) {
    ADD_FAILURE() << result.status();
    return Program();
  }
  return result->dumped;
}

std::vector<std::string> Inputs(const Op& op) { return {op.input().begin(), op.input().end()}; }
std::vector<std::string> Outputs(const Op& op) { return {op.output().begin(), op.output().end()}; }

// The ops that read `var`, in program order.
std::vector<const Op*> Readers(const Program& p, const std::string& var) {
  std::vector<const Op*> readers;
  for (const Op& op : p.op()) {
    for (const std::string& in : op.input()) {
      if (in == var) {
        readers.push_back(&op);
        break;
      }
    }
  }
  return readers;
}

// The single op writing `var`; fails the test (and returns nullptr) otherwise.
const Op* Writer(const Program& p, const std::string& var) {
  std::vector<const Op*> writers = OpsWriting(p, var);
  if (writers.size() != 1) {
    ADD_FAILURE() << writers.size() << " ops write '" << var << "'";
    return nullptr;
  }
  return writers[0];
}

// Checks that `var@recompute` is written once, by a BACKWARD clone of the
// forward op that writes `var` (same type, uid and attrs), and that every
// backward reader of `var` from the first one on reads the copy instead.
void ExpectRecomputed(const Program& p, const std::string& var) {
  SCOPED_TRACE(var);
  const std::string copy = var + "@recompute";
  const Op* original = Writer(p, var);
  const Op* clone = Writer(p, copy);
  ASSERT_NE(original, nullptr);
  ASSERT_NE(clone, nullptr);
  EXPECT_EQ(original->role(), FORWARD);
  EXPECT_EQ(clone->role(), BACKWARD);
  EXPECT_EQ(clone->type(), original->type());
  EXPECT_EQ(clone->uid(), original->uid());
  EXPECT_EQ(clone->stage(), original->stage());
  EXPECT_EQ(clone->attr().size(), original->attr().size());
  ASSERT_NE(FindVar(p, copy), nullptr);
  EXPECT_EQ(FindVar(p, copy)->kind(), ACTIVATION);
  EXPECT_EQ(FindVar(p, copy)->dtype(), FindVar(p, var)->dtype());
  EXPECT_EQ(std::vector<int64_t>(FindVar(p, copy)->shape().begin(), FindVar(p, copy)->shape().end()),
            std::vector<int64_t>(FindVar(p, var)->shape().begin(), FindVar(p, var)->shape().end()));
  for (const Op* r : Readers(p, var)) {
    EXPECT_NE(r->role(), BACKWARD) << "a backward op reads the original: " << r->ShortDebugString();
  }
  EXPECT_FALSE(Readers(p, copy).empty());
  for (const Op* r : Readers(p, copy)) {
    EXPECT_EQ(r->role(), BACKWARD) << r->ShortDebugString();
    EXPECT_GT(IndexOf(p, r), IndexOf(p, clone));
  }
}

// The clones writing `vars`@recompute sit together, in that order, right
// before the first op outside them that reads one of their outputs: a
// backward op.
void ExpectClonesRightBeforeFirstReader(const Program& p, const std::vector<std::string>& vars) {
  ASSERT_FALSE(vars.empty());
  const Op* first = Writer(p, vars[0] + "@recompute");
  ASSERT_NE(first, nullptr);
  const int start = IndexOf(p, first);
  for (size_t k = 0; k < vars.size(); ++k) {
    ASSERT_LT(start + static_cast<int>(k), p.op_size());
    EXPECT_EQ(Outputs(p.op(start + k)), std::vector<std::string>{vars[k] + "@recompute"}) << "op #" << start + k;
  }
  // The op right after the clones is the first reader of any of them from
  // outside the group.
  const int after = start + static_cast<int>(vars.size());
  ASSERT_LT(after, p.op_size());
  int first_reader = p.op_size();
  for (const std::string& v : vars) {
    for (const Op* r : Readers(p, v + "@recompute")) {
      if (IndexOf(p, r) >= after) first_reader = std::min(first_reader, IndexOf(p, r));
    }
  }
  EXPECT_EQ(first_reader, after);
  EXPECT_EQ(p.op(after).role(), BACKWARD);
}

int CountRecomputeVars(const Program& p) {
  int n = 0;
  for (const Var& v : p.var()) n += absl::EndsWith(v.name(), "@recompute");
  return n;
}

TEST(RecomputePassTest, RecomputesTheSegmentBeforeACheckpoint) {
  // Checkpoint h2: segments [a1, h1, a2, h2] and [a3, h3, z, loss]. Backward
  // reads h1 of the first (matmul w2's gradient and relu_grad): x @ w1 and
  // relu are re-emitted. a2 is never read by backward, h2 is the checkpoint.
  const Program before = After("autodiff", kChain, Recompute({"h2"}));
  const Program p = After("recompute", kChain, Recompute({"h2"}));
  EXPECT_EQ(p.op_size(), before.op_size() + 2);
  EXPECT_EQ(CountRecomputeVars(p), 2);
  ExpectRecomputed(p, "h1");
  ExpectClonesRightBeforeFirstReader(p, {"a1", "h1"});
  const Op* a1 = Writer(p, "a1@recompute");
  const Op* h1 = Writer(p, "h1@recompute");
  ASSERT_NE(a1, nullptr);
  ASSERT_NE(h1, nullptr);
  EXPECT_EQ(a1->type(), "matmul");
  EXPECT_EQ(Inputs(*a1), (std::vector<std::string>{"x", "w1"}));
  EXPECT_EQ(Inputs(*h1), std::vector<std::string>{"a1@recompute"});
  EXPECT_EQ(h1->uid(), 1);
  // The first backward reader is w2's gradient (h1^T @ da2), then relu_grad.
  const std::vector<const Op*> readers = Readers(p, "h1@recompute");
  ASSERT_EQ(readers.size(), 2u);
  EXPECT_EQ(readers[0]->type(), "matmul");
  EXPECT_EQ(Outputs(*readers[0]), std::vector<std::string>{"w2@grad"});
  EXPECT_EQ(readers[1]->type(), "relu_grad");
  // The forward still makes h1 for a2; only it reads the original.
  const std::vector<const Op*> forward_readers = Readers(p, "h1");
  ASSERT_EQ(forward_readers.size(), 1u);
  EXPECT_EQ(Outputs(*forward_readers[0]), std::vector<std::string>{"a2"});
  // The checkpoint and the loss's segment are read as they are.
  EXPECT_FALSE(HasVar(p, "h2@recompute"));
  EXPECT_FALSE(HasVar(p, "h3@recompute"));
  EXPECT_FALSE(HasVar(p, "a3@recompute"));
  EXPECT_FALSE(HasVar(p, "z@recompute"));
  EXPECT_EQ(Readers(p, "h3").size(), Readers(before, "h3").size());
  EXPECT_EQ(Readers(p, "h2").size(), Readers(before, "h2").size());
}

TEST(RecomputePassTest, CheckpointsCutTheSegments) {
  // Checkpoints h1 and h3: [a1, h1] has nothing backward reads but the
  // checkpoint and x; [a2, h2, a3, h3] re-emits a2 and h2 from h1, read
  // under its own name; [z, loss] is the loss's.
  const Program p = After("recompute", kChain, Recompute({"h1", "h3"}));
  EXPECT_EQ(CountRecomputeVars(p), 2);
  ExpectRecomputed(p, "h2");
  ExpectClonesRightBeforeFirstReader(p, {"a2", "h2"});
  const Op* a2 = Writer(p, "a2@recompute");
  ASSERT_NE(a2, nullptr);
  EXPECT_EQ(Inputs(*a2), (std::vector<std::string>{"h1", "w2"}));
  EXPECT_EQ(a2->uid(), 2);
  EXPECT_FALSE(HasVar(p, "a1@recompute"));
  EXPECT_FALSE(HasVar(p, "h1@recompute"));
  EXPECT_FALSE(HasVar(p, "a3@recompute"));
  EXPECT_FALSE(HasVar(p, "h3@recompute"));
  // Every checkpoint between two segments: one clone group per segment.
  const Program every = After("recompute", kChain, Recompute({"h1", "h2", "h3"}));
  EXPECT_EQ(CountRecomputeVars(every), 0);
  EXPECT_EQ(every.op_size(), After("autodiff", kChain, Recompute({"h1", "h2", "h3"})).op_size());
}

TEST(RecomputePassTest, StageChangesCutTheSegmentsAndVarsAnotherStageReadsAreKept) {
  // Stage 0's [a2, r2, h2] ends at the stage change: r2 (h2's matmul
  // gradient reads it) is remade from h1; h2, which stage 1 reads, is not.
  // Stage 1's [r3, h4] remakes r3 from h2 on its own, right before h4's
  // weight gradient; [r5, z, loss] is the loss's.
  const Strategy strategy = Recompute({"h1", "h4"}, PipelineStrategy(2));
  const Program p = After("recompute", kTwoStages, strategy);
  EXPECT_EQ(CountRecomputeVars(p), 3);
  ExpectRecomputed(p, "r2");
  ExpectRecomputed(p, "r3");
  ExpectClonesRightBeforeFirstReader(p, {"a2", "r2"});
  ExpectClonesRightBeforeFirstReader(p, {"r3"});
  EXPECT_FALSE(HasVar(p, "h2@recompute"));
  EXPECT_FALSE(HasVar(p, "r5@recompute"));
  EXPECT_FALSE(HasVar(p, "a1@recompute"));
  const Op* a2 = Writer(p, "a2@recompute");
  const Op* r3 = Writer(p, "r3@recompute");
  ASSERT_NE(a2, nullptr);
  ASSERT_NE(r3, nullptr);
  EXPECT_EQ(a2->stage(), 0);
  EXPECT_EQ(Inputs(*a2), (std::vector<std::string>{"h1", "w2"}));
  EXPECT_EQ(r3->stage(), 1);
  EXPECT_EQ(Inputs(*r3), std::vector<std::string>{"h2"});
  // Backward runs stage 1's segment first: r3's clone comes before r2's.
  EXPECT_LT(IndexOf(p, r3), IndexOf(p, a2));
  // The split program of each rank still runs: both ranks' plans compile.
  CompileOptions options;
  auto compiled = Compile(ParseProgramOrFail(kTwoStages), strategy, options);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ASSERT_EQ(compiled->plans.size(), 2u);
  EXPECT_TRUE(HasVar(compiled->plans[0].program(), "r2@recompute"));
  EXPECT_FALSE(HasVar(compiled->plans[0].program(), "r3@recompute"));
  EXPECT_TRUE(HasVar(compiled->plans[1].program(), "r3@recompute"));
}

TEST(RecomputePassTest, AVarARecomputedOpReadsFromAnotherSegmentIsKept) {
  // Checkpoints c and h: [a, s, c] | [d, e, r, h] | [z, loss]. r (read by
  // h's weight gradient) is remade by d, e and r again; the re-emitted add
  // reads s, which the first segment made, under its own name.
  const Program p = After("recompute", kSideInput, Recompute({"c", "h"}));
  EXPECT_EQ(CountRecomputeVars(p), 3);
  ExpectRecomputed(p, "r");
  ExpectClonesRightBeforeFirstReader(p, {"d", "e", "r"});
  const Op* e = Writer(p, "e@recompute");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->type(), "add");
  EXPECT_EQ(Inputs(*e), (std::vector<std::string>{"d@recompute", "s"}));
  EXPECT_EQ(Inputs(*Writer(p, "d@recompute")), (std::vector<std::string>{"c", "w2"}));
  EXPECT_FALSE(HasVar(p, "s@recompute"));
  EXPECT_FALSE(HasVar(p, "a@recompute"));
  EXPECT_FALSE(HasVar(p, "c@recompute"));
  // s is read by its forward reader and by the clone, nothing else.
  const std::vector<const Op*> s_readers = Readers(p, "s");
  ASSERT_EQ(s_readers.size(), 2u);
  EXPECT_EQ(s_readers[0]->role(), FORWARD);
  EXPECT_EQ(s_readers[1], e);
}

TEST(RecomputePassTest, NoCheckpointsLeaveTheProgramUnchanged) {
  Program program = After("autodiff", kChain, Strategy());
  const Program original = program;
  CompileContext ctx;
  auto mesh = Mesh::Create({{"dp", 1}, {"pp", 1}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ctx.mesh = *mesh;
  auto changed = RunOnProgram(RecomputePass(), program, ctx);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
  EXPECT_TRUE(MessageDifferencer::Equals(program, original));
  // Compile leaves the pass out.
  EXPECT_EQ(absl::c_count(CompilePassNames(Strategy()), "recompute"), 0);
  EXPECT_EQ(absl::c_count(CompilePassNames(Recompute({"h2"})), "recompute"), 1);
}

TEST(RecomputePassTest, RunOnItsOwnMatchesTheCompiledProgram) {
  const Strategy strategy = Recompute({"h2"});
  Program program = After("autodiff", kChain, strategy);
  CompileContext ctx;
  auto mesh = Mesh::Create({{"dp", 1}, {"pp", 1}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ctx.mesh = *mesh;
  ctx.strategy = strategy;
  auto changed = RunOnProgram(RecomputePass(), program, ctx);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_TRUE(MessageDifferencer::Equals(program, After("recompute", kChain, strategy)));
}

absl::Status Check(const std::string& text, const std::vector<std::string>& checkpoints) {
  return CheckRecomputeCheckpoints(ParseProgramOrFail(text), checkpoints);
}

TEST(CheckRecomputeCheckpointsTest, AcceptsVarsThatCutTheGraph) {
  EXPECT_TRUE(Check(kChain, {"a1", "h1", "h2", "a3", "h3", "z"}).ok());
  EXPECT_TRUE(Check(kResidual, {"h0", "h1"}).ok());
  EXPECT_TRUE(Check(kSideInput, {"c", "h"}).ok());
}

TEST(CheckRecomputeCheckpointsTest, RefusesAVarNotOnTheWayToTheLoss) {
  EXPECT_EQ(Check(kResidual, {"h0", "side"}).message(),
            "var 'side' is not on the way to the loss 'loss': it cuts nothing");
}

TEST(CheckRecomputeCheckpointsTest, RefusesTheLossItself) {
  EXPECT_EQ(Check(kChain, {"loss"}).message(), "var 'loss' is the loss itself");
}

TEST(CheckRecomputeCheckpointsTest, RefusesAVarAResidualBranchBypasses) {
  // x reaches the loss over the skip h0 -> h1 without the block's inner
  // vars. The var named is the one where the way around rejoins when the
  // joining op reads the checkpoint itself (h1 = h0 + r), else the first
  // var after the feed on the way around (h0).
  EXPECT_EQ(std::string(Check(kResidual, {"r"}).message()),
            "var 'r' does not cut the graph: the loss 'loss' is reached from feed 'x' without it (through 'h1')");
  EXPECT_EQ(std::string(Check(kResidual, {"h0", "a", "h1"}).message()),
            "var 'a' does not cut the graph: the loss 'loss' is reached from feed 'x' without it (through 'h0')");
  // A checkpoint cuts the paths of the feeds it depends on: s = x2 @ ws is
  // the only way from x2 to the loss, so it is accepted though x's path
  // never meets it.
  EXPECT_TRUE(Check(kSideInput, {"s"}).ok());
}

}  // namespace
}  // namespace strata
