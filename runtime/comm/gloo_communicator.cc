#include "runtime/comm/gloo_communicator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/context.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"
#include "runtime/comm/gloo_message.h"

namespace strata {
namespace {

// Gloo's own collectives use slot prefixes 0x01..0x08 in the top byte; the
// ring reduce-scatter below takes a prefix of its own, and send/recv slots
// stay under 2^56.
constexpr uint8_t kReduceScatterSlotPrefix = 0x10;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Combine(uint64_t h, uint64_t v) { return SplitMix64(h ^ SplitMix64(v)); }

// Slot of a send/recv channel: the tag, with 16 bits of (dtype, bytes) above
// it so that a sender and receiver that disagree on the payload never match.
uint64_t TransferSlot(int64_t tag, DataType dtype, size_t bytes) {
  uint64_t signature = Combine(Combine(0x5354524154410001ULL, dtype), bytes) & 0xffff;
  return (signature << 40) | static_cast<uint64_t>(tag);
}

// Tag of a collective: equal on every rank only for the same call in the same
// place of the issue order.
uint32_t CollectiveTag(int64_t sequence, CommOpType op, DataType dtype, size_t bytes,
                       int64_t detail) {
  uint64_t h = Combine(0x5354524154410002ULL, static_cast<uint64_t>(sequence));
  h = Combine(h, static_cast<uint64_t>(op));
  h = Combine(h, static_cast<uint64_t>(dtype));
  h = Combine(h, bytes);
  h = Combine(h, static_cast<uint64_t>(detail));
  return static_cast<uint32_t>(h);
}

// Gloo reads a zero timeout as "wait forever" and overflows on huge ones.
std::chrono::milliseconds ToGlooTimeout(absl::Duration timeout) {
  timeout = std::max(timeout, absl::Milliseconds(1));
  timeout = std::min(timeout, absl::Hours(24 * 30));
  return absl::ToChronoMilliseconds(timeout);
}

// For waits of our own: clamped so that now() + timeout cannot overflow.
std::chrono::milliseconds ToChronoTimeout(absl::Duration timeout) {
  timeout = std::max(timeout, absl::ZeroDuration());
  timeout = std::min(timeout, absl::Hours(24 * 30));
  return absl::ToChronoMilliseconds(timeout);
}

std::string Describe(const Tensor& t) {
  return absl::StrCat(DataTypeName(t.dtype()), ShapeString(t.shape()));
}

// Turns whatever Gloo threw into a Status; `what` names op, peer and tag.
absl::Status StatusFromException(std::exception_ptr error, const std::string& what) {
  try {
    std::rethrow_exception(error);
  } catch (const gloo::IoException& e) {
    const std::string message = GlooMessage(e.what());
    if (absl::StrContains(message, "Timed out waiting") ||
        absl::StrContains(message, "Wait timeout")) {
      return absl::DeadlineExceededError(absl::StrCat(what, " timed out: ", message));
    }
    return absl::UnavailableError(absl::StrCat(what, " failed, ", kConnectionLost, ": ", message));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(what, " failed inside Gloo: ", GlooMessage(e.what())));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, " failed: ", GlooMessage(e.what())));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, " failed with an unknown exception"));
  }
}

template <typename F>
absl::Status GuardGloo(const std::string& what, F&& body) {
  try {
    body();
    return absl::OkStatus();
  } catch (...) {
    return StatusFromException(std::current_exception(), what);
  }
}

// Gloo reads and writes the bytes on the host: a tensor on a GPU is refused
// here, with what to use instead, rather than dereferenced.
std::string NotOnHost(const Tensor& t) {
  if (!t.defined() || t.on_host()) return "";
  return absl::StrCat("the tensor is on ", t.device()->name(),
                      ", which Gloo cannot address: stage it through the host (StagedCommunicator)");
}

bool IsReducible(DataType dtype) {
  return dtype == F32 || dtype == F64 || dtype == I64 || dtype == I32;
}

template <typename T>
void ReduceInto(T* out, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      break;
  }
}

template <typename T>
void Scale(T* data, size_t n, int world) {
  for (size_t i = 0; i < n; ++i) data[i] /= static_cast<T>(world);
}

// Gloo's reduction callback: (out, a, b, element count) over void pointers.
template <typename T>
gloo::AllreduceOptions::Func GlooReduceFunction(ReduceOp op) {
  return [op](void* out, const void* a, const void* b, size_t n) {
    ReduceInto(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n, op);
  };
}

