// When the executor may capture a training step as a CUDA graph: the
// decision made before the first step (StepGraphBlocker), and the property a
// replay depends on that only a run shows, checked here on the CPU's kernels
// for every optimizer and strategy a GPU plan may carry: every op that
// writes a persistent var (parameters, optimizer state, step counters, the
// loss scale, gradient-merge buffers) writes it in place, so a replayed
// graph, which writes the buffers it captured, leaves the next step reading
// what it wrote.

#include "runtime/step_graph.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/dataset.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

std::vector<RankPlan> CompilePlans(const std::string& model, const GenOptions& gen, const Strategy& strategy,
                                   int64_t batch) {
  auto text = GenerateProgram(model, gen);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return {};
  auto program = ParseProgramText(*text, model + ".pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  if (!program.ok()) return {};
  CompileOptions options;
  options.batch_size = batch;
  options.device_kind = DEVICE_CUDA;  // the plan a GPU runs: host transfers, fused epilogues and optimizer
  auto result = Compile(*program, strategy, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->plans : std::vector<RankPlan>{};
}

GenOptions SmallMlp(const std::string& optimizer) {
  GenOptions gen;
  gen.layers = {16, 32, 10};
  gen.optimizer = optimizer;
  return gen;
}

GenOptions SmallGpt() {
  GenOptions gen;
  gen.blocks = 1;
  gen.d_model = 16;
  gen.heads = 2;
  gen.seq = 8;
  gen.vocab = 32;
  return gen;
}

StepGraphConditions Wanted() {
  StepGraphConditions c;
  c.requested = true;
  return c;
}

TEST(StepGraphBlockerTest, ASingleDeviceStepMayBeCaptured) {
  const std::vector<RankPlan> plans = CompilePlans("mlp", SmallMlp("adam"), Strategy(), 8);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(StepGraphBlocker(plans[0], Wanted()), "");
}

TEST(StepGraphBlockerTest, SaysWhyNot) {
  const std::vector<RankPlan> plans = CompilePlans("mlp", SmallMlp("adam"), Strategy(), 8);
  ASSERT_EQ(plans.size(), 1u);
  StepGraphConditions off = Wanted();
  off.requested = false;
  EXPECT_EQ(StepGraphBlocker(plans[0], off), "--cuda_graph=false");
  StepGraphConditions host = Wanted();
  host.device_unsupported = GetCpuDevice()->GraphUnsupported();
  EXPECT_EQ(StepGraphBlocker(plans[0], host), "cpu:0 has no graphs");
  StepGraphConditions traced = Wanted();
  traced.tracing = true;
  EXPECT_TRUE(absl::StrContains(StepGraphBlocker(plans[0], traced), "--trace")) << StepGraphBlocker(plans[0], traced);
}

// A communicator whose peers are not there: every op is done at once, as
// if the other ranks had issued their parts. It is capturable, as NCCL is,
// unless the test sets `blocker`, and its health and aborts are the test's.
// Enough to drive the executor's watch over replays that communicate on
// the CPU; what NCCL does under a capture is nccl_communicator_test's.
// As the world, it answers the executor's votes on graphs
// (AgreeOnStepGraphs: allgathers of I64 tensors) as if every other rank
// had voted peer_votes[v] at vote v ("": it can; past the end, "").
class ScriptedCommunicator : public testing::InstantCommunicator {
 public:
  ScriptedCommunicator(int rank, int size) : InstantCommunicator(rank, size, "scripted") {}
  std::string GraphBlocker() const override { return blocker; }
  std::unique_ptr<Work> AllGather(const Tensor& in, Tensor* out) override {
    if (in.dtype() == I64) {
      // A vote is the reasons' lengths, then, if one is not 0, the reasons.
      const int64_t n = in.num_elements();
      const std::string peer = reasons_next_ ? peer_reason_
                               : votes < static_cast<int>(peer_votes.size()) ? peer_votes[votes]
                                                                             : "";
      for (int r = 0; r < size(); ++r) {
        if (r == rank()) continue;
        int64_t* slot = out->data<int64_t>() + r * n;
        if (!reasons_next_) {
          slot[0] = static_cast<int64_t>(peer.size());
        } else {
          std::memcpy(slot, peer.data(), std::min<size_t>(peer.size(), n * sizeof(int64_t)));
        }
      }
      if (reasons_next_) {
        reasons_next_ = false;
      } else {
        ++votes;
        peer_reason_ = peer;
        reasons_next_ = !peer.empty() || in.data<int64_t>()[0] > 0;
      }
    }
    return InstantCommunicator::AllGather(in, out);
  }
  absl::Status CheckHealth() override {
    ++health_checks;
    return health;
  }
  // On the executor's abort thread: runs on_abort (a test's stand-in for
  // what ncclCommAbort does), then records the abort.
  void Abort(const absl::Status& why) override {
    if (on_abort) on_abort();
    aborts.push_back(why);
  }

  std::string blocker;
  absl::Status health;
  int health_checks = 0;
  std::function<void()> on_abort;
  std::vector<absl::Status> aborts;
  std::vector<std::string> peer_votes;
  int votes = 0;  // votes this rank took part in

 private:
  bool reasons_next_ = false;
  std::string peer_reason_;
};

// Rank `plan.rank()`'s communicators, every one of them `world` (a world of
// 2 ranks: each group spans it).
std::unique_ptr<CommunicatorSet> SetOver(Communicator* world, const RankPlan& plan) {
  auto set = std::make_unique<CommunicatorSet>(world);
  for (const CommGroup& group : plan.topology().group()) {
    absl::Status s = set->Add(group, nullptr);
    EXPECT_TRUE(s.ok()) << s;
  }
  return set;
}

std::vector<RankPlan> TwoStagePlans() {
  GenOptions gen = SmallMlp("adam");
  gen.stages = 2;
  Strategy pipeline;
  pipeline.mutable_pipeline()->set_micro_batch_size(4);
  pipeline.mutable_pipeline()->set_accumulate_steps(2);
  return CompilePlans("mlp", gen, pipeline, 8);
}

std::vector<RankPlan> DataParallelPlans() {
  Strategy data_parallel;
  data_parallel.mutable_data_parallel()->set_degree(2);
  return CompilePlans("mlp", SmallMlp("adam"), data_parallel, 8);
}

TEST(StepGraphBlockerTest, AStepThatCommunicatesOverGlooIsNotCaptured) {
  for (const auto& plans : {TwoStagePlans(), DataParallelPlans()}) {
    ASSERT_EQ(plans.size(), 2u);
    std::vector<std::unique_ptr<Communicator>> gloo = testing::ConnectRanks(2);
    for (const RankPlan& plan : plans) {
      std::unique_ptr<CommunicatorSet> comms = SetOver(gloo[plan.rank()].get(), plan);
      StepGraphConditions conditions = Wanted();
      conditions.comms = comms.get();
      const std::string why = StepGraphBlocker(plan, conditions);
      EXPECT_TRUE(absl::StrContains(why, absl::StrCat("rank ", plan.rank(), "'s step communicates"))) << why;
      EXPECT_TRUE(absl::StrContains(why, "gloo moves tensors on the host")) << why;
      const bool pipeline = plan.topology().num_stages() > 1;
      EXPECT_TRUE(absl::StrContains(why, !pipeline ? "allreduce" : plan.rank() == 0 ? "send" : "recv")) << why;
    }
  }
}

TEST(StepGraphBlockerTest, AStepThatCommunicatesOverADeviceTransportMayBeCaptured) {
  for (const auto& plans : {TwoStagePlans(), DataParallelPlans()}) {
    ASSERT_EQ(plans.size(), 2u);
    for (const RankPlan& plan : plans) {
      ScriptedCommunicator capturable(plan.rank(), 2);
      std::unique_ptr<CommunicatorSet> comms = SetOver(&capturable, plan);
      StepGraphConditions conditions = Wanted();
      conditions.comms = comms.get();
      EXPECT_EQ(StepGraphBlocker(plan, conditions), "") << "rank " << plan.rank();
      auto used = StepCommunicators(plan, comms.get());
      ASSERT_TRUE(used.ok()) << used.status();
      EXPECT_EQ(*used, std::vector<Communicator*>{&capturable});
    }
  }
  // Without communicators the plan's communication has nowhere to go.
  const std::string why = StepGraphBlocker(DataParallelPlans()[0], Wanted());
  EXPECT_TRUE(absl::StrContains(why, "no communicator serves it")) << why;
}

// Synthetic feeds for `executor`'s plan: TrainStep's feed function.
class SyntheticFeeds {
 public:
  explicit SyntheticFeeds(const Executor& executor) {
    for (const Var* v : executor.feeds()) specs_.push_back({v->name(), v->dtype(), {v->shape().begin(), v->shape().end()}});
    // The GPT's token ids below its vocab of 32; vocab= is refused for a program without token feeds.
    auto data = OpenDataset(TokenFeedName(specs_).empty() ? "synthetic" : "synthetic:vocab=32", specs_, 5);
    EXPECT_TRUE(data.ok()) << data.status();
    if (data.ok()) data_ = *std::move(data);
  }
  absl::StatusOr<std::map<std::string, Tensor>> operator()(int64_t first, int64_t rows) const {
    if (data_ == nullptr) return absl::InternalError("no dataset");
    std::vector<int64_t> idx(rows);
    for (int64_t i = 0; i < rows; ++i) idx[i] = first + i;
    std::vector<Tensor> tensors;
    if (absl::Status s = data_->GetBatch(idx, &tensors); !s.ok()) return s;
    std::map<std::string, Tensor> feeds;
    for (size_t i = 0; i < specs_.size(); ++i) feeds[specs_[i].name] = tensors[i];
    return feeds;
  }

 private:
  std::vector<FeedSpec> specs_;
  std::shared_ptr<Dataset> data_;  // shared: std::function copies its target
};

// Trains `plan` (a GPU plan, on the CPU's kernels) for `steps` steps and
// returns the executor's moved_state() after each ("" when every persistent
// write was in place).
std::vector<std::string> MovedStatePerStep(RankPlan plan, int steps) {
  plan.set_device_kind(DEVICE_CPU);
  auto e = Executor::Create(plan, {});
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return {};
  EXPECT_TRUE((*e)->InitializeState().ok());
  const SyntheticFeeds feeds(**e);
  std::vector<std::string> moved;
  for (int step = 0; step < steps; ++step) {
    auto r = (*e)->TrainStep(feeds, 0);
    EXPECT_TRUE(r.ok()) << r.status();
    moved.push_back((*e)->moved_state());
  }
  return moved;
}

void ExpectEveryPersistentWriteInPlace(const std::vector<RankPlan>& plans, int steps) {
  ASSERT_FALSE(plans.empty());
  for (const RankPlan& plan : plans) {
    SCOPED_TRACE(absl::StrCat("rank ", plan.rank()));
    const std::vector<std::string> moved = MovedStatePerStep(plan, steps);
    ASSERT_EQ(moved.size(), static_cast<size_t>(steps));
    for (int step = 0; step < steps; ++step) EXPECT_EQ(moved[step], "") << "step " << step + 1;
  }
}

TEST(PersistentWritesTest, EveryOptimizerUpdatesInPlace) {
  for (const char* optimizer : {"sgd", "momentum", "adam", "adamw"}) {
    SCOPED_TRACE(optimizer);
    ExpectEveryPersistentWriteInPlace(CompilePlans("mlp", SmallMlp(optimizer), Strategy(), 8), 3);
  }
}

TEST(PersistentWritesTest, GradientMergeAndMicroBatchesAccumulateInPlace) {
  Strategy strategy;
  strategy.mutable_gradient_merge()->set_k_steps(2);
  strategy.mutable_gradient_merge()->set_average(true);
  strategy.mutable_pipeline()->set_micro_batch_size(4);
  strategy.mutable_pipeline()->set_accumulate_steps(2);
  GenOptions gen = SmallMlp("adam");
  gen.dropout = 0.25;
  ExpectEveryPersistentWriteInPlace(CompilePlans("mlp", gen, strategy, 8), 4);
}

TEST(PersistentWritesTest, MixedPrecisionAndLossScalingUpdateInPlace) {
  for (DataType dtype : {BF16, F16}) {
    SCOPED_TRACE(DataTypeName(dtype));
    Strategy strategy;
    strategy.mutable_mixed_precision()->set_dtype(dtype);  // F16: dynamic loss scaling
    ExpectEveryPersistentWriteInPlace(CompilePlans("gpt", SmallGpt(), strategy, 2), 3);
  }
}

// The check itself: an op appended to the optimizer's section that writes a
// parameter into a buffer of its own (relu allocates its output) is named.
TEST(PersistentWritesTest, AnOutOfPlaceWriteIsNamed) {
  std::vector<RankPlan> plans = CompilePlans("mlp", SmallMlp("sgd"), Strategy(), 8);
  ASSERT_EQ(plans.size(), 1u);
  RankPlan& plan = plans[0];
  std::string param;
  for (const Var& v : plan.program().var()) {
    if (v.kind() == PARAM) {
      param = v.name();
      break;
    }
  }
  ASSERT_FALSE(param.empty());
  Op* relu = plan.mutable_program()->add_op();
  relu->set_type("relu");
  relu->set_name("clamp_weights");
  relu->add_input(param);
  relu->add_output(param);
  relu->set_role(OPTIMIZE);
  const std::vector<std::string> moved = MovedStatePerStep(plan, 2);
  ASSERT_EQ(moved.size(), 2u);
  for (const std::string& m : moved) {
    EXPECT_TRUE(absl::StrContains(m, "clamp_weights")) << m;
    EXPECT_TRUE(absl::StrContains(m, absl::StrCat("'", param, "'"))) << m;
    EXPECT_TRUE(absl::StrContains(m, "not in place")) << m;
  }
}

// A device that says it has graphs but refuses every capture: the
// executor's fallback, which no host device reaches (it has no graphs) and
// a GPU reaches only when something goes wrong, on the CPU's kernels.
class RefusingAccelerator : public testing::FakeAccelerator {
 public:
  std::string GraphUnsupported() const override { return ""; }
  absl::Status BeginCapture(const DeviceGraph*) override {
    ++captures;
    return absl::InternalError("the test device refuses to capture");
  }
  int captures = 0;
};

// A device whose kernels fell back from what the plan asked (as cuBLASLt's
// refused epilogues do on a GPU, Device::KernelFallbacks): a line known
// from the first step, a second from the third. The run reports each once,
// in order, however many steps follow.
class FallingBackAccelerator : public testing::FakeAccelerator {
 public:
  std::vector<std::string> KernelFallbacks(size_t from) const override {
    ++calls;
    std::vector<std::string> all = {"first fallback"};
    if (calls >= 3) all.push_back("second fallback");
    if (from >= all.size()) return {};
    return std::vector<std::string>(all.begin() + static_cast<std::ptrdiff_t>(from), all.end());
  }
  mutable int calls = 0;
};

TEST(KernelFallbackNotesTest, EachLineIsReportedOnceInOrder) {
  std::vector<RankPlan> plans = CompilePlans("mlp", SmallMlp("adam"), Strategy(), 8);
  ASSERT_EQ(plans.size(), 1u);
  plans[0].set_device_kind(DEVICE_CPU);  // the CPU's kernels on the fake device
  FallingBackAccelerator device;
  TrainOptions options;
  options.data = "synthetic:classes=10,size=256";
  options.steps = 5;
  options.progress = false;
  options.device = &device;
  auto report = Train(plans[0], options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->kernel_fallbacks, (std::vector<std::string>{"first fallback", "second fallback"}));
  EXPECT_EQ(device.calls, 5);  // asked after every step
}

TEST(StepGraphFallbackTest, ARefusedCaptureLeavesTheRunEagerAndSaysWhy) {
  GenOptions gen = SmallMlp("adam");
  gen.dropout = 0.25;
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(4);
  strategy.mutable_pipeline()->set_accumulate_steps(2);
  std::vector<RankPlan> plans = CompilePlans("mlp", gen, strategy, 8);
  ASSERT_EQ(plans.size(), 1u);
  plans[0].set_device_kind(DEVICE_CPU);  // the CPU's kernels on the fake device
  auto train = [&](Device* device, bool cuda_graph) {
    TrainOptions options;
    options.data = "synthetic:classes=10,size=256";
    options.steps = 5;
    options.seed = 3;
    options.progress = false;
    options.device = device;
    options.cuda_graph = cuda_graph;
    return Train(plans[0], options);
  };
  testing::FakeAccelerator plain;
  auto eager = train(&plain, false);
  ASSERT_TRUE(eager.ok()) << eager.status();
  RefusingAccelerator refusing;
  auto fallen = train(&refusing, true);
  ASSERT_TRUE(fallen.ok()) << fallen.status();
  EXPECT_EQ(refusing.captures, 1) << "a refused capture is not tried again";
  EXPECT_EQ(fallen->cuda_graphs, 0);
  EXPECT_TRUE(absl::StrContains(fallen->cuda_graph_note, "not used from step 2")) << fallen->cuda_graph_note;
  EXPECT_TRUE(absl::StrContains(fallen->cuda_graph_note, "the test device refuses to capture"))
      << fallen->cuda_graph_note;
  ASSERT_EQ(fallen->steps.size(), eager->steps.size());
  for (size_t i = 0; i < eager->steps.size(); ++i) {
    EXPECT_EQ(fallen->steps[i].loss, eager->steps[i].loss) << "step " << i + 1;
  }
  EXPECT_EQ(fallen->final_state, eager->final_state);
}

// A device whose captures record nothing (the captured step ran as its
// kernels were called) and whose graphs' replays do nothing; a replay has
// finished unless the test holds it (`hang`), as a graph whose NCCL kernel
// waits for a dead peer would.
class ReplayingAccelerator : public testing::FakeAccelerator {
 public:
  std::string GraphUnsupported() const override { return ""; }
  absl::Status BeginCapture(const DeviceGraph*) override {
    ++captures;
    capture = true;
    if (on_begin_capture) on_begin_capture();
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<DeviceGraph>> EndCapture() override {
    capture = false;
    if (on_end_capture) on_end_capture();
    return std::unique_ptr<DeviceGraph>(new Graph(this));
  }
  absl::StatusOr<bool> WorkDone() override { return !hang; }

  int captures = 0;
  int launches = 0;
  std::atomic<bool> hang{false};
  std::atomic<int> live_graphs{0};
  // Around the captured step, which runs its kernels as they are called: a
  // test that needs a capture to change nothing, as on a GPU, undoes them.
  std::function<void()> on_begin_capture;
  std::function<void()> on_end_capture;

 private:
  class Graph : public DeviceGraph {
   public:
    explicit Graph(ReplayingAccelerator* device) : device_(device) { ++device_->live_graphs; }
    ~Graph() override { --device_->live_graphs; }
    absl::Status Launch() override {
      ++device_->launches;
      return absl::OkStatus();
    }

   private:
    ReplayingAccelerator* device_;
  };
};

// Rank 0 of a data-parallel pair, alone: its allreduces go to a scripted
// communicator, its graphs to the replaying device.
struct LoneDataParallelRank {
  explicit LoneDataParallelRank(double comm_timeout_s, bool cuda_graph = true) : comm(0, 2) {
    plan = DataParallelPlans().at(0);
    plan.set_device_kind(DEVICE_CPU);  // the CPU's kernels on the fake device
    comms = SetOver(&comm, plan);
    ExecutorOptions options;
    options.device = &device;
    options.comms = comms.get();
    options.cuda_graph = cuda_graph;
    options.comm_timeout_s = comm_timeout_s;
    auto e = Executor::Create(plan, options);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return;
    executor = *std::move(e);
    EXPECT_TRUE(executor->InitializeState().ok());
    feeds = std::make_unique<SyntheticFeeds>(*executor);
  }
  absl::Status Step() { return Train().status(); }
  absl::StatusOr<StepResult> Train() {
    if (executor == nullptr) return absl::InternalError("no executor");
    return executor->TrainStep(*feeds, 0);
  }

  RankPlan plan;
  ReplayingAccelerator device;
  ScriptedCommunicator comm;
  std::unique_ptr<CommunicatorSet> comms;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<SyntheticFeeds> feeds;
};

TEST(StepGraphReplayTest, AStepThatCommunicatesIsCapturedWithItsCommunication) {
  LoneDataParallelRank rank(30);
  for (int step = 1; step <= 4; ++step) ASSERT_TRUE(rank.Step().ok()) << "step " << step;
  EXPECT_EQ(rank.device.captures, 1);
  EXPECT_EQ(rank.device.launches, 3) << "step 2 captured and launched, steps 3 and 4 replayed";
  EXPECT_EQ(rank.executor->graphs(), 1);
  EXPECT_TRUE(absl::StrContains(rank.executor->graph_note(), "step 2 captured as a graph (with the optimizer update "
                                                             "and its communication)"))
      << rank.executor->graph_note();
  EXPECT_TRUE(rank.comm.aborts.empty());
}

// What ncclCommAbort does, as NCCL 2.26 on does it: the kernels stop (the
// held replay finishes), and the call returns only once no graph holds the
// communicator's ops (bounded here, so a broken executor fails the test
// rather than hanging it).
void AbortLikeNccl(LoneDataParallelRank& rank) {
  rank.comm.on_abort = [&rank] {
    rank.device.hang = false;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (rank.device.live_graphs > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  };
}

TEST(StepGraphReplayTest, AFailedTransportEndsTheReplayAndIsAborted) {
  LoneDataParallelRank rank(30);
  AbortLikeNccl(rank);
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE(rank.Step().ok()) << "step " << step;
  rank.device.hang = true;
  rank.comm.health = absl::UnavailableError("NCCL remote error (connection lost)");
  const absl::Time start = absl::Now();
  absl::Status s = rank.Step();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the failure ends the wait, not the time limit";
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "step 4's replayed graph: NCCL remote error (connection lost); its "
                                             "communicators are aborted"))
      << s;
  ASSERT_EQ(rank.comm.aborts.size(), 1u);
  EXPECT_EQ(rank.comm.aborts[0], s);
  // The graph is gone (the abort could return) and never launched again.
  EXPECT_EQ(rank.device.live_graphs, 0);
  EXPECT_EQ(rank.executor->graphs(), 0);
  EXPECT_TRUE(absl::StrContains(rank.executor->graph_note(), "not used from step 4")) << rank.executor->graph_note();
}

TEST(StepGraphReplayTest, AReplayThatRunsOutOfTimeIsAborted) {
  LoneDataParallelRank rank(0.2);
  AbortLikeNccl(rank);
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE(rank.Step().ok()) << "step " << step;
  rank.device.hang = true;  // a peer that never issues its part; the transport sees nothing wrong
  const absl::Time start = absl::Now();
  absl::Status s = rank.Step();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "step 4's replayed graph: did not finish within")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--comm_timeout_s plus an eager step's time")) << s;
  EXPECT_GT(rank.comm.health_checks, 0);
  ASSERT_EQ(rank.comm.aborts.size(), 1u);
  EXPECT_TRUE(absl::IsDeadlineExceeded(rank.comm.aborts[0]));
  EXPECT_EQ(rank.device.live_graphs, 0);
}

// Every transport of the step is aborted at once: NCCL's abort returns only
// when no graph holds the communicator's ops, and the graph drains only
// when every communicator's kernels stop, so aborting one transport after
// another would wait 10 s for nothing and leave the graphs undestroyed.
// Rank 0 of a 2-stage pipeline x 2-way data parallel step: its transfers and
// its data-parallel group are two transports; only the second's abort stops
// the held replay, and each abort returns once the graphs are gone.
TEST(StepGraphReplayTest, EveryTransportIsAbortedAtOnce) {
  GenOptions gen = SmallMlp("adam");
  gen.stages = 2;
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(4);
  strategy.mutable_pipeline()->set_accumulate_steps(2);
  strategy.mutable_data_parallel()->set_degree(2);
  std::vector<RankPlan> plans = CompilePlans("mlp", gen, strategy, 16);
  ASSERT_EQ(plans.size(), 4u);
  RankPlan plan = plans[0];
  plan.set_device_kind(DEVICE_CPU);
  ReplayingAccelerator device;
  ScriptedCommunicator world(0, 4);
  CommunicatorSet comms(&world);
  ScriptedCommunicator* group_comm = nullptr;
  for (const CommGroup& group : plan.topology().group()) {
    if (group.rank_size() == 4) {
      ASSERT_TRUE(comms.Add(group, nullptr).ok());
      continue;
    }
    const int me = static_cast<int>(std::find(group.rank().begin(), group.rank().end(), 0) - group.rank().begin());
    auto comm = std::make_unique<ScriptedCommunicator>(me, group.rank_size());
    if (std::find(group.axis().begin(), group.axis().end(), "dp") != group.axis().end()) group_comm = comm.get();
    ASSERT_TRUE(comms.Add(group, std::move(comm)).ok());
  }
  ASSERT_NE(group_comm, nullptr) << "no data-parallel group";
  auto transfers_owned = std::make_unique<ScriptedCommunicator>(0, 4);
  ScriptedCommunicator* transfers = transfers_owned.get();
  ASSERT_TRUE(comms.SetTransfers(std::move(transfers_owned)).ok());
  auto wait_for_graphs = [&device] {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (device.live_graphs > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  };
  transfers->on_abort = wait_for_graphs;
  group_comm->on_abort = [&device, wait_for_graphs] {
    device.hang = false;
    wait_for_graphs();
  };
  ExecutorOptions options;
  options.device = &device;
  options.comms = &comms;
  options.cuda_graph = true;
  options.comm_timeout_s = 30;
  auto e = Executor::Create(plan, options);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->InitializeState().ok());
  const SyntheticFeeds feeds(**e);
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE((*e)->TrainStep(feeds, 0).ok()) << "step " << step;
  ASSERT_EQ(device.live_graphs, 1);
  device.hang = true;
  transfers->health = absl::UnavailableError("NCCL remote error (connection lost)");
  const absl::Time start = absl::Now();
  absl::Status s = (*e)->TrainStep(feeds, 0).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "aborted one after another, the drain would wait 10 s";
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_EQ(device.live_graphs, 0);
  EXPECT_EQ(transfers->aborts.size(), 1u);
  EXPECT_EQ(group_comm->aborts.size(), 1u);
}

// A capture that an op fails part-way (here the first bucket's allreduce,
// refused under the capture, fails its wait while the other buckets are
// posted) leaves Works queued: the step reruns eagerly from a clean slate
// (without it: "posted twice in one step"), trains, and stays eager.
TEST(StepGraphReplayTest, ACaptureThatFailsPartWayRunsTheStepEagerly) {
  class FailingUnderCapture : public ScriptedCommunicator {
   public:
    explicit FailingUnderCapture(Device* device) : ScriptedCommunicator(0, 2), device_(device) {}
    std::unique_ptr<Work> AllReduce(Tensor* t, ReduceOp op) override {
      if (device_->capturing() && ++captured_allreduces_ == 1) {
        return std::make_unique<DoneWork>(CommOpType::kAllReduce, 0,
                                          absl::InternalError("refused under the capture (injected)"));
      }
      return ScriptedCommunicator::AllReduce(t, op);
    }

   private:
    Device* device_;
    int captured_allreduces_ = 0;
  };
  Strategy small_buckets;
  small_buckets.mutable_data_parallel()->set_degree(2);
  small_buckets.mutable_data_parallel()->set_bucket_mb(0.001);
  RankPlan plan = CompilePlans("mlp", SmallMlp("adam"), small_buckets, 8).at(0);
  plan.set_device_kind(DEVICE_CPU);
  int buckets = 0;
  for (const Op& op : plan.program().op()) buckets += op.type() == "bucket_allreduce";
  ASSERT_GE(buckets, 2) << "the failure needs a bucket posted before it";
  ReplayingAccelerator device;
  FailingUnderCapture comm(&device);
  std::unique_ptr<CommunicatorSet> comms = SetOver(&comm, plan);
  ExecutorOptions options;
  options.device = &device;
  options.comms = comms.get();
  options.cuda_graph = true;
  auto e = Executor::Create(plan, options);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->InitializeState().ok());
  const SyntheticFeeds feeds(**e);
  for (int step = 1; step <= 3; ++step) {
    auto r = (*e)->TrainStep(feeds, 0);
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
  }
  EXPECT_EQ(device.captures, 1);
  EXPECT_EQ((*e)->graphs(), 0);
  EXPECT_TRUE(absl::StrContains((*e)->graph_note(), "refused under the capture")) << (*e)->graph_note();
}

