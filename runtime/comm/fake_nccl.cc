#include "runtime/comm/fake_nccl.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace strata {
namespace testing {
namespace {

thread_local int group_depth = 0;

template <typename T>
void Fold(T* acc, const T* in, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc[i] += in[i];
        break;
      case ReduceOp::kMax:
        acc[i] = std::max(acc[i], in[i]);
        break;
      case ReduceOp::kMin:
        acc[i] = std::min(acc[i], in[i]);
        break;
    }
  }
}

// out = op over `inputs` (n elements each), in rank order.
template <typename T>
void ReduceTyped(const std::vector<const void*>& inputs, size_t offset, size_t n, ReduceOp op, void* out) {
  std::vector<T> acc(static_cast<const T*>(inputs[0]) + offset, static_cast<const T*>(inputs[0]) + offset + n);
  for (size_t r = 1; r < inputs.size(); ++r) Fold(acc.data(), static_cast<const T*>(inputs[r]) + offset, n, op);
  if (op == ReduceOp::kAvg) {
    for (T& v : acc) v /= static_cast<T>(inputs.size());
  }
  std::memcpy(out, acc.data(), n * sizeof(T));
}

void Reduce(DataType dtype, const std::vector<const void*>& inputs, size_t offset, size_t n, ReduceOp op, void* out) {
  switch (dtype) {
    case F32:
      return ReduceTyped<float>(inputs, offset, n, op, out);
    case F64:
      return ReduceTyped<double>(inputs, offset, n, op, out);
    case I32:
      return ReduceTyped<int32_t>(inputs, offset, n, op, out);
    case I64:
      return ReduceTyped<int64_t>(inputs, offset, n, op, out);
    default:
      return;
  }
}

}  // namespace

struct FakeNccl::Op {
  enum Kind { kSend, kRecv, kAllReduce, kBroadcast, kAllGather, kReduceScatter };
  Kind kind;
  FakeComm* comm = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t size = 0;  // bytes, or elements for the reductions
  DataType dtype = DT_INVALID;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;
  int peer = 0;
  bool done = false;

  bool Agrees(const Op& o) const {
    return kind == o.kind && size == o.size && dtype == o.dtype && reduce == o.reduce && root == o.root;
  }
};

struct FakeNccl::FakeComm {
  Clique* clique = nullptr;
  int rank = 0;
  absl::Status async_error;
  bool aborted = false;
  int64_t collectives = 0;
};

struct FakeNccl::Clique {
  int nranks = 0;
  int joined = 0;
  std::vector<FakeComm*> comms;
  std::vector<int> aborts, destroys;
  std::map<int64_t, std::vector<std::shared_ptr<Op>>> collectives;  // by issue index, one part per rank
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Op>>> sends, recvs;  // by (src, dst)
};

FakeNccl::FakeNccl() = default;
FakeNccl::~FakeNccl() = default;

absl::StatusOr<std::string> FakeNccl::GetUniqueId() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = absl::StrCat("fake-nccl-id-", ids_++);
  id.resize(kUniqueIdBytes, '\0');
  return id;
}

absl::StatusOr<NcclApi::Comm> FakeNccl::CommInitRank(int, int nranks, const std::string& unique_id, int rank) {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<Clique>& clique = cliques_[unique_id];
  if (clique == nullptr) {
    clique = std::make_shared<Clique>();
    clique->nranks = nranks;
    clique->comms.assign(nranks, nullptr);
    clique->aborts.assign(nranks, 0);
    clique->destroys.assign(nranks, 0);
  }
  if (clique->nranks != nranks || rank < 0 || rank >= nranks || clique->comms[rank] != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("fake ncclCommInitRank: bad rank ", rank, " of ", nranks));
  }
  latest_ = clique;
  comms_.push_back(std::make_unique<FakeComm>());
  FakeComm* comm = comms_.back().get();
  comm->clique = clique.get();
  comm->rank = rank;
  clique->comms[rank] = comm;
  ++clique->joined;
  joined_.notify_all();
  Clique* c = clique.get();
  if (!joined_.wait_for(lock, std::chrono::seconds(30), [c] { return c->joined == c->nranks; })) {
    return absl::DeadlineExceededError("fake ncclCommInitRank: the other ranks never joined");
  }
  return static_cast<Comm>(comm);
}

