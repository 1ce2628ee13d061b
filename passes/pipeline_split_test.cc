#include "passes/pipeline_split.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "passes/compile.h"
#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "passes/testing/pass_test_util.h"

namespace strata {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

// w is tied: read on stage 0 and on stage 2.
constexpr char kTied[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w1" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w"] output: ["h0"] device: "gpu:0" }
  op { type: "matmul" input: ["h0", "w1"] output: ["h1"] device: "gpu:1" }
  op { type: "matmul" input: ["h1", "w"] output: ["z"] device: "gpu:2" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:2" }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// Index of the first op writing (reading) `var`, or -1.
int FirstWriter(const Program& p, const std::string& var) {
  for (int i = 0; i < p.op_size(); ++i) {
    if (std::count(p.op(i).output().begin(), p.op(i).output().end(), var)) return i;
  }
  return -1;
}
int FirstReader(const Program& p, const std::string& var) {
  for (int i = 0; i < p.op_size(); ++i) {
    if (std::count(p.op(i).input().begin(), p.op(i).input().end(), var)) return i;
  }
  return -1;
}

bool Reads(const Program& p, const std::string& var) { return FirstReader(p, var) >= 0; }

using ChannelKey = std::tuple<int, int, std::string, int64_t>;
ChannelKey Key(const Channel& c) { return {c.src_rank(), c.dst_rank(), c.var(), c.id()}; }

std::vector<int64_t> ShapeAttr(const Op& op) {
  const auto& shape = Attr(op, "shape").list().i();
  return std::vector<int64_t>(shape.begin(), shape.end());
}
std::string DtypeAttr(const Op& op) { return Attr(op, "dtype").s(); }

TEST(PipelineSplitPassTest, EachStageKeepsItsOwnOpsAndTheCutIsASendRecvPair) {
  auto plans = CompilePipeline(TwoStagesProgram());
  ASSERT_EQ(plans.size(), 2u);
  const Program& p0 = plans[0].program();
  const Program& p1 = plans[1].program();
  for (int r = 0; r < 2; ++r) {
    for (const Op& op : plans[r].program().op()) {
      EXPECT_EQ(op.stage(), r) << op.type() << " " << op.name();
      EXPECT_EQ(op.device(), "gpu:" + std::to_string(r)) << op.type();
    }
  }
  // Stage 0: its forward ops, backward and its parameters' updates only;
  // stage 1 the head, the loss, their backward and w2's update.
  const std::vector<std::vector<std::string>> own = {{"xw", "w@grad", "b@grad"}, {"z", "loss", "w2@grad"}};
  const std::vector<std::vector<std::string>> params = {{"w", "b"}, {"w2"}};
  for (int r = 0; r < 2; ++r) {
    const Program& p = plans[r].program();
    for (const auto& var : own[r]) EXPECT_GE(FirstWriter(p, var), 0) << r << " " << var;
    for (const auto& var : own[1 - r]) EXPECT_LT(FirstWriter(p, var), 0) << r << " " << var;
    for (const auto& param : params[1 - r]) EXPECT_EQ(FindVar(p, param), nullptr) << r << " " << param;
    std::set<std::string> updated, trained;
    for (const Op& op : p.op()) {
      if (op.type() == "sgd_update") updated.insert(op.input(0));
    }
    for (const auto& [param, grad] : p.param_grad()) trained.insert(param);
    EXPECT_THAT(updated, ::testing::ElementsAreArray(std::set<std::string>(params[r].begin(), params[r].end())));
    EXPECT_EQ(trained, updated);
  }
  EXPECT_EQ(p0.loss(), "");
  EXPECT_EQ(p1.loss(), "loss");

  // h goes forward: sent right after its producer, received before its first reader.
  auto send_h = Transfers(p0, "send", "h");
  auto recv_h = Transfers(p1, "recv", "h");
  ASSERT_EQ(send_h.size(), 1u);
  ASSERT_EQ(recv_h.size(), 1u) << "h is read in forward and backward on stage 1, received once";
  EXPECT_EQ(IndexOf(p0, send_h[0]), FirstWriter(p0, "h") + 1);
  EXPECT_THAT(send_h[0]->input(), ElementsAre("h"));
  EXPECT_EQ(Key(send_h[0]->channel()), (ChannelKey{0, 1, "h", send_h[0]->channel().id()}));
  EXPECT_EQ(Key(recv_h[0]->channel()), Key(send_h[0]->channel()));
  EXPECT_EQ(send_h[0]->role(), FORWARD);
  EXPECT_EQ(recv_h[0]->role(), FORWARD);
  EXPECT_THAT(recv_h[0]->output(), ElementsAre("h"));
  EXPECT_EQ(FirstWriter(p1, "h"), IndexOf(p1, recv_h[0]));
  EXPECT_EQ(IndexOf(p1, recv_h[0]) + 1, FirstReader(p1, "h"));
  EXPECT_EQ(DtypeAttr(*recv_h[0]), "F64");
  EXPECT_THAT(ShapeAttr(*recv_h[0]), ElementsAre(-1, 5));

  // Its gradient comes back from stage 1 to stage 0.
  auto send_g = Transfers(p1, "send", "h@grad");
  auto recv_g = Transfers(p0, "recv", "h@grad");
  ASSERT_EQ(send_g.size(), 1u);
  ASSERT_EQ(recv_g.size(), 1u);
  EXPECT_EQ(Key(send_g[0]->channel()), (ChannelKey{1, 0, "h@grad", send_g[0]->channel().id()}));
  EXPECT_EQ(Key(recv_g[0]->channel()), Key(send_g[0]->channel()));
  EXPECT_NE(send_g[0]->channel().id(), send_h[0]->channel().id());
  EXPECT_EQ(send_g[0]->role(), BACKWARD);
  EXPECT_EQ(recv_g[0]->role(), BACKWARD);
  EXPECT_EQ(IndexOf(p1, send_g[0]), FirstWriter(p1, "h@grad") + 1);
  EXPECT_EQ(IndexOf(p0, recv_g[0]) + 1, FirstReader(p0, "h@grad"));
  EXPECT_EQ(DtypeAttr(*recv_g[0]), "F64");
  EXPECT_THAT(ShapeAttr(*recv_g[0]), ElementsAre(-1, 5));
  // Nothing else crosses the cut.
  int transfers = 0;
  for (const RankPlan& plan : plans) {
    for (const Op& op : plan.program().op()) transfers += op.type() == "send" || op.type() == "recv";
  }
  EXPECT_EQ(transfers, 4);
}

TEST(PipelineSplitPassTest, AVarSkippingAStageGoesDirectlyToEachReader) {
  auto plans = CompilePipeline(kThreeStagesWithSkip);
  ASSERT_EQ(plans.size(), 3u);
  const Program& p0 = plans[0].program();
  const Program& p1 = plans[1].program();
  const Program& p2 = plans[2].program();
  // One send of h0 per reading stage, both right after matmul.
  auto sends = Transfers(p0, "send", "h0");
  ASSERT_EQ(sends.size(), 2u);
  std::set<int> dst;
  for (const Op* s : sends) {
    dst.insert(s->channel().dst_rank());
    EXPECT_EQ(s->channel().src_rank(), 0);
    EXPECT_GT(IndexOf(p0, s), FirstWriter(p0, "h0"));
    EXPECT_LE(IndexOf(p0, s), FirstWriter(p0, "h0") + 2);
  }
  EXPECT_THAT(dst, UnorderedElementsAre(1, 2));
  // Stage 1 receives h0 for itself and does not relay it.
  auto recv1 = Transfers(p1, "recv", "h0");
  ASSERT_EQ(recv1.size(), 1u);
  EXPECT_EQ(recv1[0]->channel().src_rank(), 0);
  EXPECT_THAT(Transfers(p1, "send", "h0"), IsEmpty());
  // Stage 2 receives it straight from stage 0, with its type.
  auto recv2 = Transfers(p2, "recv", "h0");
  ASSERT_EQ(recv2.size(), 1u);
  EXPECT_NE(recv2[0]->channel().id(), recv1[0]->channel().id());
  EXPECT_EQ(recv2[0]->channel().src_rank(), 0);
  EXPECT_EQ(recv2[0]->channel().dst_rank(), 2);
  EXPECT_EQ(DtypeAttr(*recv2[0]), "F64");
  EXPECT_THAT(ShapeAttr(*recv2[0]), ElementsAre(-1, 4));
  for (const Op* s : sends) {
    const auto& recv = s->channel().dst_rank() == 1 ? recv1 : recv2;
    EXPECT_EQ(Key(s->channel()), Key(recv[0]->channel()));
  }
  // Backward: h2's gradient (add passes it to h1 and h0) goes to stage 1 and
  // straight back to stage 0, where it is summed with the part from stage 1.
  std::set<int> grad_dst;
  for (const Op* s : Transfers(p2, "send", "h2@grad")) grad_dst.insert(s->channel().dst_rank());
  EXPECT_THAT(grad_dst, UnorderedElementsAre(0, 1));
  auto recv_direct = Transfers(p0, "recv", "h2@grad");
  ASSERT_EQ(recv_direct.size(), 1u);
  EXPECT_EQ(recv_direct[0]->channel().src_rank(), 2);
  EXPECT_THAT(Transfers(p1, "send", "h2@grad"), IsEmpty());
  int sum = FirstWriter(p0, "h0@grad");
  ASSERT_GE(sum, 0);
  EXPECT_EQ(p0.op(sum).type(), "add_n");
  EXPECT_THAT(p0.op(sum).input(), ::testing::Contains("h2@grad"));
}

TEST(PipelineSplitPassTest, FeedsReachOnlyTheStagesThatReadThem) {
  auto plans = CompilePipeline(kThreeStagesWithSkip);
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_TRUE(Reads(plans[0].program(), "x"));
  EXPECT_FALSE(Reads(plans[1].program(), "x"));
  EXPECT_FALSE(Reads(plans[2].program(), "x"));
  EXPECT_FALSE(Reads(plans[0].program(), "label"));
  EXPECT_FALSE(Reads(plans[1].program(), "label"));
  EXPECT_TRUE(Reads(plans[2].program(), "label"));
  for (const RankPlan& plan : plans) {
    // Feeds are never transferred: each rank reads its own data stream, and
    // so keeps them declared (as FEED) even where no op reads them.
    EXPECT_THAT(Transfers(plan.program(), "send", "x"), IsEmpty());
    EXPECT_THAT(Transfers(plan.program(), "recv", "label"), IsEmpty());
    const Var* label = FindVar(plan.program(), "label");
    ASSERT_NE(label, nullptr);
    EXPECT_EQ(label->kind(), FEED);
  }
}

TEST(PipelineSplitPassTest, TheLossBelongsToTheStageThatMakesItNotToOneThatReadsIt) {
  // A later stage reads the loss (a fuzzing helper's program): it receives
  // the value but neither seeds the loss's gradient nor reports it, where
  // both ranks used to report and write one metrics file at once.
  auto plans = CompilePipeline(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F32 shape: [4, 3] kind: PARAM init { xavier_uniform {} } }
    op { type: "matmul" input: ["x", "w"] output: ["logits"] device: "gpu:0" }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] device: "gpu:0" }
    op { type: "identity" input: ["loss"] output: ["l2"] device: "gpu:1" }
    loss: "loss"
    fetch: "l2"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb", 2);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0].program().loss(), "loss");
  EXPECT_FALSE(plans[0].program().loss_grad().empty());
  EXPECT_EQ(plans[1].program().loss(), "");
  EXPECT_EQ(plans[1].program().loss_grad(), "");
  EXPECT_THAT(Transfers(plans[1].program(), "recv", "loss"), Not(IsEmpty()));
}

