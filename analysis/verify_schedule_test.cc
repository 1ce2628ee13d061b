#include "analysis/verify_schedule.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "analysis/schedule.h"
#include "compiler/program_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/testing/pass_test_util.h"
#include "proto/mesh.h"
#include "proto/roles.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

// The three-stage program with a skip connection, compiled with `kind`.
std::vector<RankPlan> Plans(ScheduleKind kind, int micro_batches) {
  return CompilePipeline(kThreeStagesWithSkip, micro_batches, kind);
}

TEST(VerifyScheduleTest, CompiledSchedulesVerify) {
  for (ScheduleKind kind : {ONE_F_ONE_B, F_THEN_B}) {
    for (int mbs : {1, 3, 5}) EXPECT_TRUE(VerifySchedules(Plans(kind, mbs)).ok());
  }
}

TEST(VerifyScheduleTest, SkipConnectionsSendToEveryLaterReader) {
  // h0 is produced on stage 0 and read on stages 1 and 2: two channels from rank 0.
  std::vector<RankPlan> plans = Plans(ONE_F_ONE_B, 2);
  EXPECT_EQ(Transfers(plans[0].program(), "send", "h0").size(), 2u);
  // h0's gradient comes back from stages 1 and 2.
  EXPECT_EQ(OpsOfType(plans[0].program(), "recv").size(), 2u);
}

TEST(VerifyScheduleTest, ReportsTheCycleOfAScheduleThatWouldHang) {
  std::vector<RankPlan> plans = Plans(ONE_F_ONE_B, 2);
  // Rank 1 runs its backwards before its forwards: it waits for a gradient of
  // micro-batch 0 that rank 2 can only produce after rank 1's forward.
  Schedule broken;
  broken.set_kind(ONE_F_ONE_B);
  broken.set_micro_batches(2);
  for (Action::Kind kind : {Action::BACKWARD, Action::FORWARD}) {
    for (int mb = 0; mb < 2; ++mb) {
      Action* a = broken.add_action();
      a->set_kind(kind);
      a->set_micro_batch(mb);
    }
  }
  broken.add_action()->set_kind(Action::OPTIMIZE);
  *plans[1].mutable_schedule() = broken;
  absl::Status s = VerifySchedules(plans);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("would hang"));
  EXPECT_THAT(s.message(), HasSubstr("rank 1 in B0 waits to receive"));
  EXPECT_THAT(s.message(), HasSubstr("from rank 2"));
}

TEST(VerifyScheduleTest, RejectsARecvOfAnotherShape) {
  std::vector<RankPlan> plans = Plans(F_THEN_B, 2);
  for (Var& v : *plans[1].mutable_program()->mutable_var()) {
    if (v.name() == "h0") v.set_shape(1, 5);
  }
  absl::Status s = VerifySchedules(plans);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("sends F64[-1, 4]"));
  EXPECT_THAT(s.message(), HasSubstr("receives F64[-1, 5]"));
}

TEST(VerifyScheduleTest, RejectsASendNobodyReceives) {
  std::vector<RankPlan> plans = Plans(F_THEN_B, 1);
  // Drop rank 1's receive of h0.
  Program* p = plans[1].mutable_program();
  for (int i = 0; i < p->op_size(); ++i) {
    if (p->op(i).type() == "recv" && p->op(i).channel().var() == "h0") {
      p->mutable_op()->DeleteSubrange(i, 1);
      break;
    }
  }
  absl::Status s = VerifySchedules(plans);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'h0'"));
  EXPECT_THAT(s.message(), HasSubstr("no rank receives it"));
}

TEST(VerifyScheduleTest, TimelineBubbleMatchesTheFormula) {
  auto program = ParseProgramText(kThreeStagesWithSkip, "skip.pbtxt");
  ASSERT_TRUE(program.ok());
  for (int mbs : {3, 6}) {
    Timeline t = SimulateTimeline(Plans(F_THEN_B, mbs));
    EXPECT_NEAR(t.bubble[0], IdealBubbleFraction(3, mbs), 1e-9) << mbs;
  }
}

