#ifndef STRATA_RUNTIME_COMM_GLOO_COMMUNICATOR_H_
#define STRATA_RUNTIME_COMM_GLOO_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/comm/communicator.h"
#include "runtime/tensor.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace strata {

// Host tensors over Gloo's TCP transport.
//
// Send/Recv post a Gloo unbound buffer on the caller's thread at once (so a
// recv posted early lets the sender finish without waiting on this rank's
// compute); their Work waits on that buffer. Collectives run in issue order
// on one background thread per communicator, each bounded by `op_timeout`.
//
// What Gloo imposes, and how it surfaces here:
//   - A send/recv whose Wait times out makes Gloo close every connection of
//     the context (the pending transfer could still write into the buffer),
//     so after that DeadlineExceeded every later op fails with
//     FailedPrecondition naming the first error: a timeout ends the job.
//   - A peer that dies or closes its communicator closes the TCP connection:
//     pending and later ops with that peer fail with Unavailable.
//   - Gloo aborts the process if a message is longer than the posted recv,
//     so the dtype and byte size are folded into the channel's slot: a
//     mismatched pair never matches and times out naming the channel instead.
//   - Collectives are tagged with (sequence number, op, dtype, size): ranks
//     out of step time out instead of reducing unrelated buffers.
class GlooCommunicator : public Communicator {
 public:
  // Send/Recv tags must lie in [0, kMaxTag): the bits above carry the
  // dtype/size signature and Gloo's collective slot prefixes.
  static constexpr int64_t kMaxTag = int64_t{1} << 40;

  // `context` is fully connected (see Rendezvous). `op_timeout` bounds every
  // collective inside Gloo (the job's --comm_timeout_s).
  GlooCommunicator(std::shared_ptr<gloo::Context> context, absl::Duration op_timeout);
  // Fails collectives not yet started with Cancelled and waits for the one
  // running (bounded by op_timeout). Outstanding Works stay valid.
  ~GlooCommunicator() override;

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  std::string backend() const override { return "gloo"; }
  absl::Duration op_timeout() const;

  std::unique_ptr<Work> Send(const Tensor& tensor, int dst, int64_t tag) override;
  std::unique_ptr<Work> Recv(Tensor* into, int src, int64_t tag) override;
  std::unique_ptr<Work> AllReduce(Tensor* tensor, ReduceOp op) override;
  std::unique_ptr<Work> Broadcast(Tensor* tensor, int root) override;
  std::unique_ptr<Work> AllGather(const Tensor& in, Tensor* out) override;
  std::unique_ptr<Work> ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) override;
  std::unique_ptr<Work> Barrier() override;

  // Internal state shared with outstanding Works; defined in the .cc.
  struct Core;
  class CollectiveQueue;

 private:
  std::unique_ptr<Work> PostTransfer(CommOpType op, const Tensor& tensor, int peer, int64_t tag);

  std::shared_ptr<Core> core_;
  std::unique_ptr<CollectiveQueue> queue_;
  std::atomic<int64_t> transfer_sequence_{0};
};

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_GLOO_COMMUNICATOR_H_
