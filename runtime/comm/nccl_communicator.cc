#include "runtime/comm/nccl_communicator.h"

#include <algorithm>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace strata {

namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";

std::string Describe(const Tensor& t) { return absl::StrCat(DataTypeName(t.dtype()), ShapeString(t.shape())); }

bool IsReducible(DataType dtype) { return dtype == F32 || dtype == F64 || dtype == I64 || dtype == I32; }

}  // namespace

// An issued op: its tensors, kept until the completion event has passed.
struct PendingOp {
  std::vector<Tensor> tensors;
  NcclApi::Event done = nullptr;
  bool captured = false;  // issued under a capture: recorded into a graph, not run
};

struct NcclCommunicator::Core {
  std::shared_ptr<NcclApi> api;
  NcclApi::Comm comm = nullptr;
  Device* device = nullptr;
  StreamHandle stream = nullptr;  // where the ops run
  int rank = 0;
  int size = 1;

  std::mutex mu;  // every call that names `comm`, and what follows
  absl::Status broken;                              // guarded by mu: the first error
  bool aborted = false;                             // guarded by mu
  bool closed = false;                              // guarded by mu: destroyed or aborted
  std::vector<std::shared_ptr<PendingOp>> dropped;  // guarded by mu: ops whose Work went first

  absl::Status UsableLocked() {
    if (closed && broken.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("the NCCL communicator of rank ", rank, " was destroyed"));
    }
    if (broken.ok()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("the NCCL communicator of rank ", rank,
                                                      " was aborted after an earlier error: ", broken.message()));
  }

  // ncclCommAbort, never under mu and never waited for without end: since
  // NCCL 2.26 it returns only once no CUDA graph holds the communicator's
  // ops, and the executor destroys its graphs only after the failed step
  // returns (an eager step beside captured ones: a partial last batch, the
  // other step of gradient merge, an evaluation), so a caller that waited
  // would wait forever. The abort runs on a thread of its own; the caller
  // waits for it kAbortWait at most, then goes on (the kernels are stopped
  // either way, and the thread ends once the graphs are gone).
  // `release`: ops whose kernels may still run (the dropped ones, the
  // Work whose wait failed), their tensors and events let go only once the
  // abort has returned, so no kernel writes a block the allocator handed
  // on. A thread still aborting at exit is ended with the process (a failed
  // rank exits through _exit).
  static constexpr absl::Duration kAbortWait = absl::Seconds(5);
  void RunAbort(std::vector<std::shared_ptr<PendingOp>> release) {
    auto finished = std::make_shared<std::promise<void>>();
    std::future<void> done = finished->get_future();
    std::thread([api = api, comm = comm, finished, release = std::move(release)]() mutable {
      api->CommAbort(comm).IgnoreError();
      for (const auto& op : release) api->DestroyEvent(op->done);
      release.clear();
      finished->set_value();
    }).detach();
    done.wait_for(absl::ToChronoNanoseconds(kAbortWait));
  }

  // Marks the communicator aborted, `why` the first error if there was
  // none; true for the call that must then run ncclCommAbort (RunAbort, off
  // mu), which takes the ops to release after the abort.
  bool TakeAbortLocked(const absl::Status& why, std::vector<std::shared_ptr<PendingOp>>* release) {
    if (broken.ok()) broken = why;
    if (closed) return false;
    aborted = true;
    closed = true;
    *release = std::move(dropped);
    dropped.clear();
    return true;
  }

  // `keep`: the caller's op, if its kernels may still run (see RunAbort).
  void Abort(const absl::Status& why, std::shared_ptr<PendingOp> keep = nullptr) {
    std::vector<std::shared_ptr<PendingOp>> release;
    bool run = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (keep != nullptr) dropped.push_back(std::move(keep));
      run = TakeAbortLocked(why, &release);
    }
    if (run) RunAbort(std::move(release));
  }

  // The communicator's async error, unless it is already closed.
  absl::Status AsyncError() {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return absl::OkStatus();
    return api->CommGetAsyncError(comm);
  }

  // For IsCompleted, which the heartbeat's description of a stuck wait
  // calls from its own thread: never blocks on mu, which an issue holds
  // across NCCL calls that may wait for a dead peer (a first send's
  // connection). Busy counts as no error yet: the op is still pending.
  bool FailedIfIdle() {
    std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (!broken.ok()) return true;
    return !closed && !api->CommGetAsyncError(comm).ok();
  }
};

