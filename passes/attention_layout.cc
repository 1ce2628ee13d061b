#include "passes/attention_layout.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/attention_budget.h"
#include "passes/pass_helpers.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

constexpr char kPass[] = "attention-layout";

// A transpose perm (0, 2, 1, 3): [B, T, H, D] <-> [B, H, T, D].
bool IsHeadTranspose(const Graph& graph, int op) {
  if (op < 0 || graph.schema(op).type != "transpose") return false;
  const auto perm = graph.attrs(op).find("perm");
  if (perm == graph.attrs(op).end()) return false;
  const auto& p = perm->second.list().i();
  return p.size() == 4 && p[0] == 0 && p[1] == 2 && p[2] == 1 && p[3] == 3;
}

bool IsBhtdAttention(const Graph& graph, int op) {
  if (graph.schema(op).type != "scaled_dot_product_attention") return false;
  const auto layout = graph.attrs(op).find("layout");
  return layout == graph.attrs(op).end() || layout->second.s() == "bhtd";
}

class Relayouter {
 public:
  Relayouter(Graph& graph, DeviceKind device) : graph_(graph), device_(device), keep_(graph.num_vars(), true) {}

  // Every rewrite that applies on one reading of the graph (a site whose
  // vars or ops an earlier rewrite of this scan touched waits for the next
  // Step); false when none does. One reading per scan, not per site: a
  // graph of N ops with N / 20 attentions is linear, not quadratic.
  absl::StatusOr<bool> Step() {
    const std::vector<std::vector<int>> readers = graph_.Readers();
    const std::vector<int> writers = graph_.FirstWriters();
    // Only an op that is a var's one writer: a transpose the pass drops
    // must not leave another writer of its var behind.
    const VarWriters counts = CountWriters(graph_);
    const auto only_reader_is = [&](int v, int op) { return readers[v].size() == 1 && readers[v][0] == op; };
    Touched touched;
    bool rewrote = false;
    for (int att : std::vector<int>(graph_.ops())) {
      if (graph_.erased(att) || !IsBhtdAttention(graph_, att)) continue;
      if (device_ == DEVICE_CUDA) {
        // Only where the flash kernels read the layout in place.
        const int q = graph_.inputs(att)[0];
        const absl::Span<const int64_t> q_shape = graph_.shape(q);
        if (q_shape.size() != 4 || !FlashEligible(IsHalfFloating(graph_.dtype(q)), q_shape[3])) continue;
      }
      const int stage = graph_.stage(att);
      // q, k, v: each a head transpose's output that only `att` reads (q, k
      // and v may be one var).
      std::vector<std::string> sources;
      bool ok = true;
      for (int x : graph_.inputs(att)) {
        const int t = writers[x];
        ok = IsHeadTranspose(graph_, t) && graph_.stage(t) == stage && counts.count[x] == 1 &&
             only_reader_is(x, att) && IsUnreportedActivation(graph_, x);
        if (!ok) break;
        sources.emplace_back(graph_.var_name(graph_.inputs(t)[0]));
      }
      if (!ok) continue;
      // y: read by one head transpose, and only it writes y.
      const int y = graph_.outputs(att)[0];
      if (readers[y].size() != 1 || counts.count[y] != 1 || !IsUnreportedActivation(graph_, y)) continue;
      const int out = readers[y][0];
      if (!IsHeadTranspose(graph_, out) || graph_.stage(out) != stage) continue;
      std::vector<int> site_ops = {att, out}, site_vars = {y, graph_.outputs(out)[0]};
      for (int x : graph_.inputs(att)) {
        site_ops.push_back(writers[x]);
        site_vars.push_back(x);
        site_vars.push_back(graph_.inputs(writers[x])[0]);
      }
      if (!touched.Claim(site_ops, site_vars)) continue;

      Op relaid = graph_.AsOp(att);
      for (int i = 0; i < 3; ++i) relaid.set_input(i, sources[i]);
      relaid.set_output(0, std::string(graph_.var_name(graph_.outputs(out)[0])));
      (*relaid.mutable_attr())["layout"] = StringAttr("bthd");
      std::vector<int> dropped_ops;
      for (int x : graph_.inputs(att)) dropped_ops.push_back(writers[x]);
      dropped_ops.push_back(out);
      for (int x : graph_.inputs(att)) keep_[x] = false;
      keep_[y] = false;
      if (auto s = graph_.ReplaceOp(att, relaid); !s.ok()) {
        return absl::InternalError(absl::StrCat(kPass, ": ", graph_.OpLocation(att), ": ", s.message()));
      }
      // q, k and v may share one transpose: erase each once (EraseOp skips an erased op).
      for (int op : dropped_ops) graph_.EraseOp(op);
      rewrote = true;
    }
    return rewrote;
  }

  const std::vector<bool>& keep() const { return keep_; }

 private:
  Graph& graph_;
  const DeviceKind device_;
  std::vector<bool> keep_;
};

}  // namespace

absl::StatusOr<bool> AttentionLayoutPass::Run(Graph& graph, const CompileContext&) {
  Relayouter relayouter(graph, device_);
  return RewriteUntilDone(graph, relayouter, kPass);
}

}  // namespace strata