TEST(StepGraphReplayTest, AStepOverAHostTransportStaysEager) {
  LoneDataParallelRank rank(30);
  rank.comm.blocker = "scripted moves tensors on the host";
  // The decision is made at Create: a fresh executor sees the blocker.
  ExecutorOptions options;
  options.device = &rank.device;
  options.comms = rank.comms.get();
  options.cuda_graph = true;
  auto e = Executor::Create(rank.plan, options);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->InitializeState().ok());
  const SyntheticFeeds feeds(**e);
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE((*e)->TrainStep(feeds, 0).ok()) << "step " << step;
  EXPECT_EQ(rank.device.captures, 0);
  EXPECT_TRUE(absl::StrContains((*e)->graph_note(), "not used: rank 0's step communicates (op '")) << (*e)->graph_note();
  EXPECT_TRUE(absl::StrContains((*e)->graph_note(), "scripted moves tensors on the host")) << (*e)->graph_note();
}

// The ranks' vote on graphs (AgreeOnStepGraphs) over Gloo, ranks as
// threads: every rank gets the lowest rank that cannot and its reason, or
// rank -1 when all can.
TEST(StepGraphVoteTest, EveryRankLearnsTheLowestRankThatCannotAndWhy) {
  std::vector<std::unique_ptr<Communicator>> world = testing::ConnectRanks(3);
  const std::vector<std::vector<std::string>> rounds = {
      {"", "rank 1's reason, longer than one word of eight bytes", "rank 2's"},
      {"", "", ""},
      {"x", "", "y"},
  };
  std::vector<std::vector<StepGraphVote>> got(3);
  testing::RunRanks(3, [&](int rank) {
    for (const auto& round : rounds) {
      absl::StatusOr<StepGraphVote> vote = AgreeOnStepGraphs(*world[rank], round[rank], absl::Seconds(30));
      ASSERT_TRUE(vote.ok()) << vote.status();
      got[rank].push_back(*vote);
    }
  });
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_EQ(got[rank].size(), rounds.size());
    EXPECT_EQ(got[rank][0].rank, 1);
    EXPECT_EQ(got[rank][0].reason, rounds[0][1]);
    EXPECT_EQ(got[rank][1].rank, -1);
    EXPECT_EQ(got[rank][1].reason, "");
    EXPECT_EQ(got[rank][2].rank, 0);
    EXPECT_EQ(got[rank][2].reason, "x");
  }
}

