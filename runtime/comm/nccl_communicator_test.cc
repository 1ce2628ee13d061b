// NcclCommunicator's logic over FakeNccl, an in-process transport: ranks as
// threads, tensors on FakeAccelerator, the unique id through a real
// in-memory store. What the GPU adds (libnccl, CUDA events) is the real
// NcclApi's, tested on a GPU by runtime/cuda:nccl_communicator_gpu_test.

#include "runtime/comm/nccl_communicator.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/comm/fake_nccl.h"
#include "runtime/comm/store.h"

namespace strata {
namespace {

using ::strata::testing::FakeAccelerator;
using ::strata::testing::FakeNccl;
using ::strata::testing::RunRanks;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);

Tensor OnDevice(Device* device, std::vector<float> values) {
  Tensor t = Tensor::Empty(F32, {static_cast<int64_t>(values.size())}, device);
  std::copy(values.begin(), values.end(), t.data<float>());  // FakeAccelerator's memory is host memory
  return t;
}

std::vector<float> ValuesOf(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.num_elements()}; }

// `world` ranks over one FakeNccl, their ids exchanged through one memory://
// store under the group prefix "strata/job/g1".
struct Group {
  explicit Group(int world, std::shared_ptr<FakeNccl> with = std::make_shared<FakeNccl>())
      : api(std::move(with)), devices(world), comms(world) {
    spec = testing::UniqueMemorySpec();
    RunRanks(world, [&](int rank) {
      auto store = OpenStore(spec);
      ASSERT_TRUE(store.ok()) << store.status();
      std::unique_ptr<Store> view = (*store)->WithPrefix("strata/job/g1");
      auto comm = NcclCommunicator::Create(api, *view, &devices[rank], rank, world, kWait);
      ASSERT_TRUE(comm.ok()) << comm.status();
      comms[rank] = *std::move(comm);
    });
  }
  std::shared_ptr<FakeNccl> api;
  std::string spec;
  std::vector<FakeAccelerator> devices;
  std::vector<std::unique_ptr<NcclCommunicator>> comms;
};

TEST(NcclCommunicatorTest, RankZerosIdReachesTheOthersThroughTheGroupsPrefix) {
  Group group(3);
  EXPECT_EQ(group.api->unique_ids_made(), 1);
  auto store = OpenStore(group.spec);
  ASSERT_TRUE(store.ok());
  auto id = (*store)->Get("strata/job/g1/nccl_unique_id", absl::Seconds(1));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), NcclApi::kUniqueIdBytes);
  EXPECT_EQ(group.comms[2]->backend(), "nccl");
  EXPECT_EQ(group.comms[2]->rank(), 2);
  EXPECT_EQ(group.comms[2]->size(), 3);
}

// A CUDA graph may capture NCCL's operations from 2.9.6 on; an older
// library keeps the step eager and is named.
TEST(NcclCommunicatorTest, OnlyANcclThatGraphsCanCaptureLetsTheStepBeCaptured) {
  Group group(2);
  EXPECT_EQ(group.comms[0]->GraphBlocker(), "");
  group.api->version = 20906;
  EXPECT_EQ(group.comms[0]->GraphBlocker(), "");
  group.api->version = 20905;
  EXPECT_EQ(group.comms[1]->GraphBlocker(),
            "NCCL 2.9.5 is older than 2.9.6, the first whose operations a CUDA graph can capture");
  EXPECT_EQ(NcclApi::VersionString(22809), "2.28.9");
}

TEST(NcclCommunicatorTest, ARankWithoutRankZerosIdTimesOutNamingIt) {
  FakeAccelerator device;
  auto store = OpenStore(testing::UniqueMemorySpec());
  ASSERT_TRUE(store.ok());
  auto comm = NcclCommunicator::Create(std::make_shared<FakeNccl>(), **store, &device, 1, 2, absl::Milliseconds(100));
  ASSERT_FALSE(comm.ok());
  EXPECT_THAT(comm.status().message(), HasSubstr("rank 1 of 2: waiting for rank 0's NCCL id"));
}

