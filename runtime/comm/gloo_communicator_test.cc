#include "runtime/comm/gloo_communicator.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/comm/communicator.h"

namespace strata {
namespace {

using ::strata::testing::ConnectRanks;
using ::strata::testing::RunRanks;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Generous: only reached when something is broken.
constexpr absl::Duration kWait = absl::Seconds(10);

template <typename T>
Tensor Filled(Shape shape, const std::function<T(int64_t)>& value) {
  Tensor t = Tensor::Empty(DataTypeOf<T>::value, shape);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<T>()[i] = value(i);
  return t;
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.num_elements());
}

template <typename T>
std::vector<T> Expected(int64_t n, const std::function<T(int64_t)>& value) {
  std::vector<T> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(i);
  return v;
}

TEST(GlooCommunicatorTest, ReportsRankSizeAndBackend) {
  auto comms = ConnectRanks(3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_NE(comms[r], nullptr);
    EXPECT_EQ(comms[r]->rank(), r);
    EXPECT_EQ(comms[r]->size(), 3);
    EXPECT_EQ(comms[r]->backend(), "gloo");
  }
}

// Rank 1 posts its receives in reverse tag order; each lands on its own tag.
TEST(GlooCommunicatorTest, SendRecvCarriesEveryDtypeOnItsOwnTag) {
  auto comms = ConnectRanks(2);
  RunRanks(2, [&](int rank) {
    Communicator& comm = *comms[rank];
    if (rank == 0) {
      std::vector<Tensor> payload = {
          Filled<float>({2, 3}, [](int64_t i) { return 0.5f + i; }),
          Filled<double>({4}, [](int64_t i) { return -1.25 * i; }),
          Filled<int64_t>({5}, [](int64_t i) { return int64_t{1} << (30 + i); }),
          Filled<int32_t>({3}, [](int64_t i) { return static_cast<int32_t>(-7 * i); }),
          Filled<bool>({4}, [](int64_t i) { return i % 2 == 1; }),
      };
      std::vector<std::unique_ptr<Work>> sends;
      for (int tag = 0; tag < 5; ++tag) sends.push_back(comm.Send(payload[tag], 1, 100 + tag));
      for (auto& work : sends) EXPECT_TRUE(work->Wait(kWait).ok());
    } else {
      std::vector<Tensor> into = {
          Tensor::Zeros(F32, {2, 3}), Tensor::Zeros(F64, {4}),  Tensor::Zeros(I64, {5}),
          Tensor::Zeros(I32, {3}),    Tensor::Zeros(BOOL, {4}),
      };
      std::vector<std::unique_ptr<Work>> recvs(5);
      for (int tag = 4; tag >= 0; --tag) recvs[tag] = comm.Recv(&into[tag], 0, 100 + tag);
      for (int tag = 4; tag >= 0; --tag) {
        absl::Status status = recvs[tag]->Wait(kWait);
        EXPECT_TRUE(status.ok()) << status;
        EXPECT_TRUE(recvs[tag]->IsCompleted());
        EXPECT_EQ(recvs[tag]->op_type(), CommOpType::kRecv);
      }
      EXPECT_EQ(Values<float>(into[0]), (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f}));
      EXPECT_EQ(Values<double>(into[1]), (std::vector<double>{0, -1.25, -2.5, -3.75}));
      EXPECT_EQ(Values<int64_t>(into[2]),
                (std::vector<int64_t>{1LL << 30, 1LL << 31, 1LL << 32, 1LL << 33, 1LL << 34}));
      EXPECT_EQ(Values<int32_t>(into[3]), (std::vector<int32_t>{0, -7, -14}));
      EXPECT_EQ(Values<bool>(into[4]), (std::vector<bool>{false, true, false, true}));
    }
  });
}

