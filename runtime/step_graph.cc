#include "runtime/step_graph.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/comm/waiting_for.h"

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
  ScopedWaitingFor waiting("the other ranks' votes on capturing the step as a graph (--cuda_graph)");
  absl::StatusOr<std::vector<std::string>> reasons =
      AllGatherStrings(world, why_not.substr(0, kMaxReason), timeout);
  if (!reasons.ok()) {
    return absl::Status(reasons.status().code(),
                        absl::StrCat("agreeing with the other ranks whether to capture the step as a graph "
                                     "(--cuda_graph): ", reasons.status().message()));
  }
  StepGraphVote vote;
  for (int r = 0; r < static_cast<int>(reasons->size()); ++r) {
    if ((*reasons)[r].empty()) continue;
    vote.rank = r;
    vote.reason = std::move((*reasons)[r]);
    break;
  }
  return vote;
}

}  // namespace strata