TEST(VerifyScheduleTest, ASlowerStageWidensTheOthersBubbles) {
  std::vector<RankPlan> plans = Plans(ONE_F_ONE_B, 6);
  // Stage 1 does three times the others' work: it is never idle in steady
  // state and the others wait on it.
  Timeline even = SimulateTimeline(plans, {{1, 2}, {1, 2}, {1, 2}});
  Timeline slow = SimulateTimeline(plans, {{1, 2}, {3, 6}, {1, 2}});
  EXPECT_NEAR(even.bubble[0], IdealBubbleFraction(3, 6), 1e-9);
  EXPECT_LT(slow.bubble[1], even.bubble[1]);
  EXPECT_GT(slow.bubble[0], even.bubble[0] + 0.2);
  EXPECT_GT(slow.bubble[2], even.bubble[2] + 0.2);
  // The makespan is the slow stage's own work (6 micro-batches x 9 units)
  // after stage 0's first forward and before its last backward: the slow
  // stage never waits on the fast last stage.
  EXPECT_NEAR(slow.makespan, 1 + 6 * 9 + 2, 1e-9);
}

TEST(VerifyScheduleTest, TheTimelineOfATiedWeightPlacesEveryAction) {
  // Stage 2 sends its part of w0's gradient to stage 0 and takes the sum
  // back in the optimizer action (passes/pipeline_split.cc), so the
  // backwards do not wait for each other: stage 0's B0 starts after stage
  // 2's has ended (its h0@grad comes through stage 1), under gradient merge
  // too (each stage sums its part over the k steps of an update).
  for (const bool merge : {false, true}) {
  for (ScheduleKind kind : {ONE_F_ONE_B, F_THEN_B}) {
    SCOPED_TRACE(merge ? "gradient merge" : "no gradient merge");
    Strategy strategy = PipelineStrategy(4, kind);
    if (merge) strategy.mutable_gradient_merge()->set_k_steps(2);
    auto compiled = Compile(ParseProgramOrFail(kThreeStagesWithTiedWeight), strategy, CompileOptions());
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    std::vector<RankPlan> plans = compiled->plans;
    ASSERT_EQ(plans.size(), 3u);
    ASSERT_TRUE(VerifySchedules(plans).ok());
    Timeline t = SimulateTimeline(plans);
    for (size_t r = 0; r < t.ranks.size(); ++r) {
      for (const Timeline::Slot& slot : t.ranks[r]) {
        EXPECT_GE(slot.start, 0) << "rank " << r << " never runs an action of kind " << slot.action.kind();
        EXPECT_GE(slot.end, slot.start) << r;
      }
      EXPECT_GE(t.bubble[r], 0) << r;
      EXPECT_LT(t.bubble[r], 1) << r;
    }
    // One row a rank, each drawing the forward (digit) and backward (letter) of all 4 micro-batches.
    const std::string diagram = t.Diagram();
    std::vector<std::string> rows = absl::StrSplit(diagram, '\n', absl::SkipEmpty());
    ASSERT_EQ(rows.size(), 3u) << diagram;
    for (const std::string& row : rows) {
      for (char c : std::string("0123abcd")) EXPECT_NE(row.find(c), std::string::npos) << c << " in\n" << diagram;
    }
    // Stage 2's B0 starts first and ends only after stage 0's B0 has begun.
    auto backward0 = [&](int rank) {
      for (const Timeline::Slot& slot : t.ranks[rank]) {
        if (slot.action.kind() == Action::BACKWARD && slot.action.micro_batch() == 0) return slot;
      }
      return Timeline::Slot{};
    };
    EXPECT_LT(backward0(2).start, backward0(0).start);
    EXPECT_LE(backward0(2).end, backward0(0).start);
  }
  }
}

