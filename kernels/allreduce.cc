// Collectives over a communication group (Op.group), from the rank's
// CommunicatorSet: allreduce sums a small tensor at once (the stages' partial
// sums of squared gradients, for clipping by the global norm);
// bucket_allreduce and bucket_wait sum a data-parallel gradient bucket
// asynchronously, so the sum overlaps the rest of backward.

#include "kernels/comm_kernels.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "proto/status_macros.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/comm/waiting_for.h"
#include "runtime/fault_injection.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

// The group's communicator where it has peers; null on one rank or a group
// of one.
absl::StatusOr<Communicator*> PeersOf(const RunContext& run, int group, const std::string& what) {
  if (run.comms == nullptr || run.comms->world()->size() <= 1) return nullptr;
  if (group < 0) return absl::InternalError(absl::StrCat(what, " without a communication group"));
  absl::StatusOr<Communicator*> comm = run.comms->Get(group);
  if (!comm.ok()) return absl::Status(comm.status().code(), absl::StrCat(what, ": ", comm.status().message()));
  return (*comm)->size() > 1 ? *comm : nullptr;
}

class AllReduceKernel : public OpKernel {
 public:
  explicit AllReduceKernel(const KernelDef& def) : group_(def.op->has_group() ? def.op->group() : -1) {}
  absl::Status Compute(KernelContext& ctx) override {
    const RunContext& run = ctx.run();
    Tensor out = ctx.input(0).Clone();
    if (!out.defined()) return absl::ResourceExhaustedError("out of memory for allreduce");
    STRATA_ASSIGN_OR_RETURN(Communicator * comm, PeersOf(run, group_, "allreduce"));
    if (comm != nullptr) {
      const std::string what = absl::StrCat("allreduce over ", run.comms->Describe(group_));
      std::unique_ptr<Work> work = comm->AllReduce(&out, ReduceOp::kSum);
      ScopedWaitingFor waiting(what);
      if (auto s = work->Wait(absl::Seconds(run.comm_timeout_s)); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
      }
    }
    ctx.SetOutput(0, std::move(out));
    return absl::OkStatus();
  }

 private:
  const int group_;
};

int64_t BucketAttr(const KernelDef& def) {
  auto it = def.op->attr().find("bucket");
  return it == def.op->attr().end() ? 0 : it->second.i();
}

// "bucket 2 (3 gradients, F32[1290])", for messages.
std::string DescribeBucket(int64_t bucket, const Tensor& t, int gradients) {
  return absl::StrCat("bucket ", bucket, " (", gradients, " gradient", gradients == 1 ? "" : "s", ", ",
                      DataTypeName(t.dtype()), ShapeString(t.shape()), ")");
}

// Copies the gradients into the bucket and posts its sum over the group;
// in any backward but the last of an update step it does nothing. In the
// optimizer action (a bucket of gradients finished there) it always posts.
class BucketAllReduceKernel : public OpKernel {
 public:
  explicit BucketAllReduceKernel(const KernelDef& def)
      : group_(def.op->has_group() ? def.op->group() : -1),
        bucket_(BucketAttr(def)),
        in_optimizer_(def.op->role() == OPTIMIZE) {}
  absl::Status Compute(KernelContext& ctx) override {
    const RunContext& run = ctx.run();
    const Tensor& bucket = ctx.input(0);
    ctx.SetOutput(0, bucket);
    if (!in_optimizer_ && (!run.update_step || run.micro_batch + 1 != run.micro_batches)) return absl::OkStatus();
    char* at = static_cast<char*>(const_cast<void*>(bucket.raw_data()));  // stateful: the persistent bucket
    for (int i = 1; i < ctx.num_inputs(); ++i) {
      const Tensor& g = ctx.input(i);
      if (auto s = ctx.device().CopyOnDevice(at, g.raw_data(), g.bytes()); !s.ok()) return s;
      at += g.bytes();
    }
    std::string what = absl::StrCat("allreduce of ", DescribeBucket(bucket_, bucket, ctx.num_inputs() - 1));
    STRATA_ASSIGN_OR_RETURN(Communicator * comm, PeersOf(run, group_, what));
    if (comm == nullptr) return absl::OkStatus();
    if (run.pending_buckets == nullptr) return absl::InternalError("bucket_allreduce outside an executor");
    absl::StrAppend(&what, " over ", run.comms->Describe(group_));
    PendingCollective& slot = (*run.pending_buckets)[bucket_];
    if (slot.work != nullptr) return absl::InternalError(absl::StrCat(what, " posted twice in one step"));
    // Test hooks (runtime/fault_injection.h): this rank dies, or stops, where
    // it posts the bucket's sum, so its peers' sum of it cannot finish.
    const int rank = run.comms->world()->rank();
    if (FaultRequested("bucket_allreduce_exit", rank, run.step + 1)) {
      InjectedFault("bucket_allreduce_exit", rank, absl::StrCat("in ", what));
    }
    if (FaultRequested("bucket_allreduce_stall", rank, run.step + 1)) {
      InjectedStall("bucket_allreduce_stall", rank, absl::StrCat("in ", what));
    }
    Tensor shared = bucket;
    slot.work = comm->AllReduce(&shared, ReduceOp::kSum);
    slot.what = std::move(what);
    return absl::OkStatus();
  }

