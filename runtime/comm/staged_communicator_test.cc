// StagedCommunicator over real Gloo between ranks as threads, with tensors
// on FakeAccelerator: a device the runtime treats as a GPU (Gloo refuses its
// tensors) whose copies are memcpy and counted.

#include "runtime/comm/staged_communicator.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/comm_test_util.h"

namespace strata {
namespace {

using ::strata::testing::ConnectRanks;
using ::strata::testing::FakeAccelerator;
using ::strata::testing::RunRanks;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);

Tensor OnDevice(Device* device, std::vector<float> values, Shape shape) {
  Tensor t = Tensor::Empty(F32, std::move(shape), device);
  std::copy(values.begin(), values.end(), t.data<float>());  // FakeAccelerator's memory is host memory
  return t;
}

std::vector<float> ValuesOf(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.num_elements()}; }

std::vector<std::unique_ptr<Communicator>> StagedRanks(int world) {
  std::vector<std::unique_ptr<Communicator>> comms = ConnectRanks(world);
  for (auto& comm : comms) comm = std::make_unique<StagedCommunicator>(std::move(comm));
  return comms;
}

TEST(StagedCommunicatorTest, GlooAloneRefusesADeviceTensorWithWhatToUse) {
  auto comms = ConnectRanks(2);
  FakeAccelerator device;
  Tensor t = OnDevice(&device, {1, 2}, {2});
  absl::Status send = comms[0]->Send(t, 1, 0)->Wait(kWait);
  EXPECT_TRUE(absl::IsInvalidArgument(send)) << send;
  EXPECT_THAT(send.message(), HasSubstr("the tensor is on cuda:0, which Gloo cannot address"));
  absl::Status reduce = comms[0]->AllReduce(&t, ReduceOp::kSum)->Wait(kWait);
  EXPECT_THAT(reduce.message(), HasSubstr("StagedCommunicator")) << reduce;
}

// The receiver's device tensor is written in Wait, not before.
TEST(StagedCommunicatorTest, SendRecvStagesDeviceTensorsThroughHostMemory) {
  auto comms = StagedRanks(2);
  EXPECT_EQ(comms[0]->backend(), "gloo+staged");
  FakeAccelerator devices[2];
  RunRanks(2, [&](int rank) {
    FakeAccelerator& device = devices[rank];
    if (rank == 0) {
      Tensor t = OnDevice(&device, {1, 2, 3, 4, 5, 6}, {2, 3});
      std::unique_ptr<Work> work = comms[0]->Send(t, 1, 7);
      EXPECT_EQ(device.copies_to_host, 1);
      // The bytes were staged at issue: the device tensor may change at once.
      t.data<float>()[0] = 100;
      EXPECT_TRUE(work->Wait(kWait).ok());
    } else {
      Tensor into = OnDevice(&device, std::vector<float>(6, 0), {2, 3});
      std::unique_ptr<Work> work = comms[1]->Recv(&into, 0, 7);
      EXPECT_TRUE(comms[1]->Barrier()->Wait(kWait).ok());
      EXPECT_EQ(ValuesOf(into), std::vector<float>(6, 0)) << "written before Wait";
      ASSERT_TRUE(work->Wait(kWait).ok());
      EXPECT_EQ(ValuesOf(into), (std::vector<float>{1, 2, 3, 4, 5, 6}));
      EXPECT_TRUE(work->IsCompleted());
      // Waiting again: the same status, no second copy.
      EXPECT_TRUE(work->Wait(kWait).ok());
      EXPECT_EQ(device.copies_from_host, 1);
    }
    if (rank == 0) {
      EXPECT_TRUE(comms[0]->Barrier()->Wait(kWait).ok());
    }
    // Every staging buffer went back once the Works were done.
    EXPECT_EQ(device.staging().live_bytes(), 0);
    EXPECT_GT(device.staging().peak_bytes(), 0);
  });
}

