#ifndef STRATA_RUNTIME_COMM_COMMUNICATOR_H_
#define STRATA_RUNTIME_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/tensor.h"

namespace strata {

// The words a communicator's error carries when a peer's connection went
// away: the launcher tells such consequences from a failure's cause by them.
inline constexpr absl::string_view kConnectionLost = "connection lost";

// The communicator interface every transport implements (GlooCommunicator for
// host tensors; NcclCommunicator for one GPU per rank), shaped after c10d's
// Backend and Work.
//
// How the executor uses it in a pipeline (stage s, micro-batch m, channel tags
// fixed at compile time):
//   - Recvs are posted early: the recv for micro-batch m+1's activation is
//     issued before FORWARD(m) computes, into a tensor allocated with its
//     compile-time shape, so the upstream stage's send completes while this
//     stage is still busy; FORWARD(m+1) Waits on it before its first op.
//   - Sends are fire-and-forget at issue: FORWARD(m) ends with
//     Send(activation, s+1, tag) and keeps the Work.
//   - A buffer handed to Send/Recv is neither read (recv) nor overwritten
//     (send) until its Work's Wait returned OK. Dropping the tensor early is
//     safe: the Work holds a reference to the buffer until the transfer ends.
//   - Every Wait uses the job's --comm_timeout_s; a DeadlineExceeded or
//     Unavailable from Wait ends the job (the message names the channel).

enum class CommOpType {
  kSend,
  kRecv,
  kAllReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kBarrier,
};

// "send", "recv", "allreduce", ... for messages and traces.
std::string CommOpTypeName(CommOpType op);

enum class ReduceOp {
  kSum,
  kMax,
  kMin,
  kAvg,  // sum / world size; floating dtypes only
};

std::string ReduceOpName(ReduceOp op);

// A handle on one issued communication. Implementations are thread-compatible:
// one thread Waits on a given Work at a time.
class Work {
 public:
  virtual ~Work() = default;

  // True once the operation is known to have finished (successfully or not).
  // Never blocks; some transports learn of completion only inside Wait.
  virtual bool IsCompleted() = 0;

  // Blocks until the operation finished or `timeout` passed. OK means the
  // buffer may be used again; DeadlineExceeded names the op, peer and tag.
  // Waiting again after it returned gives the same status at once.
  virtual absl::Status Wait(absl::Duration timeout) = 0;

  virtual CommOpType op_type() const = 0;

  // Collectives: the n-th collective issued on this communicator, the same on
  // every rank for the same call (ranks out of step show up here).
  // Send/Recv: the n-th point-to-point op this rank issued.
  virtual int64_t sequence_number() const = 0;
};

// A Work that finished before it started (argument errors, a closed or
// aborted communicator): completed, with `status`, at once.
class DoneWork : public Work {
 public:
  DoneWork(CommOpType op, int64_t sequence, absl::Status status)
      : op_(op), sequence_(sequence), status_(std::move(status)) {}
  bool IsCompleted() override { return true; }
  absl::Status Wait(absl::Duration) override { return status_; }
  CommOpType op_type() const override { return op_; }
  int64_t sequence_number() const override { return sequence_; }

 private:
  CommOpType op_;
  int64_t sequence_;
  absl::Status status_;
};

// A group of `size()` ranks that exchange host tensors. Every method returns
// at once; errors in the arguments come back as an already-failed Work.
class Communicator {
 public:
  virtual ~Communicator() = default;

  // This process's rank in [0, size()).
  virtual int rank() const = 0;
  // Number of ranks in the group.
  virtual int size() const = 0;
  // The transport's name ("gloo", "nccl").
  virtual std::string backend() const = 0;

  // Sends `tensor` to rank `dst` on channel `tag`. A send completes once the
  // matching Recv (same tag, dtype and byte size) was posted and the bytes left.
  virtual std::unique_ptr<Work> Send(const Tensor& tensor, int dst, int64_t tag) = 0;

  // Receives from rank `src` on channel `tag` into `*into`, which is already
  // allocated with the shape and dtype the sender uses. Messages on one
  // channel (peer, tag) match in issue order.
  virtual std::unique_ptr<Work> Recv(Tensor* into, int src, int64_t tag) = 0;

  // In place: every rank ends with the elementwise reduction over all ranks.
  virtual std::unique_ptr<Work> AllReduce(Tensor* tensor, ReduceOp op) = 0;

  // In place: every rank ends with `root`'s values.
  virtual std::unique_ptr<Work> Broadcast(Tensor* tensor, int root) = 0;

  // `out` (size() times the elements of `in`, same dtype) receives every
  // rank's `in`, rank i's at row-major chunk i.
  virtual std::unique_ptr<Work> AllGather(const Tensor& in, Tensor* out) = 0;

  // `in` holds size() chunks of out's element count; rank i's `out` receives
  // the reduction over all ranks of chunk i. `in` is left unchanged.
  virtual std::unique_ptr<Work> ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) = 0;

  // Completes once every rank issued its Barrier.
  virtual std::unique_ptr<Work> Barrier() = 0;

  // Device graphs (runtime/step_graph.h). "" when this transport's ops can
  // be captured into one: they run on the device's streams, and a Work
  // issued and waited on under a capture (Device::capturing) only orders the
  // compute stream after its op, without asking the host whether it
  // finished. Else why not, as a clause ("gloo moves tensors on the host").
  virtual std::string GraphBlocker() const;
  // While the host waits for a replayed graph that holds this transport's
  // ops, which no Work watches: OK, or the transport's asynchronous error.
  virtual absl::Status CheckHealth() { return absl::OkStatus(); }
  // Stops this transport's work in flight (ncclCommAbort), so a replay that
  // waits on a dead or stalled peer returns; later ops fail naming `why`.
  // Transports whose ops the host waits for itself have nothing to stop.
  virtual void Abort(const absl::Status& why) {}
};

// Every rank's `mine`, by rank, on every rank: two host allgathers over
// `comm` (the lengths, then, unless every string is empty, the bytes
// padded to the longest), each waited for at most `timeout`. The ranks agree on settings, on capturing steps,
// and on which GPUs they share through it.
absl::StatusOr<std::vector<std::string>> AllGatherStrings(Communicator& comm, const std::string& mine,
                                                          absl::Duration timeout);

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_COMMUNICATOR_H_
