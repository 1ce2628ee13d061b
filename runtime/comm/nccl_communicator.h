#ifndef STRATA_RUNTIME_COMM_NCCL_COMMUNICATOR_H_
#define STRATA_RUNTIME_COMM_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/nccl_api.h"
#include "runtime/comm/store.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

namespace strata {

// Tensors of one GPU per rank over NCCL, every NCCL and CUDA call through
// an NcclApi (the real one, or a fake transport in tests).
//
//   - Creation: rank 0 makes the ncclUniqueId and sets it in the group's view
//     of the job's store (key "nccl_unique_id" under the group's prefix);
//     the others read it there, within `timeout`; then ncclCommInitRank.
//   - Every op is enqueued on the device's communication stream after that
//     stream waits (an event) for the work enqueued so far on the compute
//     stream, which produced the input. An event recorded after the op is
//     its completion: a Work polls it and ncclCommGetAsyncError, and when the
//     op is done makes the compute stream wait for it, so kernels enqueued
//     after Wait see the result.
//   - Send and Recv are each issued between ncclGroupStart and ncclGroupEnd.
//     NCCL matches point-to-point messages between two ranks by issue order,
//     not by tag: the tag only names the op in messages, so both sides must
//     issue a pair's transfers in the same order.
//   - An async error, or a Wait that runs out of time (a peer died or never
//     issued its part), aborts the communicator with ncclCommAbort, so no
//     rank hangs in a kernel waiting for a dead peer; every later op fails
//     with FailedPrecondition naming the first error. Poll with IsCompleted:
//     a Wait with a zero timeout on an unfinished op is a timeout too.
//   - A Work keeps its tensors until the op is done; one dropped early hands
//     them to the communicator. The destructor destroys the NCCL
//     communicator when all its ops are done and aborts it otherwise.
//   - Under a capture (Device::capturing, a CUDA graph being recorded), the
//     same calls are recorded into the graph: the communication stream
//     joins the capture through the compute stream's event, and a Work
//     issued under the capture, when waited on, only makes the compute
//     stream wait for its completion event (rejoining the capture) and
//     lets its tensors go in stream order, never querying the event, which
//     a capture forbids. Nobody watches such an op at its replays: the
//     replaying host polls CheckHealth and calls Abort when the replay runs
//     out of time (Executor). A Work issued before a capture and waited on
//     under it, or the other way round, fails (the capture then fails and
//     the step runs eagerly).
class NcclCommunicator : public Communicator {
 public:
  // `group_store`: this group's view of the job's store (Store::WithPrefix).
  // `device`: this rank's GPU; its tensors alone are accepted. `stream`:
  // where its ops run, the device's communication stream when null (a
  // stream of its own keeps its ops from queueing behind another
  // communicator's; the caller destroys it after the communicator).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(std::shared_ptr<NcclApi> api, Store& group_store,
                                                                  Device* device, int rank, int size,
                                                                  absl::Duration timeout,
                                                                  StreamHandle stream = nullptr);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  // Whether ncclCommAbort ended the communicator (after an error or timeout).
  bool aborted() const;

  std::unique_ptr<Work> Send(const Tensor& tensor, int dst, int64_t tag) override;
  std::unique_ptr<Work> Recv(Tensor* into, int src, int64_t tag) override;
  std::unique_ptr<Work> AllReduce(Tensor* tensor, ReduceOp op) override;
  std::unique_ptr<Work> Broadcast(Tensor* tensor, int root) override;
  std::unique_ptr<Work> AllGather(const Tensor& in, Tensor* out) override;
  std::unique_ptr<Work> ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) override;
  // An allreduce of one int32 on the device (NCCL has no barrier).
  std::unique_ptr<Work> Barrier() override;

  // Its ops can be captured (see the class comment's "Under a capture")
  // from NCCL 2.9.6 on; an older library is named.
  std::string GraphBlocker() const override;
  // ncclCommGetAsyncError (OK once closed without an error); the first
  // error after an abort.
  absl::Status CheckHealth() override;
  // ncclCommAbort, once; `why` becomes the error later ops and Waits name.
  void Abort(const absl::Status& why) override;

  // Shared with outstanding Works; defined in the .cc.
  struct Core;

 private:
  NcclCommunicator(std::shared_ptr<Core> core, int rank, int size);
  // Issues `enqueue` on the communication stream, ordered after the compute
  // stream; the Work keeps `tensors` until the op is done.
  std::unique_ptr<Work> Issue(CommOpType op, bool collective, const std::string& what_suffix,
                              std::vector<Tensor> tensors,
                              const std::function<absl::Status(NcclApi&, NcclApi::Comm, StreamHandle)>& enqueue);
  // An argument error: never issued, no sequence number taken.
  std::unique_ptr<Work> Reject(CommOpType op, bool collective, const std::string& what_suffix,
                               const std::string& problem);
  // Empty when `t` is a defined tensor of this communicator's device.
  std::string NotOnDevice(const Tensor& t, const std::string& name) const;

  std::shared_ptr<Core> core_;
  const int rank_;
  const int size_;
  std::atomic<int64_t> next_collective_{0};
  std::atomic<int64_t> next_transfer_{0};
};

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_NCCL_COMMUNICATOR_H_
