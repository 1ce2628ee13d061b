#include "passes/in_place_loss_grad.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "passes/pass_helpers.h"

namespace strata {

namespace {

// Ops whose kernels always write output 0 into a buffer of their own (some
// kernels hand their input's buffer on in special cases: a same-dtype
// cast, dropout with nothing to drop, add_n of one input, reshape views):
// the logits' producers the gradient may write over.
bool OwnsItsOutput(absl::string_view type) { return type == "matmul" || type == "matmul_bias" || type == "add"; }

// Readers that keep no alias of what they read (their outputs are their own).
bool KeepsNoAlias(absl::string_view type) { return type == "softmax_cross_entropy" || type == "accuracy"; }

}  // namespace

absl::StatusOr<bool> InPlaceLossGradPass::Run(Graph& graph, const CompileContext&) {
  const std::vector<std::vector<int>> readers = graph.Readers();
  const VarWriters writers = CountWriters(graph);
  std::map<int, int> position;  // op id -> its place in program order
  for (int op : graph.ops()) position.emplace(op, static_cast<int>(position.size()));
  std::vector<std::pair<int, Op>> marked;
  for (int op : graph.ops()) {
    if (graph.schema(op).type != "softmax_cross_entropy_grad") continue;
    auto set = graph.attrs(op).find("in_place");
    if (set != graph.attrs(op).end() && set->second.b()) continue;
    const int logits = graph.inputs(op)[0];
    if (!IsUnreportedActivation(graph, logits) || writers.count[logits] != 1) continue;
    if (!OwnsItsOutput(graph.schema(writers.last[logits]).type)) continue;  // may share another var's buffer
    bool last = true;
    for (int reader : readers[logits]) {
      if (reader == op) continue;
      last = last && position.at(reader) < position.at(op) && KeepsNoAlias(graph.schema(reader).type);
    }
    // The gradient's other inputs must not be the logits (label, dloss).
    for (size_t k = 1; k < graph.inputs(op).size(); ++k) last = last && graph.inputs(op)[k] != logits;
    if (!last) continue;
    Op edited = graph.AsOp(op);
    (*edited.mutable_attr())["in_place"].set_b(true);
    marked.emplace_back(op, std::move(edited));
  }
  for (const auto& [id, op] : marked) {
    if (auto s = graph.ReplaceOp(id, op); !s.ok()) {
      return absl::InternalError(absl::StrCat("in-place-loss-gradient: ", graph.OpLocation(id), ": ", s.message()));
    }
  }
  return !marked.empty();
}

}  // namespace strata
