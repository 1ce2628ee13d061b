#include "passes/fuse_epilogues.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "passes/pass_helpers.h"

namespace strata {
namespace {

bool BoolAttr(const Graph& graph, int op, const char* name) {
  auto it = graph.attrs(op).find(name);
  return it != graph.attrs(op).end() && it->second.b();
}

// The one op reading var `v`, or -1 (none, several, or a var the program
// names as its loss or a fetch, which must stay).
int SoleReader(const Graph& graph, const std::vector<std::vector<int>>& readers, int v) {
  if (graph.kind(v) != ACTIVATION || readers[v].size() != 1) return -1;
  const absl::string_view name = graph.var_name(v);
  if (name == graph.loss()) return -1;
  for (const std::string& f : graph.program_fields().fetch()) {
    if (f == name) return -1;
  }
  return readers[v][0];
}

bool SamePlace(const Graph& graph, int a, int b) {
  return graph.stage(a) == graph.stage(b) && graph.role(a) == graph.role(b);
}

}  // namespace

absl::StatusOr<bool> FuseEpiloguesPass::Run(Graph& graph, const CompileContext&) {
  const std::vector<std::vector<int>> readers = graph.Readers();
  std::vector<bool> keep(graph.num_vars(), true);
  bool changed = false;
  const std::vector<int> order = graph.ops();
  for (int m : order) {
    if (graph.erased(m) || graph.schema(m).type != "matmul" || graph.outputs(m).size() != 1) continue;
    const int a = graph.inputs(m)[0], b = graph.inputs(m)[1];
    if (BoolAttr(graph, m, "transpose_a") || graph.shape(b).size() != 2 || graph.shape(a).size() < 2) continue;
    // matmul -> add, or matmul (low precision) -> cast to F32 -> add.
    int product = graph.outputs(m)[0];
    std::vector<int> dropped = {product};
    std::vector<int> erased = {m};
    int next = SoleReader(graph, readers, product);
    if (next < 0 || !SamePlace(graph, m, next)) continue;
    if (graph.schema(next).type == "cast" && IsHalfFloating(graph.dtype(product))) {
      const int wide = graph.outputs(next)[0];
      if (graph.dtype(wide) != F32) continue;
      erased.push_back(next);
      dropped.push_back(wide);
      product = wide;
      next = SoleReader(graph, readers, wide);
      if (next < 0 || !SamePlace(graph, m, next)) continue;
    }
    const int add = next;
    if (graph.schema(add).type != "add" || graph.inputs(add).size() != 2) continue;
    const int bias = graph.inputs(add)[0] == product ? graph.inputs(add)[1] : graph.inputs(add)[0];
    if (bias == product) continue;  // product + product
    const int y = graph.outputs(add)[0];
    const auto& ps = graph.shape(product);
    if (graph.shape(bias).size() != 1 || graph.shape(bias)[0] != ps.back() || graph.dtype(bias) != graph.dtype(product) ||
        graph.shape(y) != ps || graph.dtype(y) != graph.dtype(product)) {
      continue;
    }
    Op fused = OpPlacedLike(graph, add, "matmul_bias", graph.role(add));
    fused.add_input(std::string(graph.var_name(a)));
    fused.add_input(std::string(graph.var_name(b)));
    fused.add_input(std::string(graph.var_name(bias)));
    fused.add_output(std::string(graph.var_name(y)));
    AttrValue tb;
    tb.set_b(BoolAttr(graph, m, "transpose_b"));
    (*fused.mutable_attr())["transpose_b"] = tb;
    // The schema's defaults for the rest (allow_tf32), as every op in a plan has them.
    if (auto s = CanonicalizeOp(*OpRegistry::Global().Find("matmul_bias"), &fused); !s.ok()) {
      return absl::InternalError(absl::StrCat("fuse-epilogues: matmul_bias: ", s.message()));
    }
    if (auto s = graph.ReplaceOp(add, fused); !s.ok()) {
      return absl::InternalError(absl::StrCat("fuse-epilogues: ", graph.OpLocation(add), ": ", s.message()));
    }
    for (int op : erased) graph.EraseOp(op);
    for (int v : dropped) keep[v] = false;
    changed = true;
  }
  if (changed) {
    if (auto s = graph.RetainVars(keep); !s.ok()) return absl::InternalError(absl::StrCat("fuse-epilogues: ", s.message()));
  }
  return changed;
}

}  // namespace strata