// A weight tied across two stages whose gradient has one path: t is read
// on stage 0 by the first matmul (all of its gradient) and on stage 1 only
// for a fetched mean.
inline constexpr char kOnePathForward[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "t" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w2" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "t"] output: ["h0"] device: "gpu:0" }
  op { type: "reduce_mean" input: ["t"] output: ["tm"] device: "gpu:1" }
  op { type: "matmul" input: ["h0", "w2"] output: ["z"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
  loss: "loss"
  fetch: "tm"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// NCCL matches the messages from one rank to another by issue order: a GPU
// plan must receive each peer's messages in the order the peer sends them.
// Two weights tied across two stages exchange their gradients in the
// optimizer action in one order on both ends, with or without gradient
// merge, and so does a weight tied across the stages whose gradient has one
// path (its sum of one part moved to the update): every plan compiles.
TEST(VerifyScheduleTest, GpuPlansReceiveEachPairsMessagesInTheOrderTheyAreSent) {
  constexpr char kTwoTied[] = R"pb(
    var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "a" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "b" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "w2" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "matmul" input: ["x", "a"] output: ["h0"] device: "gpu:0" }
    op { type: "matmul" input: ["h0", "b"] output: ["h1"] device: "gpu:0" }
    op { type: "matmul" input: ["h1", "b"] output: ["h2"] device: "gpu:1" }
    op { type: "matmul" input: ["h2", "a"] output: ["h3"] device: "gpu:1" }
    op { type: "matmul" input: ["h3", "w2"] output: ["z"] device: "gpu:1" }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  for (const char* text : {kTwoTied, kOnePathForward}) {
    for (const bool merge : {false, true}) {
      for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
        SCOPED_TRACE(absl::StrCat(text == kTwoTied ? "two tied weights, " : "one path, ",
                                  merge ? "gradient merge, " : "", DeviceKind_Name(device)));
        Strategy strategy = PipelineStrategy(2);
        if (merge) strategy.mutable_gradient_merge()->set_k_steps(2);
        CompileOptions options;
        options.device_kind = device;
        auto compiled = Compile(ParseProgramOrFail(text), strategy, options);
        EXPECT_TRUE(compiled.ok()) << compiled.status();
      }
    }
  }
}

// The check itself, on the one-path program's plans with its tied gradient's
// exchange put back in the backward, as the pipeline split left it before
// 2026-11-28: under 1F1B the home's next forward has sent its activation on
// the pair before the gradient the replica waits for in its backward. Over
// Gloo (matching by tag) that runs; a GPU plan is refused, naming both
// messages.
TEST(VerifyScheduleTest, RefusesAGpuPlanWhosePairsMessagesCross) {
  for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
    SCOPED_TRACE(DeviceKind_Name(device));
    CompileOptions options;
    options.device_kind = device;
    auto compiled = Compile(ParseProgramOrFail(kOnePathForward), PipelineStrategy(2), options);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    std::vector<RankPlan> plans = compiled->plans;
    ASSERT_EQ(plans.size(), 2u);
    EXPECT_TRUE(VerifySchedules(plans).ok());
    int moved = 0;
    for (RankPlan& plan : plans) {
      for (Op& op : *plan.mutable_program()->mutable_op()) {
        const bool sum = op.type() == "add_n" && op.output_size() == 1 && op.output(0) == "t@grad";
        if (sum || (op.has_channel() && op.channel().var() == "t@grad")) {
          op.set_role(BACKWARD);
          ++moved;
        }
      }
    }
    ASSERT_EQ(moved, 3);  // the home's sum and send, the replica's receive
    absl::Status status = VerifySchedules(plans);
    if (device == DEVICE_CPU) {
      EXPECT_TRUE(status.ok()) << status;
      continue;
    }
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.message().find("NCCL matches a pair's messages in the order they are issued"), std::string::npos)
        << status;
    EXPECT_NE(status.message().find("rank 0's message 2 to rank 1"), std::string::npos) << status;
  }
}