TEST(GlooCommunicatorTest, MessagesOnOneChannelMatchInIssueOrder) {
  auto comms = ConnectRanks(2);
  RunRanks(2, [&](int rank) {
    Communicator& comm = *comms[rank];
    std::vector<Tensor> tensors;
    std::vector<std::unique_ptr<Work>> works;
    for (int m = 0; m < 4; ++m) {
      if (rank == 0) {
        tensors.push_back(Filled<float>({3}, [m](int64_t i) { return 10.0f * m + i; }));
        works.push_back(comm.Send(tensors.back(), 1, 7));
      } else {
        tensors.push_back(Tensor::Zeros(F32, {3}));
        works.push_back(comm.Recv(&tensors.back(), 0, 7));
      }
    }
    for (auto& work : works) EXPECT_TRUE(work->Wait(kWait).ok());
    if (rank == 1) {
      for (int m = 0; m < 4; ++m) {
        EXPECT_EQ(Values<float>(tensors[m]),
                  (std::vector<float>{10.0f * m, 10.0f * m + 1, 10.0f * m + 2}));
      }
    }
  });
}

// The pipeline pattern: the receiver posts its recv, then stays busy; the
// sender's Wait completes without the receiver ever calling Wait meanwhile.
TEST(GlooCommunicatorTest, SendCompletesWhileReceiverComputesAfterPostingRecv) {
  auto comms = ConnectRanks(2);
  absl::Notification recv_posted;
  absl::Notification send_done;
  RunRanks(2, [&](int rank) {
    Communicator& comm = *comms[rank];
    if (rank == 1) {
      Tensor activation = Tensor::Zeros(F64, {64, 32});
      std::unique_ptr<Work> recv = comm.Recv(&activation, 0, 3);
      recv_posted.Notify();
      // "Compute" until the sender is done; a rendezvous-style send would deadlock here.
      EXPECT_TRUE(send_done.WaitForNotificationWithTimeout(kWait));
      ASSERT_TRUE(recv->Wait(kWait).ok());
      EXPECT_EQ(activation.data<double>()[0], 0.0);
      EXPECT_EQ(activation.data<double>()[64 * 32 - 1], 0.25 * (64 * 32 - 1));
    } else {
      ASSERT_TRUE(recv_posted.WaitForNotificationWithTimeout(kWait));
      Tensor activation = Filled<double>({64, 32}, [](int64_t i) { return 0.25 * i; });
      std::unique_ptr<Work> send = comm.Send(activation, 1, 3);
      EXPECT_TRUE(send->Wait(kWait).ok());
      send_done.Notify();
    }
  });
}

// A send issued long before its recv: the send is parked, not lost.
TEST(GlooCommunicatorTest, SendBeforeRecvIsDeliveredWhenRecvIsPosted) {
  auto comms = ConnectRanks(2);
  absl::Notification sent;
  RunRanks(2, [&](int rank) {
    Communicator& comm = *comms[rank];
    if (rank == 0) {
      Tensor t = Filled<int64_t>({4}, [](int64_t i) { return 100 + i; });
      std::unique_ptr<Work> send = comm.Send(t, 1, 9);
      sent.Notify();
      EXPECT_TRUE(send->Wait(kWait).ok());
    } else {
      ASSERT_TRUE(sent.WaitForNotificationWithTimeout(kWait));
      absl::SleepFor(absl::Milliseconds(100));
      Tensor t = Tensor::Zeros(I64, {4});
      EXPECT_TRUE(comm.Recv(&t, 0, 9)->Wait(kWait).ok());
      EXPECT_EQ(Values<int64_t>(t), (std::vector<int64_t>{100, 101, 102, 103}));
    }
  });
}

TEST(GlooCommunicatorTest, SendAndRecvOfEmptyTensors) {
  auto comms = ConnectRanks(2);
  RunRanks(2, [&](int rank) {
    Communicator& comm = *comms[rank];
    Tensor t = Tensor::Zeros(F32, {0, 5});
    std::unique_ptr<Work> work = rank == 0 ? comm.Send(t, 1, 1) : comm.Recv(&t, 0, 1);
    EXPECT_TRUE(work->Wait(kWait).ok());
  });
}