namespace {

using Core = NcclCommunicator::Core;

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<Core> core, CommOpType op, int64_t sequence, std::string what,
           std::shared_ptr<PendingOp> pending)
      : core_(std::move(core)), op_(op), sequence_(sequence), what_(std::move(what)), pending_(std::move(pending)) {}

  ~NcclWork() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_ == nullptr) return;
    std::lock_guard<std::mutex> core_lock(core_->mu);
    core_->dropped.push_back(std::move(pending_));
  }

  // Never blocks: a Wait on this Work holds mu_ for as long as it waits,
  // and the heartbeat's description of that wait asks the other pending
  // Works from its own thread; a Work being waited on counts as pending.
  bool IsCompleted() override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (finished_) return true;
    // A recorded op runs at the graph's replays: nothing to ask the event.
    if (pending_->captured) return false;
    absl::StatusOr<bool> done = core_->api->EventDone(pending_->done);
    if (!done.ok() || *done) return true;
    return core_->FailedIfIdle();
  }

  absl::Status Wait(absl::Duration timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return status_;
    if (pending_->captured != core_->device->capturing()) {
      // The op may still be running (or be replayed): the communicator keeps
      // its tensors, as for a Work dropped early.
      finished_ = true;
      status_ = absl::FailedPreconditionError(absl::StrCat(
          what_, pending_->captured ? " was issued under a capture that ended before its wait"
                                    : " was issued before the capture began and waited on under it: a graph cannot "
                                      "wait for work outside it"));
      std::lock_guard<std::mutex> core_lock(core_->mu);
      core_->dropped.push_back(std::move(pending_));
      return status_;
    }
    if (pending_->captured) return Finish(WaitUnderCapture());
    const absl::Time deadline = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
    absl::Duration nap = absl::Microseconds(20);
    for (;;) {
      {
        // After an abort the op's event passes too (its kernel was stopped):
        // the error decides, not the event.
        std::lock_guard<std::mutex> core_lock(core_->mu);
        if (!core_->broken.ok()) {
          return Finish(absl::FailedPreconditionError(
              absl::StrCat(what_, " aborted: the communicator was aborted by an earlier error: ", core_->broken.message())));
        }
      }
      absl::StatusOr<bool> done = core_->api->EventDone(pending_->done);
      if (!done.ok()) {
        absl::Status s(done.status().code(), absl::StrCat(what_, " failed on the device: ", done.status().message()));
        return AbortAndFinish(s);
      }
      if (*done) {
        // Kernels the caller enqueues after this Wait run after the op.
        absl::Status s = core_->api->StreamWaitEvent(core_->device->compute_stream(), pending_->done);
        if (!s.ok()) s = absl::Status(s.code(), absl::StrCat(what_, ": ordering the compute stream: ", s.message()));
        return Finish(s);
      }
      if (absl::Status async = core_->AsyncError(); !async.ok()) {
        absl::Status s(async.code(), absl::StrCat(what_, " failed: ", async.message(), "; the communicator is aborted"));
        return AbortAndFinish(s);
      }
      {
        std::lock_guard<std::mutex> core_lock(core_->mu);
        if (core_->closed) {
          return Finish(absl::CancelledError(absl::StrCat(what_, " cancelled: the communicator was destroyed first")));
        }
      }
      if (absl::Now() >= deadline) {
        absl::Status s = absl::DeadlineExceededError(
            absl::StrCat(what_, " timed out after ", absl::FormatDuration(timeout),
                         ": a rank did not issue the same op (order, size) or died; the communicator is aborted"));
        return AbortAndFinish(s);
      }
      absl::SleepFor(std::min(nap, std::max(deadline - absl::Now(), absl::ZeroDuration())));
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
  }

  CommOpType op_type() const override { return op_; }
  int64_t sequence_number() const override { return sequence_; }

 private:
  // A Wait where the op, or the wait, is recorded into a graph: the compute
  // stream's later work follows the op's completion event (which rejoins
  // the communication stream to the capture), and the tensors go back in
  // the compute stream's order. The event is never queried.
  absl::Status WaitUnderCapture() {
    {
      std::lock_guard<std::mutex> core_lock(core_->mu);
      if (!core_->broken.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat(what_, " aborted: the communicator was aborted by an earlier error: ", core_->broken.message()));
      }
    }
    absl::Status s = core_->api->StreamWaitEvent(core_->device->compute_stream(), pending_->done);
    if (!s.ok()) s = absl::Status(s.code(), absl::StrCat(what_, ": ordering the compute stream: ", s.message()));
    return s;
  }

  // Aborts the communicator over this op, whose kernels may still run:
  // its tensors and event go with the abort (Core::RunAbort).
  absl::Status AbortAndFinish(absl::Status s) {
    core_->Abort(s, std::move(pending_));
    return Finish(std::move(s));
  }

  absl::Status Finish(absl::Status s) {
    finished_ = true;
    status_ = std::move(s);
    if (pending_ != nullptr) {
      core_->api->DestroyEvent(pending_->done);
      pending_.reset();
    }
    return status_;
  }

  const std::shared_ptr<Core> core_;
  const CommOpType op_;
  const int64_t sequence_;
  const std::string what_;
  std::mutex mu_;
  bool finished_ = false;               // guarded by mu_
  absl::Status status_;                 // guarded by mu_
  std::shared_ptr<PendingOp> pending_;  // guarded by mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(std::shared_ptr<NcclApi> api,
                                                                          Store& group_store, Device* device,
                                                                          int rank, int size,
                                                                          absl::Duration timeout,
                                                                          StreamHandle stream) {
  const std::string where = absl::StrCat("NCCL communicator of rank ", rank, " of ", size);
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the rank must lie in [0, size)"));
  }
  if (device == nullptr || device->host_accessible()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": NCCL needs a GPU, not ",
                                                   device == nullptr ? "no device" : device->name()));
  }
  std::string id;
  if (rank == 0) {
    absl::StatusOr<std::string> made = api->GetUniqueId();
    if (!made.ok()) return absl::Status(made.status().code(), absl::StrCat(where, ": ", made.status().message()));
    id = *std::move(made);
    if (absl::Status s = group_store.Set(kUniqueIdKey, id); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(where, ": publishing the NCCL id: ", s.message()));
    }
  } else {
    absl::StatusOr<std::string> got = group_store.Get(kUniqueIdKey, timeout);
    if (!got.ok()) {
      return absl::Status(got.status().code(), absl::StrCat(where, ": waiting for rank 0's NCCL id: ",
                                                            got.status().message()));
    }
    id = *std::move(got);
  }
  if (id.size() != NcclApi::kUniqueIdBytes) {
    return absl::DataLossError(absl::StrCat(where, ": the NCCL id in the store has ", id.size(), " bytes, not ",
                                            NcclApi::kUniqueIdBytes));
  }
  absl::StatusOr<NcclApi::Comm> comm = api->CommInitRank(device->ordinal(), size, id, rank);
  if (!comm.ok()) return absl::Status(comm.status().code(), absl::StrCat(where, ": ", comm.status().message()));
  auto core = std::make_shared<Core>();
  core->api = std::move(api);
  core->comm = *comm;
  core->device = device;
  core->stream = stream != nullptr ? stream : device->comm_stream();
  core->rank = rank;
  core->size = size;
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(core), rank, size));
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Core> core, int rank, int size)
    : core_(std::move(core)), rank_(rank), size_(size) {}

