#include "passes/loss_seed.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"

namespace strata {

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