// Values on rank r, element i: (r + 1) * (i + 1), plus 0.5 for floats, so
// sum = (i + 1) * W (W + 1) / 2 + W / 2, max = W (i + 1) + .5, min = i + 1 + .5.
template <typename T>
void CheckAllReduce(int world, int64_t n) {
  const double half = std::is_floating_point<T>::value ? 0.5 : 0.0;
  auto comms = ConnectRanks(world);
  RunRanks(world, [&](int rank) {
    Communicator& comm = *comms[rank];
    auto value = [&](int64_t i) { return static_cast<T>((rank + 1) * (i + 1) + half); };
    Tensor sum = Filled<T>({n}, value);
    Tensor max = Filled<T>({n}, value);
    Tensor min = Filled<T>({n}, value);
    auto w1 = comm.AllReduce(&sum, ReduceOp::kSum);
    auto w2 = comm.AllReduce(&max, ReduceOp::kMax);
    auto w3 = comm.AllReduce(&min, ReduceOp::kMin);
    for (Work* w : {w1.get(), w2.get(), w3.get()}) {
      absl::Status status = w->Wait(kWait);
      ASSERT_TRUE(status.ok()) << status;
    }
    EXPECT_EQ(Values<T>(sum), Expected<T>(n, [&](int64_t i) {
                return static_cast<T>((i + 1) * world * (world + 1) / 2 + half * world);
              }));
    EXPECT_EQ(Values<T>(max),
              Expected<T>(n, [&](int64_t i) { return static_cast<T>(world * (i + 1) + half); }));
    EXPECT_EQ(Values<T>(min),
              Expected<T>(n, [&](int64_t i) { return static_cast<T>(i + 1 + half); }));
  });
}

TEST(GlooCommunicatorTest, AllReduceSumMaxMinOverTwoRanks) {
  CheckAllReduce<float>(2, 7);
  CheckAllReduce<int64_t>(2, 5);
}

TEST(GlooCommunicatorTest, AllReduceSumMaxMinOverThreeRanks) {
  CheckAllReduce<double>(3, 11);
  CheckAllReduce<int32_t>(3, 2);  // fewer elements than ranks
}

TEST(GlooCommunicatorTest, AllReduceSumMaxMinOverFourRanks) {
  CheckAllReduce<float>(4, 13);
  CheckAllReduce<int64_t>(4, 1);
}

// Larger than Gloo's 1 MiB segment, so the ring runs several segments.
TEST(GlooCommunicatorTest, AllReduceOfSeveralMegabytes) { CheckAllReduce<double>(3, 400000); }

TEST(GlooCommunicatorTest, AllReduceAverage) {
  auto comms = ConnectRanks(4);
  RunRanks(4, [&](int rank) {
    Tensor t = Filled<double>({3}, [&](int64_t i) { return rank * 1.0 + i; });
    ASSERT_TRUE(comms[rank]->AllReduce(&t, ReduceOp::kAvg)->Wait(kWait).ok());
    // mean over r of (r + i) = 1.5 + i
    EXPECT_EQ(Values<double>(t), (std::vector<double>{1.5, 2.5, 3.5}));
  });
}

void CheckBroadcast(int world, int root) {
  auto comms = ConnectRanks(world);
  RunRanks(world, [&](int rank) {
    Tensor t =
        Filled<float>({2, 5}, [&](int64_t i) { return rank == root ? 3.0f * i - 1 : -99.0f; });
    absl::Status status = comms[rank]->Broadcast(&t, root)->Wait(kWait);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(Values<float>(t), Expected<float>(10, [](int64_t i) { return 3.0f * i - 1; }));
  });
}

TEST(GlooCommunicatorTest, BroadcastFromEveryKindOfRoot) {
  CheckBroadcast(2, 0);
  CheckBroadcast(3, 1);
  CheckBroadcast(4, 3);
}

// Rank r contributes [10 r, 10 r + 1, 10 r + 2]; chunk i of the output is rank i's.
void CheckAllGather(int world) {
  auto comms = ConnectRanks(world);
  RunRanks(world, [&](int rank) {
    Tensor in = Filled<int64_t>({3}, [&](int64_t j) { return 10 * rank + j; });
    Tensor out = Tensor::Zeros(I64, {world, 3});
    absl::Status status = comms[rank]->AllGather(in, &out)->Wait(kWait);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(Values<int64_t>(out),
              Expected<int64_t>(3 * world, [](int64_t k) { return 10 * (k / 3) + k % 3; }));
    EXPECT_EQ(Values<int64_t>(in), (std::vector<int64_t>{10 * rank, 10 * rank + 1, 10 * rank + 2}));
  });
}

