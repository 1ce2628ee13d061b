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
class ScriptedCommunicator : public testing::InstantCommunicator {
 public:
  ScriptedCommunicator(int rank, int size) : InstantCommunicator(rank, size, "scripted") {}
  std::string GraphBlocker() const override { return blocker; }
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
    auto data = OpenDataset("synthetic:vocab=32", specs_, 5);
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
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<DeviceGraph>> EndCapture() override {
    capture = false;
    return std::unique_ptr<DeviceGraph>(new Graph(this));
  }
  absl::StatusOr<bool> WorkDone() override { return !hang; }

  int captures = 0;
  int launches = 0;
  std::atomic<bool> hang{false};
  std::atomic<int> live_graphs{0};

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
  explicit LoneDataParallelRank(double comm_timeout_s) : comm(0, 2) {
    plan = DataParallelPlans().at(0);
    plan.set_device_kind(DEVICE_CPU);  // the CPU's kernels on the fake device
    comms = SetOver(&comm, plan);
    ExecutorOptions options;
    options.device = &device;
    options.comms = comms.get();
    options.cuda_graph = true;
    options.comm_timeout_s = comm_timeout_s;
    auto e = Executor::Create(plan, options);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return;
    executor = *std::move(e);
    EXPECT_TRUE(executor->InitializeState().ok());
    feeds = std::make_unique<SyntheticFeeds>(*executor);
  }
  absl::Status Step() {
    if (executor == nullptr) return absl::InternalError("no executor");
    return executor->TrainStep(*feeds, 0).status();
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

}  // namespace
}  // namespace strata