template <typename T>
void RunAllReduce(const std::shared_ptr<gloo::Context>& context, T* data, size_t n, ReduceOp op,
                  uint32_t tag, std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions options(context);
  options.setOutput<T>(data, n);
  options.setReduceFunction(GlooReduceFunction<T>(op));
  options.setTag(tag);
  options.setTimeout(timeout);
  gloo::allreduce(options);
  if (op == ReduceOp::kAvg) Scale(data, n, context->size);
}

// Ring reduce-scatter over unbound buffers (this Gloo release only has the
// old bound-buffer algorithm, whose waits ignore timeouts). Rank r holds
// P chunks of n elements; at step s it sends chunk r-s-1 to r+1 and folds
// chunk r-s-2 from r-1 into its copy, so after P-1 steps chunk r is complete.
template <typename T>
void RunReduceScatter(const std::shared_ptr<gloo::Context>& context, const T* in, T* out, size_t n,
                      ReduceOp op, uint32_t tag, std::chrono::milliseconds timeout) {
  const int world = context->size;
  const int rank = context->rank;
  std::vector<T> acc(in, in + n * world);
  if (world > 1 && n > 0) {
    std::vector<T> incoming(n);
    auto acc_buffer = context->createUnboundBuffer(acc.data(), acc.size() * sizeof(T));
    auto incoming_buffer = context->createUnboundBuffer(incoming.data(), n * sizeof(T));
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    const int right = (rank + 1) % world;
    const int left = (rank + world - 1) % world;
    for (int step = 0; step < world - 1; ++step) {
      const size_t send_chunk = ((rank - step - 1) % world + world) % world;
      const size_t recv_chunk = ((rank - step - 2) % world + world) % world;
      incoming_buffer->recv(left, slot);
      acc_buffer->send(right, slot, send_chunk * n * sizeof(T), n * sizeof(T));
      if (!incoming_buffer->waitRecv(timeout)) GLOO_THROW("reduce_scatter recv was aborted");
      T* chunk = acc.data() + recv_chunk * n;
      ReduceInto(chunk, chunk, incoming.data(), n, op);
      if (!acc_buffer->waitSend(timeout)) GLOO_THROW("reduce_scatter send was aborted");
    }
  }
  std::memcpy(out, acc.data() + static_cast<size_t>(rank) * n, n * sizeof(T));
  if (op == ReduceOp::kAvg) Scale(out, n, world);
}

// Calls fn.template operator()<T>() for a reducible dtype.
template <typename F>
void DispatchReducible(DataType dtype, F&& fn) {
  switch (dtype) {
    case F32:
      fn(float{});
      break;
    case F64:
      fn(double{});
      break;
    case I64:
      fn(int64_t{});
      break;
    case I32:
      fn(int32_t{});
      break;
    default:
      GLOO_THROW("unreachable: dtype validated at issue");
  }
}

}  // namespace

namespace gloo_internal {

// A posted send/recv: Gloo holds the buffer's address until the transfer
// ends, so the tensor reference lives exactly as long as the buffer.
struct PendingTransfer {
  Tensor tensor;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

}  // namespace gloo_internal

using gloo_internal::PendingTransfer;

struct GlooCommunicator::Core {
  Core(std::shared_ptr<gloo::Context> context, absl::Duration op_timeout)
      : context(std::move(context)), op_timeout(op_timeout) {}

  // Connections close before the buffers they may still name go away.
  ~Core() {
    context.reset();
    std::lock_guard<std::mutex> lock(mu);
    orphans.clear();
  }

  absl::Status Usable() {
    std::lock_guard<std::mutex> lock(mu);
    if (broken.ok()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("the communicator of rank ", context->rank,
                     " is closed after an earlier error: ", broken.message()));
  }

  absl::Status FirstError() {
    std::lock_guard<std::mutex> lock(mu);
    return broken;
  }

  void MarkBroken(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu);
    if (broken.ok()) broken = status;
  }

  // A Work dropped before its transfer ended hands the buffer over, since
  // Gloo may still write into it.
  void Adopt(std::shared_ptr<PendingTransfer> transfer) {
    std::lock_guard<std::mutex> lock(mu);
    orphans.push_back(std::move(transfer));
  }

  std::shared_ptr<gloo::Context> context;
  const absl::Duration op_timeout;
  std::mutex mu;
  absl::Status broken;                                    // guarded by mu
  std::vector<std::shared_ptr<PendingTransfer>> orphans;  // guarded by mu
};