TEST(NcclCommunicatorTest, CollectivesMoveTheBytesAndOrderTheStreams) {
  constexpr int kWorld = 3;
  Group group(kWorld);
  RunRanks(kWorld, [&](int rank) {
    NcclCommunicator& comm = *group.comms[rank];
    Device* device = &group.devices[rank];
    const float r = static_cast<float>(rank);
    Tensor sum = OnDevice(device, {r, 10 * r});
    std::unique_ptr<Work> work = comm.AllReduce(&sum, ReduceOp::kSum);
    ASSERT_TRUE(work->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(sum), (std::vector<float>{3, 30}));
    EXPECT_EQ(work->op_type(), CommOpType::kAllReduce);
    EXPECT_EQ(work->sequence_number(), 0);

    Tensor avg = OnDevice(device, {3 * r});
    ASSERT_TRUE(comm.AllReduce(&avg, ReduceOp::kAvg)->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(avg), (std::vector<float>{3}));

    Tensor bcast = OnDevice(device, {r, r});
    ASSERT_TRUE(comm.Broadcast(&bcast, 1)->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(bcast), (std::vector<float>{1, 1}));

    Tensor in = OnDevice(device, {r});
    Tensor gathered = OnDevice(device, {-1, -1, -1});
    ASSERT_TRUE(comm.AllGather(in, &gathered)->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(gathered), (std::vector<float>{0, 1, 2}));

    Tensor chunks = OnDevice(device, {r, r + 1, r + 2});
    Tensor mine = OnDevice(device, {0});
    std::unique_ptr<Work> scatter = comm.ReduceScatter(chunks, &mine, ReduceOp::kSum);
    ASSERT_TRUE(scatter->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(mine), (std::vector<float>{3.0f + 3 * r}));
    EXPECT_EQ(scatter->sequence_number(), 4);
    std::unique_ptr<Work> barrier = comm.Barrier();
    EXPECT_TRUE(barrier->Wait(kWait).ok());
    EXPECT_EQ(barrier->sequence_number(), 5);
  });
  for (FakeAccelerator& device : group.devices) {
    // Before each of the 6 ops the comm stream waited for the compute
    // stream; after each, the compute stream for the op.
    EXPECT_EQ(group.api->stream_waits(device.comm_stream()), 6);
    EXPECT_EQ(group.api->stream_waits(device.compute_stream()), 6);
  }
  EXPECT_EQ(group.api->live_events(), 0);
}

// Point-to-point ops are each issued inside ncclGroupStart/End, take their
// own sequence numbers, and match per pair in issue order.
TEST(NcclCommunicatorTest, SendAndRecvAreGroupedAndMatchInIssueOrder) {
  Group group(2);
  RunRanks(2, [&](int rank) {
    NcclCommunicator& comm = *group.comms[rank];
    Device* device = &group.devices[rank];
    if (rank == 0) {
      std::unique_ptr<Work> a = comm.Send(OnDevice(device, {1, 2}), 1, 5);
      std::unique_ptr<Work> b = comm.Send(OnDevice(device, {3}), 1, 6);
      EXPECT_EQ(a->sequence_number(), 0);
      EXPECT_EQ(b->sequence_number(), 1);
      EXPECT_TRUE(a->Wait(kWait).ok());
      EXPECT_TRUE(b->Wait(kWait).ok());
    } else {
      Tensor first = OnDevice(device, {0, 0});
      Tensor second = OnDevice(device, {0});
      std::unique_ptr<Work> a = comm.Recv(&first, 0, 5);
      std::unique_ptr<Work> b = comm.Recv(&second, 0, 6);
      ASSERT_TRUE(b->Wait(kWait).ok());
      ASSERT_TRUE(a->Wait(kWait).ok());
      EXPECT_EQ(ValuesOf(first), (std::vector<float>{1, 2}));
      EXPECT_EQ(ValuesOf(second), (std::vector<float>{3}));
    }
    std::unique_ptr<Work> after = comm.Barrier();
    EXPECT_EQ(after->sequence_number(), 0) << "collectives count apart from transfers";
    EXPECT_TRUE(after->Wait(kWait).ok());
  });
  EXPECT_EQ(group.api->ungrouped_transfers(), 0);
}

