#include "runtime/step_graph.h"

#include "absl/strings/str_cat.h"

namespace strata {

bool IsCommunicationOp(const Op& op) {
  // A transfer names its channel and a collective its group, whatever its type.
  return op.has_channel() || op.has_group();
}

std::string StepGraphBlocker(const RankPlan& plan, const StepGraphConditions& conditions) {
  if (!conditions.requested) return "--cuda_graph=false";
  if (!conditions.device_unsupported.empty()) return conditions.device_unsupported;
  if (conditions.tracing) return "--trace times every op on its own, which a replayed step cannot";
  const Program& program = plan.program();
  for (const Op& op : program.op()) {
    if (IsCommunicationOp(op)) {
      return absl::StrCat("rank ", plan.rank(), "'s step communicates (op '", op.name(), "' of type '", op.type(),
                          "'), over Gloo staged through host memory or over NCCL, whose completion the executor "
                          "polls on the host: neither is captured yet");
    }
  }
  return "";
}

}  // namespace strata
