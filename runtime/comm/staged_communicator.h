#ifndef STRATA_RUNTIME_COMM_STAGED_COMMUNICATOR_H_
#define STRATA_RUNTIME_COMM_STAGED_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "runtime/comm/communicator.h"
#include "runtime/tensor.h"

namespace strata {

// A host communicator (GlooCommunicator) made to move tensors of any device
// by staging them through host memory: how several ranks share one GPU, and
// how a GPU job runs where NCCL does not.
//
// A tensor on a device the host cannot address is copied into a buffer of
// its device's staging_allocator() (page-locked on a GPU) before the host op
// is issued: Device::CopyToHost is ordered on the compute stream and returns
// once the bytes are on the host, so the copy sees every kernel enqueued
// before the call. What the op writes (recv, the collectives' outputs) is
// copied back to the device in the first Wait that finds the host op done,
// ordered on the compute stream before every kernel enqueued after that
// Wait; until then the device tensor is untouched. Host tensors pass through
// as they are.
//
// Work semantics are the wrapped communicator's: Wait OK means the device
// tensor holds the result; waiting again returns the same status without a
// second copy; dropping a Work early is safe (the host op keeps its staging
// buffer). A failed staging copy or allocation is an already-failed Work
// naming the op and the device; it was never issued, so its sequence number
// is -1.
class StagedCommunicator : public Communicator {
 public:
  explicit StagedCommunicator(std::unique_ptr<Communicator> host);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  // "gloo+staged".
  std::string backend() const override { return host_->backend() + "+staged"; }
  Communicator* host() const { return host_.get(); }

  std::unique_ptr<Work> Send(const Tensor& tensor, int dst, int64_t tag) override;
  std::unique_ptr<Work> Recv(Tensor* into, int src, int64_t tag) override;
  std::unique_ptr<Work> AllReduce(Tensor* tensor, ReduceOp op) override;
  std::unique_ptr<Work> Broadcast(Tensor* tensor, int root) override;
  std::unique_ptr<Work> AllGather(const Tensor& in, Tensor* out) override;
  std::unique_ptr<Work> ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) override;
  std::unique_ptr<Work> Barrier() override { return host_->Barrier(); }

 private:
  std::unique_ptr<Communicator> host_;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_STAGED_COMMUNICATOR_H_