TEST(NcclCommunicatorTest, AnAsyncErrorAbortsAndNamesTheFirstError) {
  Group group(2);
  RunRanks(2, [&](int rank) {
    NcclCommunicator& comm = *group.comms[rank];
    Tensor t = OnDevice(&group.devices[rank], {1});
    if (rank == 1) {
      // Rank 1's part never comes; its NCCL reports a remote error instead.
      group.api->InjectAsyncError(1, absl::UnavailableError("NCCL remote error (connection lost)"));
      Tensor other = OnDevice(&group.devices[rank], {1, 2});
      std::unique_ptr<Work> work = comm.Broadcast(&other, 0);  // does not match rank 0's allreduce
      absl::Status s = work->Wait(kWait);
      EXPECT_TRUE(absl::IsUnavailable(s)) << s;
      EXPECT_THAT(s.message(), HasSubstr("broadcast #0 (root 0, F32[2]) on rank 1 of 2 failed: NCCL remote error"));
      EXPECT_TRUE(comm.aborted());
      EXPECT_EQ(group.api->aborts(1), 1);
      absl::Status later = comm.AllReduce(&t, ReduceOp::kSum)->Wait(kWait);
      EXPECT_TRUE(absl::IsFailedPrecondition(later)) << later;
      EXPECT_THAT(later.message(), HasSubstr("aborted after an earlier error: broadcast #0"));
    } else {
      // The peer is gone: rank 0 times out, aborts, and does not hang.
      const absl::Time start = absl::Now();
      absl::Status s = comm.AllReduce(&t, ReduceOp::kSum)->Wait(absl::Milliseconds(300));
      EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
      EXPECT_THAT(s.message(), HasSubstr("allreduce #0 (sum, F32[1]) on rank 0 of 2 timed out after 300ms"));
      EXPECT_LT(absl::Now() - start, absl::Seconds(5));
      EXPECT_TRUE(comm.aborted());
      EXPECT_EQ(group.api->aborts(0), 1);
      EXPECT_TRUE(absl::IsFailedPrecondition(comm.Send(t, 1, 0)->Wait(kWait)));
    }
  });
}

// Since NCCL 2.26 ncclCommAbort returns only once no CUDA graph holds the
// communicator's ops, and the executor destroys its graphs only after the
// failed step returns. So a timed-out Wait ends after a bounded wait for
// the abort, not when the abort does, and asking another Work whether it is
// done (the heartbeat's description of a stuck wait, from its own thread)
// never blocks on the abort.
TEST(NcclCommunicatorTest, AnAbortAGraphHoldsEndsTheWaitAndBlocksNoQuery) {
  class HeldAbort : public FakeNccl {
   public:
    absl::Status CommAbort(Comm comm) override {
      std::unique_lock<std::mutex> lock(mu_);
      entered_ = true;
      released_cv_.wait(lock, [this] { return released_; });
      lock.unlock();
      return FakeNccl::CommAbort(comm);
    }
    bool entered() {
      std::lock_guard<std::mutex> lock(mu_);
      return entered_;
    }
    void Release() {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
      released_cv_.notify_all();
    }

   private:
    std::mutex mu_;
    std::condition_variable released_cv_;
    bool entered_ = false;
    bool released_ = false;
  };
  auto api = std::make_shared<HeldAbort>();
  Group group(2, api);
  NcclCommunicator& comm = *group.comms[0];
  Tensor t = OnDevice(&group.devices[0], {1});
  Tensor u = OnDevice(&group.devices[0], {2});
  std::unique_ptr<Work> stuck = comm.AllReduce(&t, ReduceOp::kSum);  // rank 1 never joins either
  std::unique_ptr<Work> behind = comm.AllReduce(&u, ReduceOp::kSum);
  const absl::Time start = absl::Now();
  absl::Status s = stuck->Wait(absl::Milliseconds(200));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(waited, absl::Seconds(10)) << "the Wait waited for the held abort";
  EXPECT_TRUE(api->entered());
  EXPECT_TRUE(comm.aborted());
  const absl::Time asked = absl::Now();
  EXPECT_TRUE(behind->IsCompleted()) << "an aborted communicator's ops are over";
  EXPECT_LT(absl::Now() - asked, absl::Seconds(1));
  EXPECT_EQ(api->aborts(0), 0) << "the abort is still held";
  api->Release();  // the graphs are gone: the abort returns
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (api->aborts(0) == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(api->aborts(0), 1);
}

TEST(NcclCommunicatorTest, BadArgumentsFailAtOnceWithoutTakingASequenceNumber) {
  Group group(2);
  RunRanks(2, [&](int rank) {
    NcclCommunicator& comm = *group.comms[rank];
    Device* device = &group.devices[rank];
    Tensor host = Tensor::Zeros(F32, {2});
    absl::Status s = comm.AllReduce(&host, ReduceOp::kSum)->Wait(kWait);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("the tensor is on cpu:0: NCCL moves tensors of this rank's GPU, cuda:0, only"));
    Tensor in = OnDevice(device, {1});
    Tensor wrong = OnDevice(device, {0, 0, 0});
    s = comm.AllGather(in, &wrong)->Wait(kWait);
    EXPECT_THAT(s.message(), HasSubstr("the output must be F32 with 2 x 1 elements, got F32[3]"));
    EXPECT_THAT(comm.Send(in, rank, 0)->Wait(kWait).message(), HasSubstr("is not a peer"));
    Tensor ints = Tensor::Zeros(I32, {1}, device);
    EXPECT_THAT(comm.AllReduce(&ints, ReduceOp::kAvg)->Wait(kWait).message(), HasSubstr("avg needs a floating dtype"));
    std::unique_ptr<Work> ok = comm.AllReduce(&in, ReduceOp::kSum);
    EXPECT_EQ(ok->sequence_number(), 0);
    EXPECT_TRUE(ok->Wait(kWait).ok());
    EXPECT_FALSE(comm.aborted());
  });
}