NcclCommunicator::~NcclCommunicator() {
  std::unique_lock<std::mutex> lock(core_->mu);
  if (core_->closed) return;
  // Ops still running (their Works dropped, or kept past this) would hang a
  // destroy: abort instead.
  bool all_done = true;
  for (const auto& op : core_->dropped) {
    // A recorded op's replays ended with its graph, which goes first.
    if (op->captured) continue;
    absl::StatusOr<bool> done = core_->api->EventDone(op->done);
    all_done = all_done && done.ok() && *done;
  }
  if (all_done && core_->api->CommGetAsyncError(core_->comm).ok()) {
    core_->api->CommDestroy(core_->comm).IgnoreError();
    core_->closed = true;
    for (const auto& op : core_->dropped) core_->api->DestroyEvent(op->done);
    core_->dropped.clear();
    return;
  }
  // Works that outlive it say it was destroyed first (broken stays OK);
  // the running ops' tensors go once the abort has stopped their kernels.
  core_->aborted = true;
  core_->closed = true;
  std::vector<std::shared_ptr<PendingOp>> release = std::move(core_->dropped);
  core_->dropped.clear();
  lock.unlock();
  core_->RunAbort(std::move(release));
}

absl::Status NcclCommunicator::CheckHealth() {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (!core_->broken.ok()) return core_->broken;
  }
  absl::Status async = core_->AsyncError();
  if (async.ok()) return async;
  return absl::Status(async.code(), absl::StrCat("the NCCL communicator of rank ", rank_, " of ", size_,
                                                 " failed: ", async.message()));
}

