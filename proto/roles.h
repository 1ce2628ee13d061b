#ifndef STRATA_PROTO_ROLES_H_
#define STRATA_PROTO_ROLES_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "proto/plan.pb.h"
#include "proto/program.pb.h"

namespace strata {

// Which ops a schedule action runs, by role: FORWARD(mb) the forward and loss
// ops, BACKWARD(mb) the backward ops, OPTIMIZE the learning-rate and update ops.
// No action runs a REFRESH op (the executor's refresh of the PARAM_COPY vars does).
inline bool ActionRuns(Action::Kind action, OpRole role) {
  switch (action) {
    case Action::FORWARD: return role == FORWARD || role == LOSS;
    case Action::BACKWARD: return role == BACKWARD;
    case Action::OPTIMIZE: return role == OPTIMIZE || role == LR_SCHEDULE;
    default: return false;
  }
}

// The plan's predicted peak of a training step, or with `evaluation` of an
// evaluation (a plan from before it had one: the step's, an upper bound).
inline int64_t PredictedPeak(const MemoryPlan& memory, bool evaluation) {
  return evaluation && memory.eval_peak_bytes() > 0 ? memory.eval_peak_bytes() : memory.peak_bytes();
}

// How many micro-batches' forward sends an evaluation holds in flight when
// it starts a forward (Executor::Evaluate, and the memory plan's prediction
// of it): as many as the training step holds when one of its forwards
// starts, the earlier forwards with a send on one of `forward_channels` that
// the plan waits for (`waits`) at or after it (a send without a wait: at the
// step's end).
inline int EvalSendsInFlight(const Schedule& schedule,
                             const google::protobuf::RepeatedPtrField<MemoryPlan::SendWait>& waits,
                             const std::vector<int64_t>& forward_channels) {
  std::map<std::pair<int64_t, int>, int> wait_action;
  for (const auto& wait : waits) wait_action[{wait.channel(), wait.micro_batch()}] = wait.action();
  const int last = schedule.action_size() - 1;
  int most = 0;
  for (int i = 0; i <= last; ++i) {
    if (schedule.action(i).kind() != Action::FORWARD) continue;
    int held = 0;
    for (int j = 0; j < i; ++j) {
      const Action& earlier = schedule.action(j);
      if (earlier.kind() != Action::FORWARD) continue;
      for (int64_t channel : forward_channels) {
        auto it = wait_action.find({channel, earlier.micro_batch()});
        if ((it == wait_action.end() ? last : std::max(j, it->second)) >= i) {
          ++held;
          break;
        }
      }
    }
    most = std::max(most, held);
  }
  return most;
}

// Lives outside the micro-batch scopes, for the whole run (never freed by
// the memory plan): PARAM, STATE, SCRATCH or PARAM_COPY.
inline bool IsPersistent(VarKind kind) {
  return kind == PARAM || kind == STATE || kind == SCRATCH || kind == PARAM_COPY;
}
// Saved in and required from a checkpoint: PARAM and STATE, never SCRATCH.
inline bool IsCheckpointed(VarKind kind) { return kind == PARAM || kind == STATE; }

}  // namespace strata

#endif  // STRATA_PROTO_ROLES_H_