TEST(PipelineSplitPassTest, TiedWeightGradientIsSummedOnItsHomeStageAndSentToTheReplica) {
  auto plans = CompilePipeline(kTied);
  ASSERT_EQ(plans.size(), 3u);
  const Program& home = plans[0].program();
  const Program& middle = plans[1].program();
  const Program& replica = plans[2].program();
  // Both ends hold w and update it from the same gradient var.
  for (const Program* p : {&home, &replica}) {
    const Var* w = FindVar(*p, "w");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->kind(), PARAM);
    ASSERT_EQ(p->param_grad().count("w"), 1u);
    EXPECT_EQ(p->param_grad().at("w"), "w@grad");
    int updates = 0;
    for (const Op& op : p->op()) {
      if (op.type() == "sgd_update" && op.input(0) == "w") {
        ++updates;
        EXPECT_EQ(op.input(1), "w@grad");
      }
    }
    EXPECT_EQ(updates, 1);
  }
  EXPECT_EQ(FindVar(middle, "w"), nullptr);
  EXPECT_THAT(home.tied_replica(), IsEmpty());
  EXPECT_THAT(middle.tied_replica(), IsEmpty());
  EXPECT_THAT(replica.tied_replica(), ElementsAre("w"));

  // Home: add_n of its own part and the part received from the replica,
  // once an update, in the optimizer action (the parts summed over the
  // micro-batches on their own stages first).
  int sum = FirstWriter(home, "w@grad");
  ASSERT_GE(sum, 0);
  const Op& add_n = home.op(sum);
  EXPECT_EQ(add_n.type(), "add_n");
  EXPECT_EQ(add_n.role(), OPTIMIZE);
  ASSERT_EQ(add_n.input_size(), 2);
  int received_parts = 0;
  for (const auto& part : add_n.input()) {
    const Op& producer = home.op(FirstWriter(home, part));
    if (producer.type() == "recv") {
      ++received_parts;
      EXPECT_EQ(producer.channel().src_rank(), 2);
      EXPECT_EQ(producer.role(), OPTIMIZE);
      auto send = Transfers(replica, "send", part);
      ASSERT_EQ(send.size(), 1u);
      EXPECT_EQ(Key(send[0]->channel()), Key(producer.channel()));
      EXPECT_EQ(send[0]->role(), OPTIMIZE);
    } else {
      EXPECT_EQ(producer.type(), "matmul");
      EXPECT_EQ(producer.role(), BACKWARD);
    }
  }
  EXPECT_EQ(received_parts, 1);
  // ...and the sum goes to the replica right after it is made.
  auto send_sum = Transfers(home, "send", "w@grad");
  ASSERT_EQ(send_sum.size(), 1u);
  EXPECT_EQ(IndexOf(home, send_sum[0]), sum + 1);
  EXPECT_EQ(send_sum[0]->role(), OPTIMIZE);
  EXPECT_EQ(send_sum[0]->channel().dst_rank(), 2);

  // Replica: w@grad is only received (never computed there), in the
  // optimizer action after its part went out, and before the update.
  int recv_sum = FirstWriter(replica, "w@grad");
  ASSERT_GE(recv_sum, 0);
  const Op& recv = replica.op(recv_sum);
  EXPECT_EQ(recv.type(), "recv");
  EXPECT_EQ(recv.role(), OPTIMIZE);
  EXPECT_EQ(Key(recv.channel()), Key(send_sum[0]->channel()));
  EXPECT_EQ(DtypeAttr(recv), "F64");
  EXPECT_THAT(ShapeAttr(recv), ElementsAre(4, 4));
  for (int i = 0; i < replica.op_size(); ++i) {
    const Op& op = replica.op(i);
    if (i != recv_sum) {
      EXPECT_EQ(std::count(op.output().begin(), op.output().end(), "w@grad"), 0) << op.type();
    }
    if (op.role() == BACKWARD || op.type() == "send") {
      EXPECT_LT(i, recv_sum) << op.type();
    }
    if (op.type() == "sgd_update" || op.role() == LR_SCHEDULE) {
      EXPECT_GT(i, recv_sum) << op.type();
    }
  }
}

