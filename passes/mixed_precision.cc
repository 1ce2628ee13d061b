#include "passes/mixed_precision.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "passes/pass_helpers.h"
#include "proto/roles.h"

namespace strata {

absl::StatusOr<bool> MixedPrecisionPass::Run(Graph& graph, const CompileContext& ctx) {
  if (!ctx.strategy.has_mixed_precision()) return false;
  const DataType low = ctx.strategy.mixed_precision().dtype();
  if (low != BF16 && low != F16) {
    return absl::InternalError(absl::StrCat("mixed-precision: dtype ", DataType_Name(low),
                                            " reached the pass (ValidateStrategy admits BF16 and F16 only)"));
  }
  const std::string suffix = low == BF16 ? "@bf16" : "@f16";
  const std::vector<int> order = graph.ops();
  // (var, stage) -> its low-precision copy: one cast per var a stage reads.
  std::map<std::pair<int, int>, int> copy_of;
  bool changed = false;
  for (int op : order) {
    if (graph.schema(op).type != "matmul" || graph.outputs(op).size() != 1) continue;
    bool f32 = true;
    for (int in : graph.inputs(op)) f32 &= graph.dtype(in) == F32;
    if (!f32 || graph.dtype(graph.outputs(op)[0]) != F32) continue;
    Op matmul = graph.AsOp(op);
    const std::vector<int> inputs(graph.inputs(op).begin(), graph.inputs(op).end());
    for (size_t k = 0; k < inputs.size(); ++k) {
      const int in = inputs[k];
      auto [it, fresh] = copy_of.try_emplace({in, graph.stage(op)}, -1);
      if (fresh) {
        std::string name = absl::StrCat(graph.var_name(in), suffix);
        if (graph.stage(op) != 0 && graph.FindVar(name) >= 0) name = absl::StrCat(name, "@stage", graph.stage(op));
        const int v = graph.AddVar(name, low, graph.shape(in), ACTIVATION);
        if (v < 0) return absl::InternalError(absl::StrCat("mixed-precision: var '", name, "' exists already"));
        Op cast = OpPlacedLike(graph, op, "cast", graph.role(op));
        cast.add_input(std::string(graph.var_name(in)));
        cast.add_output(name);
        (*cast.mutable_attr())["dtype"] = StringAttr(DataType_Name(low));
        if (auto added = graph.InsertOpBefore(op, cast); !added.ok()) return added.status();
        it->second = v;
      }
      matmul.set_input(static_cast<int>(k), std::string(graph.var_name(it->second)));
    }
    const int out = graph.outputs(op)[0];
    const std::string out_name(graph.var_name(out));
    const std::string low_name = absl::StrCat(out_name, suffix);
    if (graph.AddVar(low_name, low, graph.shape(out), ACTIVATION) < 0) {
      return absl::InternalError(absl::StrCat("mixed-precision: var '", low_name, "' exists already"));
    }
    matmul.set_output(0, low_name);
    if (auto s = graph.ReplaceOp(op, matmul); !s.ok()) return s;
    Op back = OpPlacedLike(graph, op, "cast", graph.role(op));
    back.add_input(low_name);
    back.add_output(out_name);
    (*back.mutable_attr())["dtype"] = StringAttr(DataType_Name(F32));
    if (auto added = graph.InsertOpAfter(op, back); !added.ok()) return added.status();
    changed = true;
  }
  return changed;
}

}  // namespace strata
