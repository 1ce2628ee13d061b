#include "passes/gradient_merge.h"

#include <set>
#include <string>

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
  // (two parameters may share one), in name order.
  std::set<std::string> buffers;
  for (const auto& [param, grad] : graph.program_fields().param_grad()) {
    const int v = graph.FindVar(grad);
    if (v < 0 || graph.kind(v) != STATE) {
      return absl::InternalError(absl::StrCat("gradient-merge: the gradient '", grad, "' of '", param,
                                              "' is not summed into a state buffer"));
    }
    buffers.insert(grad);
  }
  Program& fields = graph.mutable_program_fields();
  for (const std::string& b : buffers) fields.add_merge_buffer(b);
  return true;
}

}  // namespace strata
