#ifndef STRATA_PASSES_PASS_HELPERS_H_
#define STRATA_PASSES_PASS_HELPERS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "compiler/graph.h"

namespace strata {

// What several passes do alike.

// An op of a pass's making placed like op `like` (its stage, device and uid,
// so a random op keyed by the uid draws alike): type and role set, no
// inputs, outputs or attrs yet.
Op OpPlacedLike(const Graph& graph, int like, const std::string& type, OpRole role);

// Multiplies the seed of dL/dloss (the `value` of the op autodiff made for
// Program.loss_grad) by `factor`: the passes that split the global batch
// (micro-batches 1/M, data parallel 1/D, gradient merge's average 1/k) make
// each part's mean loss contribute its share of the global mean's gradient.
// A stage without the loss has no seed: nothing to do. `pass` names the
// caller in errors.
absl::Status ScaleLossSeed(Graph& graph, double factor, absl::string_view pass);

// The mixed-precision cast rewrites (commute-casts, fold-casts):
// The dtype a cast op converts to (DT_INVALID when unreadable).
DataType CastTarget(const Graph& graph, int op);
// A cast from F32 to BF16 / F16 (down) or from BF16 / F16 to F32 (up).
bool IsCastDown(const Graph& graph, int op);
bool IsCastUp(const Graph& graph, int op);
// A var such a pass may drop or retype: an activation the program does not
// report (not the loss, not fetched) and no later pass looks up by name
// (not pinned: Graph::Pin).
bool IsUnreportedActivation(const Graph& graph, int v);

// A var name the graph does not have yet: base + suffix, else
// base + suffix + "@2", "@3", ...
std::string FreshVarName(const Graph& graph, absl::string_view base, absl::string_view suffix);

// By var id: how many live ops write it, and the last of them (-1: none).
struct VarWriters {
  std::vector<int> count;
  std::vector<int> last;
};
VarWriters CountWriters(const Graph& graph);

// Runs `rewriter.Step()` (one rewrite, false when none applies) until none
// does, then drops the vars `rewriter.keep()` marks false; `pass` names the
// caller in errors. Whether anything changed.
template <typename Rewriter>
absl::StatusOr<bool> RewriteUntilDone(Graph& graph, Rewriter& rewriter, absl::string_view pass) {
  bool changed = false;
  while (true) {
    absl::StatusOr<bool> step = rewriter.Step();
    if (!step.ok()) return step.status();
    if (!*step) break;
    changed = true;
  }
  if (changed) {
    if (auto s = graph.RetainVars(rewriter.keep()); !s.ok()) {
      return absl::InternalError(absl::StrCat(pass, ": ", s.message()));
    }
  }
  return changed;
}

}  // namespace strata

#endif  // STRATA_PASSES_PASS_HELPERS_H_
