#include "passes/fold_casts.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "passes/pass_helpers.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

// Whether `op` can write its output 0 in 16-bit `target` with out_dtype:
// the float ops (layer_norm, gelu_grad) from an F32 x; the GEMMs with a bias
// epilogue (matmul_bias, matmul_bias_gelu's gelu output) from operands of
// that very type over an F32 bias, in float until the one rounding (not a
// matmul_bias with a residual: its sum stays float, cuBLASLt's C and D of
// one type).
bool StoresOutputLow(const Graph& graph, int op, DataType target) {
  const std::string& type = graph.schema(op).type;
  const absl::Span<const int> in = graph.inputs(op);
  if (type == "layer_norm" || type == "gelu_grad") return graph.dtype(in[0]) == F32;
  if (type == "matmul_bias" || type == "matmul_bias_gelu") {
    return in.size() == 3 && graph.dtype(in[0]) == target && graph.dtype(in[2]) == F32;
  }
  return false;
}

// The input an op reads widened from 16 bits (its dy), or -1.
int ReadsLowInput(absl::string_view type) {
  if (type == "layer_norm_grad") return 2;
  if (type == "gelu_grad") return 1;
  return -1;
}

// The folds, found in one sweep: each takes its own cast and its own
// float32 var (layer_norm_grad's dx_low keeps its float32 dx, which no
// other fold takes), so none changes whether another applies. gelu_grad
// may take two (its dy and its dx), edited into one replacement op, and
// layer_norm_grad two (its dy and its dx_low).
class Folder {
 public:
  explicit Folder(Graph& graph) : graph_(graph), readers_(graph.Readers()), writers_(CountWriters(graph)) {}

  absl::StatusOr<bool> Run() {
    std::vector<bool> keep(graph_.num_vars(), true);
    std::map<int, Op> edited;  // op id -> its replacement
    std::vector<int> casts;    // folded, to erase
    const auto edit = [&](int op) -> Op& {
      auto it = edited.find(op);
      if (it == edited.end()) it = edited.emplace(op, graph_.AsOp(op)).first;
      return it->second;
    };
    for (int op : graph_.ops()) {
      if (IsCastDown(graph_, op)) {
        const int x = graph_.inputs(op)[0], producer = writers_.last[x];
        if (producer >= 0 && StoresDxLow(x, op, producer) &&
            (edited.count(producer) == 0 || edited.at(producer).output_size() == 3)) {
          // layer_norm_grad's dx, which other ops read in float32 too: the op
          // also writes the 16-bit copy (dx_low), and dx stays.
          Op& folded = edit(producer);
          folded.add_output(std::string(graph_.var_name(graph_.outputs(op)[0])));
          (*folded.mutable_attr())["out_dtype"].set_s(DataType_Name(CastTarget(graph_, op)));
          casts.push_back(op);
          continue;
        }
        if (producer < 0 || !Foldable(x, op) || !StoresOutputLow(graph_, producer, CastTarget(graph_, op)) ||
            graph_.outputs(producer)[0] != x) {
          continue;
        }
        auto set = graph_.attrs(producer).find("out_dtype");
        if (set != graph_.attrs(producer).end() && !set->second.s().empty()) continue;
        Op& folded = edit(producer);
        folded.set_output(0, std::string(graph_.var_name(graph_.outputs(op)[0])));
        (*folded.mutable_attr())["out_dtype"].set_s(DataType_Name(CastTarget(graph_, op)));
        casts.push_back(op);
        keep[x] = false;
      } else if (IsCastUp(graph_, op)) {
        const int v = graph_.outputs(op)[0];
        if (readers_[v].size() != 1) continue;
        const int reader = readers_[v][0];
        const int k = ReadsLowInput(graph_.schema(reader).type);
        if (k < 0 || !Foldable(v, reader) || graph_.dtype(graph_.inputs(reader)[0]) != F32) continue;
        bool only_k = true;  // v is the op's dy and nothing else of it
        for (int i = 0; i < static_cast<int>(graph_.inputs(reader).size()); ++i) {
          only_k = only_k && (graph_.inputs(reader)[i] == v) == (i == k);
        }
        if (!only_k) continue;
        edit(reader).set_input(k, std::string(graph_.var_name(graph_.inputs(op)[0])));
        casts.push_back(op);
        keep[v] = false;
      }
    }
    if (casts.empty()) return false;
    for (const auto& [id, op] : edited) {
      if (auto s = graph_.ReplaceOp(id, op); !s.ok()) {
        return absl::InternalError(absl::StrCat("fold-casts: ", graph_.OpLocation(id), ": ", s.message()));
      }
    }
    for (int c : casts) graph_.EraseOp(c);
    if (auto s = graph_.RetainVars(keep); !s.ok()) {
      return absl::InternalError(absl::StrCat("fold-casts: ", s.message()));
    }
    return true;
  }

 private:
  // The float32 var between a cast and the op it folds into: an activation
  // the program does not report, written once, read by `reader` alone, on
  // the writer's stage.
  bool Foldable(int v, int reader) const {
    return IsUnreportedActivation(graph_, v) && writers_.count[v] == 1 && readers_[v].size() == 1 &&
           readers_[v][0] == reader && graph_.stage(writers_.last[v]) == graph_.stage(reader);
  }

  // Whether cast `cast` of `dx` is a layer_norm_grad's (`ln`) float32 dx,
  // written once, read by other ops too (else nothing would read the
  // float32 dx the op still writes), the cast on the op's stage: the op can
  // write the cast's output as its dx_low.
  bool StoresDxLow(int dx, int cast, int ln) const {
    return graph_.schema(ln).type == "layer_norm_grad" && graph_.outputs(ln).size() == 3 &&
           graph_.outputs(ln)[0] == dx && graph_.dtype(dx) == F32 && writers_.count[dx] == 1 &&
           readers_[dx].size() > 1 && graph_.stage(ln) == graph_.stage(cast);
  }

  Graph& graph_;
  const std::vector<std::vector<int>> readers_;
  const VarWriters writers_;
};

}  // namespace

absl::StatusOr<bool> FoldCastsPass::Run(Graph& graph, const CompileContext&) { return Folder(graph).Run(); }

}  // namespace strata
