#include "runtime/comm/staged_communicator.h"

#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

bool NeedsStaging(const Tensor& t) { return t.defined() && !t.on_host(); }

// A host buffer of t's dtype and shape from its device's staging allocator.
absl::StatusOr<Tensor> StagingBuffer(const Tensor& t) {
  Tensor host = Tensor::Empty(t.dtype(), t.shape(), t.device()->staging_allocator());
  if (!host.defined() && t.bytes() > 0) {
    return absl::ResourceExhaustedError(absl::StrCat("out of host staging memory for ", DataTypeName(t.dtype()),
                                                     ShapeString(t.shape()), " of ", t.device()->name()));
  }
  return host;
}

// `t` itself on the host; else a staging buffer holding t's bytes, or (with
// copy false) an uninitialized one for an op to write into.
absl::StatusOr<Tensor> ToHost(const Tensor& t, bool copy) {
  if (!NeedsStaging(t)) return t;
  absl::StatusOr<Tensor> host = StagingBuffer(t);
  if (!host.ok() || !copy) return host;
  if (absl::Status s = t.device()->CopyToHost(host->raw_data(), t.raw_data(), t.bytes()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("staging ", t.device()->name(), " to the host: ", s.message()));
  }
  return host;
}

std::unique_ptr<Work> Fail(CommOpType op, int rank, const absl::Status& status) {
  return std::make_unique<DoneWork>(
      op, -1, absl::Status(status.code(), absl::StrCat(CommOpTypeName(op), " on rank ", rank, ": ", status.message())));
}

// A device tensor and the host buffer the op writes its result into.
struct CopyBack {
  Tensor device;
  Tensor host;
};

// The host op's Work, plus the copies back to the device in the first Wait
// that finds it done.
class StagedWork : public Work {
 public:
  StagedWork(std::unique_ptr<Work> host, std::vector<CopyBack> copies)
      : host_(std::move(host)), copies_(std::move(copies)) {}

  bool IsCompleted() override {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_ || host_->IsCompleted();
  }

  absl::Status Wait(absl::Duration timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return status_;
    absl::Status s = host_->Wait(timeout);
    if (!s.ok()) {
      // A timeout of this wait alone may be waited out again.
      if (host_->IsCompleted()) Finish(s);
      return s;
    }
    for (const CopyBack& c : copies_) {
      if (s.ok()) s = c.device.device()->CopyFromHost(const_cast<void*>(c.device.raw_data()), c.host.raw_data(),
                                                      c.device.bytes());
      if (!s.ok()) {
        s = absl::Status(s.code(), absl::StrCat(CommOpTypeName(host_->op_type()), " #", host_->sequence_number(),
                                                ": copying the result back to ", c.device.device()->name(), ": ",
                                                s.message()));
      }
    }
    Finish(s);
    return status_;
  }

  CommOpType op_type() const override { return host_->op_type(); }
  int64_t sequence_number() const override { return host_->sequence_number(); }

 private:
  // The staging buffers go back to their allocator, which reuses them only
  // after the stream passed the copies just enqueued.
  void Finish(absl::Status s) {
    finished_ = true;
    status_ = std::move(s);
    copies_.clear();
  }

  std::mutex mu_;
  std::unique_ptr<Work> host_;
  std::vector<CopyBack> copies_;  // guarded by mu_
  bool finished_ = false;         // guarded by mu_
  absl::Status status_;           // guarded by mu_
};

std::unique_ptr<Work> WithCopies(std::unique_ptr<Work> host, std::vector<CopyBack> copies) {
  if (copies.empty()) return host;
  return std::make_unique<StagedWork>(std::move(host), std::move(copies));
}

}  // namespace

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> host) : host_(std::move(host)) {}

std::unique_ptr<Work> StagedCommunicator::Send(const Tensor& tensor, int dst, int64_t tag) {
  absl::StatusOr<Tensor> host = ToHost(tensor, /*copy=*/true);
  if (!host.ok()) return Fail(CommOpType::kSend, rank(), host.status());
  // The host op holds the staging buffer until its bytes left.
  return host_->Send(*host, dst, tag);
}

std::unique_ptr<Work> StagedCommunicator::Recv(Tensor* into, int src, int64_t tag) {
  if (into == nullptr || !NeedsStaging(*into)) return host_->Recv(into, src, tag);
  absl::StatusOr<Tensor> host = ToHost(*into, /*copy=*/false);
  if (!host.ok()) return Fail(CommOpType::kRecv, rank(), host.status());
  std::unique_ptr<Work> work = host_->Recv(&*host, src, tag);
  return WithCopies(std::move(work), {CopyBack{*into, *host}});
}

std::unique_ptr<Work> StagedCommunicator::AllReduce(Tensor* tensor, ReduceOp op) {
  if (tensor == nullptr || !NeedsStaging(*tensor)) return host_->AllReduce(tensor, op);
  absl::StatusOr<Tensor> host = ToHost(*tensor, /*copy=*/true);
  if (!host.ok()) return Fail(CommOpType::kAllReduce, rank(), host.status());
  std::unique_ptr<Work> work = host_->AllReduce(&*host, op);
  return WithCopies(std::move(work), {CopyBack{*tensor, *host}});
}

std::unique_ptr<Work> StagedCommunicator::Broadcast(Tensor* tensor, int root) {
  if (tensor == nullptr || !NeedsStaging(*tensor)) return host_->Broadcast(tensor, root);
  // Only the root's values travel; the others' are overwritten.
  absl::StatusOr<Tensor> host = ToHost(*tensor, /*copy=*/rank() == root);
  if (!host.ok()) return Fail(CommOpType::kBroadcast, rank(), host.status());
  std::unique_ptr<Work> work = host_->Broadcast(&*host, root);
  return WithCopies(std::move(work), {CopyBack{*tensor, *host}});
}

std::unique_ptr<Work> StagedCommunicator::AllGather(const Tensor& in, Tensor* out) {
  absl::StatusOr<Tensor> host_in = ToHost(in, /*copy=*/true);
  if (!host_in.ok()) return Fail(CommOpType::kAllGather, rank(), host_in.status());
  if (out == nullptr || !NeedsStaging(*out)) return host_->AllGather(*host_in, out);
  absl::StatusOr<Tensor> host_out = ToHost(*out, /*copy=*/false);
  if (!host_out.ok()) return Fail(CommOpType::kAllGather, rank(), host_out.status());
  std::unique_ptr<Work> work = host_->AllGather(*host_in, &*host_out);
  return WithCopies(std::move(work), {CopyBack{*out, *host_out}});
}

std::unique_ptr<Work> StagedCommunicator::ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) {
  absl::StatusOr<Tensor> host_in = ToHost(in, /*copy=*/true);
  if (!host_in.ok()) return Fail(CommOpType::kReduceScatter, rank(), host_in.status());
  if (out == nullptr || !NeedsStaging(*out)) return host_->ReduceScatter(*host_in, out, op);
  absl::StatusOr<Tensor> host_out = ToHost(*out, /*copy=*/false);
  if (!host_out.ok()) return Fail(CommOpType::kReduceScatter, rank(), host_out.status());
  std::unique_ptr<Work> work = host_->ReduceScatter(*host_in, &*host_out, op);
  return WithCopies(std::move(work), {CopyBack{*out, *host_out}});
}

}  // namespace strata