absl::Status FakeNccl::Post(FakeComm* comm, StreamHandle stream, std::shared_ptr<Op> op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm->aborted) return absl::FailedPreconditionError("fake NCCL: the communicator was aborted");
  op->comm = comm;
  streams_[stream].push_back(op);
  Clique& clique = *comm->clique;
  switch (op->kind) {
    case Op::kSend:
      ++transfers_;
      if (group_depth == 0) ++ungrouped_;
      clique.sends[{comm->rank, op->peer}].push_back(op);
      MatchTransfers(clique, comm->rank, op->peer);
      break;
    case Op::kRecv:
      ++transfers_;
      if (group_depth == 0) ++ungrouped_;
      clique.recvs[{op->peer, comm->rank}].push_back(op);
      MatchTransfers(clique, op->peer, comm->rank);
      break;
    default: {
      std::vector<std::shared_ptr<Op>>& parts = clique.collectives[comm->collectives++];
      parts.resize(clique.nranks);
      parts[comm->rank] = op;
      MatchCollectives(clique);
    }
  }
  return absl::OkStatus();
}

void FakeNccl::MatchTransfers(Clique& clique, int src, int dst) {
  auto& sends = clique.sends[{src, dst}];
  auto& recvs = clique.recvs[{src, dst}];
  while (!sends.empty() && !recvs.empty() && sends.front()->size == recvs.front()->size) {
    std::memcpy(recvs.front()->recv, sends.front()->send, sends.front()->size);
    sends.front()->done = recvs.front()->done = true;
    sends.pop_front();
    recvs.pop_front();
  }
}

void FakeNccl::MatchCollectives(Clique& clique) {
  for (auto it = clique.collectives.begin(); it != clique.collectives.end();) {
    std::vector<std::shared_ptr<Op>>& parts = it->second;
    bool all = true;
    for (const auto& p : parts) all = all && p != nullptr && p->Agrees(*parts[0]);
    if (!all) {
      ++it;
      continue;
    }
    const Op& first = *parts[0];
    const int n = clique.nranks;
    std::vector<const void*> inputs;
    for (const auto& p : parts) inputs.push_back(p->send);
    const size_t element = first.dtype == DT_INVALID ? 1 : DataTypeSize(first.dtype);
    switch (first.kind) {
      case Op::kAllReduce: {
        std::vector<char> result(first.size * element);
        Reduce(first.dtype, inputs, 0, first.size, first.reduce, result.data());
        for (const auto& p : parts) std::memcpy(p->recv, result.data(), result.size());
        break;
      }
      case Op::kBroadcast: {
        std::vector<char> result(static_cast<const char*>(inputs[first.root]),
                                 static_cast<const char*>(inputs[first.root]) + first.size);
        for (const auto& p : parts) std::memcpy(p->recv, result.data(), result.size());
        break;
      }
      case Op::kAllGather: {
        std::vector<char> result(first.size * n);
        for (int r = 0; r < n; ++r) std::memcpy(result.data() + r * first.size, inputs[r], first.size);
        for (const auto& p : parts) std::memcpy(p->recv, result.data(), result.size());
        break;
      }
      case Op::kReduceScatter: {
        std::vector<std::vector<char>> chunks(n, std::vector<char>(first.size * element));
        for (int r = 0; r < n; ++r) Reduce(first.dtype, inputs, r * first.size, first.size, first.reduce, chunks[r].data());
        for (int r = 0; r < n; ++r) std::memcpy(parts[r]->recv, chunks[r].data(), chunks[r].size());
        break;
      }
      default:
        break;
    }
    for (const auto& p : parts) p->done = true;
    it = clique.collectives.erase(it);
  }
}

absl::Status FakeNccl::Send(const void* buffer, size_t bytes, int peer, Comm comm, StreamHandle stream) {
  auto op = std::make_shared<Op>(Op{Op::kSend});
  op->send = buffer;
  op->size = bytes;
  op->peer = peer;
  return Post(static_cast<FakeComm*>(comm), stream, op);
}

absl::Status FakeNccl::Recv(void* buffer, size_t bytes, int peer, Comm comm, StreamHandle stream) {
  auto op = std::make_shared<Op>(Op{Op::kRecv});
  op->recv = buffer;
  op->size = bytes;
  op->peer = peer;
  return Post(static_cast<FakeComm*>(comm), stream, op);
}

absl::Status FakeNccl::AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp reduce, Comm comm,
                                 StreamHandle stream) {
  auto op = std::make_shared<Op>(Op{Op::kAllReduce});
  op->send = send;
  op->recv = recv;
  op->size = count;
  op->dtype = dtype;
  op->reduce = reduce;
  return Post(static_cast<FakeComm*>(comm), stream, op);
}

absl::Status FakeNccl::Broadcast(const void* send, void* recv, size_t bytes, int root, Comm comm,
                                 StreamHandle stream) {
  auto op = std::make_shared<Op>(Op{Op::kBroadcast});
  op->send = send;
  op->recv = recv;
  op->size = bytes;
  op->root = root;
  return Post(static_cast<FakeComm*>(comm), stream, op);
}

