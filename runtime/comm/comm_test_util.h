#ifndef STRATA_RUNTIME_COMM_COMM_TEST_UTIL_H_
#define STRATA_RUNTIME_COMM_COMM_TEST_UTIL_H_

#include <sys/types.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/plan.pb.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/device.h"

namespace strata {
namespace testing {

// Runs fn(rank) for every rank on its own thread and joins them all.
void RunRanks(int world, const std::function<void(int rank)>& fn);

// A memory:// spec no other test in this process uses.
std::string UniqueMemorySpec();

// A folder path under the test's temp dir that no earlier run used
// (stores are write-once, so reruns need fresh folders).
std::string FreshDir(const std::string& name);

// Rendezvous of `world` ranks as threads over a fresh in-memory store;
// element r is rank r's communicator. Fails the test on any error.
std::vector<std::unique_ptr<Communicator>> ConnectRanks(
    int world, absl::Duration op_timeout = absl::Seconds(30));

// Runs fn(rank, comms) for every rank of `plans` on its own thread, after a
// rendezvous of all ranks over a fresh in-memory store and of the groups of
// each rank's plan (ConnectGroups); rank r presents plans[r]'s fingerprint.
// Element r is rank r's result: fn's, or the rendezvous error.
// With `stage_device_tensors` the communicators stage tensors of a GPU (or
// FakeAccelerator) through host memory (RendezvousOptions).
std::vector<absl::Status> RunConnectedPlans(const std::vector<RankPlan>& plans,
                                            const std::function<absl::Status(int rank, CommunicatorSet* comms)>& fn,
                                            absl::Duration timeout = absl::Seconds(60),
                                            bool stage_device_tensors = false);

// A device the host cannot address, as far as the runtime knows (kind
// DEVICE_CUDA, so Tensor::on_host() is false and GlooCommunicator refuses its
// tensors), whose memory is host memory and whose copies are memcpy: what
// staging through the host is tested on without a GPU. It counts its copies;
// `fail_copies` makes every copy fail, as a device error would.
class FakeAccelerator : public Device {
 public:
  explicit FakeAccelerator(int ordinal = 0) : ordinal_(ordinal) {}
  DeviceKind kind() const override { return DEVICE_CUDA; }
  int ordinal() const override { return ordinal_; }
  Allocator* allocator() const override { return &memory_; }
  Allocator* staging_allocator() const override { return &staging_; }
  // Two distinct handles (nothing runs on them): what a fake NCCL tells
  // this device's streams apart by.
  StreamHandle compute_stream() const override { return const_cast<char*>(&streams_[0]); }
  StreamHandle comm_stream() const override { return const_cast<char*>(&streams_[1]); }
  CpuAllocator& staging() { return staging_; }
  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    ++copies_from_host;
    return Copy(dst, host_src, bytes);
  }
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    ++copies_to_host;
    return Copy(host_dst, src, bytes);
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override { return Copy(dst, src, bytes); }
  absl::Status Memset(void* dst, int byte, size_t bytes) override {
    if (bytes > 0) std::memset(dst, byte, bytes);
    return absl::OkStatus();
  }

  // What capturing() says: a test sets it around ops it would have a
  // graph record (nothing is recorded; work still runs as it is called).
  bool capturing() const override { return capture; }

  std::atomic<int> copies_to_host{0};
  std::atomic<int> copies_from_host{0};
  std::atomic<bool> fail_copies{false};
  std::atomic<bool> capture{false};

 protected:
  absl::Status WaitForWork() override { return absl::OkStatus(); }

 private:
  absl::Status Copy(void* dst, const void* src, size_t bytes) {
    if (fail_copies) return absl::InternalError("injected copy failure");
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  int ordinal_;
  char streams_[2] = {0, 0};
  mutable CpuAllocator memory_;
  mutable CpuAllocator staging_;
};

// A transport whose peers are never waited for: every op is done at once,
// OK, as if the other ranks had issued their parts (tensors untouched).
// Rank, size and backend as given; tests derive from it for what they
// script (a registry's checks, a capturable transport's health).
class InstantCommunicator : public Communicator {
 public:
  InstantCommunicator(int rank, int size, std::string backend = "instant")
      : rank_(rank), size_(size), backend_(std::move(backend)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return backend_; }
  std::unique_ptr<Work> Send(const Tensor&, int, int64_t) override { return Done(CommOpType::kSend); }
  std::unique_ptr<Work> Recv(Tensor*, int, int64_t) override { return Done(CommOpType::kRecv); }
  std::unique_ptr<Work> AllReduce(Tensor*, ReduceOp) override { return Done(CommOpType::kAllReduce); }
  std::unique_ptr<Work> Broadcast(Tensor*, int) override { return Done(CommOpType::kBroadcast); }
  std::unique_ptr<Work> AllGather(const Tensor&, Tensor*) override { return Done(CommOpType::kAllGather); }
  std::unique_ptr<Work> ReduceScatter(const Tensor&, Tensor*, ReduceOp) override {
    return Done(CommOpType::kReduceScatter);
  }
  std::unique_ptr<Work> Barrier() override { return Done(CommOpType::kBarrier); }

 private:
  std::unique_ptr<Work> Done(CommOpType op) { return std::make_unique<DoneWork>(op, ops_++, absl::OkStatus()); }
  const int rank_;
  const int size_;
  const std::string backend_;
  int64_t ops_ = 0;
};

// A loopback TCP port nobody listens on right now.
int PickFreePort();

// A redis-server child process on 127.0.0.1 (no persistence), killed when
// this object goes (and by the kernel if the test process dies first).
class RedisServer {
 public:
  // Fails (never skips) when redis-server is missing or does not come up.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start();
  ~RedisServer();

  int port() const { return port_; }
  std::string spec() const;

 private:
  RedisServer(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
};

}  // namespace testing
}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_COMM_TEST_UTIL_H_
