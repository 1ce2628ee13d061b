#include "runtime/step_graph.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/comm/waiting_for.h"
#include "runtime/tensor.h"

namespace strata {

bool IsCommunicationOp(const Op& op) {
  // A transfer names its channel and a collective its group, whatever its type.
  return op.has_channel() || op.has_group();
}

namespace {

// The communicator `op` goes through: the transfer transport for a
// transfer, its group's for a collective.
absl::StatusOr<Communicator*> OpCommunicator(const RankPlan& plan, const Op& op, const CommunicatorSet* comms) {
  if (comms == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("op '", op.name(), "' communicates, but rank ", plan.rank(), " has no communicators"));
  }
  if (op.has_channel()) return comms->transfers();
  absl::StatusOr<Communicator*> got = comms->Get(op.group());
  if (!got.ok()) return absl::Status(got.status().code(), absl::StrCat("op '", op.name(), "': ", got.status().message()));
  return got;
}

}  // namespace

absl::StatusOr<std::vector<Communicator*>> StepCommunicators(const RankPlan& plan, const CommunicatorSet* comms) {
  std::vector<Communicator*> used;
  for (const Op& op : plan.program().op()) {
    if (!IsCommunicationOp(op)) continue;
    absl::StatusOr<Communicator*> comm = OpCommunicator(plan, op, comms);
    if (!comm.ok()) return comm.status();
    if (std::find(used.begin(), used.end(), *comm) == used.end()) used.push_back(*comm);
  }
  return used;
}

std::string StepGraphBlocker(const RankPlan& plan, const StepGraphConditions& conditions) {
  if (!conditions.requested) return "--cuda_graph=false";
  if (!conditions.device_unsupported.empty()) return conditions.device_unsupported;
  if (conditions.tracing) return "--trace times every op on its own, which a replayed step cannot";
  for (const Op& op : plan.program().op()) {
    if (!IsCommunicationOp(op)) continue;
    absl::StatusOr<Communicator*> comm = OpCommunicator(plan, op, conditions.comms);
    const std::string why = comm.ok() ? (*comm)->GraphBlocker()
                                      : absl::StrCat("no communicator serves it (", comm.status().message(), ")");
    if (!why.empty()) {
      return absl::StrCat("rank ", plan.rank(), "'s step communicates (op '", op.name(), "' of type '", op.type(),
                          "') and ", why, ": only NCCL's device streams are captured");
    }
  }
  return "";
}

absl::StatusOr<StepGraphVote> AgreeOnStepGraphs(Communicator& world, const std::string& why_not,
                                                absl::Duration timeout) {
  // A reason is a note's clause: a few hundred bytes; the cap keeps a
  // runaway message from sizing every rank's buffers.
  constexpr size_t kMaxReason = 4096;
  const std::string mine = why_not.substr(0, kMaxReason);
  const int size = world.size();
  const int me = world.rank();
  ScopedWaitingFor waiting("the other ranks' votes on capturing the step as a graph (--cuda_graph)");
  auto failed = [](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("agreeing with the other ranks whether to capture the step as a graph "
                                               "(--cuda_graph): ", s.message()));
  };
  Tensor length = Tensor::Empty(I64, {1});
  Tensor lengths = Tensor::Zeros(I64, {size});
  if (!length.defined() || !lengths.defined()) return failed(absl::ResourceExhaustedError("out of host memory"));
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  lengths.data<int64_t>()[me] = static_cast<int64_t>(mine.size());
  if (absl::Status s = world.AllGather(length, &lengths)->Wait(timeout); !s.ok()) return failed(s);
  StepGraphVote vote;
  int64_t words = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t n = std::clamp<int64_t>(lengths.data<int64_t>()[r], 0, kMaxReason);
    if (n > 0 && vote.rank < 0) vote.rank = r;
    words = std::max(words, (n + 7) / 8);
  }
  if (vote.rank < 0) return vote;
  // Every rank saw the same lengths, so every rank gathers the reasons.
  Tensor text = Tensor::Zeros(I64, {words});
  Tensor texts = Tensor::Zeros(I64, {size * words});
  if (!text.defined() || !texts.defined()) return failed(absl::ResourceExhaustedError("out of host memory"));
  std::memcpy(text.raw_data(), mine.data(), mine.size());
  std::memcpy(texts.data<int64_t>() + me * words, mine.data(), mine.size());
  if (absl::Status s = world.AllGather(text, &texts)->Wait(timeout); !s.ok()) return failed(s);
  const int64_t n = std::clamp<int64_t>(lengths.data<int64_t>()[vote.rank], 0, kMaxReason);
  vote.reason.assign(reinterpret_cast<const char*>(texts.data<int64_t>() + vote.rank * words), n);
  return vote;
}

}  // namespace strata
