#ifndef STRATA_RUNTIME_COMM_NCCL_API_H_
#define STRATA_RUNTIME_COMM_NCCL_API_H_

// Every NCCL and CUDA call NcclCommunicator makes, behind one small
// interface with plain C++ types: the real one (runtime/cuda/cuda_nccl_api.h)
// calls libnccl and cudart; tests give a fake in-process transport, so the
// communicator's logic (the id exchange, grouping, completion, error and
// timeout handling) runs in CPU-only CI.

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/types.h"
#include "runtime/allocator.h"
#include "runtime/comm/communicator.h"

namespace strata {

class NcclApi {
 public:
  using Comm = void*;   // ncclComm_t
  using Event = void*;  // cudaEvent_t

  virtual ~NcclApi() = default;

  // ncclGetVersion of the library loaded: major * 10000 + minor * 100 +
  // patch (2.28.9 is 22809).
  virtual int Version() const = 0;
  // The oldest NCCL whose operations a CUDA graph can capture (the NCCL
  // documentation's "Using NCCL with CUDA Graphs": 2.9.6, CUDA 11.3).
  static constexpr int kOldestCapturable = 20906;
  // "2.28.9" of Version()'s 22809.
  static std::string VersionString(int version);

  // ncclGetUniqueId: kUniqueIdBytes opaque bytes rank 0 makes and every rank
  // passes to CommInitRank.
  static constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
  virtual absl::StatusOr<std::string> GetUniqueId() = 0;
  // ncclCommInitRank on device `ordinal`; blocks until every rank joined.
  virtual absl::StatusOr<Comm> CommInitRank(int ordinal, int nranks, const std::string& unique_id, int rank) = 0;

  // Enqueued on `stream`. Send, Recv, Broadcast and AllGather move bytes
  // (ncclUint8); the reductions take an element count and dtype.
  virtual absl::Status Send(const void* buffer, size_t bytes, int peer, Comm comm, StreamHandle stream) = 0;
  virtual absl::Status Recv(void* buffer, size_t bytes, int peer, Comm comm, StreamHandle stream) = 0;
  virtual absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, Comm comm,
                                 StreamHandle stream) = 0;
  virtual absl::Status Broadcast(const void* send, void* recv, size_t bytes, int root, Comm comm,
                                 StreamHandle stream) = 0;
  // `bytes` per rank: recv holds nranks of them.
  virtual absl::Status AllGather(const void* send, void* recv, size_t bytes, Comm comm, StreamHandle stream) = 0;
  // `count` elements per rank: send holds nranks of them.
  virtual absl::Status ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                     Comm comm, StreamHandle stream) = 0;
  virtual absl::Status GroupStart() = 0;
  virtual absl::Status GroupEnd() = 0;

  // ncclCommGetAsyncError: OK while the communicator is healthy (or still
  // initializing), else the error.
  virtual absl::Status CommGetAsyncError(Comm comm) = 0;
  // ncclCommAbort: stops the communicator's kernels at once; the communicator
  // is gone afterwards.
  virtual absl::Status CommAbort(Comm comm) = 0;
  // ncclCommDestroy, once its work is done.
  virtual absl::Status CommDestroy(Comm comm) = 0;

  // A CUDA event recorded on `stream` now.
  virtual absl::StatusOr<Event> RecordEvent(StreamHandle stream) = 0;
  // cudaEventQuery: true once the stream passed it; an error of the work
  // before it is the status.
  virtual absl::StatusOr<bool> EventDone(Event event) = 0;
  virtual void DestroyEvent(Event event) = 0;
  // cudaStreamWaitEvent: work enqueued on `stream` later runs after `event`.
  virtual absl::Status StreamWaitEvent(StreamHandle stream, Event event) = 0;
  // A non-blocking stream of its own on device `ordinal`, for a communicator
  // whose transfers must not queue behind another's (point-to-point pairs);
  // DestroyStream once its communicator is gone.
  virtual absl::StatusOr<StreamHandle> CreateStream(int ordinal) = 0;
  virtual void DestroyStream(StreamHandle stream) = 0;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_NCCL_API_H_
