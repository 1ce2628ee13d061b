#include "passes/hoist_param_casts.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "passes/pass_helpers.h"

namespace strata {
namespace {

// The update ops that can write a param's copy themselves (attr copy_dtype).
bool WritesCopies(const std::string& type) {
  return type == "sgd_update" || type == "momentum_update" || type == "adam_update";
}

// By var: the one OPTIMIZE update op writing that param in place and no copy
// yet, or -1 (none, or more than one).
std::vector<int> UpdateOfParam(const Graph& graph) {
  std::vector<int> update(graph.num_vars(), -1), count(graph.num_vars(), 0);
  for (int op : graph.ops()) {
    if (graph.role(op) != OPTIMIZE) continue;
    const absl::Span<const int> out = graph.outputs(op);
    for (int v : out) ++count[v];
    if (!WritesCopies(graph.schema(op).type) || graph.inputs(op).empty() || out.empty() ||
        graph.inputs(op)[0] != out[0] || WritesParamCopy(graph, op)) {
      continue;
    }
    update[out[0]] = op;
  }
  for (int v = 0; v < graph.num_vars(); ++v) {
    if (count[v] != 1) update[v] = -1;
  }
  return update;
}

}  // namespace

absl::StatusOr<bool> HoistParamCastsPass::Run(Graph& graph, const CompileContext& ctx) {
  const VarWriters writers = CountWriters(graph);
  // The casts of each (param, dtype), in program order.
  std::map<std::pair<int, DataType>, std::vector<int>> casts;
  std::vector<std::pair<int, DataType>> order;  // first cast first
  for (int op : graph.ops()) {
    if (graph.schema(op).type != "cast") continue;
    if (graph.role(op) != FORWARD && graph.role(op) != LOSS && graph.role(op) != BACKWARD) continue;
    const int param = graph.inputs(op)[0];
    const int copy = graph.outputs(op)[0];
    if (graph.kind(param) != PARAM || graph.dtype(copy) == graph.dtype(param)) continue;
    // An activation only this op writes, which the program does not report.
    if (!IsUnreportedActivation(graph, copy) || writers.count[copy] != 1) continue;
    std::vector<int>& group = casts[{param, graph.dtype(copy)}];
    if (group.empty()) order.push_back({param, graph.dtype(copy)});
    group.push_back(op);
  }
  // Where a weight is cast once an update anyway (one micro-batch, no
  // gradient merge, no recompute), a copy would only be held longer, unless
  // its update writes it (no cast at all then).
  const bool once_per_update = ctx.micro_batches * ctx.merge_steps <= 1;
  std::vector<int> update_of = UpdateOfParam(graph);
  std::vector<bool> keep(graph.num_vars(), true);
  std::vector<Op> hoisted;
  for (const auto& key : order) {
    const std::vector<int>& group = casts.at(key);
    const int update = key.second == BF16 || key.second == F16 ? update_of[key.first] : -1;
    if (once_per_update && group.size() == 1 && update < 0) continue;
    const int copy = graph.outputs(group[0])[0];
    for (size_t k = 1; k < group.size(); ++k) {
      // Another cast of the same weight (a recomputed segment's): its
      // readers read the copy the first one makes.
      const int again = graph.outputs(group[k])[0];
      if (absl::StatusOr<int> n = graph.ReplaceAllUsesWith(again, copy); !n.ok()) {
        return absl::InternalError(
            absl::StrCat("hoist-param-casts: ", graph.OpLocation(group[k]), ": ", n.status().message()));
      }
      graph.EraseOp(group[k]);
      keep[again] = false;
    }
    Op moved = graph.AsOp(group[0]);  // a copy: AsOp's message is scratch
    moved.set_role(OPTIMIZE);
    if (update >= 0) {
      // The update writes the copy (one read of the new weight, no launch of
      // its own); the cast stays only to refresh it (role REFRESH).
      Op writer = graph.AsOp(update);
      writer.add_output(std::string(graph.var_name(copy)));
      (*writer.mutable_attr())["copy_dtype"] = StringAttr(DataType_Name(key.second));
      if (absl::Status s = graph.ReplaceOp(update, writer); !s.ok()) {
        return absl::InternalError(
            absl::StrCat("hoist-param-casts: ", graph.OpLocation(update), ": writing the copy: ", s.message()));
      }
      update_of[key.first] = -1;  // one copy an update
      moved.set_role(REFRESH);
    }
    hoisted.push_back(std::move(moved));
    graph.EraseOp(group[0]);
    graph.set_kind(copy, PARAM_COPY);
  }
  // After every update op, in the order the forward cast them.
  for (const Op& op : hoisted) {
    if (absl::Status s = graph.AddOp(op); !s.ok()) {
      return absl::InternalError(absl::StrCat("hoist-param-casts: appending the cast of '", op.input(0), "': ",
                                              s.message()));
    }
  }
  if (hoisted.empty()) return false;
  if (auto s = graph.RetainVars(keep); !s.ok()) return absl::InternalError(absl::StrCat("hoist-param-casts: ", s.message()));
  return true;
}

}  // namespace strata