void NcclCommunicator::Abort(const absl::Status& why) { core_->Abort(why); }

std::string NcclApi::VersionString(int version) {
  return absl::StrCat(version / 10000, ".", version / 100 % 100, ".", version % 100);
}

std::string NcclCommunicator::GraphBlocker() const {
  const int version = core_->api->Version();
  if (version >= NcclApi::kOldestCapturable) return "";
  return absl::StrCat("NCCL ", NcclApi::VersionString(version), " is older than ",
                      NcclApi::VersionString(NcclApi::kOldestCapturable),
                      ", the first whose operations a CUDA graph can capture");
}

bool NcclCommunicator::aborted() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->aborted;
}

std::string NcclCommunicator::NotOnDevice(const Tensor& t, const std::string& name) const {
  if (!t.defined()) return absl::StrCat(name, " is undefined");
  if (t.device() != core_->device) {
    return absl::StrCat(name, " is on ", t.device()->name(), ": NCCL moves tensors of this rank's GPU, ",
                        core_->device->name(), ", only");
  }
  return "";
}

std::unique_ptr<Work> NcclCommunicator::Reject(CommOpType op, bool collective, const std::string& what_suffix,
                                               const std::string& problem) {
  const int64_t sequence = collective ? next_collective_.load() : next_transfer_.load();
  return std::make_unique<DoneWork>(
      op, sequence,
      absl::InvalidArgumentError(absl::StrCat(CommOpTypeName(op), collective ? absl::StrCat(" #", sequence) : "",
                                              what_suffix, " on rank ", rank_, " of ", size_, ": ", problem)));
}

std::unique_ptr<Work> NcclCommunicator::Issue(
    CommOpType op, bool collective, const std::string& what_suffix, std::vector<Tensor> tensors,
    const std::function<absl::Status(NcclApi&, NcclApi::Comm, StreamHandle)>& enqueue) {
  std::unique_lock<std::mutex> lock(core_->mu);
  // Taken under the lock: the issue order is the sequence order.
  const int64_t sequence = collective ? next_collective_++ : next_transfer_++;
  const std::string what = absl::StrCat(CommOpTypeName(op), collective ? absl::StrCat(" #", sequence) : "",
                                        what_suffix, " on rank ", rank_, " of ", size_);
  if (absl::Status usable = core_->UsableLocked(); !usable.ok()) {
    return std::make_unique<DoneWork>(op, sequence,
                                      absl::Status(usable.code(), absl::StrCat(what, ": ", usable.message())));
  }
  NcclApi& api = *core_->api;
  const StreamHandle compute = core_->device->compute_stream();
  const StreamHandle comm_stream = core_->stream;
  const bool capturing = core_->device->capturing();
  auto fail = [&](const absl::Status& s) {
    if (capturing) {
      // Nothing ran (a failed capture, say one an earlier op invalidated):
      // no peer is inside its half, and the step reruns eagerly on this
      // communicator, so it stays usable, its sequence number given back.
      --(collective ? next_collective_ : next_transfer_);
      return std::make_unique<DoneWork>(op, sequence,
                                        absl::Status(s.code(), absl::StrCat(what, " under a capture: ", s.message())));
    }
    absl::Status named(s.code(), absl::StrCat(what, ": ", s.message(), "; the communicator is aborted"));
    // A peer may already be inside its half of the op: abort so it fails too.
    std::vector<std::shared_ptr<PendingOp>> release;
    const bool run = core_->TakeAbortLocked(named, &release);
    lock.unlock();
    if (run) core_->RunAbort(std::move(release));
    return std::make_unique<DoneWork>(op, sequence, named);
  };
  // The inputs were produced by kernels enqueued on the compute stream.
  absl::StatusOr<NcclApi::Event> produced = api.RecordEvent(compute);
  if (!produced.ok()) return fail(produced.status());
  absl::Status s = api.StreamWaitEvent(comm_stream, *produced);
  api.DestroyEvent(*produced);  // released once the wait has passed it
  if (!s.ok()) return fail(s);
  if (absl::Status e = enqueue(api, core_->comm, comm_stream); !e.ok()) return fail(e);
  absl::StatusOr<NcclApi::Event> done = api.RecordEvent(comm_stream);
  if (!done.ok()) return fail(done.status());
  auto pending = std::make_shared<PendingOp>();
  pending->tensors = std::move(tensors);
  pending->done = *done;
  pending->captured = capturing;
  return std::make_unique<NcclWork>(core_, op, sequence, what, std::move(pending));
}