// On one device, a weight read twice (kTied's w, every op on one stage)
// has its gradient's parts summed as a pipeline must sum them: each over
// the micro-batches (the GEMMs accumulate into buffers of their own), then
// the two once, in the optimizer action, in the order the pipeline's home
// stage adds them; so one device adds the same floats in the same order as
// the stages. With one micro-batch, and under gradient merge (whose
// checkpoints hold the whole gradient's buffer), the sum stays in the
// backward.
TEST(PipelineSplitPassTest, OneDeviceSumsATiedWeightsPartsAsThePipelineDoes) {
  std::string one_stage = kTied;
  for (const char* stage : {"gpu:1", "gpu:2"}) {
    for (size_t at; (at = one_stage.find(stage)) != std::string::npos;) one_stage.replace(at, 5, "gpu:0");
  }
  const auto sum_of_w = [](const Program& p) -> const Op* {
    auto sums = OpsWriting(p, "w@grad");
    return sums.size() == 1 ? sums[0] : nullptr;
  };
  auto unmoved = CompilePipeline(one_stage, 1);
  ASSERT_EQ(unmoved.size(), 1u);
  const Op* sum = sum_of_w(unmoved[0].program());
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(sum->role(), BACKWARD);

  auto single = CompilePipeline(one_stage, 3);
  auto pipeline = CompilePipeline(kTied, 3);
  ASSERT_EQ(single.size(), 1u);
  ASSERT_EQ(pipeline.size(), 3u);
  const Program& p = single[0].program();
  sum = sum_of_w(p);
  const Op* home_sum = sum_of_w(pipeline[0].program());
  ASSERT_NE(sum, nullptr);
  ASSERT_NE(home_sum, nullptr);
  EXPECT_EQ(sum->type(), "add_n");
  EXPECT_EQ(sum->role(), OPTIMIZE);
  for (const Op& op : p.op()) {
    if (op.type() == "sgd_update" && op.input(0) == "w") {
      EXPECT_GT(IndexOf(p, &op), IndexOf(p, sum));
    }
  }
  // Each part summed over the micro-batches by its GEMM into its buffer
  // (`<part>@acc`), and the parts in the home stage's order: the one the
  // last stage summed and sent, then its own.
  ASSERT_EQ(sum->input_size(), 2);
  ASSERT_EQ(home_sum->input_size(), 2);
  EXPECT_EQ(OpsWriting(pipeline[0].program(), home_sum->input(0))[0]->type(), "recv");
  EXPECT_EQ(sum->input(0), home_sum->input(0) + "@acc");
  EXPECT_EQ(sum->input(1), home_sum->input(1));
  for (const std::string& part : sum->input()) {
    auto writers = OpsWriting(p, part);
    ASSERT_EQ(writers.size(), 2u) << part;
    EXPECT_EQ(writers[0]->type(), "matmul_accumulate") << part;
    EXPECT_EQ(writers[0]->role(), BACKWARD) << part;
    EXPECT_EQ(writers[1]->type(), "fill_zero") << part;
    EXPECT_GT(IndexOf(p, writers[1]), IndexOf(p, sum)) << part;
  }

  Strategy merge = PipelineStrategy(3);
  merge.mutable_gradient_merge()->set_k_steps(2);
  auto merged = Compile(ParseProgramOrFail(one_stage), merge, CompileOptions());
  ASSERT_TRUE(merged.ok()) << merged.status();
  sum = sum_of_w(merged->plans[0].program());
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(sum->role(), BACKWARD);
}

