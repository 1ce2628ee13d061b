#include "passes/mixed_precision.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "compiler/op_registry.h"
#include "kernels/attention_budget.h"
#include "passes/pass_helpers.h"
#include "proto/roles.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

// The ops mixed precision runs in the low dtype: which inputs are cast down
// and which outputs come back up (the others keep their dtype, as attention's
// lse stays F32 by its schema).
struct LowOp {
  int inputs = 0;            // inputs [0, inputs) are cast
  std::vector<int> outputs;  // outputs written in the low dtype, cast back to F32
  size_t num_outputs = 0;    // the op's output count
};

const LowOp* LowOpFor(absl::string_view type) {
  static const LowOp kMatmul{2, {0}, 1};
  static const LowOp kAttention{3, {0}, 2};  // q, k, v; y (lse stays F32)
  static const LowOp kConv2d{2, {0}, 1};     // x, w; y (conv2d has no bias input: the add stays F32)
  static const LowOp kGelu{1, {0}, 1};       // x; y (float math on the widened x)
  if (type == "matmul") return &kMatmul;
  if (type == "gelu") return &kGelu;
  if (type == "conv2d") return &kConv2d;
  if (type == "scaled_dot_product_attention") return &kAttention;
  return nullptr;
}

// (var, stage) -> its low-precision copy: one cast per var a stage reads.
using CopyMap = std::map<std::pair<int, int>, int>;

// The softmax_cross_entropy that is the only reader of `var` (an output of
// the low op `op`), reading it as its logits on `op`'s stage, or -1. A var
// any other op reads, or the program fetches (or names as its loss), keeps
// its float32 form, as does a recompute checkpoint (the strategy names it).
// Whether `name` must stay a float32 var: the loss, a fetch, or a recompute
// checkpoint (which the backward reads again).
bool KeptInFloat(const Graph& graph, const Strategy& strategy, const std::string& name) {
  if (graph.loss() == name) return true;
  for (const std::string& checkpoint : strategy.recompute().checkpoints()) {
    if (checkpoint == name) return true;
  }
  for (const std::string& fetch : graph.program_fields().fetch()) {
    if (fetch == name) return true;
  }
  return false;
}

int SoleLossReader(const Graph& graph, const Strategy& strategy, int op, int var) {
  if (KeptInFloat(graph, strategy, std::string(graph.var_name(var)))) return -1;
  int reader = -1;
  for (int r : graph.ops()) {
    const absl::Span<const int> in = graph.inputs(r);
    const int reads = static_cast<int>(std::count(in.begin(), in.end(), var));
    if (reads == 0) continue;
    if (reader >= 0 || reads != 1 || in[0] != var) return -1;
    reader = r;
  }
  if (reader < 0 || graph.schema(reader).type != "softmax_cross_entropy") return -1;
  if (graph.stage(reader) != graph.stage(op)) return -1;  // no 16-bit logits cross stages
  return reader;
}

// Runs `op` in `low`: its cast inputs read `<var><suffix>` copies (made on
// first use per stage) and its cast outputs write `<y><suffix>`, with a cast
// back to F32 into `y` right after the op. With `fold_losses` (the strategy;
// null: no folding), an output whose only reader is softmax_cross_entropy's
// logits gets no cast back: the loss reads `<y><suffix>` itself, and `y`'s
// name goes to `dropped` (the F32 var no op uses now, removed at the pass's
// end, when no var id is held any more).
absl::Status RunInLow(Graph& graph, int op, const LowOp& spec, DataType low, const std::string& suffix,
                      const Strategy* fold_losses, CopyMap& copy_of, std::vector<std::string>& dropped,
                      std::vector<std::string>& cast_back) {
  Op lowered = graph.AsOp(op);
  const std::vector<int> inputs(graph.inputs(op).begin(), graph.inputs(op).end());
  for (int k = 0; k < spec.inputs; ++k) {
    const int in = inputs[k];
    auto [it, fresh] = copy_of.try_emplace({in, graph.stage(op)}, -1);
    if (fresh) {
      std::string name = absl::StrCat(graph.var_name(in), suffix);
      if (graph.stage(op) != 0 && graph.FindVar(name) >= 0) name = absl::StrCat(name, "@stage", graph.stage(op));
      const int v = graph.AddVar(name, low, graph.shape(in), ACTIVATION);
      if (v < 0) return absl::InternalError(absl::StrCat("mixed-precision: var '", name, "' exists already"));
      Op cast = OpPlacedLike(graph, op, "cast", graph.role(op));
      cast.add_input(std::string(graph.var_name(in)));
      cast.add_output(name);
      (*cast.mutable_attr())["dtype"] = StringAttr(DataType_Name(low));
      if (auto added = graph.InsertOpBefore(op, cast); !added.ok()) return added.status();
      it->second = v;
    }
    lowered.set_input(k, std::string(graph.var_name(it->second)));
  }
  std::vector<Op> backs;
  std::vector<std::pair<int, std::string>> losses;  // (softmax_cross_entropy, the low logits it reads)
  for (int i : spec.outputs) {
    const int out = graph.outputs(op)[i];
    const std::string out_name(graph.var_name(out));
    const std::string low_name = absl::StrCat(out_name, suffix);
    const int low_var = graph.AddVar(low_name, low, graph.shape(out), ACTIVATION);
    if (low_var < 0) {
      return absl::InternalError(absl::StrCat("mixed-precision: var '", low_name, "' exists already"));
    }
    lowered.set_output(i, low_name);
    if (const int loss = fold_losses != nullptr ? SoleLossReader(graph, *fold_losses, op, out) : -1; loss >= 0) {
      losses.emplace_back(loss, low_name);
      dropped.push_back(out_name);
      continue;
    }
    // A later low op on this stage reading y reads this 16-bit y: the cast
    // back and a cast down again would give its bits exactly (widening is
    // exact), and a second `<y>@bf16` cannot be named. (For a recompute
    // checkpoint y, the float y stays, and the recompute pass then redoes
    // this op for the later one, which reads no checkpoint: a cast down of
    // y afresh would be cheaper, but commute-casts would fold it back.)
    copy_of.insert_or_assign({out, graph.stage(op)}, low_var);
    cast_back.push_back(out_name);
    Op back = OpPlacedLike(graph, op, "cast", graph.role(op));
    back.add_input(low_name);
    back.add_output(out_name);
    (*back.mutable_attr())["dtype"] = StringAttr(DataType_Name(F32));
    backs.push_back(std::move(back));
  }
  if (auto s = graph.ReplaceOp(op, lowered); !s.ok()) return s;
  for (const auto& [loss, logits] : losses) {
    Op reads_low = graph.AsOp(loss);
    reads_low.set_input(0, logits);
    if (auto s = graph.ReplaceOp(loss, reads_low); !s.ok()) return s;
  }
  // Inserted in reverse right after the op, so the casts back run in output order.
  for (auto it = backs.rbegin(); it != backs.rend(); ++it) {
    if (auto added = graph.InsertOpAfter(op, *it); !added.ok()) return added.status();
  }
  return absl::OkStatus();
}