// A rank whose peer cannot capture (here its peer's warm-up step moved its
// state) stays eager from the first step, tries no capture, and says which
// rank stopped it and why: a captured rank would wait in its NCCL kernels
// for a peer that runs its collectives eagerly.
TEST(StepGraphAgreementTest, APeerThatCannotCaptureKeepsTheRankEagerAndSaysWhy) {
  LoneDataParallelRank rank(30);
  rank.comm.peer_votes = {"a replayed step would not follow its state: (scripted)"};
  for (int step = 1; step <= 4; ++step) ASSERT_TRUE(rank.Step().ok()) << "step " << step;
  EXPECT_EQ(rank.device.captures, 0);
  EXPECT_EQ(rank.device.launches, 0);
  EXPECT_EQ(rank.executor->graphs(), 0);
  EXPECT_EQ(rank.comm.votes, 1) << "no votes once graphs are off on every rank";
  EXPECT_EQ(rank.executor->graph_note(),
            "not used from step 1: rank 1 cannot capture its step: a replayed step would not follow its state: "
            "(scripted)");
}

bool SameState(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.bytes() != t.bytes() ||
        std::memcmp(it->second.raw_data(), t.raw_data(), t.bytes()) != 0) {
      return false;
    }
  }
  return true;
}

// A rank whose own capture succeeded but whose peer's failed drops its
// graph unlaunched and trains the step eagerly, as an eager run does: the
// peer reruns its step eagerly, and a launched graph's allreduces would
// have met nothing.
TEST(StepGraphAgreementTest, APeerWhoseCaptureFailedMakesTheRankDropItsGraph) {
  LoneDataParallelRank eager(30, /*cuda_graph=*/false);
  std::vector<double> eager_losses;
  for (int step = 1; step <= 4; ++step) {
    absl::StatusOr<StepResult> r = eager.Train();
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
    eager_losses.push_back(r->loss);
  }
  absl::StatusOr<std::map<std::string, Tensor>> eager_state = eager.executor->HostState();
  ASSERT_TRUE(eager_state.ok()) << eager_state.status();

  LoneDataParallelRank rank(30);
  rank.comm.peer_votes = {"", "the device refused the capture: (scripted)"};
  // The fake device runs the captured step's kernels; a GPU's capture runs
  // nothing, so the state goes back to what it was.
  std::map<std::string, Tensor> before_capture;
  rank.device.on_begin_capture = [&] {
    for (const auto& [name, t] : rank.executor->PersistentState()) before_capture[name] = t.Clone(GetCpuAllocator());
  };
  rank.device.on_end_capture = [&] {
    for (auto& [name, t] : rank.executor->PersistentState()) {
      std::memcpy(t.raw_data(), before_capture.at(name).raw_data(), t.bytes());
    }
  };
  std::vector<double> losses;
  for (int step = 1; step <= 4; ++step) {
    absl::StatusOr<StepResult> r = rank.Train();
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
    losses.push_back(r->loss);
  }
  EXPECT_EQ(rank.device.captures, 1);
  EXPECT_EQ(rank.device.launches, 0) << "the graph is never launched";
  EXPECT_EQ(rank.device.live_graphs, 0);
  EXPECT_EQ(rank.executor->graphs(), 0);
  EXPECT_EQ(rank.comm.votes, 2) << "the warm-up's and the capture's";
  EXPECT_EQ(rank.executor->graph_note(),
            "not used from step 2: rank 1 cannot capture its step: the device refused the capture: (scripted)");
  EXPECT_EQ(losses, eager_losses);
  absl::StatusOr<std::map<std::string, Tensor>> state = rank.executor->HostState();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(SameState(*state, *eager_state));
}

