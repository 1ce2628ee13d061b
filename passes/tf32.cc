#include "passes/tf32.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<bool> Tf32Pass::Run(Graph& graph, const CompileContext& ctx) {
  if (!ctx.strategy.allow_tf32()) return false;
  static const std::set<std::string> kFamily = {"matmul",
                                                "matmul_shared_b_grad_a",
                                                "matmul_shared_b_grad_b",
                                                "matmul_accumulate",
                                                "matmul_bias",
                                                "matmul_bias_gelu",
                                                "matmul_gelu_grad",
                                                "matmul_bias_grad_b",
                                                "scaled_dot_product_attention",
                                                "scaled_dot_product_attention_grad",
                                                "scaled_dot_product_attention_qkv",
                                                "scaled_dot_product_attention_qkv_grad"};
  bool changed = false;
  for (int op : std::vector<int>(graph.ops())) {
    if (kFamily.count(graph.schema(op).type) == 0 || graph.inputs(op).empty()) continue;
    if (graph.dtype(graph.inputs(op)[0]) != F32) continue;
    Op marked = graph.AsOp(op);
    (*marked.mutable_attr())["allow_tf32"].set_b(true);
    if (auto s = graph.ReplaceOp(op, marked); !s.ok()) {
      return absl::InternalError(absl::StrCat("tf32: ", graph.OpLocation(op), ": ", s.message()));
    }
    changed = true;
  }
  return changed;
}

}  // namespace strata