// Destroyed with every op done: ncclCommDestroy. With an op still running
// (its Work dropped): ncclCommAbort, which a destroy would hang on.
TEST(NcclCommunicatorTest, DestroysWhenIdleAndAbortsWithAnOpRunning) {
  Group group(2);
  RunRanks(2, [&](int rank) {
    Tensor t = OnDevice(&group.devices[rank], {1});
    EXPECT_TRUE(group.comms[rank]->AllReduce(&t, ReduceOp::kSum)->Wait(kWait).ok());
  });
  Tensor t = OnDevice(&group.devices[0], {1});
  group.comms[0]->AllReduce(&t, ReduceOp::kSum).reset();  // rank 1 never joins it
  group.comms[0].reset();
  group.comms[1].reset();
  EXPECT_EQ(group.api->aborts(0), 1);
  EXPECT_EQ(group.api->destroys(0), 0);
  EXPECT_EQ(group.api->destroys(1), 1);
  EXPECT_EQ(group.api->aborts(1), 0);
  EXPECT_EQ(group.api->live_events(), 0);
}

// Under a capture (a CUDA graph being recorded) nothing may ask an event
// whether it passed: a Wait only makes the compute stream wait for the op,
// which rejoins the communication stream to the capture. The fake runs the
// op when both ranks issued it, as a replay would.
TEST(NcclCommunicatorTest, UnderACaptureAWaitOrdersTheComputeStreamWithoutQueryingTheEvent) {
  Group group(2);
  std::vector<Tensor> sums(2);
  RunRanks(2, [&](int rank) {
    FakeAccelerator& device = group.devices[rank];
    sums[rank] = OnDevice(&device, {static_cast<float>(rank + 1)});
    device.capture = true;
    std::unique_ptr<Work> work = group.comms[rank]->AllReduce(&sums[rank], ReduceOp::kSum);
    EXPECT_FALSE(work->IsCompleted()) << "a recorded op has not run when its Wait returns";
    EXPECT_TRUE(work->Wait(kWait).ok());
    EXPECT_TRUE(work->IsCompleted());
    device.capture = false;
  });
  EXPECT_EQ(group.api->event_queries(), 0);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(ValuesOf(sums[rank]), (std::vector<float>{3}));
    EXPECT_EQ(group.api->stream_waits(group.devices[rank].comm_stream()), 1);
    EXPECT_EQ(group.api->stream_waits(group.devices[rank].compute_stream()), 1);
  }
  EXPECT_EQ(group.api->live_events(), 0);
}

