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

}  // namespace strata