// Two data-parallel ranks as threads, voting over Gloo (the world); their
// allreduces go over scripted transports, rank 0's host-bound when
// `rank0_blocker` is set. Keeps each rank's executor after `steps` steps.
struct VotingPair {
  ReplayingAccelerator devices[2];
  std::vector<std::unique_ptr<Communicator>> world;
  std::vector<std::unique_ptr<CommunicatorSet>> comm_sets = std::vector<std::unique_ptr<CommunicatorSet>>(2);
  std::vector<std::unique_ptr<Executor>> executors = std::vector<std::unique_ptr<Executor>>(2);
  std::vector<absl::Status> results = std::vector<absl::Status>(2);
  std::vector<absl::Duration> took = std::vector<absl::Duration>(2);

  void Run(const std::string& rank0_blocker, int steps) {
    const std::vector<RankPlan> plans = DataParallelPlans();
    ASSERT_EQ(plans.size(), 2u);
    world = testing::ConnectRanks(2);
    testing::RunRanks(2, [&](int r) {
      RankPlan plan = plans[r];
      plan.set_device_kind(DEVICE_CPU);
      comm_sets[r] = std::make_unique<CommunicatorSet>(world[r].get());
      for (const CommGroup& group : plan.topology().group()) {
        auto dp = std::make_unique<ScriptedCommunicator>(r, group.rank_size());
        if (r == 0) dp->blocker = rank0_blocker;
        absl::Status s = comm_sets[r]->Add(group, std::move(dp));
        ASSERT_TRUE(s.ok()) << s;
      }
      ExecutorOptions options;
      options.device = &devices[r];
      options.comms = comm_sets[r].get();
      options.cuda_graph = true;
      options.comm_timeout_s = 10;
      auto e = Executor::Create(plan, options);
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE((*e)->InitializeState().ok());
      const SyntheticFeeds feeds(**e);
      const absl::Time start = absl::Now();
      for (int step = 1; step <= steps && results[r].ok(); ++step) results[r] = (*e)->TrainStep(feeds, 0).status();
      took[r] = absl::Now() - start;
      executors[r] = *std::move(e);
    });
  }
};

