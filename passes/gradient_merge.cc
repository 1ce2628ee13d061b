#include "passes/gradient_merge.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "passes/pass_helpers.h"

namespace strata {

absl::StatusOr<bool> GradientMergePass::Run(Graph& graph, const CompileContext& ctx) {
  const int k = ctx.merge_steps;
  if (k <= 1) return false;
  if (ctx.strategy.gradient_merge().average()) {
    if (auto s = ScaleLossSeed(graph, 1.0 / k, "gradient-merge"); !s.ok()) return s;
  }
  // The buffers the micro-batch pass sums the gradients into, once each
  // (two parameters may share one), in name order: each parameter's, or for
  // a tied weight summed from its stages' parts in the optimizer action (its
  // gradient made or received there), this stage's parts' (merge_part).
  const std::vector<int> producer = graph.FirstWriters();
  std::set<std::string> buffers;
  for (const auto& [param, grad] : graph.program_fields().param_grad()) {
    const int v = graph.FindVar(grad);
    if (v >= 0 && graph.kind(v) == STATE) {
      buffers.insert(grad);
      continue;
    }
    const bool at_update = v >= 0 && producer[v] >= 0 && graph.role(producer[v]) == OPTIMIZE;
    if (!at_update) {
      return absl::InternalError(absl::StrCat("gradient-merge: the gradient '", grad, "' of '", param,
                                              "' is not summed into a state buffer"));
    }
  }
  for (const Program::MergePart& m : graph.program_fields().merge_part()) {
    const int v = graph.FindVar(m.buffer());
    if (v < 0 || graph.kind(v) != STATE) {
      return absl::InternalError(absl::StrCat("gradient-merge: the tied gradient's part '", m.buffer(), "' is not state"));
    }
    buffers.insert(m.buffer());
  }
  Program& fields = graph.mutable_program_fields();
  for (const std::string& b : buffers) fields.add_merge_buffer(b);
  return true;
}

}  // namespace strata