// The op's cast inputs and outputs are all F32 (so it is the program's own
// float32 op, not one already lowered).
bool AllF32(const Graph& graph, int op, const LowOp& spec) {
  if (graph.outputs(op).size() != spec.num_outputs || static_cast<int>(graph.inputs(op).size()) < spec.inputs) {
    return false;
  }
  bool f32 = true;
  for (int k = 0; k < spec.inputs; ++k) f32 &= graph.dtype(graph.inputs(op)[k]) == F32;
  for (int i : spec.outputs) f32 &= graph.dtype(graph.outputs(op)[i]) == F32;
  return f32;
}

}  // namespace

absl::StatusOr<bool> MixedPrecisionPass::Run(Graph& graph, const CompileContext& ctx) {
  if (!ctx.strategy.has_mixed_precision()) return false;
  const DataType low = ctx.strategy.mixed_precision().dtype();
  if (low != BF16 && low != F16) {
    return absl::InternalError(absl::StrCat("mixed-precision: dtype ", DataType_Name(low),
                                            " reached the pass (ValidateStrategy admits BF16 and F16 only)"));
  }
  const std::string suffix = low == BF16 ? "@bf16" : "@f16";
  const std::vector<int> order = graph.ops();
  CopyMap copy_of;
  std::vector<std::string> dropped;    // F32 logits the losses no longer read
  std::vector<std::string> cast_back;  // float outputs the low ops' casts back write
  bool changed = false;
  for (int op : order) {
    const LowOp* spec = LowOpFor(graph.schema(op).type);
    if (spec == nullptr || !AllF32(graph, op, *spec)) continue;
    if (device_ == DEVICE_CUDA && graph.schema(op).type == "scaled_dot_product_attention") {
      // q [B, H, T, D] ([B, T, H, D] for layout "bthd"): a T the 16-bit GPU
      // kernels cannot hold stays float32.
      const auto& q = graph.shape(graph.inputs(op)[0]);
      const auto layout = graph.attrs(op).find("layout");
      const bool bthd = layout != graph.attrs(op).end() && layout->second.s() == "bthd";
      if (q.size() == 4 && !HalfAttentionFitsOnGpu(q[bthd ? 1 : 2])) continue;
    }
    STRATA_RETURN_IF_ERROR(RunInLow(graph, op, *spec, low, suffix, fold_losses_ ? &ctx.strategy : nullptr, copy_of,
                                    dropped, cast_back));
    changed = true;
  }
  // A cast back whose float output nothing reads now (its readers were low
  // ops, which read the 16-bit output itself) goes, with that output.
  if (!cast_back.empty()) {
    const std::vector<std::vector<int>> readers = graph.Readers();
    const std::vector<int> writers = graph.FirstWriters();
    for (const std::string& name : cast_back) {
      const int v = graph.FindVar(name);
      if (v < 0 || !readers[v].empty() || KeptInFloat(graph, ctx.strategy, name)) continue;
      const int w = writers[v];
      if (w < 0 || graph.schema(w).type != "cast") continue;
      graph.EraseOp(w);
      dropped.push_back(name);
    }
  }
  if (!dropped.empty()) {
    std::vector<bool> keep(graph.num_vars(), true);
    for (const std::string& name : dropped) keep[graph.FindVar(name)] = false;
    if (auto s = graph.RetainVars(keep); !s.ok()) {
      return absl::InternalError(absl::StrCat("mixed-precision: ", s.message()));
    }
  }
  return changed;
}

}  // namespace strata