// A graph cannot wait for work outside it, nor an op it recorded be waited
// for after it ended: both are errors (the capture then fails, and the
// executor runs the step eagerly), never an event query under a capture.
TEST(NcclCommunicatorTest, AWorkThatCrossesACapturesEdgeFails) {
  Group group(2);
  RunRanks(2, [&](int rank) {
    FakeAccelerator& device = group.devices[rank];
    Tensor before = OnDevice(&device, {1});
    std::unique_ptr<Work> eager = group.comms[rank]->AllReduce(&before, ReduceOp::kSum);
    device.capture = true;
    Tensor during = OnDevice(&device, {1});
    std::unique_ptr<Work> recorded = group.comms[rank]->AllReduce(&during, ReduceOp::kSum);
    absl::Status s = eager->Wait(kWait);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("allreduce #0 (sum, F32[1]) on rank " + std::to_string(rank) +
                                       " of 2 was issued before the capture began"));
    device.capture = false;
    s = recorded->Wait(kWait);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("allreduce #1 (sum, F32[1]) on rank " + std::to_string(rank) +
                                       " of 2 was issued under a capture that ended"));
  });
  EXPECT_EQ(group.api->event_queries(), 0);
}

// An op that cannot be issued under a capture (its event record fails,
// as on a capture an earlier call invalidated) ran nowhere: its Work fails
// and the communicator is not aborted, so the step's eager rerun can use it.
TEST(NcclCommunicatorTest, AnIssueFailingUnderACaptureDoesNotAbort) {
  Group group(2);
  RunRanks(2, [&](int rank) {
    FakeAccelerator& device = group.devices[rank];
    Tensor t = OnDevice(&device, {static_cast<float>(rank + 1)});
    device.capture = true;
    if (rank == 0) group.api->fail_event_records = true;
    std::unique_ptr<Work> failed = rank == 0 ? group.comms[rank]->AllReduce(&t, ReduceOp::kSum) : nullptr;
    device.capture = false;
    if (rank == 0) {
      absl::Status s = failed->Wait(kWait);
      EXPECT_FALSE(s.ok());
      EXPECT_THAT(s.message(), HasSubstr("allreduce #0 (sum, F32[1]) on rank 0 of 2 under a capture"));
      EXPECT_FALSE(group.comms[rank]->aborted());
      group.api->fail_event_records = false;
    }
  });
  EXPECT_EQ(group.api->aborts(0), 0);
  // The eager rerun's allreduce completes, numbered #0 on both ranks (the
  // failed op gave its number back).
  RunRanks(2, [&](int rank) {
    Tensor t = OnDevice(&group.devices[rank], {static_cast<float>(rank + 1)});
    std::unique_ptr<Work> work = group.comms[rank]->AllReduce(&t, ReduceOp::kSum);
    EXPECT_EQ(work->sequence_number(), 0);
    EXPECT_TRUE(work->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(t), (std::vector<float>{3}));
  });
}

// What the host watches a replay through, which no Work watches: the
// communicator's async error, and the abort that ends its kernels.
TEST(NcclCommunicatorTest, CheckHealthReportsTheAsyncErrorAndAbortEndsTheCommunicator) {
  Group group(2);
  EXPECT_EQ(group.comms[0]->GraphBlocker(), "");
  EXPECT_TRUE(group.comms[0]->CheckHealth().ok());
  group.api->InjectAsyncError(1, absl::UnavailableError("NCCL remote error (connection lost)"));
  absl::Status health = group.comms[1]->CheckHealth();
  EXPECT_TRUE(absl::IsUnavailable(health)) << health;
  EXPECT_THAT(health.message(), HasSubstr("NCCL communicator of rank 1 of 2 failed: NCCL remote error"));
  EXPECT_FALSE(group.comms[1]->aborted()) << "checking does not abort; the host decides";

  group.comms[0]->Abort(absl::DeadlineExceededError("step 3's replayed graph did not finish"));
  EXPECT_TRUE(group.comms[0]->aborted());
  EXPECT_EQ(group.api->aborts(0), 1);
  group.comms[0]->Abort(absl::InternalError("a second abort"));
  EXPECT_EQ(group.api->aborts(0), 1) << "ncclCommAbort once";
  health = group.comms[0]->CheckHealth();
  EXPECT_TRUE(absl::IsDeadlineExceeded(health)) << health;
  Tensor t = OnDevice(&group.devices[0], {1});
  absl::Status later = group.comms[0]->AllReduce(&t, ReduceOp::kSum)->Wait(kWait);
  EXPECT_TRUE(absl::IsFailedPrecondition(later)) << later;
  EXPECT_THAT(later.message(), HasSubstr("step 3's replayed graph did not finish"));
}

}  // namespace
}  // namespace strata
