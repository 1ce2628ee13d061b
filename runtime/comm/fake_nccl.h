#ifndef STRATA_RUNTIME_COMM_FAKE_NCCL_H_
#define STRATA_RUNTIME_COMM_FAKE_NCCL_H_

// An in-process NCCL for tests: ranks are threads of one process sharing one
// FakeNccl, "device" buffers are host memory (FakeAccelerator), and an op
// completes once every rank it involves has issued its part, when the bytes
// move. Collectives match by their place in each communicator's issue order,
// point-to-point transfers by their order per (sender, receiver); parts that
// disagree (op, size, dtype, root) never complete, as NCCL would hang.
// Streams are opaque handles: an event recorded on a stream passes once every
// op enqueued on it before has completed. Failures are injected by hand.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/nccl_api.h"

namespace strata {
namespace testing {

class FakeNccl : public NcclApi {
 public:
  FakeNccl();
  ~FakeNccl() override;

  int Version() const override { return version; }
  absl::StatusOr<std::string> GetUniqueId() override;
  absl::StatusOr<Comm> CommInitRank(int ordinal, int nranks, const std::string& unique_id, int rank) override;
  absl::Status Send(const void* buffer, size_t bytes, int peer, Comm comm, StreamHandle stream) override;
  absl::Status Recv(void* buffer, size_t bytes, int peer, Comm comm, StreamHandle stream) override;
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, Comm comm,
                         StreamHandle stream) override;
  absl::Status Broadcast(const void* send, void* recv, size_t bytes, int root, Comm comm,
                         StreamHandle stream) override;
  absl::Status AllGather(const void* send, void* recv, size_t bytes, Comm comm, StreamHandle stream) override;
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, Comm comm,
                             StreamHandle stream) override;
  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;
  absl::Status CommGetAsyncError(Comm comm) override;
  absl::Status CommAbort(Comm comm) override;
  absl::Status CommDestroy(Comm comm) override;
  absl::StatusOr<Event> RecordEvent(StreamHandle stream) override;
  absl::StatusOr<bool> EventDone(Event event) override;
  void DestroyEvent(Event event) override;
  absl::Status StreamWaitEvent(StreamHandle stream, Event event) override;
  absl::StatusOr<StreamHandle> CreateStream(int ordinal) override;
  void DestroyStream(StreamHandle stream) override;
  // Send and Recv calls, over every communicator.
  int transfers();
  // Streams made by CreateStream and not destroyed.
  int live_streams();

  // Test hooks and counters, by rank of the clique made from `unique_id`
  // (every FakeNccl test makes one clique at a time, so: the latest).
  void InjectAsyncError(int rank, absl::Status error);
  int unique_ids_made();
  int aborts(int rank);
  int destroys(int rank);
  // Send/Recv calls made outside GroupStart/GroupEnd.
  int ungrouped_transfers();
  // StreamWaitEvent calls per stream.
  int stream_waits(StreamHandle stream);
  int live_events();
  // EventDone calls (cudaEventQuery), which a capture forbids.
  int event_queries();
  // While set, RecordEvent fails (as cudaEventRecord on a stream whose
  // capture an earlier call invalidated).
  std::atomic<bool> fail_event_records{false};
  // What Version() says: the NCCL this project builds against by default.
  int version = 22809;

 private:
  struct Op;
  struct FakeComm;
  struct Clique;
  struct FakeEvent {
    std::vector<std::shared_ptr<Op>> before;
  };

  // Enqueues `op` on `stream` and completes whatever it completes.
  absl::Status Post(FakeComm* comm, StreamHandle stream, std::shared_ptr<Op> op) ;
  void MatchCollectives(Clique& clique);
  void MatchTransfers(Clique& clique, int src, int dst);

  std::mutex mu_;
  std::condition_variable joined_;
  int ids_ = 0;
  int ungrouped_ = 0;
  int transfers_ = 0;
  int live_streams_ = 0;
  std::map<std::string, std::shared_ptr<Clique>> cliques_;
  std::shared_ptr<Clique> latest_;
  std::vector<std::unique_ptr<FakeComm>> comms_;
  std::map<StreamHandle, std::vector<std::shared_ptr<Op>>> streams_;
  std::map<StreamHandle, int> stream_waits_;
  int live_events_ = 0;
  int event_queries_ = 0;
};

}  // namespace testing
}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_FAKE_NCCL_H_