TEST(VerifyScheduleTest, CompiledPlansCarryTheCostModelsEstimate) {
  std::vector<RankPlan> plans = Plans(ONE_F_ONE_B, 3);
  for (const RankPlan& p : plans) {
    EXPECT_GT(p.memory().forward_cost(), 0) << p.rank();
    EXPECT_GT(p.memory().backward_cost(), p.memory().forward_cost()) << p.rank();
  }
  // The last stage runs two matmuls' worth (the add and the head), the
  // middle one one: the timeline the compiler used weighs them so.
  std::vector<std::pair<double, double>> costs;
  for (const RankPlan& p : plans) costs.push_back({p.memory().forward_cost(), p.memory().backward_cost()});
  Timeline t = SimulateTimeline(plans, costs);
  for (const RankPlan& p : plans) EXPECT_DOUBLE_EQ(p.memory().bubble_fraction(), t.bubble[p.rank()]);
}

// Each rank's sends, (channel id, micro-batch) -> the index of the action that posts it.
std::vector<std::map<std::pair<int64_t, int>, int>> SendActions(const std::vector<RankPlan>& plans) {
  std::vector<std::map<std::pair<int64_t, int>, int>> out(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    const Schedule& schedule = plans[r].schedule();
    for (int a = 0; a < schedule.action_size(); ++a) {
      const Action& action = schedule.action(a);
      for (const Op& op : plans[r].program().op()) {
        if (op.type() != "send" || !ActionRuns(action.kind(), op.role())) continue;
        out[r][{op.channel().id(), action.kind() == Action::OPTIMIZE ? 0 : action.micro_batch()}] = a;
      }
    }
  }
  return out;
}

TEST(VerifyScheduleTest, ASendWaitThatWouldCloseACycleGoesOneActionLater) {
  // Every send waited for at the end of the action that posts it. Under 1F1B
  // rank 1 then waits at the end of F1 for rank 2 to start F1, while rank 2
  // waits at the end of B0 for rank 1 to start B0: the tie of two equal
  // stages on the timeline. Rank 1's wait moves to the end of B0.
  std::vector<RankPlan> plans = Plans(ONE_F_ONE_B, 3);
  ASSERT_TRUE(VerifySchedules(plans).ok());
  std::vector<std::map<std::pair<int64_t, int>, int>> sends = SendActions(plans);
  std::vector<std::map<std::pair<int64_t, int>, int>> releases = sends;
  ASSERT_TRUE(DeferDeadlockingSendWaits(plans, &releases).ok());
  ASSERT_EQ(Transfers(plans[1].program(), "send", "h1").size(), 1u);
  const int64_t h1 = Transfers(plans[1].program(), "send", "h1")[0]->channel().id();
  ASSERT_EQ(plans[1].schedule().action(1).kind(), Action::FORWARD);
  EXPECT_EQ(sends[1].at({h1, 1}), 1);
  EXPECT_EQ(releases[1].at({h1, 1}), 2);
  for (size_t r = 0; r < plans.size(); ++r) {
    ASSERT_EQ(releases[r].size(), sends[r].size()) << r;
    for (const auto& [key, action] : sends[r]) {
      EXPECT_GE(releases[r].at(key), action) << "rank " << r << " channel " << key.first << " mb " << key.second;
    }
  }
  // Waiting at the end of the step never closes a cycle: nothing moves.
  std::vector<std::map<std::pair<int64_t, int>, int>> at_end(plans.size());
  ASSERT_TRUE(DeferDeadlockingSendWaits(plans, &at_end).ok());
  for (size_t r = 0; r < plans.size(); ++r) {
    for (const auto& [key, action] : sends[r]) EXPECT_EQ(at_end[r].at(key), plans[r].schedule().action_size() - 1);
  }
}