std::unique_ptr<Work> NcclCommunicator::Send(const Tensor& tensor, int dst, int64_t tag) {
  const std::string suffix = absl::StrCat(" to rank ", dst, " (tag ", tag, tensor.defined() ? ", " : "",
                                          tensor.defined() ? Describe(tensor) : "", ")");
  if (std::string problem = NotOnDevice(tensor, "the tensor"); !problem.empty()) {
    return Reject(CommOpType::kSend, false, suffix, problem);
  }
  if (dst < 0 || dst >= size_ || dst == rank_) {
    return Reject(CommOpType::kSend, false, suffix, absl::StrCat("rank ", dst, " is not a peer in a group of ", size_));
  }
  return Issue(CommOpType::kSend, false, suffix, {tensor},
               [&](NcclApi& api, NcclApi::Comm comm, StreamHandle stream) -> absl::Status {
                 if (absl::Status s = api.GroupStart(); !s.ok()) return s;
                 absl::Status sent = api.Send(tensor.raw_data(), tensor.bytes(), dst, comm, stream);
                 absl::Status ended = api.GroupEnd();
                 return !sent.ok() ? sent : ended;
               });
}

std::unique_ptr<Work> NcclCommunicator::Recv(Tensor* into, int src, int64_t tag) {
  const Tensor t = into != nullptr ? *into : Tensor();
  const std::string suffix =
      absl::StrCat(" from rank ", src, " (tag ", tag, t.defined() ? ", " : "", t.defined() ? Describe(t) : "", ")");
  if (std::string problem = NotOnDevice(t, "the destination"); !problem.empty()) {
    return Reject(CommOpType::kRecv, false, suffix, problem);
  }
  if (src < 0 || src >= size_ || src == rank_) {
    return Reject(CommOpType::kRecv, false, suffix, absl::StrCat("rank ", src, " is not a peer in a group of ", size_));
  }
  return Issue(CommOpType::kRecv, false, suffix, {t},
               [&](NcclApi& api, NcclApi::Comm comm, StreamHandle stream) -> absl::Status {
                 if (absl::Status s = api.GroupStart(); !s.ok()) return s;
                 absl::Status got = api.Recv(const_cast<void*>(t.raw_data()), t.bytes(), src, comm, stream);
                 absl::Status ended = api.GroupEnd();
                 return !got.ok() ? got : ended;
               });
}

std::unique_ptr<Work> NcclCommunicator::AllReduce(Tensor* tensor, ReduceOp op) {
  const Tensor t = tensor != nullptr ? *tensor : Tensor();
  const std::string suffix =
      absl::StrCat(" (", ReduceOpName(op), t.defined() ? absl::StrCat(", ", Describe(t)) : "", ")");
  if (std::string problem = NotOnDevice(t, "the tensor"); !problem.empty()) {
    return Reject(CommOpType::kAllReduce, true, suffix, problem);
  }
  if (!IsReducible(t.dtype())) {
    return Reject(CommOpType::kAllReduce, true, suffix, "only F32, F64, I64 and I32 tensors can be reduced");
  }
  if (op == ReduceOp::kAvg && !IsFloating(t.dtype())) {
    return Reject(CommOpType::kAllReduce, true, suffix, "avg needs a floating dtype");
  }
  return Issue(CommOpType::kAllReduce, true, suffix, {t},
               [&](NcclApi& api, NcclApi::Comm comm, StreamHandle stream) {
                 void* data = const_cast<void*>(t.raw_data());
                 return api.AllReduce(data, data, static_cast<size_t>(t.num_elements()), t.dtype(), op, comm, stream);
               });
}