namespace {

class TransferWork : public Work {
 public:
  TransferWork(std::shared_ptr<GlooCommunicator::Core> core, CommOpType op, int64_t sequence,
               int peer, std::string what, std::shared_ptr<PendingTransfer> transfer)
      : core_(std::move(core)),
        op_(op),
        sequence_(sequence),
        peer_(peer),
        what_(std::move(what)),
        transfer_(std::move(transfer)) {}

  ~TransferWork() override {
    if (transfer_ != nullptr) core_->Adopt(std::move(transfer_));
  }

  bool IsCompleted() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  absl::Status Wait(absl::Duration timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return status_;
    status_ = WaitOnGloo(timeout);
    done_ = true;
    if (status_.ok()) {
      transfer_.reset();
    } else {
      core_->MarkBroken(status_);
    }
    return status_;
  }

  CommOpType op_type() const override { return op_; }
  int64_t sequence_number() const override { return sequence_; }

 private:
  absl::Status WaitOnGloo(absl::Duration timeout) {
    bool completed = false;
    try {
      completed = op_ == CommOpType::kSend ? transfer_->buffer->waitSend(ToGlooTimeout(timeout))
                                           : transfer_->buffer->waitRecv(ToGlooTimeout(timeout));
    } catch (...) {
      absl::Status status = StatusFromException(std::current_exception(), what_);
      if (absl::IsDeadlineExceeded(status)) {
        return absl::DeadlineExceededError(absl::StrCat(
            what_, " timed out after ", absl::FormatDuration(timeout), ": rank ", peer_,
            op_ == CommOpType::kSend ? " never posted a matching recv"
                                     : " never sent a matching message",
            " (same tag, dtype and byte size); the communicator is now closed"));
      }
      absl::Status first = core_->FirstError();
      if (!first.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            what_, " aborted: the communicator was closed by an earlier error: ", first.message()));
      }
      return status;
    }
    if (!completed) return absl::CancelledError(absl::StrCat(what_, " was aborted"));
    return absl::OkStatus();
  }

  const std::shared_ptr<GlooCommunicator::Core> core_;
  const CommOpType op_;
  const int64_t sequence_;
  const int peer_;
  const std::string what_;
  std::mutex mu_;
  bool done_ = false;    // guarded by mu_
  absl::Status status_;  // guarded by mu_
  std::shared_ptr<PendingTransfer> transfer_;
};

// Completion state of one collective, shared by its Work and the queue.
struct CollectiveState {
  std::mutex mu;
  std::condition_variable finished;
  bool done = false;    // guarded by mu
  absl::Status status;  // guarded by mu

  void Finish(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
    finished.notify_all();
  }
};

class CollectiveWork : public Work {
 public:
  CollectiveWork(CommOpType op, int64_t sequence, std::string what,
                 std::shared_ptr<CollectiveState> state)
      : op_(op), sequence_(sequence), what_(std::move(what)), state_(std::move(state)) {}

  bool IsCompleted() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done;
  }

  absl::Status Wait(absl::Duration timeout) override {
    std::unique_lock<std::mutex> lock(state_->mu);
    auto done = [this] { return state_->done; };
    if (timeout == absl::InfiniteDuration()) {
      state_->finished.wait(lock, done);
    } else if (!state_->finished.wait_for(lock, ToChronoTimeout(timeout), done)) {
      return absl::DeadlineExceededError(
          absl::StrCat(what_, " not finished after ", absl::FormatDuration(timeout),
                       " (a peer stalled or slower than the timeout allows, or the ranks issue different "
                       "collectives)"));
    }
    return state_->status;
  }

  CommOpType op_type() const override { return op_; }
  int64_t sequence_number() const override { return sequence_; }

 private:
  const CommOpType op_;
  const int64_t sequence_;
  const std::string what_;
  std::shared_ptr<CollectiveState> state_;
};

}  // namespace

// One thread runs the collectives in issue order, which is also the order
// every rank issues them in.
class GlooCommunicator::CollectiveQueue {
 public:
  explicit CollectiveQueue(std::shared_ptr<Core> core)
      : core_(std::move(core)), thread_([this] { Loop(); }) {}

  ~CollectiveQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  // Fields of a collective that every rank must agree on; they make its tag.
  struct Signature {
    CommOpType op;
    DataType dtype;
    size_t bytes;
    int64_t detail;      // root, reduce op
    std::string suffix;  // " (sum, F32[4,8])"
  };

