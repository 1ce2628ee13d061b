// Ranks with a GPU each run their collectives and their sends and receives
// over NCCL (runtime/comm/device_collectives.h): the collectives per group,
// the transfers over a 2-rank communicator and stream per ordered pair of
// ranks. Here every rank is a FakeAccelerator (a device the runtime cannot
// address from the host, whose memory is the host's) running the CPU's
// kernels, over an in-process fake NCCL: data parallelism, a 2-stage 1F1B
// pipeline (whose early-posted receives would deadlock on one shared
// communicator and stream) and the two together train what one device
// trains on the same global batch (float64, within the parity bar, 1e-5
// relative, against a real single-device run in the same test), the
// gradient buckets and the stages' tensors did go over the fake NCCL, and
// the pairs' streams are gone after the run. A rank's transfer pairs are
// aborted all at once.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/clock.h"

#include "gtest/gtest.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/comm/device_collectives.h"
#include "runtime/comm/fake_nccl.h"
#include "compiler/program_text.h"
#include "tests/hard_pipelines.h"
#include "tests/parity_util.h"

namespace strata {
namespace {

constexpr double kTolerance = 1e-5;

struct NcclRun {
  ParityRun run;
  int device_transports = 0;  // over all ranks
  int comm_stream_waits = 0;  // ops the NcclCommunicators put on the devices' communication streams
  int transfers = 0;          // sends and receives over the fake NCCL
  int collective_ops = 0;     // ops of the ranks' plans that name a group
  int live_streams = 0;       // the transfer pairs' streams left after the run
};

absl::StatusOr<NcclRun> TrainOverFakeNccl(const Program& program, const Strategy& strategy,
                                          const ParityOptions& base) {
  auto api = std::make_shared<testing::FakeNccl>();
  const std::string spec = testing::UniqueMemorySpec();
  std::mutex mu;
  std::vector<StreamHandle> comm_streams;
  NcclRun result;
  ParityOptions options = base;
  options.device_kind = DEVICE_CUDA;
  options.cpu_kernels = true;
  options.make_device = [](int rank) -> absl::StatusOr<std::unique_ptr<Device>> {
    return std::unique_ptr<Device>(new testing::FakeAccelerator(rank));
  };
  options.connect_device = [&](int rank, const RankPlan& plan, Device* device, CommunicatorSet* comms) -> absl::Status {
    auto store = OpenStore(spec, false, absl::Seconds(30));
    if (!store.ok()) return store.status();
    std::unique_ptr<Store> job = (*store)->WithPrefix("job");
    if (absl::Status s = ConnectDeviceCollectives(api, *job, CollectiveGroups(plan), device, absl::Seconds(30), comms);
        !s.ok()) {
      return s;
    }
    if (!TransferPeers(plan).empty()) {
      if (absl::Status s = ConnectDeviceTransfers(api, *job, plan, device, absl::Seconds(30), comms); !s.ok()) {
        return s;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    result.device_transports += comms->device_transports();
    for (const Op& op : plan.program().op()) result.collective_ops += op.has_group() ? 1 : 0;
    comm_streams.push_back(device->comm_stream());
    return absl::OkStatus();
  };
  absl::StatusOr<ParityRun> run = TrainParallel(program, strategy, options);
  if (!run.ok()) return run.status();
  result.run = *std::move(run);
  result.transfers = api->transfers();
  result.live_streams = api->live_streams();
  for (StreamHandle stream : comm_streams) result.comm_stream_waits += api->stream_waits(stream);
  return result;
}

ParityOptions Options() {
  ParityOptions options;
  options.data = "synthetic:classes=10,size=512";
  options.steps = 8;
  options.batch_size = 16;
  return options;
}

GenOptions Mlp(int stages) {
  GenOptions gen;
  gen.dtype = "F64";
  gen.layers = {784, 64, 32, 10};
  gen.stages = stages;
  return gen;
}

TEST(DeviceCollectivesTest, DataParallelBucketsOverNcclTrainLikeOneDevice) {
  auto program = GenerateModel("mlp", Mlp(1));
  ASSERT_TRUE(program.ok()) << program.status();
  auto single = TrainSingleDevice(*program, 16, Options());
  ASSERT_TRUE(single.ok()) << single.status();
  Strategy dp;
  dp.mutable_data_parallel()->set_degree(2);
  auto nccl = TrainOverFakeNccl(*program, dp, Options());
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  EXPECT_EQ(nccl->device_transports, 2);  // the dp group on each rank
  // Each bucket's allreduce once a step, every one over the fake NCCL.
  EXPECT_GT(nccl->collective_ops, 0);
  EXPECT_EQ(nccl->comm_stream_waits, Options().steps * nccl->collective_ops);
  EXPECT_EQ(nccl->transfers, 0);
  EXPECT_LE(MaxLossDifference(nccl->run, *single), kTolerance);
  EXPECT_LE(MaxWeightDifference(nccl->run, *single), kTolerance);
}

Strategy OneFOneB() {
  Strategy s;
  s.mutable_pipeline()->set_micro_batch_size(4);
  s.mutable_pipeline()->set_accumulate_steps(4);
  s.mutable_pipeline()->set_schedule(ONE_F_ONE_B);
  return s;
}

TEST(DeviceCollectivesTest, PipelineTransfersOverNcclPairsTrainLikeOneDevice) {
  auto program = GenerateModel("mlp", Mlp(2));
  ASSERT_TRUE(program.ok()) << program.status();
  auto single = TrainSingleDevice(*program, 16, Options());
  ASSERT_TRUE(single.ok()) << single.status();
  auto nccl = TrainOverFakeNccl(*program, OneFOneB(), Options());
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  // 8 steps x 4 micro-batches x (an activation forward, its gradient back),
  // sent and received, and each direction's first transfer at connect time
  // (NCCL connects a pair lazily at its first transfer, which needs both
  // ranks there: device_collectives.cc's WarmUpPair).
  EXPECT_EQ(nccl->transfers, 8 * 4 * 2 * 2 + 2 * 2);
  EXPECT_EQ(nccl->live_streams, 0);
  EXPECT_LE(MaxLossDifference(nccl->run, *single), kTolerance);
  EXPECT_LE(MaxWeightDifference(nccl->run, *single), kTolerance);
}

TEST(DeviceCollectivesTest, PipelineAndDataParallelOverNcclTrainLikeOneDevice) {
  auto program = GenerateModel("mlp", Mlp(2));
  ASSERT_TRUE(program.ok()) << program.status();
  auto single = TrainSingleDevice(*program, 16, Options());
  ASSERT_TRUE(single.ok()) << single.status();
  Strategy hybrid = OneFOneB();
  hybrid.mutable_data_parallel()->set_degree(2);
  hybrid.mutable_pipeline()->set_accumulate_steps(2);
  auto nccl = TrainOverFakeNccl(*program, hybrid, Options());
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  EXPECT_EQ(nccl->device_transports, 4);  // each rank's dp group
  EXPECT_GT(nccl->comm_stream_waits, 0);
  EXPECT_GT(nccl->transfers, 0);
  EXPECT_EQ(nccl->live_streams, 0);
  EXPECT_LE(MaxLossDifference(nccl->run, *single), kTolerance);
  EXPECT_LE(MaxWeightDifference(nccl->run, *single), kTolerance);
}

// Stages that send one another several tensors in one action, and weights
// tied across stages (several, and with crossed homes), over the fake NCCL,
// which matches a pair's messages by issue order as NCCL does: each action
// posts its receives in channel order, the order the sends go in, so the
// pipelines train what one device trains. (With receives posted in the
// order they are read, the pass-through program's three gradients from
// stage 1 to stage 0 would arrive in each other's buffers.)
TEST(DeviceCollectivesTest, HardPipelinesOverNcclTrainLikeOneDevice) {
  for (const char* text : {kPassThroughAcrossStages, kThreeTiedWeights, kCrossedTiedWeights, kOnePathTiedWeight}) {
    auto program = ParseProgramText(text, "hard.pbtxt");
    ASSERT_TRUE(program.ok()) << program.status();
    SCOPED_TRACE(program->var(2).name());
    ParityOptions options = Options();
    options.data = "synthetic:classes=10,size=512";
    auto single = TrainSingleDevice(*program, 16, options);
    ASSERT_TRUE(single.ok()) << single.status();
    auto nccl = TrainOverFakeNccl(*program, OneFOneB(), options);
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    EXPECT_GT(nccl->transfers, 0);
    EXPECT_LE(MaxLossDifference(nccl->run, *single), kTolerance);
    EXPECT_LE(MaxWeightDifference(nccl->run, *single), kTolerance);
    EXPECT_GT(MaxWeightDifference(single->weights, single->initial_weights), 1e-3);
  }
}

// ncclCommAbort as NCCL 2.26 on does it under a CUDA graph: it returns only
// once the graph holding the communicator's ops is gone, which needs every
// other communicator in the graph stopped too. Stand-in: an abort waits
// (at most `patience`) until all `together` aborts have begun.
class AbortReturnsOnceAllAreAborting : public testing::FakeNccl {
 public:
  AbortReturnsOnceAllAreAborting(int together, absl::Duration patience) : together_(together), patience_(patience) {}
  absl::Status CommAbort(Comm comm) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++begun_;
      all_begun_.notify_all();
      if (!all_begun_.wait_for(lock, absl::ToChronoNanoseconds(patience_), [this] { return begun_ >= together_; })) {
        ++waited_out;
      }
    }
    return FakeNccl::CommAbort(comm);
  }
  int waited_out = 0;  // aborts that gave up waiting for the others (read after they return)

 private:
  const int together_;
  const absl::Duration patience_;
  std::mutex mu_;
  std::condition_variable all_begun_;
  int begun_ = 0;
};

// A rank's transfers are one 2-rank communicator per direction; aborting
// them one after another would leave the first waiting for graphs that the
// second's kernels keep alive, so the rank aborts them all at once.
TEST(DeviceCollectivesTest, EveryTransferPairIsAbortedAtOnce) {
  // Rank 0 sends to rank 1: each rank has the pairs 0 -> 1 and 1 -> 0.
  auto api = std::make_shared<AbortReturnsOnceAllAreAborting>(2, absl::Seconds(3));
  const std::string spec = testing::UniqueMemorySpec();
  testing::FakeAccelerator devices[2] = {testing::FakeAccelerator(0), testing::FakeAccelerator(1)};
  std::vector<std::unique_ptr<Communicator>> worlds;
  std::vector<std::unique_ptr<CommunicatorSet>> sets;
  for (int r = 0; r < 2; ++r) {
    worlds.push_back(std::make_unique<testing::InstantCommunicator>(r, 2));
    sets.push_back(std::make_unique<CommunicatorSet>(worlds[r].get()));
  }
  testing::RunRanks(2, [&](int r) {
    RankPlan plan;
    plan.set_rank(r);
    Op* send = plan.mutable_program()->add_op();
    send->set_type(r == 0 ? "send" : "recv");
    send->mutable_channel()->set_src_rank(0);
    send->mutable_channel()->set_dst_rank(1);
    auto store = OpenStore(spec, false, absl::Seconds(30));
    ASSERT_TRUE(store.ok()) << store.status();
    std::unique_ptr<Store> job = (*store)->WithPrefix("job");
    absl::Status s = ConnectDeviceTransfers(api, *job, plan, &devices[r], absl::Seconds(30), sets[r].get());
    ASSERT_TRUE(s.ok()) << s;
  });
  const absl::Time start = absl::Now();
  sets[0]->transfers()->Abort(absl::UnavailableError("a peer died (injected)"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "aborted one after another, the first abort waits 3 s";
  EXPECT_EQ(api->waited_out, 0);
}

}  // namespace
}  // namespace strata