TEST(StagedCommunicatorTest, CollectivesOnDeviceTensorsMatchTheHostResults) {
  constexpr int kWorld = 3;
  auto comms = StagedRanks(kWorld);
  FakeAccelerator devices[kWorld];
  RunRanks(kWorld, [&](int rank) {
    Device* device = &devices[rank];
    const float r = static_cast<float>(rank);
    Tensor sum = OnDevice(device, {r, 10 * r}, {2});
    ASSERT_TRUE(comms[rank]->AllReduce(&sum, ReduceOp::kSum)->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(sum), (std::vector<float>{3, 30}));

    Tensor bcast = OnDevice(device, {r, r}, {2});
    ASSERT_TRUE(comms[rank]->Broadcast(&bcast, 2)->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(bcast), (std::vector<float>{2, 2}));

    Tensor in = OnDevice(device, {r}, {1});
    Tensor gathered = OnDevice(device, {-1, -1, -1}, {3});
    ASSERT_TRUE(comms[rank]->AllGather(in, &gathered)->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(gathered), (std::vector<float>{0, 1, 2}));

    // Chunk i of rank r holds r + i; rank i receives sum_r (r + i) = 3 + 3i.
    Tensor chunks = OnDevice(device, {r, r + 1, r + 2}, {3});
    Tensor mine = OnDevice(device, {0}, {1});
    ASSERT_TRUE(comms[rank]->ReduceScatter(chunks, &mine, ReduceOp::kSum)->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(mine), (std::vector<float>{3.0f + 3 * r}));
    EXPECT_EQ(ValuesOf(chunks), (std::vector<float>{r, r + 1, r + 2})) << "input left as it was";

    // A host output beside a device input: only the input is staged.
    Tensor host_out = Tensor::Zeros(F32, {3});
    ASSERT_TRUE(comms[rank]->AllGather(in, &host_out)->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(host_out), (std::vector<float>{0, 1, 2}));
  });
  for (FakeAccelerator& device : devices) EXPECT_EQ(device.staging().live_bytes(), 0);
}

TEST(StagedCommunicatorTest, HostTensorsPassThroughWithoutCopies) {
  auto comms = StagedRanks(2);
  RunRanks(2, [&](int rank) {
    Tensor t = Tensor::Empty(F32, {2});
    t.Fill(rank + 1);
    ASSERT_TRUE(comms[rank]->AllReduce(&t, ReduceOp::kSum)->Wait(kWait).ok());
    EXPECT_EQ(ValuesOf(t), (std::vector<float>{3, 3}));
  });
}

// A device copy that fails is the Work's error naming the op and device;
// the host op was never issued, so the peer's times out (and says so).
TEST(StagedCommunicatorTest, AFailedStagingCopyIsTheWorksErrorNamingTheDevice) {
  auto comms = StagedRanks(2);
  FakeAccelerator devices[2];
  RunRanks(2, [&](int rank) {
    FakeAccelerator& device = devices[rank];
    if (rank == 0) {
      device.fail_copies = true;
      Tensor t = OnDevice(&device, {1}, {1});
      std::unique_ptr<Work> work = comms[0]->Send(t, 1, 3);
      EXPECT_TRUE(work->IsCompleted());
      EXPECT_EQ(work->sequence_number(), -1);
      absl::Status s = work->Wait(kWait);
      EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
      EXPECT_THAT(s.message(), HasSubstr("send on rank 0: staging cuda:0 to the host: injected copy failure"));
    } else {
      Tensor into = OnDevice(&device, {0}, {1});
      absl::Status s = comms[1]->Recv(&into, 0, 3)->Wait(absl::Milliseconds(300));
      EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    }
  });
}

// The copy back failing (a device error after the bytes arrived) fails Wait.
TEST(StagedCommunicatorTest, AFailedCopyBackFailsTheWait) {
  auto comms = StagedRanks(2);
  FakeAccelerator devices[2];
  RunRanks(2, [&](int rank) {
    Tensor t = OnDevice(&devices[rank], {1, 2}, {2});
    std::unique_ptr<Work> work = comms[rank]->AllReduce(&t, ReduceOp::kSum);
    devices[rank].fail_copies = true;
    absl::Status s = work->Wait(kWait);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_THAT(s.message(), HasSubstr("allreduce #0: copying the result back to cuda:0: injected copy failure"));
    EXPECT_EQ(work->Wait(kWait), s) << "the same status again";
  });
}

}  // namespace
}  // namespace strata