TEST(GlooCommunicatorTest, AllGatherOverTwoThreeAndFourRanks) {
  CheckAllGather(2);
  CheckAllGather(3);
  CheckAllGather(4);
}

// Rank r's input element k is r + k (k < W n). Rank r's output element j is
// the reduction over q of q + r n + j: sum W (r n + j) + W (W - 1) / 2,
// max W - 1 + r n + j.
void CheckReduceScatter(int world, int64_t n) {
  auto comms = ConnectRanks(world);
  RunRanks(world, [&](int rank) {
    Tensor in = Filled<double>({world * n}, [&](int64_t k) { return rank + k; });
    Tensor sum = Tensor::Zeros(F64, {n});
    Tensor max = Tensor::Zeros(F64, {n});
    auto w1 = comms[rank]->ReduceScatter(in, &sum, ReduceOp::kSum);
    auto w2 = comms[rank]->ReduceScatter(in, &max, ReduceOp::kMax);
    for (Work* w : {w1.get(), w2.get()}) {
      absl::Status status = w->Wait(kWait);
      ASSERT_TRUE(status.ok()) << status;
    }
    EXPECT_EQ(Values<double>(sum), Expected<double>(n, [&](int64_t j) {
                return world * (rank * n + j) + world * (world - 1) / 2.0;
              }));
    EXPECT_EQ(Values<double>(max),
              Expected<double>(n, [&](int64_t j) { return world - 1.0 + rank * n + j; }));
    EXPECT_EQ(Values<double>(in), Expected<double>(world * n, [&](int64_t k) { return rank + k; }));
  });
}

TEST(GlooCommunicatorTest, ReduceScatterOverTwoThreeAndFourRanks) {
  CheckReduceScatter(2, 3);
  CheckReduceScatter(3, 5);
  CheckReduceScatter(4, 1);
}

TEST(GlooCommunicatorTest, ReduceScatterAverageOfFloats) {
  auto comms = ConnectRanks(2);
  RunRanks(2, [&](int rank) {
    Tensor in = Filled<float>({2, 2}, [&](int64_t k) { return rank == 0 ? 1.0f * k : 3.0f * k; });
    Tensor out = Tensor::Zeros(F32, {2});
    ASSERT_TRUE(comms[rank]->ReduceScatter(in, &out, ReduceOp::kAvg)->Wait(kWait).ok());
    // mean of k and 3 k is 2 k, for k = 2 rank + j.
    EXPECT_EQ(Values<float>(out), (std::vector<float>{4.0f * rank, 4.0f * rank + 2}));
  });
}

// No rank leaves the barrier before the last one, which arrives 200 ms late.
TEST(GlooCommunicatorTest, BarrierHoldsEveryRankUntilTheLastArrives) {
  for (int world : {2, 3, 4}) {
    auto comms = ConnectRanks(world);
    std::atomic<int> arrived{0};
    RunRanks(world, [&](int rank) {
      if (rank == world - 1) absl::SleepFor(absl::Milliseconds(200));
      arrived.fetch_add(1);
      ASSERT_TRUE(comms[rank]->Barrier()->Wait(kWait).ok());
      EXPECT_EQ(arrived.load(), world);
    });
  }
}

TEST(GlooCommunicatorTest, CollectivesShareSequenceNumbersAcrossRanks) {
  auto comms = ConnectRanks(3);
  RunRanks(3, [&](int rank) {
    Communicator& comm = *comms[rank];
    Tensor t = Tensor::Zeros(F32, {4});
    auto a = comm.AllReduce(&t, ReduceOp::kSum);
    auto b = comm.Barrier();
    auto c = comm.Broadcast(&t, 2);
    EXPECT_EQ(a->sequence_number(), 0);
    EXPECT_EQ(b->sequence_number(), 1);
    EXPECT_EQ(c->sequence_number(), 2);
    EXPECT_EQ(a->op_type(), CommOpType::kAllReduce);
    EXPECT_EQ(b->op_type(), CommOpType::kBarrier);
    EXPECT_EQ(c->op_type(), CommOpType::kBroadcast);
    for (Work* w : {a.get(), b.get(), c.get()}) EXPECT_TRUE(w->Wait(kWait).ok());
    EXPECT_TRUE(c->IsCompleted());
  });
}