// w read twice on stage 0 of two: its sum moves to the optimizer action as
// one device's does; read three times, the sum stays in the backward (each
// part a buffer of the weight's size through the step would be too dear).
TEST(PipelineSplitPassTest, AWeightReadTwiceOnOneStageIsSummedOnceAnUpdate) {
  const std::string twice = R"pb(
    var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "w" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    var { name: "w1" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
    op { type: "matmul" input: ["x", "w"] output: ["h0"] device: "gpu:0" }
    op { type: "matmul" input: ["h0", "w"] output: ["h1"] device: "gpu:0" }
    op { type: "matmul" input: ["h1", "w1"] output: ["z"] device: "gpu:1" }
    op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  std::string thrice = twice;
  thrice.replace(thrice.find("input: [\"h1\", \"w1\"]"), 19, "input: [\"h2\", \"w1\"]");
  thrice.replace(thrice.find("    op { type: \"matmul\" input: [\"h2\""), 0,
                 "    op { type: \"matmul\" input: [\"h1\", \"w\"] output: [\"h2\"] device: \"gpu:0\" }\n");
  for (const auto& [text, role] : {std::pair{twice, OPTIMIZE}, std::pair{thrice, BACKWARD}}) {
    auto plans = CompilePipeline(text, 3);
    ASSERT_EQ(plans.size(), 2u);
    auto sums = OpsWriting(plans[0].program(), "w@grad");
    ASSERT_EQ(sums.size(), 1u);
    EXPECT_EQ(sums[0]->type(), "add_n");
    EXPECT_EQ(sums[0]->input_size(), role == OPTIMIZE ? 2 : 3);
    EXPECT_EQ(sums[0]->role(), role);
  }
}

// Under gradient merge the sum moves to the optimizer action too (which
// runs once every k steps): each stage's part is summed over the k steps'
// micro-batches in a merge buffer of its own, which the plan names with the
// buffer one device sums the whole gradient in (the checkpoints' name for
// it), and the sum's first input (the home's own part) takes that whole on
// a load under another layout.
TEST(PipelineSplitPassTest, UnderGradientMergeEachStageSumsItsPartOfATiedGradient) {
  Strategy strategy = PipelineStrategy(2);
  strategy.mutable_gradient_merge()->set_k_steps(3);
  auto result = Compile(ParseProgramOrFail(kTied), strategy, CompileOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->plans.size(), 3u);
  const Program& home = result->plans[0].program();
  const Program& middle = result->plans[1].program();
  const Program& replica = result->plans[2].program();
  const int sum_index = FirstWriter(home, "w@grad");
  ASSERT_GE(sum_index, 0);
  const Op& sum = home.op(sum_index);
  EXPECT_EQ(sum.type(), "add_n");
  EXPECT_EQ(sum.role(), OPTIMIZE);
  ASSERT_EQ(sum.input_size(), 2);
  for (const Program* p : {&home, &replica}) {
    for (const std::string& var : {std::string("w@grad"), std::string("w@grad@part")}) {
      for (const Op* t : Transfers(*p, "send", var)) EXPECT_EQ(t->role(), OPTIMIZE) << var;
      for (const Op* t : Transfers(*p, "recv", var)) EXPECT_EQ(t->role(), OPTIMIZE) << var;
    }
  }
  ASSERT_EQ(Transfers(replica, "send", "w@grad@part").size(), 1u);
  ASSERT_EQ(Transfers(home, "send", "w@grad").size(), 1u);
  // The parts' buffers are state, merge buffers, named in merge_part.
  ASSERT_EQ(home.merge_part_size(), 1);
  ASSERT_EQ(replica.merge_part_size(), 1);
  EXPECT_EQ(middle.merge_part_size(), 0);
  const Program::MergePart& own = home.merge_part(0);
  const Program::MergePart& far = replica.merge_part(0);
  EXPECT_EQ(own.whole(), "w@grad@acc");
  EXPECT_EQ(far.whole(), "w@grad@acc");
  EXPECT_NE(own.buffer(), far.buffer());
  EXPECT_EQ(own.primary(), sum.input(0) == own.buffer());
  EXPECT_EQ(far.primary(), !own.primary());
  EXPECT_EQ(Transfers(replica, "send", "w@grad@part")[0]->input(0), far.buffer());
  for (const auto& [p, m] : {std::pair<const Program*, const Program::MergePart*>{&home, &own}, {&replica, &far}}) {
    const Var* buffer = FindVar(*p, m->buffer());
    ASSERT_NE(buffer, nullptr) << m->buffer();
    EXPECT_EQ(buffer->kind(), STATE);
    EXPECT_THAT(p->merge_buffer(), Contains(m->buffer()));
    EXPECT_THAT(p->merge_buffer(), Not(Contains("w@grad"))) << "the whole gradient is made or received in the update";
  }
}

// A weight read on two stages whose gradient flows through one reader has
// no sum of parts from autodiff: its gradient op (the last stage's matmul
// gradient) writes a part, summed over the micro-batches in a buffer of its
// own, and a sum of that one part (a copy) in the optimizer action makes the
// whole, which crosses to the other stage's replica once an update, as the
// other tied gradients do. The copy, not the buffer, is sent: the buffer is
// zeroed for the next step in the same action (sent from the buffer, the
// replicas parted). Under gradient merge the part is a merge buffer, the
// primary one of its gradient.
TEST(PipelineSplitPassTest, ATiedWeightWithOneGradientPathCrossesOnceAnUpdateFromACopy) {
  for (const int merge : {1, 3}) {
    SCOPED_TRACE(absl::StrCat("gradient merge k = ", merge));
    Strategy strategy = PipelineStrategy(2);
    if (merge > 1) strategy.mutable_gradient_merge()->set_k_steps(merge);
    auto result = Compile(ParseProgramOrFail(kOnePathTiedWeightOnTwoStages), strategy, CompileOptions());
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->plans.size(), 2u);
    const Program& replica = result->plans[0].program();
    const Program& home = result->plans[1].program();
    EXPECT_THAT(replica.tied_replica(), ElementsAre("t"));
    auto send = Transfers(home, "send", "t@grad");
    auto recv = Transfers(replica, "recv", "t@grad");
    ASSERT_EQ(send.size(), 1u);
    ASSERT_EQ(recv.size(), 1u);
    EXPECT_EQ(send[0]->role(), OPTIMIZE);
    EXPECT_EQ(recv[0]->role(), OPTIMIZE);
    EXPECT_EQ(Key(send[0]->channel()), Key(recv[0]->channel()));
    const int sum_index = FirstWriter(home, "t@grad");
    ASSERT_GE(sum_index, 0);
    const Op& sum = home.op(sum_index);
    EXPECT_EQ(sum.type(), "add_n");
    EXPECT_EQ(sum.role(), OPTIMIZE);
    ASSERT_EQ(sum.input_size(), 1);
    EXPECT_THAT(send[0]->input(), ElementsAre("t@grad"));
    const std::string buffer = sum.input(0);
    EXPECT_NE(buffer, "t@grad");
    const Var* b = FindVar(home, buffer);
    ASSERT_NE(b, nullptr) << buffer;
    EXPECT_EQ(b->kind(), merge > 1 ? STATE : SCRATCH) << buffer;
    // The micro-batches' gradient ops sum into the buffer in the backward;
    // the buffer is zeroed after the sum has read it.
    int zeroed = -1;
    for (int i = 0; i < home.op_size(); ++i) {
      const Op& op = home.op(i);
      if (std::count(op.output().begin(), op.output().end(), buffer) == 0) continue;
      if (op.type() == "fill_zero") {
        zeroed = i;
      } else {
        EXPECT_EQ(op.role(), BACKWARD) << op.type();
      }
    }
    EXPECT_GT(zeroed, sum_index);
    for (const Op* op : OpsWriting(replica, "t@grad")) EXPECT_EQ(op->type(), "recv");
    if (merge > 1) {
      ASSERT_EQ(home.merge_part_size(), 1);
      EXPECT_EQ(home.merge_part(0).buffer(), buffer);
      EXPECT_EQ(home.merge_part(0).whole(), "t@grad@acc");
      EXPECT_TRUE(home.merge_part(0).primary());
      EXPECT_EQ(replica.merge_part_size(), 0);
      EXPECT_THAT(home.merge_buffer(), Contains(buffer));
    } else {
      EXPECT_EQ(home.merge_part_size(), 0);
    }
  }
}