absl::Status FakeNccl::AllGather(const void* send, void* recv, size_t bytes, Comm comm, StreamHandle stream) {
  auto op = std::make_shared<Op>(Op{Op::kAllGather});
  op->send = send;
  op->recv = recv;
  op->size = bytes;
  return Post(static_cast<FakeComm*>(comm), stream, op);
}

absl::Status FakeNccl::ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp reduce,
                                     Comm comm, StreamHandle stream) {
  auto op = std::make_shared<Op>(Op{Op::kReduceScatter});
  op->send = send;
  op->recv = recv;
  op->size = count;
  op->dtype = dtype;
  op->reduce = reduce;
  return Post(static_cast<FakeComm*>(comm), stream, op);
}

absl::Status FakeNccl::GroupStart() {
  ++group_depth;
  return absl::OkStatus();
}

absl::Status FakeNccl::GroupEnd() {
  if (group_depth == 0) return absl::InvalidArgumentError("fake ncclGroupEnd without ncclGroupStart");
  --group_depth;
  return absl::OkStatus();
}

absl::Status FakeNccl::CommGetAsyncError(Comm comm) {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<FakeComm*>(comm)->async_error;
}

absl::Status FakeNccl::CommAbort(Comm comm) {
  std::lock_guard<std::mutex> lock(mu_);
  FakeComm* c = static_cast<FakeComm*>(comm);
  c->aborted = true;
  ++c->clique->aborts[c->rank];
  // Its kernels stop: the streams pass its pending ops.
  for (auto& [stream, ops] : streams_) {
    for (auto& op : ops) {
      if (op->comm == c) op->done = true;
    }
  }
  return absl::OkStatus();
}

absl::Status FakeNccl::CommDestroy(Comm comm) {
  std::lock_guard<std::mutex> lock(mu_);
  FakeComm* c = static_cast<FakeComm*>(comm);
  ++c->clique->destroys[c->rank];
  return absl::OkStatus();
}

absl::StatusOr<NcclApi::Event> FakeNccl::RecordEvent(StreamHandle stream) {
  if (fail_event_records) {
    return absl::InternalError("CUDA event record failed: operation not permitted when stream is capturing (injected)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto* event = new FakeEvent;
  for (const auto& op : streams_[stream]) {
    if (!op->done) event->before.push_back(op);
  }
  ++live_events_;
  return static_cast<Event>(event);
}

absl::StatusOr<bool> FakeNccl::EventDone(Event event) {
  std::lock_guard<std::mutex> lock(mu_);
  ++event_queries_;
  for (const auto& op : static_cast<FakeEvent*>(event)->before) {
    if (!op->done) return false;
  }
  return true;
}

int FakeNccl::event_queries() {
  std::lock_guard<std::mutex> lock(mu_);
  return event_queries_;
}

void FakeNccl::DestroyEvent(Event event) {
  std::lock_guard<std::mutex> lock(mu_);
  delete static_cast<FakeEvent*>(event);
  --live_events_;
}

absl::Status FakeNccl::StreamWaitEvent(StreamHandle stream, Event) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stream_waits_[stream];
  return absl::OkStatus();
}

absl::StatusOr<StreamHandle> FakeNccl::CreateStream(int) {
  std::lock_guard<std::mutex> lock(mu_);
  ++live_streams_;
  return static_cast<StreamHandle>(new char);  // a fresh address, as a stream handle
}

void FakeNccl::DestroyStream(StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mu_);
  --live_streams_;
  delete static_cast<char*>(stream);
}

int FakeNccl::transfers() {
  std::lock_guard<std::mutex> lock(mu_);
  return transfers_;
}

int FakeNccl::live_streams() {
  std::lock_guard<std::mutex> lock(mu_);
  return live_streams_;
}

void FakeNccl::InjectAsyncError(int rank, absl::Status error) {
  std::lock_guard<std::mutex> lock(mu_);
  latest_->comms[rank]->async_error = std::move(error);
}

int FakeNccl::unique_ids_made() {
  std::lock_guard<std::mutex> lock(mu_);
  return ids_;
}

int FakeNccl::aborts(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_->aborts[rank];
}

int FakeNccl::destroys(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_->destroys[rank];
}

int FakeNccl::ungrouped_transfers() {
  std::lock_guard<std::mutex> lock(mu_);
  return ungrouped_;
}

int FakeNccl::stream_waits(StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mu_);
  return stream_waits_[stream];
}

int FakeNccl::live_events() {
  std::lock_guard<std::mutex> lock(mu_);
  return live_events_;
}

}  // namespace testing
}  // namespace strata
