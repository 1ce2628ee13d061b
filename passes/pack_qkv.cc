#include "passes/pack_qkv.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "kernels/attention_budget.h"
#include "passes/pass_helpers.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

constexpr char kPass[] = "pack-qkv";

bool IsBthdAttention(const Graph& graph, int op) {
  if (graph.erased(op) || graph.schema(op).type != "scaled_dot_product_attention") return false;
  const auto layout = graph.attrs(op).find("layout");
  return layout != graph.attrs(op).end() && layout->second.s() == "bthd";
}

// The ints of attr `name` of op `op` (empty when absent).
std::vector<int64_t> IntsOf(const Graph& graph, int op, const char* name) {
  const auto it = graph.attrs(op).find(name);
  if (it == graph.attrs(op).end()) return {};
  return std::vector<int64_t>(it->second.list().i().begin(), it->second.list().i().end());
}

class Packer {
 public:
  Packer(Graph& graph, const Strategy& strategy, DeviceKind device)
      : graph_(graph),
        device_(device),
        checkpoints_(strategy.recompute().checkpoints().begin(), strategy.recompute().checkpoints().end()),
        keep_(graph.num_vars(), true) {}

  // Every rewrite that applies on one reading of the graph (a site an
  // earlier rewrite of this scan touched waits for the next Step); false
  // when none does.
  absl::StatusOr<bool> Step() {
    const std::vector<std::vector<int>> readers = graph_.Readers();
    const std::vector<int> writers = graph_.FirstWriters();
    const VarWriters counts = CountWriters(graph_);
    // `v` is written once, read by `op` alone, an unreported activation.
    const auto only_for = [&](int v, int op) {
      return counts.count[v] == 1 && readers[v].size() == 1 && readers[v][0] == op &&
             IsUnreportedActivation(graph_, v) && !checkpoints_.contains(std::string(graph_.var_name(v)));
    };
    Touched touched;
    bool rewrote = false;
    for (int att : std::vector<int>(graph_.ops())) {
      if (graph_.erased(att) || !IsBthdAttention(graph_, att) || graph_.inputs(att).size() != 3) continue;
      const int stage = graph_.stage(att);
      const absl::Span<const int64_t> q = graph_.shape(graph_.inputs(att)[0]);
      if (q.size() != 4) continue;
      if (device_ == DEVICE_CUDA && !FlashEligible(IsHalfFloating(graph_.dtype(graph_.inputs(att)[0])), q[3])) continue;
      // q, k, v: reshapes of the split's outputs 0, 1, 2.
      int split = -1;
      bool ok = true;
      std::vector<int> reshapes;
      for (int i = 0; i < 3 && ok; ++i) {
        const int x = graph_.inputs(att)[i];
        const int r = writers[x];
        ok = r >= 0 && graph_.schema(r).type == "reshape" && graph_.stage(r) == stage && only_for(x, att) &&
             graph_.inputs(r).size() == 1;
        if (!ok) break;
        const int part = graph_.inputs(r)[0];
        const int s = writers[part];
        ok = s >= 0 && graph_.schema(s).type == "split" && (split < 0 || s == split) && graph_.stage(s) == stage &&
             graph_.outputs(s).size() == 3 && graph_.outputs(s)[i] == part && only_for(part, r);
        split = s;
        reshapes.push_back(r);
      }
      if (!ok) continue;
      // X [B, T, 3 * H * D] split along its last axis into three H * D.
      const int x = graph_.inputs(split)[0];
      const absl::Span<const int64_t> xs = graph_.shape(x);
      const int64_t hd = q[2] * q[3];
      const auto axis_attr = graph_.attrs(split).find("axis");
      const int64_t axis = axis_attr == graph_.attrs(split).end() ? 0 : axis_attr->second.i();
      const std::vector<int64_t> sections = IntsOf(graph_, split, "sections");
      // Three equal sections: named, or none (the split's equal parts).
      const bool thirds = sections.empty() || sections == std::vector<int64_t>{hd, hd, hd};
      if (xs.size() != 3 || (axis != 2 && axis != -1) || !thirds ||
          xs[1] != q[1] || xs[2] != 3 * hd || graph_.dtype(x) != graph_.dtype(graph_.inputs(att)[0])) {
        continue;
      }
      std::vector<int> site_ops = {att, split}, site_vars = {x};
      for (int r : reshapes) {
        site_ops.push_back(r);
        site_vars.push_back(graph_.inputs(r)[0]);
        site_vars.push_back(graph_.outputs(r)[0]);
      }
      for (int out : graph_.outputs(att)) site_vars.push_back(out);
      if (!touched.Claim(site_ops, site_vars)) continue;

      const std::string packed_name = FreshVarName(graph_, graph_.var_name(x), "@qkv");
      const std::vector<int64_t> packed_shape = {xs[0], q[1], 3, q[2], q[3]};
      if (graph_.AddVar(packed_name, graph_.dtype(x), packed_shape, ACTIVATION) < 0) {
        return absl::InternalError(absl::StrCat(kPass, ": var '", packed_name, "' exists already"));
      }
      keep_.resize(graph_.num_vars(), true);
      Op view = OpPlacedLike(graph_, split, "reshape", graph_.role(split));
      view.add_input(std::string(graph_.var_name(x)));
      view.add_output(packed_name);
      (*view.mutable_attr())["shape"] = IntsAttr(packed_shape);
      Op packed = OpPlacedLike(graph_, att, "scaled_dot_product_attention_qkv", graph_.role(att));
      packed.add_input(packed_name);
      for (int out : graph_.outputs(att)) packed.add_output(std::string(graph_.var_name(out)));
      for (const char* attr : {"causal", "scale", "allow_tf32"}) {
        if (const auto it = graph_.attrs(att).find(attr); it != graph_.attrs(att).end()) {
          (*packed.mutable_attr())[attr] = it->second;
        }
      }
      for (int v : graph_.inputs(att)) keep_[v] = false;
      for (int v : graph_.outputs(split)) keep_[v] = false;
      if (auto s = graph_.ReplaceOp(att, packed); !s.ok()) {
        return absl::InternalError(absl::StrCat(kPass, ": ", graph_.OpLocation(att), ": ", s.message()));
      }
      if (auto s = graph_.ReplaceOp(split, view); !s.ok()) {
        return absl::InternalError(absl::StrCat(kPass, ": ", graph_.OpLocation(split), ": ", s.message()));
      }
      for (int r : reshapes) graph_.EraseOp(r);
      rewrote = true;
    }
    return rewrote;
  }

  const std::vector<bool>& keep() const { return keep_; }

 private:
  Graph& graph_;
  const DeviceKind device_;
  const absl::flat_hash_set<std::string> checkpoints_;  // the recompute pass's: they must stay
  std::vector<bool> keep_;
};

}  // namespace

absl::StatusOr<bool> PackQkvPass::Run(Graph& graph, const CompileContext& ctx) {
  Packer packer(graph, ctx.strategy, device_);
  return RewriteUntilDone(graph, packer, kPass);
}

}  // namespace strata