  // `body` runs on the queue's thread with the Gloo tag and a description.
  std::unique_ptr<Work> Enqueue(const Signature& signature,
                                std::function<absl::Status(uint32_t, const std::string&)> body) {
    auto state = std::make_shared<CollectiveState>();
    int64_t sequence;
    std::string what;
    {
      std::lock_guard<std::mutex> lock(mu_);
      sequence = next_sequence_++;
      what = Name(signature, sequence);
      uint32_t tag =
          CollectiveTag(sequence, signature.op, signature.dtype, signature.bytes, signature.detail);
      tasks_.push_back(
          Task{state, what, [body = std::move(body), tag, what] { return body(tag, what); }});
    }
    wake_.notify_one();
    return std::make_unique<CollectiveWork>(signature.op, sequence, std::move(what),
                                            std::move(state));
  }

  // An argument error: the call never reaches the wire, so it takes no
  // sequence number; its Work reports the number it would have had.
  std::unique_ptr<Work> Reject(const Signature& signature, const std::string& problem) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::make_unique<DoneWork>(
        signature.op, next_sequence_,
        absl::InvalidArgumentError(absl::StrCat(Name(signature, next_sequence_), ": ", problem)));
  }

 private:
  struct Task {
    std::shared_ptr<CollectiveState> state;
    std::string what;
    std::function<absl::Status()> body;
  };

  std::string Name(const Signature& signature, int64_t sequence) const {
    return absl::StrCat(CommOpTypeName(signature.op), " #", sequence, signature.suffix, " on rank ",
                        core_->context->rank, " of ", core_->context->size);
  }

  void Loop() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (stopping_) {
          for (Task& pending : tasks_) {
            pending.state->Finish(absl::CancelledError(
                absl::StrCat(pending.what, " cancelled: the communicator was destroyed first")));
          }
          tasks_.clear();
          return;
        }
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      absl::Status status = core_->Usable();
      if (status.ok()) status = task.body();
      if (!status.ok()) core_->MarkBroken(status);
      // The body holds the op's tensors: they go before its Work says done,
      // not when the next collective comes.
      task.body = nullptr;
      task.state->Finish(std::move(status));
    }
  }

  const std::shared_ptr<Core> core_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;      // guarded by mu_
  int64_t next_sequence_ = 0;  // guarded by mu_
  std::deque<Task> tasks_;     // guarded by mu_
  std::thread thread_;
};

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context,
                                   absl::Duration op_timeout)
    : core_(std::make_shared<Core>(std::move(context), op_timeout)),
      queue_(std::make_unique<CollectiveQueue>(core_)) {}

GlooCommunicator::~GlooCommunicator() { queue_.reset(); }

int GlooCommunicator::rank() const { return core_->context->rank; }
int GlooCommunicator::size() const { return core_->context->size; }
absl::Duration GlooCommunicator::op_timeout() const { return core_->op_timeout; }

std::unique_ptr<Work> GlooCommunicator::PostTransfer(CommOpType op, const Tensor& tensor, int peer,
                                                     int64_t tag) {
  const bool is_send = op == CommOpType::kSend;
  const int64_t sequence = transfer_sequence_.fetch_add(1);
  std::string what =
      absl::StrCat(is_send ? "send to rank " : "recv from rank ", peer, " (tag ", tag, ", ",
                   tensor.defined() ? Describe(tensor) : "undefined", ") on rank ", rank());
  auto fail = [&](absl::Status status) {
    return std::make_unique<DoneWork>(op, sequence, std::move(status));
  };
  if (peer < 0 || peer >= size()) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", peer, " is not in a group of ", size(), " ranks")));
  }
  if (peer == rank()) {
    return fail(absl::InvalidArgumentError(absl::StrCat(what, ": a rank cannot address itself")));
  }
  if (tag < 0 || tag >= kMaxTag) {
    return fail(
        absl::InvalidArgumentError(absl::StrCat(what, ": tag must lie in [0, ", kMaxTag, ")")));
  }
  if (!tensor.defined()) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(what, is_send ? ": the tensor is undefined"
                                   : ": the destination must be allocated with its shape")));
  }
  if (std::string problem = NotOnHost(tensor); !problem.empty()) {
    return fail(absl::InvalidArgumentError(absl::StrCat(what, ": ", problem)));
  }
  absl::Status usable = core_->Usable();
  if (!usable.ok())
    return fail(absl::Status(usable.code(), absl::StrCat(what, ": ", usable.message())));

  auto transfer = std::make_shared<PendingTransfer>();
  transfer->tensor = tensor;
  const uint64_t slot = TransferSlot(tag, tensor.dtype(), tensor.bytes());
  absl::Status posted = GuardGloo(what, [&] {
    transfer->buffer = core_->context->createUnboundBuffer(
        const_cast<void*>(transfer->tensor.raw_data()), transfer->tensor.bytes());
    if (is_send) {
      transfer->buffer->send(peer, slot);
    } else {
      transfer->buffer->recv(peer, slot);
    }
  });
  if (!posted.ok()) {
    core_->MarkBroken(posted);
    return fail(posted);
  }
  return std::make_unique<TransferWork>(core_, op, sequence, peer, std::move(what),
                                        std::move(transfer));
}

