#include "passes/host_transfers.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "passes/pass_helpers.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

absl::Status PassError(const std::string& what, const absl::Status& s) {
  return absl::InternalError(absl::StrCat("host-transfers: ", what, ": ", s.message()));
}

// A var named `name` of v's type in the other memory; an error if the name is taken.
absl::StatusOr<int> AddCopyVar(Graph& graph, int v, const std::string& name, bool host) {
  const int copy = graph.AddVar(name, graph.dtype(v), graph.shape(v), ACTIVATION);
  if (copy < 0) return absl::InternalError(absl::StrCat("host-transfers: var '", name, "' already exists"));
  graph.set_host_memory(copy, host);
  return copy;
}

Op CopyOp(const Graph& graph, int like, const char* type, OpRole role, int from, int to) {
  Op op = OpPlacedLike(graph, like, type, role);
  op.set_uid(-1);
  op.add_input(std::string(graph.var_name(from)));
  op.add_output(std::string(graph.var_name(to)));
  return op;
}

// Each feed some op reads: host memory, copied to `<feed>@device` first thing.
absl::StatusOr<bool> CopyFeedsIn(Graph& graph) {
  const std::vector<int> first_readers = graph.FirstReaders();
  bool changed = false;
  for (int v = 0; v < graph.num_vars(); ++v) {
    if (graph.kind(v) != FEED || graph.host_memory(v) || first_readers[v] < 0) continue;
    const std::string name(graph.var_name(v));
    STRATA_ASSIGN_OR_RETURN(const int on_device, AddCopyVar(graph, v, name + "@device", /*host=*/false));
    const int head = graph.ops().front();
    auto copy = graph.InsertOpBefore(head, CopyOp(graph, first_readers[v], "copy_to_device", FORWARD, v, on_device));
    if (!copy.ok()) return PassError(absl::StrCat("copy of feed '", name, "'"), copy.status());
    const int copy_op = *copy;
    auto replaced = graph.ReplaceAllUsesWith(v, on_device, [copy_op](int op) { return op != copy_op; });
    if (!replaced.ok()) return PassError(absl::StrCat("reads of feed '", name, "'"), replaced.status());
    graph.set_host_memory(v, true);
    changed = true;
  }
  return changed;
}

// The loss and the fetches written on this rank, and the clipped update's
// sum of squares (Program.grad_sumsq, written in the optimizer action):
// copied to `<var>@host` after their last writer, and recorded in
// Program.host_copy.
absl::StatusOr<bool> CopyMetricsOut(Graph& graph) {
  std::vector<std::string> names;
  if (!graph.loss().empty()) names.push_back(graph.loss());
  for (const std::string& f : graph.program_fields().fetch()) names.push_back(f);
  const std::string& grad_sumsq = graph.program_fields().grad_sumsq();
  if (!grad_sumsq.empty()) names.push_back(grad_sumsq);
  absl::flat_hash_set<std::string> seen;
  std::vector<int> last_writer(graph.num_vars(), -1);
  for (int op : graph.ops()) {
    for (int v : graph.outputs(op)) last_writer[v] = op;
  }
  bool changed = false;
  for (const std::string& name : names) {
    if (!seen.insert(name).second || graph.program_fields().host_copy().contains(name)) continue;
    const int v = graph.FindVar(name);
    if (v < 0 || graph.kind(v) != ACTIVATION || graph.host_memory(v) || last_writer[v] < 0) continue;
    // The executor reports what the forward writes (it reads the metrics
    // after each forward action), and grad_sumsq after the optimizer
    // action; a var written elsewhere is not copied.
    const OpRole role = graph.role(last_writer[v]);
    if (role != FORWARD && role != LOSS && !(name == grad_sumsq && role == OPTIMIZE)) continue;
    const std::string host_name = name + "@host";
    STRATA_ASSIGN_OR_RETURN(const int host, AddCopyVar(graph, v, host_name, /*host=*/true));
    const int writer = last_writer[v];
    auto copy = graph.InsertOpAfter(writer, CopyOp(graph, writer, "copy_to_host", graph.role(writer), v, host));
    if (!copy.ok()) return PassError(absl::StrCat("copy of '", name, "'"), copy.status());
    (*graph.mutable_program_fields().mutable_host_copy())[name] = host_name;
    changed = true;
  }
  return changed;
}

}  // namespace

absl::StatusOr<bool> HostTransfersPass::Run(Graph& graph, const CompileContext&) {
  if (graph.num_ops() == 0) return false;
  STRATA_ASSIGN_OR_RETURN(const bool feeds, CopyFeedsIn(graph));
  STRATA_ASSIGN_OR_RETURN(const bool metrics, CopyMetricsOut(graph));
  return feeds || metrics;
}

}  // namespace strata