std::unique_ptr<Work> NcclCommunicator::Broadcast(Tensor* tensor, int root) {
  const Tensor t = tensor != nullptr ? *tensor : Tensor();
  const std::string suffix =
      absl::StrCat(" (root ", root, t.defined() ? absl::StrCat(", ", Describe(t)) : "", ")");
  if (std::string problem = NotOnDevice(t, "the tensor"); !problem.empty()) {
    return Reject(CommOpType::kBroadcast, true, suffix, problem);
  }
  if (root < 0 || root >= size_) {
    return Reject(CommOpType::kBroadcast, true, suffix,
                  absl::StrCat("root ", root, " is not in a group of ", size_, " ranks"));
  }
  return Issue(CommOpType::kBroadcast, true, suffix, {t},
               [&](NcclApi& api, NcclApi::Comm comm, StreamHandle stream) {
                 void* data = const_cast<void*>(t.raw_data());
                 return api.Broadcast(data, data, t.bytes(), root, comm, stream);
               });
}

std::unique_ptr<Work> NcclCommunicator::AllGather(const Tensor& in, Tensor* out) {
  const Tensor o = out != nullptr ? *out : Tensor();
  const std::string suffix = absl::StrCat(" (", in.defined() ? Describe(in) : "undefined", ")");
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&in, "the input"}, {&o, "the output"}}) {
    if (std::string problem = NotOnDevice(*t, name); !problem.empty()) {
      return Reject(CommOpType::kAllGather, true, suffix, problem);
    }
  }
  if (o.dtype() != in.dtype() || o.num_elements() != in.num_elements() * size_) {
    return Reject(CommOpType::kAllGather, true, suffix,
                  absl::StrCat("the output must be ", DataTypeName(in.dtype()), " with ", size_, " x ",
                               in.num_elements(), " elements, got ", Describe(o)));
  }
  return Issue(CommOpType::kAllGather, true, suffix, {in, o},
               [&](NcclApi& api, NcclApi::Comm comm, StreamHandle stream) {
                 return api.AllGather(in.raw_data(), const_cast<void*>(o.raw_data()), in.bytes(), comm, stream);
               });
}

std::unique_ptr<Work> NcclCommunicator::ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) {
  const Tensor o = out != nullptr ? *out : Tensor();
  const std::string suffix =
      absl::StrCat(" (", ReduceOpName(op), in.defined() ? absl::StrCat(", ", Describe(in)) : "", ")");
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&in, "the input"}, {&o, "the output"}}) {
    if (std::string problem = NotOnDevice(*t, name); !problem.empty()) {
      return Reject(CommOpType::kReduceScatter, true, suffix, problem);
    }
  }
  if (o.dtype() != in.dtype() || in.num_elements() != o.num_elements() * size_) {
    return Reject(CommOpType::kReduceScatter, true, suffix,
                  absl::StrCat("the input must hold ", size_, " chunks of the output's ", DataTypeName(o.dtype()),
                               " elements, got input ", Describe(in), " and output ", Describe(o)));
  }
  if (!IsReducible(in.dtype())) {
    return Reject(CommOpType::kReduceScatter, true, suffix, "only F32, F64, I64 and I32 tensors can be reduced");
  }
  if (op == ReduceOp::kAvg && !IsFloating(in.dtype())) {
    return Reject(CommOpType::kReduceScatter, true, suffix, "avg needs a floating dtype");
  }
  return Issue(CommOpType::kReduceScatter, true, suffix, {in, o},
               [&](NcclApi& api, NcclApi::Comm comm, StreamHandle stream) {
                 return api.ReduceScatter(in.raw_data(), const_cast<void*>(o.raw_data()),
                                          static_cast<size_t>(o.num_elements()), in.dtype(), op, comm, stream);
               });
}

std::unique_ptr<Work> NcclCommunicator::Barrier() {
  Tensor token = Tensor::Zeros(I32, {1}, core_->device);
  if (!token.defined()) {
    return Reject(CommOpType::kBarrier, true, "", absl::StrCat("out of memory on ", core_->device->name()));
  }
  return Issue(CommOpType::kBarrier, true, "", {token}, [&](NcclApi& api, NcclApi::Comm comm, StreamHandle stream) {
    void* data = token.raw_data();
    return api.AllReduce(data, data, 1, I32, ReduceOp::kSum, comm, stream);
  });
}

}  // namespace strata