std::unique_ptr<Work> GlooCommunicator::Send(const Tensor& tensor, int dst, int64_t tag) {
  return PostTransfer(CommOpType::kSend, tensor, dst, tag);
}

std::unique_ptr<Work> GlooCommunicator::Recv(Tensor* into, int src, int64_t tag) {
  return PostTransfer(CommOpType::kRecv, into != nullptr ? *into : Tensor(), src, tag);
}

namespace {

// A collective's Gloo failure, with the hint a user needs for a timeout.
absl::Status RunCollective(const std::string& what, absl::Duration op_timeout,
                           const std::function<void()>& body) {
  absl::Status status = GuardGloo(what, body);
  if (absl::IsDeadlineExceeded(status)) {
    return absl::DeadlineExceededError(absl::StrCat(
        what, " timed out after ", absl::FormatDuration(op_timeout),
        ": a rank did not issue the same collective (op, dtype, size, order) or stalled; the "
        "communicator is now closed (",
        status.message(), ")"));
  }
  return status;
}

}  // namespace

std::unique_ptr<Work> GlooCommunicator::AllReduce(Tensor* tensor, ReduceOp op) {
  CollectiveQueue::Signature signature{CommOpType::kAllReduce, DT_INVALID, 0,
                                       static_cast<int64_t>(op), ""};
  if (tensor == nullptr || !tensor->defined()) {
    return queue_->Reject(signature, "the tensor is undefined");
  }
  Tensor t = *tensor;
  signature.dtype = t.dtype();
  signature.bytes = t.bytes();
  signature.suffix = absl::StrCat(" (", ReduceOpName(op), ", ", Describe(t), ")");
  if (std::string problem = NotOnHost(t); !problem.empty()) return queue_->Reject(signature, problem);
  if (!IsReducible(t.dtype())) {
    return queue_->Reject(signature, "only F32, F64, I64 and I32 tensors can be reduced");
  }
  if (op == ReduceOp::kAvg && !IsFloating(t.dtype())) {
    return queue_->Reject(signature, "avg needs a floating dtype");
  }
  std::shared_ptr<Core> core = core_;
  return queue_->Enqueue(signature, [core, t, op](uint32_t tag, const std::string& what) mutable {
    if (t.num_elements() == 0) return absl::OkStatus();
    return RunCollective(what, core->op_timeout, [&] {
      DispatchReducible(t.dtype(), [&](auto zero) {
        using T = decltype(zero);
        RunAllReduce<T>(core->context, t.data<T>(), t.num_elements(), op, tag,
                        ToGlooTimeout(core->op_timeout));
      });
    });
  });
}

std::unique_ptr<Work> GlooCommunicator::Broadcast(Tensor* tensor, int root) {
  CollectiveQueue::Signature signature{CommOpType::kBroadcast, DT_INVALID, 0, root,
                                       absl::StrCat(" (root ", root, ")")};
  if (tensor == nullptr || !tensor->defined()) {
    return queue_->Reject(signature, "the tensor is undefined");
  }
  Tensor t = *tensor;
  signature.dtype = t.dtype();
  signature.bytes = t.bytes();
  signature.suffix = absl::StrCat(" (root ", root, ", ", Describe(t), ")");
  if (root < 0 || root >= size()) {
    return queue_->Reject(signature,
                          absl::StrCat("root ", root, " is not in a group of ", size(), " ranks"));
  }
  if (std::string problem = NotOnHost(t); !problem.empty()) return queue_->Reject(signature, problem);
  std::shared_ptr<Core> core = core_;
  return queue_->Enqueue(signature, [core, t, root](uint32_t tag, const std::string& what) mutable {
    if (t.bytes() == 0) return absl::OkStatus();
    return RunCollective(what, core->op_timeout, [&] {
      gloo::BroadcastOptions options(core->context);
      options.setOutput<uint8_t>(static_cast<uint8_t*>(t.raw_data()), t.bytes());
      options.setRoot(root);
      options.setTag(tag);
      options.setTimeout(ToGlooTimeout(core->op_timeout));
      gloo::broadcast(options);
    });
  });
}