TEST(PipelineSplitPassTest, ChannelIdsAreUniquePerVarAndDestinationAndMatchOnBothEnds) {
  auto plans = CompilePipeline(kTied, 2);
  ASSERT_EQ(plans.size(), 3u);
  std::map<int64_t, ChannelKey> sends, recvs;
  std::set<std::pair<std::string, int>> var_dst;
  for (const RankPlan& plan : plans) {
    for (const Op& op : plan.program().op()) {
      if (op.type() != "send" && op.type() != "recv") continue;
      const Channel& c = op.channel();
      EXPECT_NE(c.src_rank(), c.dst_rank());
      auto& side = op.type() == "send" ? sends : recvs;
      EXPECT_EQ(op.type() == "send" ? c.src_rank() : c.dst_rank(), plan.rank()) << op.name();
      EXPECT_TRUE(side.emplace(c.id(), Key(c)).second) << "id " << c.id() << " used twice by " << op.type();
      if (op.type() == "send") {
        EXPECT_TRUE(var_dst.insert({c.var(), c.dst_rank()}).second) << c.var() << " -> " << c.dst_rank();
        // The tied gradient's part leaves once an update, from the buffer
        // the micro-batch pass sums it into.
        EXPECT_THAT(op.input(), ElementsAre(op.role() == OPTIMIZE && c.var() == "w@grad@part" ? c.var() + "@acc"
                                                                                               : c.var()));
      } else {
        EXPECT_THAT(op.output(), ElementsAre(c.var()));
      }
    }
  }
  // Every send meets exactly one recv with the same channel; ids are dense.
  EXPECT_EQ(sends, recvs);
  EXPECT_GE(sends.size(), 6u);
  int64_t expected = 0;
  for (const auto& [id, key] : sends) EXPECT_EQ(id, expected++);
}

