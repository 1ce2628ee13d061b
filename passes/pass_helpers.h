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

// Whether update op `op` also writes its param's 16-bit copy (attr
// copy_dtype set by hoist-param-casts): its last output (fuse-optimizer's
// multi op: its last n).
bool WritesParamCopy(const Graph& graph, int op);

// A var name the graph does not have yet: base + suffix, else
// base + suffix + "@2", "@3", ...
std::string FreshVarName(const Graph& graph, absl::string_view base, absl::string_view suffix);

// By var id: how many live ops write it, and the last of them (-1: none).
struct VarWriters {
  std::vector<int> count;
  std::vector<int> last;
};
VarWriters CountWriters(const Graph& graph);

// The ops and vars the rewrites of one scan have changed, for rewriters
// that apply every site they find on one reading of the graph (its readers
// and writers): a site that shares an op or var with an earlier rewrite of
// the scan is left for the next scan, which reads the graph again.
class Touched {
 public:
  // Whether none of the site's ops and vars is touched yet; if so, they are now.
  bool Claim(const std::vector<int>& ops, const std::vector<int>& vars) {
    for (int op : ops) {
      if (op < 0 || (op < static_cast<int>(ops_.size()) && ops_[op])) return false;
    }
    for (int v : vars) {
      if (v < 0 || (v < static_cast<int>(vars_.size()) && vars_[v])) return false;
    }
    for (int op : ops) Mark(ops_, op);
    for (int v : vars) Mark(vars_, v);
    return true;
  }

 private:
  static void Mark(std::vector<bool>& marks, int i) {
    if (i >= static_cast<int>(marks.size())) marks.resize(i + 1, false);
    marks[i] = true;
  }

  std::vector<bool> ops_;
  std::vector<bool> vars_;
};

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
