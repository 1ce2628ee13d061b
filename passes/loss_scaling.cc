#include "passes/loss_scaling.h"

#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/graph.h"
#include "compiler/op_registry.h"
#include "passes/pass_helpers.h"

namespace strata {
namespace {

bool IsOptimizerBlock(OpRole role) { return role == OPTIMIZE || role == LR_SCHEDULE; }

// An op of this pass's optimizer-block part, on the rank's stage.
Op BlockOp(const CompileContext& ctx, const std::string& type, std::vector<std::string> inputs,
           std::vector<std::string> outputs) {
  Op op;
  op.set_type(type);
  for (auto& in : inputs) op.add_input(std::move(in));
  for (auto& out : outputs) op.add_output(std::move(out));
  op.set_stage(ctx.stage());
  op.set_device(absl::StrCat("gpu:", ctx.stage()));
  op.set_role(OPTIMIZE);
  op.set_uid(-1);
  return op;
}

absl::StatusOr<int> AddVarOrFail(Graph& graph, const std::string& name, DataType dtype,
                                 absl::Span<const int64_t> shape, VarKind kind) {
  const int v = graph.AddVar(name, dtype, shape, kind);
  if (v < 0) return absl::InternalError(absl::StrCat("loss-scaling: var '", name, "' exists already"));
  return v;
}

// Fills the op's attr defaults (as the optimizer pass does for its ops).
absl::Status Canonical(Op* op) {
  const OpSchema* schema = OpRegistry::Global().Find(op->type());
  if (schema == nullptr) return absl::InternalError(absl::StrCat("loss-scaling: unregistered op ", op->type()));
  if (auto s = CanonicalizeOp(*schema, op); !s.ok()) {
    return absl::InternalError(absl::StrCat("loss-scaling: ", op->type(), ": ", s.message()));
  }
  return absl::OkStatus();
}

// The backward seed times the scale: `<seed>@scaled` right after the seed
// op, read by every op that read the seed. The seed op keeps its value, which
// the later passes scale (1/M, 1/D, 1/k).
absl::Status ScaleSeed(Graph& graph, int scale_var) {
  const std::string seed_name = graph.program_fields().loss_grad();
  const int seed = graph.FindVar(seed_name);
  const int seed_op = seed >= 0 ? graph.FirstWriters()[seed] : -1;
  if (seed_op < 0) {
    return absl::InternalError(absl::StrCat("loss-scaling: the loss gradient '", seed_name, "' has no seed op"));
  }
  int anchor = seed_op;
  std::string scale(graph.var_name(scale_var));
  if (graph.dtype(seed) != graph.dtype(scale_var)) {
    const std::string cast_name = absl::StrCat(scale, ".", DataType_Name(graph.dtype(seed)));
    if (auto v = AddVarOrFail(graph, cast_name, graph.dtype(seed), {}, ACTIVATION); !v.ok()) return v.status();
    Op cast = OpPlacedLike(graph, seed_op, "cast", BACKWARD);
    cast.add_input(scale);
    cast.add_output(cast_name);
    (*cast.mutable_attr())["dtype"] = StringAttr(DataType_Name(graph.dtype(seed)));
    absl::StatusOr<int> added = graph.InsertOpAfter(anchor, cast);
    if (!added.ok()) return added.status();
    anchor = *added;
    scale = cast_name;
  }
  const std::string scaled_name = absl::StrCat(seed_name, "@scaled");
  absl::StatusOr<int> scaled = AddVarOrFail(graph, scaled_name, graph.dtype(seed), graph.shape(seed), ACTIVATION);
  if (!scaled.ok()) return scaled.status();
  Op mul = OpPlacedLike(graph, seed_op, "mul", BACKWARD);
  mul.add_input(seed_name);
  mul.add_input(scale);
  mul.add_output(scaled_name);
  absl::StatusOr<int> mul_id = graph.InsertOpAfter(anchor, mul);
  if (!mul_id.ok()) return mul_id.status();
  const int skip_until = *mul_id;
  return graph
      .ReplaceAllUsesWith(seed, *scaled, [&](int op) { return op != skip_until && graph.role(op) == BACKWARD; })
      .status();
}

}  // namespace

bool UsesLossScaling(const Strategy& strategy) {
  if (!strategy.has_mixed_precision()) return false;
  const MixedPrecisionConfig& mp = strategy.mixed_precision();
  return mp.dtype() == F16 || (mp.dtype() == BF16 && mp.has_loss_scaling());
}

LossScaling EffectiveLossScaling(const Strategy& strategy) {
  LossScaling ls = strategy.mixed_precision().loss_scaling();
  if (ls.init_scale() == 0) ls.set_init_scale(65536.0);
  if (ls.growth_factor() == 0) ls.set_growth_factor(2.0);
  if (ls.backoff_factor() == 0) ls.set_backoff_factor(0.5);
  if (ls.growth_interval() == 0) ls.set_growth_interval(2000);
  return ls;
}

absl::StatusOr<bool> LossScalingPass::Run(Graph& graph, const CompileContext& ctx) {
  if (!UsesLossScaling(ctx.strategy)) return false;
  if (graph.program_fields().optimizer().kind_case() == Optimizer::KIND_NOT_SET) return false;  // nothing to update
  const LossScaling ls = EffectiveLossScaling(ctx.strategy);

  // The state, on every rank.
  absl::StatusOr<int> scale = AddVarOrFail(graph, kLossScaleVar, F32, {}, STATE);
  if (!scale.ok()) return scale.status();
  Initializer init;
  init.mutable_constant()->set_value(ls.init_scale());
  graph.SetInit(*scale, init);
  for (const char* name : {kGoodStepsVar, kSkippedUpdatesVar}) {
    if (auto v = AddVarOrFail(graph, name, I64, {}, STATE); !v.ok()) return v.status();
  }
  graph.mutable_program_fields().set_loss_scale(kLossScaleVar);
  graph.mutable_program_fields().set_skipped_updates(kSkippedUpdatesVar);

  if (!graph.program_fields().loss_grad().empty()) {
    if (auto s = ScaleSeed(graph, *scale); !s.ok()) return s;
  }

  // This rank's gradients as the optimizer reads them, once each (two
  // parameters may share one), in parameter declaration order.
  std::vector<int> grads;
  std::set<int> seen;
  const auto& param_grad = graph.program_fields().param_grad();
  for (int v = 0; v < graph.num_vars(); ++v) {
    if (graph.kind(v) != PARAM) continue;
    auto it = param_grad.find(std::string(graph.var_name(v)));
    if (it == param_grad.end()) continue;
    const int g = graph.FindVar(it->second);
    if (g >= 0 && seen.insert(g).second) grads.push_back(g);
  }

  // The check goes before the optimizer block's first op (at the end on a
  // rank without one) after every gradient is written: a tied weight's
  // gradient is exchanged between stages in the optimizer action
  // (passes/pipeline_split.cc), its transfers and sum before the rest.
  const std::vector<int> order = graph.ops();
  absl::flat_hash_set<int> grad_set(grads.begin(), grads.end());
  size_t after = 0;  // the first position after the last writer of a gradient
  for (size_t i = 0; i < order.size(); ++i) {
    for (int out : graph.outputs(order[i])) {
      if (grad_set.contains(out)) after = i + 1;
    }
  }
  int anchor = -1;
  for (size_t i = after; i < order.size(); ++i) {
    const absl::string_view type = graph.schema(order[i]).type;
    if (IsOptimizerBlock(graph.role(order[i])) && type != "send" && type != "recv") {
      anchor = order[i];
      break;
    }
  }
  auto place = [&](const Op& op) -> absl::StatusOr<int> {
    return anchor >= 0 ? graph.InsertOpBefore(anchor, op) : graph.AppendOp(op);
  };

  std::string found = kFoundInfVar;
  if (auto v = AddVarOrFail(graph, found, F32, {}, ACTIVATION); !v.ok()) return v.status();
  int check_id = -1;
  std::vector<int> unscaled;
  if (grads.empty()) {
    // A rank without gradients finds nothing, but joins the stages' allreduce.
    Op zero = BlockOp(ctx, "fill_scalar", {}, {found});
    (*zero.mutable_attr())["dtype"] = StringAttr("F32");
    (*zero.mutable_attr())["value"] = FloatAttr(0.0);
    if (auto added = place(zero); !added.ok()) return added.status();
  } else {
    Op check = BlockOp(ctx, "check_finite_and_unscale", {kLossScaleVar}, {found});
    for (int g : grads) {
      const std::string name = absl::StrCat(graph.var_name(g), "@unscaled");
      absl::StatusOr<int> u = AddVarOrFail(graph, name, graph.dtype(g), graph.shape(g), ACTIVATION);
      if (!u.ok()) return u.status();
      unscaled.push_back(*u);
      check.add_input(std::string(graph.var_name(g)));
      check.add_output(name);
    }
    absl::StatusOr<int> added = place(check);
    if (!added.ok()) return added.status();
    check_id = *added;
  }
  if (ctx.num_stages() > 1) {
    const std::string all = absl::StrCat(found, ".all");
    if (auto v = AddVarOrFail(graph, all, F32, {}, ACTIVATION); !v.ok()) return v.status();
    Op reduce = BlockOp(ctx, "allreduce", {found}, {all});
    reduce.set_group(ctx.GroupAlong("pp"));
    if (auto s = Canonical(&reduce); !s.ok()) return s;
    if (auto added = place(reduce); !added.ok()) return added.status();
    found = all;
  }

  // The optimizer block reads the unscaled gradients (a tied gradient's
  // send to its replicas carries the scaled sum, which each unscales).
  for (size_t k = 0; k < grads.size(); ++k) {
    auto replaced = graph.ReplaceAllUsesWith(grads[k], unscaled[k], [&](int op) {
      return op != check_id && IsOptimizerBlock(graph.role(op)) && graph.schema(op).type != "send";
    });
    if (!replaced.ok()) return replaced.status();
  }
  // Every optimizer op with an optional found_inf input skips on it.
  const std::vector<int> live = graph.ops();  // a copy: the walk replaces ops
  for (int op : live) {
    if (graph.role(op) != OPTIMIZE) continue;
    const OpSchema& schema = graph.schema(op);
    if (schema.inputs.empty() || !schema.inputs.back().optional || schema.inputs.back().name != "found_inf") continue;
    // Already there: every optional input given, or found_inf itself last.
    if (static_cast<int>(graph.inputs(op).size()) == static_cast<int>(schema.inputs.size()) ||
        graph.var_name(graph.inputs(op).back()) == found) {
      continue;
    }
    Op with_flag = graph.AsOp(op);
    with_flag.add_input(found);
    if (auto s = graph.ReplaceOp(op, with_flag); !s.ok()) return s;
  }

  Op update = BlockOp(ctx, "update_loss_scaling", {found, kLossScaleVar, kGoodStepsVar, kSkippedUpdatesVar},
                      {kLossScaleVar, kGoodStepsVar, kSkippedUpdatesVar});
  (*update.mutable_attr())["growth_factor"] = FloatAttr(ls.growth_factor());
  (*update.mutable_attr())["backoff_factor"] = FloatAttr(ls.backoff_factor());
  (*update.mutable_attr())["growth_interval"] = IntAttr(ls.growth_interval());
  if (auto s = graph.AddOp(update); !s.ok()) return s;
  return true;
}

}  // namespace strata
