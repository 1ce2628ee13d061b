#include "passes/pass_helpers.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"

namespace strata {

Op OpPlacedLike(const Graph& graph, int like, const std::string& type, OpRole role) {
  Op op;
  op.set_type(type);
  op.set_role(role);
  op.set_stage(graph.stage(like));
  const absl::string_view device = graph.device(like);
  op.set_device(device.data(), device.size());
  op.set_uid(graph.uid(like));
  return op;
}

absl::Status ScaleLossSeed(Graph& graph, double factor, absl::string_view pass) {
  const std::string& seed_var = graph.program_fields().loss_grad();
  if (seed_var.empty()) return absl::OkStatus();
  const int v = graph.FindVar(seed_var);
  const int op = v >= 0 ? graph.FirstWriters()[v] : -1;
  if (op < 0 || !graph.attrs(op).contains("value")) {
    return absl::InternalError(
        absl::StrCat(pass, ": the loss gradient '", seed_var, "' has no seed op with a value to scale"));
  }
  Op seed = graph.AsOp(op);
  (*seed.mutable_attr())["value"] = FloatAttr(graph.attrs(op).at("value").f() * factor);
  return graph.ReplaceOp(op, seed);
}

DataType CastTarget(const Graph& graph, int op) {
  auto it = graph.attrs(op).find("dtype");
  DataType dtype = DT_INVALID;
  if (it == graph.attrs(op).end() || !DataType_Parse(it->second.s(), &dtype)) return DT_INVALID;
  return dtype;
}

bool IsCastDown(const Graph& graph, int op) {
  if (graph.schema(op).type != "cast") return false;
  const DataType to = CastTarget(graph, op);
  return (to == BF16 || to == F16) && graph.dtype(graph.inputs(op)[0]) == F32;
}

bool IsCastUp(const Graph& graph, int op) {
  if (graph.schema(op).type != "cast") return false;
  const DataType from = graph.dtype(graph.inputs(op)[0]);
  return (from == BF16 || from == F16) && CastTarget(graph, op) == F32;
}

VarWriters CountWriters(const Graph& graph) {
  VarWriters w{std::vector<int>(graph.num_vars(), 0), std::vector<int>(graph.num_vars(), -1)};
  for (int op : graph.ops()) {
    for (int v : graph.outputs(op)) {
      ++w.count[v];
      w.last[v] = op;
    }
  }
  return w;
}

std::string FreshVarName(const Graph& graph, absl::string_view base, absl::string_view suffix) {
  std::string name = absl::StrCat(base, suffix);
  for (int n = 2; graph.FindVar(name) >= 0; ++n) name = absl::StrCat(base, suffix, "@", n);
  return name;
}

bool WritesParamCopy(const Graph& graph, int op) {
  auto copy = graph.attrs(op).find("copy_dtype");
  return copy != graph.attrs(op).end() && !copy->second.s().empty();
}

bool IsUnreportedActivation(const Graph& graph, int v) {
  if (graph.kind(v) != ACTIVATION) return false;
  const absl::string_view name = graph.var_name(v);
  if (name == graph.loss() || graph.pinned(name)) return false;
  for (const std::string& f : graph.program_fields().fetch()) {
    if (f == name) return false;
  }
  return true;
}

}  // namespace strata
