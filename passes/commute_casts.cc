#include "passes/commute_casts.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "passes/pass_helpers.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

bool IsMove(absl::string_view type) { return type == "transpose" || type == "reshape" || type == "flatten"; }

class Commuter {
 public:
  explicit Commuter(Graph& graph) : graph_(graph), keep_(graph.num_vars(), true) {}

  // One rewrite, if any applies; false when none does.
  absl::StatusOr<bool> Step() {
    const std::vector<std::vector<int>> readers = graph_.Readers();
    const std::vector<int> writers = graph_.FirstWriters();
    for (int op : std::vector<int>(graph_.ops())) {
      if (!IsCastDown(graph_, op)) continue;
      const int x = graph_.inputs(op)[0], y = graph_.outputs(op)[0];
      const int producer = writers[x];
      if (producer < 0 || graph_.stage(producer) != graph_.stage(op) || !IsUnreportedActivation(graph_, y)) continue;
      const absl::string_view type = graph_.schema(producer).type;
      // cast_down(cast_up(w)) == w.
      if (type == "cast" && graph_.dtype(graph_.inputs(producer)[0]) == graph_.dtype(y)) {
        const int w = graph_.inputs(producer)[0];
        if (auto replaced = graph_.ReplaceAllUsesWith(y, w); !replaced.ok()) return replaced.status();
        graph_.EraseOp(op);
        keep_[y] = false;
        if (readers[x].size() == 1 && IsUnreportedActivation(graph_, x)) {
          graph_.EraseOp(producer);
          keep_[x] = false;
        }
        return true;
      }
      if (!IsUnreportedActivation(graph_, x) || readers[x].size() != 1) continue;
      if (IsMove(type) && graph_.outputs(producer).size() == 1) {
        STRATA_RETURN_IF_ERROR(MoveAbove(producer, {op}));
        return true;
      }
      if (type == "split") {
        // Every output read by one cast to the same dtype, nothing else.
        std::vector<int> casts;
        for (int out : graph_.outputs(producer)) {
          if (!IsUnreportedActivation(graph_, out) || readers[out].size() != 1) break;
          const int c = readers[out][0];
          if (!IsCastDown(graph_, c) || CastTarget(graph_, c) != CastTarget(graph_, op) ||
              graph_.stage(c) != graph_.stage(producer) || !IsUnreportedActivation(graph_, graph_.outputs(c)[0])) {
            break;
          }
          casts.push_back(c);
        }
        if (casts.size() != graph_.outputs(producer).size()) continue;
        STRATA_RETURN_IF_ERROR(MoveAbove(producer, casts));
        return true;
      }
    }
    return false;
  }

  const std::vector<bool>& keep() const { return keep_; }

 private:
  // `mover` reads a cast copy of its input and writes the outputs of
  // `casts` (one per output, in order); the casts and the old outputs go.
  absl::Status MoveAbove(int mover, const std::vector<int>& casts) {
    const int u = graph_.inputs(mover)[0];
    const DataType low = CastTarget(graph_, casts[0]);
    const std::string suffix = low == BF16 ? "@bf16" : "@f16";
    const std::string name = FreshVarName(graph_, graph_.var_name(u), suffix);
    const int u_low = graph_.AddVar(name, low, graph_.shape(u), ACTIVATION);
    if (u_low < 0) return absl::InternalError(absl::StrCat("commute-casts: var '", name, "' exists already"));
    keep_.push_back(true);
    Op cast = OpPlacedLike(graph_, mover, "cast", graph_.role(mover));
    cast.add_input(std::string(graph_.var_name(u)));
    cast.add_output(name);
    (*cast.mutable_attr())["dtype"] = graph_.attrs(casts[0]).at("dtype");
    if (auto added = graph_.InsertOpBefore(mover, cast); !added.ok()) return added.status();
    Op moved = graph_.AsOp(mover);
    moved.set_input(0, name);
    for (size_t i = 0; i < casts.size(); ++i) {
      keep_[graph_.outputs(mover)[i]] = false;
      moved.set_output(static_cast<int>(i), std::string(graph_.var_name(graph_.outputs(casts[i])[0])));
    }
    if (auto s = graph_.ReplaceOp(mover, moved); !s.ok()) {
      return absl::InternalError(absl::StrCat("commute-casts: ", graph_.OpLocation(mover), ": ", s.message()));
    }
    for (int c : casts) graph_.EraseOp(c);
    return absl::OkStatus();
  }

  Graph& graph_;
  std::vector<bool> keep_;
};

}  // namespace

absl::StatusOr<bool> CommuteCastsPass::Run(Graph& graph, const CompileContext&) {
  Commuter commuter(graph);
  return RewriteUntilDone(graph, commuter, name_);
}

}  // namespace strata