// The compiled plans list a wait for every send, no earlier than the send.
TEST(VerifyScheduleTest, CompiledPlansWaitForEverySend) {
  for (ScheduleKind kind : {ONE_F_ONE_B, F_THEN_B}) {
    for (const char* text : {kThreeStagesWithSkip, kThreeStagesWithTiedWeight}) {
      std::vector<RankPlan> plans = CompilePipeline(text, 4, kind);
      std::vector<std::map<std::pair<int64_t, int>, int>> sends = SendActions(plans);
      for (size_t r = 0; r < plans.size(); ++r) {
        std::map<std::pair<int64_t, int>, int> waits;
        for (const auto& w : plans[r].memory().send_waits()) waits[{w.channel(), w.micro_batch()}] = w.action();
        ASSERT_EQ(waits.size(), sends[r].size()) << r;
        for (const auto& [key, action] : sends[r]) {
          ASSERT_TRUE(waits.count(key)) << r;
          EXPECT_GE(waits.at(key), action) << r;
          EXPECT_LT(waits.at(key), plans[r].schedule().action_size()) << r;
        }
      }
    }
  }
}

// The ranks of a group must enter its collectives in the same order: a rank
// that skips the pipeline's clip-norm allreduce (or reduces another tensor)
// is a compile error showing both sequences.
TEST(VerifyScheduleTest, RanksOfAGroupEnterTheSameCollectives) {
  std::vector<RankPlan> plans =
      CompilePipeline(TwoStagesProgram(R"pb(optimizer { sgd { learning_rate: 0.1 } clip_global_norm: 1 })pb"), 2);
  ASSERT_EQ(plans.size(), 2u);
  ASSERT_TRUE(VerifySchedules(plans).ok());

  std::vector<RankPlan> skipping = plans;
  Program* p = skipping[1].mutable_program();
  for (int i = 0; i < p->op_size(); ++i) {
    if (p->op(i).type() == "allreduce") p->mutable_op(i)->clear_group();
  }
  absl::Status s = VerifySchedules(skipping);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("enter different collectives"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0: allreduce F64[] (OPT); rank 1: none"));
}

// A collective blocks until its communicator's members reach it, so it
// takes part in the joint run with send/recv: rank 1 entering the clip-norm
// allreduce before its forwards waits there for rank 0, which waits for rank
// 1's first gradient.
TEST(VerifyScheduleTest, ACollectiveThatWaitsOnAReceiverHangs) {
  std::vector<RankPlan> plans =
      CompilePipeline(TwoStagesProgram(R"pb(optimizer { sgd { learning_rate: 0.1 } clip_global_norm: 1 })pb"), 2);
  ASSERT_EQ(plans.size(), 2u);
  Schedule* schedule = plans[1].mutable_schedule();
  ASSERT_EQ(schedule->action(schedule->action_size() - 1).kind(), Action::OPTIMIZE);
  // OPT first, then the forwards and backwards in their order.
  std::rotate(schedule->mutable_action()->begin(), schedule->mutable_action()->end() - 1,
              schedule->mutable_action()->end());
  absl::Status s = VerifySchedules(plans);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("schedule would hang: rank 0 in B0 waits to receive"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 1 in OPT waits in allreduce F64[] over group 1 (pp: ranks 0, 1) for rank 0"));
}

// One OPT action entering allreduces of F64[] over `groups` in order, on a
// rank of the dp2 x pp2 mesh (groups 1, 2: dp; 3, 4: pp).
RankPlan CollectivesPlan(int rank, const std::vector<int>& groups) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"dp", 2}, {"pp", 2}});
  RankPlan plan;
  plan.set_rank(rank);
  for (const CommGroup& g : mesh->GroupsOf(rank)) *plan.mutable_topology()->add_group() = g;
  Program* p = plan.mutable_program();
  Var* x = p->add_var();
  x->set_name("x");
  x->set_dtype(F64);
  for (size_t i = 0; i < groups.size(); ++i) {
    Op* op = p->add_op();
    op->set_type("allreduce");
    op->add_input("x");
    op->add_output(absl::StrCat("y", i));
    op->set_role(OPTIMIZE);
    op->set_group(groups[i]);
  }
  plan.mutable_schedule()->add_action()->set_kind(Action::OPTIMIZE);
  return plan;
}