 private:
  const int group_;
  const int64_t bucket_;
  const bool in_optimizer_;
};

// The communicator runs its collectives in the order they were posted, and
// once one failed every later one says only that the communicator is closed:
// of `failed` and the buckets still pending, the first posted that finished
// with an error, so that the message names the bucket whose sum failed
// rather than the one whose wait came first.
const PendingCollective& FirstFailed(std::map<int64_t, PendingCollective>& pending_buckets,
                                     const PendingCollective& failed) {
  const PendingCollective* first = &failed;
  for (auto& [bucket, other] : pending_buckets) {
    if (other.work->sequence_number() < first->work->sequence_number() && other.work->IsCompleted() &&
        !other.work->Wait(absl::ZeroDuration()).ok()) {
      first = &other;
    }
  }
  return *first;
}

// What a bucket's wait is blocked on, for the heartbeat's message: the first
// posted of its bucket and the earlier ones still pending that has not
// finished (the communicator runs them in order).
std::string DescribeWait(const std::map<int64_t, PendingCollective>& pending_buckets, const PendingCollective& waited,
                         int64_t bucket) {
  const PendingCollective* first = &waited;
  for (const auto& [other_bucket, other] : pending_buckets) {
    if (other.work->sequence_number() < first->work->sequence_number() && !other.work->IsCompleted()) first = &other;
  }
  if (first == &waited) return waited.what;
  return absl::StrCat(first->what, " (in bucket ", bucket, "'s wait, queued behind it)");
}

// Waits for the bucket's sum and copies each gradient out of it.
class BucketWaitKernel : public OpKernel {
 public:
  explicit BucketWaitKernel(const KernelDef& def) : bucket_(BucketAttr(def)), types_(def.output_types) {}
  absl::Status Compute(KernelContext& ctx) override {
    const RunContext& run = ctx.run();
    const Tensor& bucket = ctx.input(0);
    std::map<int64_t, PendingCollective>* pending_buckets = run.pending_buckets;
    if (pending_buckets != nullptr && pending_buckets->count(bucket_) > 0) {
      PendingCollective pending = std::move(pending_buckets->at(bucket_));
      pending_buckets->erase(bucket_);
      ScopedWaitingFor waiting([&] { return DescribeWait(*pending_buckets, pending, bucket_); });
      if (auto s = pending.work->Wait(absl::Seconds(run.comm_timeout_s)); !s.ok()) {
        const PendingCollective& cause = FirstFailed(*pending_buckets, pending);
        if (&cause == &pending) return absl::Status(s.code(), absl::StrCat(pending.what, ": ", s.message()));
        s = cause.work->Wait(absl::ZeroDuration());
        return absl::Status(s.code(),
                            absl::StrCat(cause.what, " (found waiting for bucket ", bucket_, "): ", s.message()));
      }
    } else if (run.comms != nullptr && run.comms->world()->size() > 1) {
      return absl::InternalError(absl::StrCat("allreduce of ", DescribeBucket(bucket_, bucket, ctx.num_outputs()),
                                              " was never posted this step"));
    }
    const char* at = static_cast<const char*>(bucket.raw_data());
    for (int i = 0; i < ctx.num_outputs(); ++i) {
      STRATA_ASSIGN_OR_RETURN(Tensor * out, ctx.AllocateOutput(i, types_[i].dtype, types_[i].shape));
      if (auto s = ctx.device().CopyOnDevice(out->raw_data(), at, out->bytes()); !s.ok()) return s;
      at += out->bytes();
    }
    return absl::OkStatus();
  }

 private:
  const int64_t bucket_;
  const std::vector<TensorType> types_;
};

}  // namespace

KernelFactory AllReduceKernelFactory() { return MakeFactory<AllReduceKernel>(); }
KernelFactory BucketAllReduceKernelFactory() { return MakeFactory<BucketAllReduceKernel>(); }
KernelFactory BucketWaitKernelFactory() { return MakeFactory<BucketWaitKernel>(); }

}  // namespace strata
