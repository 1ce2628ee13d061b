#include "runtime/comm/device_collectives.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/nccl_communicator.h"

namespace strata {
namespace {

// One element from src to dst over the pair's new communicator, waited for.
// NCCL (2.15 on) sets a point-to-point connection up at the first transfer
// between two ranks, and that setup needs both of them there: the sender's
// host blocks in its first send until the receiver posts its first receive.
// Inside a step the receiver may be busy elsewhere (its host waiting on
// another peer), so each pair makes its first transfer here, in the same
// global order as the communicators' creation (PaddlePaddle does the same
// with an all-to-all at group creation, PR 54431). Both ranks of the pair
// come here right after its init, so it adds no wait the init did not
// have; as with the init, NCCL may block the host inside the send itself,
// before the timeout applies, and a peer that dies there ends this rank
// through the heartbeat monitor.
absl::Status WarmUpPair(NcclCommunicator& comm, bool sender, Device* device, absl::Duration timeout) {
  Tensor probe = Tensor::Zeros(F32, Shape{1}, device);
  if (!probe.defined()) return absl::ResourceExhaustedError("out of memory for a 4-byte probe");
  std::unique_ptr<Work> work = sender ? comm.Send(probe, 1, 0) : comm.Recv(&probe, 0, 0);
  return work->Wait(timeout);
}

NcclApiFactory& RegisteredFactory() {
  static NcclApiFactory* factory = new NcclApiFactory();
  return *factory;
}

}  // namespace

std::vector<int> CollectiveGroups(const RankPlan& plan) {
  std::set<int> ids;
  for (const Op& op : plan.program().op()) {
    if (op.has_group() && !op.has_channel()) ids.insert(op.group());
  }
  return std::vector<int>(ids.begin(), ids.end());
}

std::vector<int> CollectiveGroups(const std::vector<RankPlan>& plans, int rank) {
  std::set<int> mine;
  if (rank >= 0 && rank < static_cast<int>(plans.size())) {
    for (const CommGroup& g : plans[rank].topology().group()) mine.insert(g.id());
  }
  std::set<int> ids;
  for (const RankPlan& plan : plans) {
    for (int id : CollectiveGroups(plan)) {
      if (mine.count(id) > 0) ids.insert(id);
    }
  }
  return std::vector<int>(ids.begin(), ids.end());
}

absl::Status ConnectDeviceCollectives(std::shared_ptr<NcclApi> api, Store& job_store,
                                      const std::vector<int>& group_ids, Device* device, absl::Duration timeout,
                                      CommunicatorSet* set) {
  if (api == nullptr) return absl::InvalidArgumentError("no NCCL to connect the collectives with");
  const int rank = set->world()->rank();
  std::vector<int> sorted = group_ids;
  std::sort(sorted.begin(), sorted.end());
  for (int id : sorted) {
    const CommGroup* group = set->group(id);
    if (group == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, "'s collectives name group ", id,
                                                     ", which it has not connected"));
    }
    if (group->rank_size() <= 1) continue;
    const auto me = std::find(group->rank().begin(), group->rank().end(), rank);
    if (me == group->rank().end()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not a member of group ", id));
    }
    std::unique_ptr<Store> group_store = job_store.WithPrefix(absl::StrCat("nccl/g", id));
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
        NcclCommunicator::Create(api, *group_store, device, static_cast<int>(me - group->rank().begin()),
                                 group->rank_size(), timeout);
    if (!comm.ok()) {
      return absl::Status(comm.status().code(), absl::StrCat("connecting ", set->Describe(id), " over NCCL: ",
                                                             comm.status().message()));
    }
    if (absl::Status s = set->SetDeviceTransport(id, *std::move(comm)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

// Send and Recv over one NcclCommunicator per ordered pair of ranks (the
// first the sender, rank 0 in it), each on a stream of its own.
class PairwiseTransfers : public Communicator {
 public:
  PairwiseTransfers(std::shared_ptr<NcclApi> api, Device* device, int rank, int size)
      : api_(std::move(api)), device_(device), rank_(rank), size_(size) {}
  ~PairwiseTransfers() override {
    // The communicators before their streams, in (src, dst) order on every
    // rank: ncclCommDestroy talks to the peer, and the standard does not
    // say in which order a map's clear() destroys its elements.
    for (auto& [pair, comm] : pairs_) comm.reset();
    pairs_.clear();
    peer_streams_.clear();  // out of the device's list before they go
    for (StreamHandle stream : streams_) api_->DestroyStream(stream);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  // The pair (src -> dst)'s communicator and its stream, which this object owns.
  // The pair's stream may hold kernels waiting for the peer: the device's
  // out-of-memory retry waits for it only within its limit.
  void AddPair(int src, int dst, std::unique_ptr<NcclCommunicator> comm, StreamHandle stream) {
    pairs_[{src, dst}] = std::move(comm);
    streams_.push_back(stream);
    peer_streams_.push_back(device_->AddPeerStream(stream));
  }

  std::unique_ptr<Work> Send(const Tensor& tensor, int dst, int64_t tag) override {
    auto it = pairs_.find({rank_, dst});
    if (it == pairs_.end()) return NoPair(CommOpType::kSend, "to", dst);
    return it->second->Send(tensor, 1, tag);
  }
  std::unique_ptr<Work> Recv(Tensor* into, int src, int64_t tag) override {
    auto it = pairs_.find({src, rank_});
    if (it == pairs_.end()) return NoPair(CommOpType::kRecv, "from", src);
    return it->second->Recv(into, 0, tag);
  }
  std::unique_ptr<Work> AllReduce(Tensor*, ReduceOp) override { return NoCollective(CommOpType::kAllReduce); }
  std::unique_ptr<Work> Broadcast(Tensor*, int) override { return NoCollective(CommOpType::kBroadcast); }
  std::unique_ptr<Work> AllGather(const Tensor&, Tensor*) override { return NoCollective(CommOpType::kAllGather); }
  std::unique_ptr<Work> ReduceScatter(const Tensor&, Tensor*, ReduceOp) override {
    return NoCollective(CommOpType::kReduceScatter);
  }
  std::unique_ptr<Work> Barrier() override { return NoCollective(CommOpType::kBarrier); }

  std::string GraphBlocker() const override { return ""; }
  absl::Status CheckHealth() override {
    for (auto& [pair, comm] : pairs_) {
      if (absl::Status s = comm->CheckHealth(); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // Each pair on a thread of its own, all at once: since NCCL 2.26
  // ncclCommAbort returns only once no CUDA graph holds the communicator's
  // ops, and a graph drains only when every pair's kernels have stopped, so
  // the first of aborts in turn would wait on the pairs after it (as the
  // executor's AbortReplay aborts its transports).
  void Abort(const absl::Status& why) override {
    std::vector<std::thread> aborting;
    aborting.reserve(pairs_.size());
    for (auto& [pair, comm] : pairs_) {
      NcclCommunicator* c = comm.get();
      aborting.emplace_back([c, &why] { c->Abort(why); });
    }
    for (std::thread& t : aborting) t.join();
  }

 private:
  std::unique_ptr<Work> NoPair(CommOpType op, const char* direction, int peer) const {
    return std::make_unique<DoneWork>(
        op, -1,
        absl::InvalidArgumentError(absl::StrCat(CommOpTypeName(op), " ", direction, " rank ", peer, " on rank ", rank_,
                                                ": the plan has no transfer with that rank, so it was not connected")));
  }
  std::unique_ptr<Work> NoCollective(CommOpType op) const {
    return std::make_unique<DoneWork>(op, -1,
                                      absl::UnimplementedError(absl::StrCat(CommOpTypeName(op),
                                                                            ": the NCCL transfer pairs carry sends "
                                                                            "and receives only")));
  }

  std::shared_ptr<NcclApi> api_;
  Device* const device_;  // while connecting
  std::vector<std::shared_ptr<void>> peer_streams_;  // the device's handles on streams_
  const int rank_;
  const int size_;
  std::map<std::pair<int, int>, std::unique_ptr<NcclCommunicator>> pairs_;
  std::vector<StreamHandle> streams_;
};

}  // namespace

std::vector<int> TransferPeers(const RankPlan& plan) {
  std::set<int> peers;
  for (const Op& op : plan.program().op()) {
    if (!op.has_channel()) continue;
    const Channel& c = op.channel();
    if (c.src_rank() == plan.rank() && c.dst_rank() != plan.rank()) peers.insert(c.dst_rank());
    if (c.dst_rank() == plan.rank() && c.src_rank() != plan.rank()) peers.insert(c.src_rank());
  }
  return std::vector<int>(peers.begin(), peers.end());
}

absl::Status ConnectDeviceTransfers(std::shared_ptr<NcclApi> api, Store& job_store, const RankPlan& plan,
                                    Device* device, absl::Duration timeout, CommunicatorSet* set) {
  if (api == nullptr) return absl::InvalidArgumentError("no NCCL to connect the transfers with");
  const int me = plan.rank();
  auto transfers = std::make_unique<PairwiseTransfers>(api, device, me, set->world()->size());
  // Pairs in (lower, higher) rank order, each pair's two directions lower
  // rank's sends first: a global order, so every pair's two ranks reach it
  // (ncclCommInitRank blocks until both have) without waiting on each other.
  for (int peer : TransferPeers(plan)) {
    const int low = std::min(me, peer), high = std::max(me, peer);
    for (const auto& [src, dst] : {std::make_pair(low, high), std::make_pair(high, low)}) {
      absl::StatusOr<StreamHandle> stream = api->CreateStream(device->ordinal());
      if (!stream.ok()) return stream.status();
      std::unique_ptr<Store> pair_store = job_store.WithPrefix(absl::StrCat("nccl/p2p/", src, "-", dst));
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
          NcclCommunicator::Create(api, *pair_store, device, src == me ? 0 : 1, 2, timeout, *stream);
      if (!comm.ok()) {
        api->DestroyStream(*stream);
        return absl::Status(comm.status().code(), absl::StrCat("connecting rank ", src, "'s sends to rank ", dst,
                                                               " over NCCL: ", comm.status().message()));
      }
      if (auto s = WarmUpPair(**comm, src == me, device, timeout); !s.ok()) {
        comm->reset();
        api->DestroyStream(*stream);
        return absl::Status(s.code(), absl::StrCat("the first transfer from rank ", src, " to rank ", dst,
                                                   " over NCCL: ", s.message()));
      }
      transfers->AddPair(src, dst, *std::move(comm), *stream);
    }
  }
  return set->SetTransfers(std::move(transfers));
}

bool RegisterNcclApiFactory(NcclApiFactory factory) {
  RegisteredFactory() = std::move(factory);
  return true;
}

std::shared_ptr<NcclApi> NewRegisteredNcclApi() {
  const NcclApiFactory& factory = RegisteredFactory();
  return factory ? factory() : nullptr;
}

}  // namespace strata