// A collective Wait shorter than the collective is only a local deadline:
// waiting again succeeds once the late rank arrives.
TEST(GlooCommunicatorTest, ShortWaitOnCollectiveDoesNotBreakIt) {
  auto comms = ConnectRanks(2);
  RunRanks(2, [&](int rank) {
    if (rank == 1) absl::SleepFor(absl::Milliseconds(500));
    std::unique_ptr<Work> barrier = comms[rank]->Barrier();
    if (rank == 0) {
      absl::Status early = barrier->Wait(absl::Milliseconds(50));
      EXPECT_TRUE(absl::IsDeadlineExceeded(early)) << early;
      EXPECT_THAT(std::string(early.message()), HasSubstr("barrier #0"));
      EXPECT_FALSE(barrier->IsCompleted());
    }
    EXPECT_TRUE(barrier->Wait(kWait).ok());
  });
}

TEST(GlooCommunicatorTest, RecvNobodySendsTimesOutNamingPeerAndTag) {
  auto comms = ConnectRanks(2);
  absl::Notification rank0_done;
  RunRanks(2, [&](int rank) {
    if (rank == 1) {
      rank0_done.WaitForNotificationWithTimeout(kWait);
      return;
    }
    Communicator& comm = *comms[0];
    Tensor t = Tensor::Zeros(F32, {4, 8});
    std::unique_ptr<Work> recv = comm.Recv(&t, 1, 42);
    absl::Time start = absl::Now();
    absl::Status status = recv->Wait(absl::Milliseconds(300));
    absl::Duration waited = absl::Now() - start;
    EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr("recv from rank 1"), HasSubstr("tag 42"), HasSubstr("F32[4, 8]"),
                      HasSubstr("timed out after 300ms")));
    EXPECT_GE(waited, absl::Milliseconds(290));
    EXPECT_LT(waited, absl::Seconds(5));
    EXPECT_TRUE(recv->IsCompleted());
    // Gloo closed the connections: later ops say why instead of hanging.
    std::unique_ptr<Work> later = comm.Send(t, 1, 43);
    absl::Status later_status = later->Wait(kWait);
    EXPECT_TRUE(absl::IsFailedPrecondition(later_status)) << later_status;
    EXPECT_THAT(std::string(later_status.message()), HasSubstr("tag 42"));
    rank0_done.Notify();
  });
}

TEST(GlooCommunicatorTest, SendNobodyReceivesTimesOutNamingPeerAndTag) {
  auto comms = ConnectRanks(2);
  absl::Notification rank0_done;
  RunRanks(2, [&](int rank) {
    if (rank == 1) {
      rank0_done.WaitForNotificationWithTimeout(kWait);
      return;
    }
    Tensor t = Tensor::Zeros(I64, {3});
    absl::Status status = comms[0]->Send(t, 1, 5)->Wait(absl::Milliseconds(200));
    EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr("send to rank 1"), HasSubstr("tag 5"),
                      HasSubstr("never posted a matching recv")));
    rank0_done.Notify();
  });
}

// Gloo aborts the process when a message outgrows the posted recv; the
// payload signature in the slot turns that into a timeout naming the channel.
TEST(GlooCommunicatorTest, MismatchedPayloadTimesOutInsteadOfAborting) {
  auto comms = ConnectRanks(2);
  RunRanks(2, [&](int rank) {
    if (rank == 0) {
      // The receiver times out first and closes its side: the sender learns
      // of it at once, long before its own timeout.
      Tensor big = Tensor::Zeros(F32, {8});
      absl::Time start = absl::Now();
      absl::Status status = comms[0]->Send(big, 1, 11)->Wait(absl::Seconds(8));
      EXPECT_LT(absl::Now() - start, absl::Seconds(4));
      EXPECT_TRUE(absl::IsUnavailable(status)) << status;
      EXPECT_THAT(std::string(status.message()),
                  AllOf(HasSubstr("send to rank 1"), HasSubstr("tag 11")));
    } else {
      Tensor small = Tensor::Zeros(F32, {2});
      absl::Status status = comms[1]->Recv(&small, 0, 11)->Wait(absl::Milliseconds(500));
      EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
      EXPECT_THAT(std::string(status.message()),
                  AllOf(HasSubstr("rank 0"), HasSubstr("tag 11"), HasSubstr("byte size")));
    }
  });
}