std::unique_ptr<Work> GlooCommunicator::AllGather(const Tensor& in, Tensor* out) {
  CollectiveQueue::Signature signature{CommOpType::kAllGather, in.dtype(), in.bytes(), 0,
                                       in.defined() ? absl::StrCat(" (", Describe(in), ")") : ""};
  if (!in.defined() || out == nullptr || !out->defined()) {
    return queue_->Reject(signature, "input and output must be allocated tensors");
  }
  if (out->dtype() != in.dtype() || out->num_elements() != in.num_elements() * size()) {
    return queue_->Reject(
        signature, absl::StrCat("the output must be ", DataTypeName(in.dtype()), " with ", size(),
                                " x ", in.num_elements(), " elements, got ", Describe(*out)));
  }
  for (const Tensor* t : {&in, static_cast<const Tensor*>(out)}) {
    if (std::string problem = NotOnHost(*t); !problem.empty()) return queue_->Reject(signature, problem);
  }
  Tensor input = in;
  Tensor output = *out;
  std::shared_ptr<Core> core = core_;
  return queue_->Enqueue(
      signature, [core, input, output](uint32_t tag, const std::string& what) mutable {
        if (input.bytes() == 0) return absl::OkStatus();
        return RunCollective(what, core->op_timeout, [&] {
          gloo::AllgatherOptions options(core->context);
          options.setInput<uint8_t>(static_cast<uint8_t*>(input.raw_data()), input.bytes());
          options.setOutput<uint8_t>(static_cast<uint8_t*>(output.raw_data()), output.bytes());
          options.setTag(tag);
          options.setTimeout(ToGlooTimeout(core->op_timeout));
          gloo::allgather(options);
        });
      });
}

std::unique_ptr<Work> GlooCommunicator::ReduceScatter(const Tensor& in, Tensor* out, ReduceOp op) {
  CollectiveQueue::Signature signature{
      CommOpType::kReduceScatter, in.dtype(), in.bytes(), static_cast<int64_t>(op),
      absl::StrCat(" (", ReduceOpName(op), in.defined() ? absl::StrCat(", ", Describe(in)) : "",
                   ")")};
  if (!in.defined() || out == nullptr || !out->defined()) {
    return queue_->Reject(signature, "input and output must be allocated tensors");
  }
  if (out->dtype() != in.dtype() || in.num_elements() != out->num_elements() * size()) {
    return queue_->Reject(
        signature, absl::StrCat("the input must hold ", size(), " chunks of the output's ",
                                DataTypeName(out->dtype()), " elements, got input ", Describe(in),
                                " and output ", Describe(*out)));
  }
  if (!IsReducible(in.dtype())) {
    return queue_->Reject(signature, "only F32, F64, I64 and I32 tensors can be reduced");
  }
  if (op == ReduceOp::kAvg && !IsFloating(in.dtype())) {
    return queue_->Reject(signature, "avg needs a floating dtype");
  }
  for (const Tensor* t : {&in, static_cast<const Tensor*>(out)}) {
    if (std::string problem = NotOnHost(*t); !problem.empty()) return queue_->Reject(signature, problem);
  }
  Tensor input = in;
  Tensor output = *out;
  std::shared_ptr<Core> core = core_;
  return queue_->Enqueue(
      signature, [core, input, output, op](uint32_t tag, const std::string& what) mutable {
        return RunCollective(what, core->op_timeout, [&] {
          DispatchReducible(input.dtype(), [&](auto zero) {
            using T = decltype(zero);
            RunReduceScatter<T>(core->context, input.data<T>(), output.data<T>(),
                                output.num_elements(), op, tag, ToGlooTimeout(core->op_timeout));
          });
        });
      });
}

std::unique_ptr<Work> GlooCommunicator::Barrier() {
  CollectiveQueue::Signature signature{CommOpType::kBarrier, DT_INVALID, 0, 0, ""};
  std::shared_ptr<Core> core = core_;
  return queue_->Enqueue(signature, [core](uint32_t tag, const std::string& what) {
    return RunCollective(what, core->op_timeout, [&] {
      gloo::BarrierOptions options(core->context);
      options.setTag(tag);
      options.setTimeout(ToGlooTimeout(core->op_timeout));
      gloo::barrier(options);
    });
  });
}

}  // namespace strata
