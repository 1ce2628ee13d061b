// Pipeline transfers over the rank's communicator. The tag of a transfer is
// (channel id, micro-batch), so both sides agree without looking at program
// order. send posts and returns (the executor waits for all sends at the end
// of the step); recv posts its receive at the start of its action (Prefetch)
// and waits for it when its turn comes, with the run's comm timeout.

#include "kernels/comm_kernels.h"

#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

int64_t Tag(const Channel& c, const RunContext& run) {
  return c.id() * std::max(run.micro_batches, 1) + run.micro_batch;
}

std::string Describe(const Channel& c, const RunContext& run) {
  return absl::StrCat("channel ", c.id(), " '", c.var(), "' rank ", c.src_rank(), " -> rank ", c.dst_rank(),
                      ", micro-batch ", run.micro_batch, ", step ", run.step + 1);
}

// A posted send that names its channel when waiting for it fails (the
// step-end wait, on the send waiter's thread, sees only the Work).
class ChannelWork : public Work {
 public:
  ChannelWork(std::unique_ptr<Work> inner, std::string what) : inner_(std::move(inner)), what_(std::move(what)) {}
  bool IsCompleted() override { return inner_->IsCompleted(); }
  absl::Status Wait(absl::Duration timeout) override {
    absl::Status s = inner_->Wait(timeout);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("send on ", what_, ": ", s.message()));
  }
  CommOpType op_type() const override { return inner_->op_type(); }
  int64_t sequence_number() const override { return inner_->sequence_number(); }

 private:
  std::unique_ptr<Work> inner_;
  std::string what_;
};

class SendKernel : public OpKernel {
 public:
  explicit SendKernel(const KernelDef& def) : channel_(def.op->channel()) {}
  absl::Status Compute(KernelContext& ctx) override {
    const RunContext& run = ctx.run();
    if (run.comms == nullptr || run.pending_sends == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("send on ", Describe(channel_, run), " without a communicator"));
    }
    run.pending_sends->push_back(std::make_unique<ChannelWork>(
        run.comms->transfers()->Send(ctx.input(0), channel_.dst_rank(), Tag(channel_, run)), Describe(channel_, run)));
    return absl::OkStatus();
  }

 private:
  Channel channel_;
};

class RecvKernel : public OpKernel {
 public:
  explicit RecvKernel(const KernelDef& def)
      : channel_(def.op->channel()), type_(def.output_types.at(0)) {}

  bool prefetches() const override { return true; }

  absl::Status Prefetch(KernelContext& ctx) override {
    const RunContext& run = ctx.run();
    if (run.comms == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("recv on ", Describe(channel_, run), " without a communicator"));
    }
    Shape shape;
    for (int64_t d : type_.shape) shape.push_back(d == -1 ? run.micro_batch_size : d);
    Posted& p = posted_[run.micro_batch];
    p.buffer = Tensor::Empty(type_.dtype, shape, run.device);
    if (!p.buffer.defined()) {
      return absl::ResourceExhaustedError(absl::StrCat("out of memory for recv on ", Describe(channel_, run)));
    }
    p.work = run.comms->transfers()->Recv(&p.buffer, channel_.src_rank(), Tag(channel_, run));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    const RunContext& run = ctx.run();
    auto it = posted_.find(run.micro_batch);
    if (it == posted_.end()) {
      if (auto s = Prefetch(ctx); !s.ok()) return s;
      it = posted_.find(run.micro_batch);
    }
    absl::Status s = it->second.work->Wait(absl::Seconds(run.comm_timeout_s));
    if (!s.ok()) {
      posted_.erase(it);
      return absl::Status(s.code(), absl::StrCat("recv on ", Describe(channel_, run), ": ", s.message()));
    }
    ctx.SetOutput(0, std::move(it->second.buffer));
    posted_.erase(it);
    return absl::OkStatus();
  }

 private:
  struct Posted {
    Tensor buffer;
    std::unique_ptr<Work> work;
  };
  Channel channel_;
  TensorType type_;
  std::map<int, Posted> posted_;  // by micro-batch
};

}  // namespace

KernelFactory SendKernelFactory() { return MakeFactory<SendKernel>(); }
KernelFactory RecvKernelFactory() { return MakeFactory<RecvKernel>(); }

}  // namespace strata