// A peer that goes away mid-recv (process death closes its sockets the same
// way) fails the pending recv with Unavailable at once, not at the timeout.
TEST(GlooCommunicatorTest, PeerGoneMidRecvIsUnavailable) {
  auto comms = ConnectRanks(2);
  absl::Notification recv_posted;
  RunRanks(2, [&](int rank) {
    if (rank == 1) {
      ASSERT_TRUE(recv_posted.WaitForNotificationWithTimeout(kWait));
      absl::SleepFor(absl::Milliseconds(100));
      comms[1].reset();
      return;
    }
    Tensor t = Tensor::Zeros(F32, {16});
    std::unique_ptr<Work> recv = comms[0]->Recv(&t, 1, 8);
    recv_posted.Notify();
    absl::Time start = absl::Now();
    absl::Status status = recv->Wait(absl::Seconds(20));
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_TRUE(absl::IsUnavailable(status)) << status;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr("recv from rank 1"), HasSubstr("tag 8"), HasSubstr("connection")));
    // Gloo's own source location ("[./gloo/transport/tcp/pair.cc:598] ...") is left out.
    EXPECT_THAT(std::string(status.message()), Not(HasSubstr("gloo/")));
  });
}

// The first rank to time out closes its connections, so its peer may see
// the connection drop before its own timeout: both fail, neither hangs.
TEST(GlooCommunicatorTest, CollectivesOutOfStepTimeOutInsteadOfMixingBuffers) {
  auto comms = ConnectRanks(2, /*op_timeout=*/absl::Milliseconds(700));
  std::atomic<int> timed_out{0};
  RunRanks(2, [&](int rank) {
    Tensor t = Filled<float>({6}, [](int64_t i) { return 1.0f * i; });
    std::unique_ptr<Work> work =
        rank == 0 ? comms[rank]->AllReduce(&t, ReduceOp::kSum) : comms[rank]->Broadcast(&t, 0);
    absl::Time start = absl::Now();
    absl::Status status = work->Wait(kWait);
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(rank == 0 ? "allreduce #0" : "broadcast #0"));
    if (absl::IsDeadlineExceeded(status)) {
      timed_out.fetch_add(1);
      EXPECT_THAT(std::string(status.message()), HasSubstr("same collective"));
    } else {
      EXPECT_TRUE(absl::IsUnavailable(status)) << status;
    }
  });
  EXPECT_GE(timed_out.load(), 1);
}

