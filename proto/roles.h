#ifndef STRATA_PROTO_ROLES_H_
#define STRATA_PROTO_ROLES_H_

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

// Lives outside the micro-batch scopes, for the whole run (never freed by
// the memory plan): PARAM, STATE, SCRATCH or PARAM_COPY.
inline bool IsPersistent(VarKind kind) {
  return kind == PARAM || kind == STATE || kind == SCRATCH || kind == PARAM_COPY;
}
// Saved in and required from a checkpoint: PARAM and STATE, never SCRATCH.
inline bool IsCheckpointed(VarKind kind) { return kind == PARAM || kind == STATE; }

}  // namespace strata

#endif  // STRATA_PROTO_ROLES_H_