// A rank that may not capture at all (its step's transport runs on the
// host, decided at Prepare) still joins the first step's vote: its peer,
// which could capture, learns why not and stays eager instead of waiting
// for a vote that never comes, or capturing alone.
TEST(StepGraphAgreementTest, ARankThatMayNotCaptureStillVotes) {
  VotingPair pair;
  pair.Run("scripted moves tensors on the host", 3);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_TRUE(pair.results[r].ok()) << pair.results[r];
    EXPECT_LT(pair.took[r], absl::Seconds(5)) << "no rank waits out a vote";
    EXPECT_EQ(pair.devices[r].captures, 0);
    ASSERT_NE(pair.executors[r], nullptr);
    EXPECT_EQ(pair.executors[r]->graphs(), 0);
  }
  ASSERT_NE(pair.executors[0], nullptr);
  ASSERT_NE(pair.executors[1], nullptr);
  EXPECT_TRUE(absl::StartsWith(pair.executors[0]->graph_note(), "not used: rank 0's step communicates"))
      << pair.executors[0]->graph_note();
  EXPECT_TRUE(absl::StartsWith(pair.executors[1]->graph_note(),
                               "not used from step 1: rank 0 cannot capture its step: rank 0's step communicates"))
      << pair.executors[1]->graph_note();
  EXPECT_TRUE(absl::StrContains(pair.executors[1]->graph_note(), "scripted moves tensors on the host"))
      << pair.executors[1]->graph_note();
}

// Where every rank can, the votes pass: both capture step 2 and replay.
TEST(StepGraphAgreementTest, RanksThatAllCanCaptureReplayTogether) {
  VotingPair pair;
  pair.Run("", 4);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_TRUE(pair.results[r].ok()) << pair.results[r];
    EXPECT_EQ(pair.devices[r].captures, 1);
    EXPECT_EQ(pair.devices[r].launches, 3);
    ASSERT_NE(pair.executors[r], nullptr);
    EXPECT_EQ(pair.executors[r]->graphs(), 1);
    EXPECT_TRUE(absl::StartsWith(pair.executors[r]->graph_note(), "step 2 captured as a graph"))
        << pair.executors[r]->graph_note();
  }
}

}  // namespace
}  // namespace strata
