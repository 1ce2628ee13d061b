#include "passes/fold_casts.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "passes/pass_helpers.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

// Ops that write output 0 in 16 bits with out_dtype.
bool StoresOutputLow(absl::string_view type) { return type == "layer_norm" || type == "gelu_grad"; }

// The input an op reads widened from 16 bits (its dy), or -1.
int ReadsLowInput(absl::string_view type) {
  if (type == "layer_norm_grad") return 2;
  if (type == "gelu_grad") return 1;
  return -1;
}

class Folder {
 public:
  explicit Folder(Graph& graph) : graph_(graph), keep_(graph.num_vars(), true) {}

  // One fold, if any applies; false when none does.
  absl::StatusOr<bool> Step() {
    const std::vector<std::vector<int>> readers = graph_.Readers();
    std::vector<int> writes(graph_.num_vars(), 0), writer(graph_.num_vars(), -1);
    for (int op : graph_.ops()) {
      for (int v : graph_.outputs(op)) {
        ++writes[v];
        writer[v] = op;
      }
    }
    // The float32 var between the cast and the op: dropped by the fold.
    const auto foldable = [&](int v, int reader) {
      return IsUnreportedActivation(graph_, v) && writes[v] == 1 && readers[v].size() == 1 &&
             readers[v][0] == reader && graph_.stage(writer[v]) == graph_.stage(reader);
    };
    for (int op : std::vector<int>(graph_.ops())) {
      if (IsCastDown(graph_, op)) {
        const int x = graph_.inputs(op)[0], producer = writer[x];
        if (producer < 0 || !foldable(x, op) || !StoresOutputLow(graph_.schema(producer).type) ||
            graph_.outputs(producer)[0] != x || graph_.dtype(graph_.inputs(producer)[0]) != F32) {
          continue;
        }
        auto set = graph_.attrs(producer).find("out_dtype");
        if (set != graph_.attrs(producer).end() && !set->second.s().empty()) continue;
        Op folded = graph_.AsOp(producer);
        folded.set_output(0, std::string(graph_.var_name(graph_.outputs(op)[0])));
        (*folded.mutable_attr())["out_dtype"].set_s(DataType_Name(CastTarget(graph_, op)));
        STRATA_RETURN_IF_ERROR(Replace(producer, folded));
        graph_.EraseOp(op);
        keep_[x] = false;
        return true;
      }
      if (IsCastUp(graph_, op)) {
        const int v = graph_.outputs(op)[0];
        if (readers[v].size() != 1) continue;
        const int reader = readers[v][0];
        const int k = ReadsLowInput(graph_.schema(reader).type);
        if (k < 0 || !foldable(v, reader) || graph_.inputs(reader)[k] != v ||
            graph_.dtype(graph_.inputs(reader)[0]) != F32) {
          continue;
        }
        bool read_once = true;  // v is the op's dy and nothing else of it
        for (int i = 0; i < static_cast<int>(graph_.inputs(reader).size()); ++i) {
          read_once = read_once && (i == k || graph_.inputs(reader)[i] != v);
        }
        if (!read_once) continue;
        Op folded = graph_.AsOp(reader);
        folded.set_input(k, std::string(graph_.var_name(graph_.inputs(op)[0])));
        STRATA_RETURN_IF_ERROR(Replace(reader, folded));
        graph_.EraseOp(op);
        keep_[v] = false;
        return true;
      }
    }
    return false;
  }

  const std::vector<bool>& keep() const { return keep_; }

 private:
  absl::Status Replace(int id, const Op& op) {
    if (auto s = graph_.ReplaceOp(id, op); !s.ok()) {
      return absl::InternalError(absl::StrCat("fold-casts: ", graph_.OpLocation(id), ": ", s.message()));
    }
    return absl::OkStatus();
  }

  Graph& graph_;
  std::vector<bool> keep_;
};

}  // namespace

absl::StatusOr<bool> FoldCastsPass::Run(Graph& graph, const CompileContext&) {
  Folder folder(graph);
  return RewriteUntilDone(graph, folder, "fold-casts");
}

}  // namespace strata