TEST(GlooCommunicatorTest, BadArgumentsFailOnlyTheirWork) {
  auto comms = ConnectRanks(2);
  RunRanks(2, [&](int rank) {
    Communicator& comm = *comms[rank];
    Tensor t = Tensor::Zeros(F32, {4});
    Tensor ints = Tensor::Zeros(I64, {4});
    Tensor undefined;
    Tensor wrong_out = Tensor::Zeros(F32, {3});
    std::vector<std::pair<std::unique_ptr<Work>, std::string>> bad;
    bad.emplace_back(comm.Send(t, rank, 1), "cannot address itself");
    bad.emplace_back(comm.Send(t, 5, 1), "rank 5 is not in a group of 2");
    bad.emplace_back(comm.Recv(&t, 1 - rank, -3), "tag must lie in");
    bad.emplace_back(comm.Send(t, 1 - rank, GlooCommunicator::kMaxTag), "tag must lie in");
    bad.emplace_back(comm.Recv(&undefined, 1 - rank, 1), "allocated");
    bad.emplace_back(comm.Recv(nullptr, 1 - rank, 1), "allocated");
    bad.emplace_back(comm.AllReduce(&ints, ReduceOp::kAvg), "avg needs a floating dtype");
    bad.emplace_back(comm.AllGather(t, &wrong_out), "the output must be F32 with 2 x 4");
    bad.emplace_back(comm.ReduceScatter(t, &wrong_out, ReduceOp::kSum), "2 chunks");
    bad.emplace_back(comm.Broadcast(&t, -1), "root -1");
    for (auto& [work, message] : bad) {
      EXPECT_TRUE(work->IsCompleted());
      absl::Status status = work->Wait(kWait);
      EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
      EXPECT_THAT(std::string(status.message()), HasSubstr(message));
    }
    // The communicator still works, and argument errors used no sequence numbers.
    std::unique_ptr<Work> sum = comm.AllReduce(&t, ReduceOp::kSum);
    EXPECT_EQ(sum->sequence_number(), 0);
    EXPECT_TRUE(sum->Wait(kWait).ok());
    Tensor x = Filled<float>({2}, [&](int64_t i) { return 1.0f + i + rank; });
    Tensor y = Tensor::Zeros(F32, {2});
    auto send = comm.Send(x, 1 - rank, 2);
    auto recv = comm.Recv(&y, 1 - rank, 2);
    EXPECT_TRUE(send->Wait(kWait).ok());
    EXPECT_TRUE(recv->Wait(kWait).ok());
    EXPECT_EQ(Values<float>(y), (std::vector<float>{2.0f - rank, 3.0f - rank}));
  });
}

// A Work dropped before its transfer ends keeps the buffer alive, and the
// channel stays usable for the messages after it.
TEST(GlooCommunicatorTest, DroppedWorkNeitherCorruptsNorWedgesTheChannel) {
  auto comms = ConnectRanks(2);
  absl::Notification dropped;
  RunRanks(2, [&](int rank) {
    Communicator& comm = *comms[rank];
    if (rank == 1) {
      {
        Tensor scratch = Tensor::Zeros(F32, {1024});
        comm.Recv(&scratch, 0, 4);  // Work and tensor both dropped at once
      }
      dropped.Notify();
      Tensor next = Tensor::Zeros(F32, {3});
      ASSERT_TRUE(comm.Recv(&next, 0, 5)->Wait(kWait).ok());
      EXPECT_EQ(Values<float>(next), (std::vector<float>{7, 8, 9}));
    } else {
      ASSERT_TRUE(dropped.WaitForNotificationWithTimeout(kWait));
      Tensor first = Filled<float>({1024}, [](int64_t i) { return 1.0f * i; });
      EXPECT_TRUE(comm.Send(first, 1, 4)->Wait(kWait).ok());
      Tensor second = Filled<float>({3}, [](int64_t i) { return 7.0f + i; });
      EXPECT_TRUE(comm.Send(second, 1, 5)->Wait(kWait).ok());
    }
  });
}

// Issue order is kept per communicator while p2p runs beside collectives.
TEST(GlooCommunicatorTest, SendRecvOverlapCollectives) {
  auto comms = ConnectRanks(3);
  RunRanks(3, [&](int rank) {
    Communicator& comm = *comms[rank];
    Tensor grad = Filled<float>({5}, [&](int64_t i) { return 1.0f * rank; });
    std::unique_ptr<Work> allreduce = comm.AllReduce(&grad, ReduceOp::kSum);
    Tensor out = Filled<float>({2}, [&](int64_t i) { return 10.0f * rank + i; });
    Tensor in = Tensor::Zeros(F32, {2});
    const int next = (rank + 1) % 3;
    const int prev = (rank + 2) % 3;
    auto recv = comm.Recv(&in, prev, 77);
    auto send = comm.Send(out, next, 77);
    EXPECT_TRUE(recv->Wait(kWait).ok());
    EXPECT_TRUE(send->Wait(kWait).ok());
    EXPECT_TRUE(allreduce->Wait(kWait).ok());
    EXPECT_EQ(Values<float>(in), (std::vector<float>{10.0f * prev, 10.0f * prev + 1}));
    EXPECT_EQ(Values<float>(grad), Expected<float>(5, [](int64_t) { return 3.0f; }));
  });
}

}  // namespace
}  // namespace strata