// Run by hand on the program after autodiff: the channel ranks follow the
// rank layout (dp_rank * num_stages + stage), and one stage changes nothing.
// A residual whose sum is on the middle stage: z = h0 + u on stage 1, read
// on stage 2. dz comes back to stage 1, which sums h0's two gradient parts
// and sends one gradient to stage 0; nothing goes from stage 2 to stage 0.
TEST(PipelineSplitPassTest, AResidualSendsOneGradientAcrossEachCut) {
  auto plans = CompilePipeline(R"pb(
    var { name: "x" dtype: F64 shape: [-1, 8] kind: FEED }
    var { name: "label" dtype: I64 shape: [-1] kind: FEED }
    var { name: "A" dtype: F64 shape: [8, 8] kind: PARAM init { normal { std: 0.3 } } }
    var { name: "B" dtype: F64 shape: [8, 8] kind: PARAM init { normal { std: 0.3 } } }
    var { name: "C" dtype: F64 shape: [8, 4] kind: PARAM init { normal { std: 0.3 } } }
    op { type: "matmul" input: ["x", "A"] output: ["h0"] device: "gpu:0" }
    op { type: "matmul" input: ["h0", "B"] output: ["u"] device: "gpu:1" }
    op { type: "add" input: ["h0", "u"] output: ["z"] device: "gpu:1" }
    op { type: "matmul" input: ["z", "C"] output: ["y"] device: "gpu:2" }
    op { type: "softmax_cross_entropy" input: ["y", "label"] output: ["loss"] device: "gpu:2" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb");
  ASSERT_EQ(plans.size(), 3u);
  std::vector<std::string> into_stage0;
  for (const Op& op : plans[0].program().op()) {
    if (op.type() == "recv" && op.role() == BACKWARD) {
      into_stage0.push_back(absl::StrCat(op.channel().var(), " from ", op.channel().src_rank()));
    }
  }
  EXPECT_THAT(into_stage0, ElementsAre("h0@grad from 1"));
}

TEST(PipelineSplitPassTest, ChannelRanksFollowTheDataParallelRankAndOneStageIsANoOp) {
  auto program = ParseProgramText(TwoStagesProgram(), "two.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  CompileOptions options;
  options.dump_after = "autodiff";
  auto result = Compile(*program, PipelineStrategy(1), options);
  ASSERT_TRUE(result.ok()) << result.status();
  const Program& backward = result->dumped;
  ASSERT_GT(backward.op_size(), 4);

  Program single = backward;
  CompileContext one;
  auto unchanged = RunOnProgram(PipelineSplitPass(), single, one);
  ASSERT_TRUE(unchanged.ok()) << unchanged.status();
  EXPECT_FALSE(*unchanged);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(single, backward));

  for (int stage : {0, 1}) {
    Program split = backward;
    CompileContext ctx;
    ctx.mesh = *Mesh::Create({{"dp", 2}, {"pp", 2}});
    ctx.rank = 2 + stage;  // data-parallel replica 1
    auto changed = RunOnProgram(PipelineSplitPass(), split, ctx);
    ASSERT_TRUE(changed.ok()) << changed.status();
    EXPECT_TRUE(*changed);
    EXPECT_TRUE(VerifyProgram(split).ok()) << VerifyProgram(split);
    auto h = Transfers(split, stage == 0 ? "send" : "recv", "h");
    ASSERT_EQ(h.size(), 1u);
    EXPECT_EQ(h[0]->channel().src_rank(), 2);
    EXPECT_EQ(h[0]->channel().dst_rank(), 3);
    auto g = Transfers(split, stage == 0 ? "recv" : "send", "h@grad");
    ASSERT_EQ(g.size(), 1u);
    EXPECT_EQ(g[0]->channel().src_rank(), 3);
    EXPECT_EQ(g[0]->channel().dst_rank(), 2);
  }
}

// Every plan records the mesh, the rank's coordinates and its groups; the
// channels' ranks are the mesh's ranks of the stages.
TEST(PipelineSplitTest, PlansRecordTheMeshAndTheirGroups) {
  std::vector<RankPlan> plans = CompilePipeline(TwoStagesProgram(), 2);
  ASSERT_EQ(plans.size(), 2u);
  for (const RankPlan& plan : plans) {
    const Topology& t = plan.topology();
    ASSERT_EQ(t.mesh().axis_size(), 2);
    EXPECT_EQ(t.mesh().axis(0).name(), "dp");
    EXPECT_EQ(t.mesh().axis(0).size(), 1);
    EXPECT_EQ(t.mesh().axis(1).name(), "pp");
    EXPECT_EQ(t.mesh().axis(1).size(), 2);
    ASSERT_EQ(t.coordinate_size(), 2);
    EXPECT_EQ(t.coordinate(0), 0);
    EXPECT_EQ(t.coordinate(1), plan.rank());
    EXPECT_EQ(t.stage(), plan.rank());
    // The world, and the pipeline along "pp" (dp has size 1: no group).
    ASSERT_EQ(t.group_size(), 2);
    EXPECT_EQ(t.group(0).id(), 0);
    EXPECT_EQ(t.group(1).axis(0), "pp");
    EXPECT_EQ(t.group(1).rank_size(), 2);
    for (const Op& op : plan.program().op()) {
      if (!op.has_channel()) continue;
      EXPECT_EQ(op.type() == "send" ? op.channel().src_rank() : op.channel().dst_rank(), plan.rank()) << op.name();
    }
  }
}

}  // namespace
}  // namespace strata