// Each communicator's members enter its collectives in the same order, yet
// the ranks wait around a cycle of communicators.
TEST(VerifyScheduleTest, CollectivesOfDifferentGroupsWaitingInACycleHang) {
  std::vector<RankPlan> cycle = {CollectivesPlan(0, {3, 1}), CollectivesPlan(1, {2, 3}), CollectivesPlan(2, {1, 4}),
                                 CollectivesPlan(3, {4, 2})};
  absl::Status s = VerifySchedules(cycle);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "schedule would hang: rank 0 in OPT waits in allreduce F64[] over group 3 (pp: ranks 0, 1) for rank 1; "
            "rank 1 in OPT waits in allreduce F64[] over group 2 (dp: ranks 1, 3) for rank 3; "
            "rank 3 in OPT waits in allreduce F64[] over group 4 (pp: ranks 2, 3) for rank 2; "
            "rank 2 in OPT waits in allreduce F64[] over group 1 (dp: ranks 0, 2) for rank 0");
  // Every rank data-parallel first, then pipeline: no cycle.
  std::vector<RankPlan> ordered = {CollectivesPlan(0, {1, 3}), CollectivesPlan(1, {2, 3}), CollectivesPlan(2, {1, 4}),
                                   CollectivesPlan(3, {2, 4})};
  EXPECT_TRUE(VerifySchedules(ordered).ok()) << VerifySchedules(ordered);
}

// A rank that enters a collective of a group it is not in would be counted
// as one of its members, releasing them before the last one arrives.
TEST(VerifyScheduleTest, ACollectiveOfAGroupTheRankIsNotInIsRefused) {
  // Rank 0 is not in group 2 (dp: ranks 1, 3), and its plan does not list it.
  std::vector<RankPlan> plans = {CollectivesPlan(0, {2}), CollectivesPlan(1, {2}), CollectivesPlan(2, {}),
                                 CollectivesPlan(3, {2})};
  absl::Status s = VerifySchedules(plans);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "schedule: rank 0 enters a collective of a group its plan does not list (group 2 (dp: ranks 1, 3))");
  // Its plan lists the group, wrongly: still not a member.
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"dp", 2}, {"pp", 2}});
  ASSERT_TRUE(mesh.ok());
  for (const CommGroup& g : mesh->GroupsOf(1)) {
    if (g.id() == 2) *plans[0].mutable_topology()->add_group() = g;
  }
  s = VerifySchedules(plans);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "schedule: rank 0 enters a collective of group 2 (dp: ranks 1, 3), which it is not a member of");
}

// Groups with the same members share one communicator (the world and the
// pipeline without data parallelism): their collectives are one sequence, and
// the members must agree on each one's group, or one group's tensor would be
// reduced with the other's.
TEST(VerifyScheduleTest, GroupsSharingACommunicatorMustAgreeOnTheirOrder) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"pp", 2}});
  ASSERT_TRUE(mesh.ok());
  std::vector<RankPlan> plans = {CollectivesPlan(0, {0, 1}), CollectivesPlan(1, {1, 0})};
  for (int r = 0; r < 2; ++r) {
    plans[r].mutable_topology()->clear_group();
    for (const CommGroup& g : mesh->GroupsOf(r)) *plans[r].mutable_topology()->add_group() = g;
  }
  absl::Status s = VerifySchedules(plans);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the ranks of group 0 (pp: ranks 0, 1), whose communicator also serves group 1, enter different "
                        "collectives: rank 0: allreduce F64[] (OPT, group 0), allreduce F64[] (OPT, group 1); "
                        "rank 1: allreduce F64[] (OPT, group 1), allreduce F64[] (OPT, group 0)"));
  plans[1] = CollectivesPlan(1, {0, 1});
  plans[1].mutable_topology()->clear_group();
  for (const CommGroup& g : mesh->GroupsOf(1)) *plans[1].mutable_topology()->add_group() = g;
  EXPECT_TRUE(VerifySchedules(plans).ok());
}

}  // namespace
}  // namespace strata
