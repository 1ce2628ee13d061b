#include "passes/optimizer.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "compiler/graph.h"
#include "compiler/op_registry.h"
#include "compiler/program_text.h"
#include "kernels/lr_schedule_of.h"

namespace strata {
namespace {

// Collects the optimizer's vars and ops and appends them to the graph; each
// op's output vars are typed by its shape function as it is appended.
class BlockBuilder {
 public:
  explicit BlockBuilder(Graph* graph) : graph_(graph) {}

  void AddVar(const std::string& name, DataType dtype, absl::Span<const int64_t> shape, VarKind kind) {
    if (graph_->AddVar(name, dtype, shape, kind) < 0 && status_.ok()) {
      status_ = absl::InternalError(absl::StrCat("optimizer: var '", name, "' already exists"));
    }
  }

  void AddOp(const std::string& type, std::vector<std::string> inputs, std::vector<std::string> outputs, int stage,
             OpRole role, std::map<std::string, AttrValue> attrs = {}, int group = -1) {
    Op& op = ops_.emplace_back();
    if (group >= 0) op.set_group(group);
    op.set_type(type);
    for (auto& in : inputs) op.add_input(std::move(in));
    for (auto& out : outputs) op.add_output(std::move(out));
    for (auto& [k, v] : attrs) (*op.mutable_attr())[k] = std::move(v);
    op.set_stage(stage);
    op.set_device(absl::StrCat("gpu:", stage));
    op.set_role(role);
    op.set_uid(-1);
  }

  // Appends the ops in order: attr defaults filled in, output vars that do not
  // exist yet declared with their inferred types (in-place updates write
  // existing ones).
  absl::Status Finish() {
    if (!status_.ok()) return status_;
    std::vector<TensorType> in;
    for (Op& op : ops_) {
      const OpSchema* schema = OpRegistry::Global().Find(op.type());
      if (schema == nullptr) return absl::InternalError(absl::StrCat("optimizer: unregistered op ", op.type()));
      if (auto s = CanonicalizeOp(*schema, &op); !s.ok()) {
        return absl::InternalError(absl::StrCat("optimizer: ", op.type(), ": ", s.message()));
      }
      in.clear();
      for (const auto& name : op.input()) {
        // An unknown input reads as untyped (the verifier reports it).
        const int v = graph_->FindVar(name);
        in.push_back(v < 0 ? TensorType{} : graph_->type(v));
      }
      auto out = InferOutputTypes(*schema, op, in);
      if (!out.ok()) return absl::InternalError(absl::StrCat("optimizer: ", op.type(), ": ", out.status().message()));
      for (int k = 0; k < op.output_size(); ++k) {
        if (graph_->FindVar(op.output(k)) >= 0) continue;  // in-place update of an existing var
        const TensorType& t = (*out)[k];
        graph_->AddVar(op.output(k), t.dtype, absl::MakeConstSpan(t.shape.data(), t.shape.size()), ACTIVATION);
      }
      if (auto s = graph_->AddOp(op); !s.ok()) return absl::InternalError(absl::StrCat("optimizer: ", s.message()));
    }
    return absl::OkStatus();
  }

 private:
  Graph* graph_;
  std::vector<Op> ops_;
  absl::Status status_;
};

std::string DtypeString(DataType dtype) { return DataType_Name(dtype); }

// The dtype the ranks sum the global gradient norm in: the whole program's,
// from the compiler, else the parameters' here (F64 when they mix).
DataType NormDtype(const CompileContext& ctx, const std::set<DataType>& param_dtypes) {
  if (ctx.global_norm_dtype != DT_INVALID) return ctx.global_norm_dtype;
  return param_dtypes.size() == 1 ? *param_dtypes.begin() : F64;
}

// "@grad_sumsq" = 0: the part of the global norm of a stage with no
// gradients of its own to count.
void AddZeroPartialNorm(BlockBuilder& b, DataType dtype, int stage) {
  b.AddOp("fill_scalar", {}, {"@grad_sumsq"}, stage, OPTIMIZE,
          {{"dtype", StringAttr(DtypeString(dtype))}, {"value", FloatAttr(0.0)}});
}

// A trained parameter, updated on its first consumer's stage.
struct Param {
  std::string name, grad;
  DataType dtype;
  std::vector<int64_t> shape;
  int stage;
};

// The parameters param_grad names, in declaration order (deterministic).
absl::StatusOr<std::vector<Param>> TrainedParams(const Graph& graph) {
  const Program& fields = graph.program_fields();
  const std::vector<int> first_reader = graph.FirstReaders();
  std::vector<Param> params;
  for (int v = 0; v < graph.num_vars(); ++v) {
    if (graph.kind(v) != PARAM) continue;  // only parameters have gradients
    const std::string name(graph.var_name(v));
    auto g = fields.param_grad().find(name);
    if (g == fields.param_grad().end()) continue;
    if (first_reader[v] < 0) {
      return absl::InternalError(absl::StrCat("optimizer: parameter '", name, "' has a gradient but no reader"));
    }
    const absl::Span<const int64_t> shape = graph.shape(v);
    params.push_back({name, g->second, graph.dtype(v), std::vector<int64_t>(shape.begin(), shape.end()),
                      graph.stage(first_reader[v])});
  }
  if (params.empty()) {
    return absl::InternalError(absl::StrCat("optimizer: param_grad names no parameter of this program (",
                                            fields.param_grad().size(), " entries)"));
  }
  return params;
}

// One step counter and one lr per dtype, made on the home stage when first
// asked for. The pass runs on each rank's program after the pipeline split,
// so every rank has its own copies under the same names, and a checkpoint is
// the same under any layout.
class LearningRates {
 public:
  LearningRates(BlockBuilder* b, const Optimizer& opt, int home_stage)
      : b_(*b), sched_(LrScheduleOf(opt)), home_stage_(home_stage) {}

  // The lr var of `dtype` ("@lr.F32"), its lr_schedule op appended on first use.
  std::string For(DataType dtype) {
    if (lr_var_.count(dtype)) return lr_var_[dtype];
    if (step_var_.empty()) {
      step_var_ = kStepVar;
      b_.AddVar(step_var_, I64, {}, STATE);
    }
    std::string lr = absl::StrCat("@lr.", DtypeString(dtype));
    std::map<std::string, AttrValue> attrs = {{"dtype", StringAttr(DtypeString(dtype))},
                                              {"base_lr", FloatAttr(sched_.base_lr)},
                                              {"warmup_steps", IntAttr(sched_.warmup_steps)}};
    if (sched_.kind == kernel_math::LrScheduleKind::kCosine) {
      attrs["kind"] = StringAttr("cosine");
      attrs["decay_steps"] = IntAttr(sched_.decay_steps);
      attrs["alpha"] = FloatAttr(sched_.alpha);
    } else if (sched_.kind == kernel_math::LrScheduleKind::kStep) {
      attrs["kind"] = StringAttr("step");
      attrs["step_size"] = IntAttr(sched_.step_size);
      attrs["gamma"] = FloatAttr(sched_.gamma);
    }
    b_.AddOp("lr_schedule", {step_var_}, {lr}, home_stage_, LR_SCHEDULE, attrs);
    lr_var_[dtype] = lr;
    return lr;
  }

  // Empty until the first For().
  const std::string& step_var() const { return step_var_; }

 private:
  BlockBuilder& b_;
  const kernel_math::LrSchedule sched_;
  const int home_stage_;
  std::string step_var_;
  std::map<DataType, std::string> lr_var_;
};

// This stage's part of the global norm, the sum of its gradients' squares:
// per dtype, cast to the norm's dtype and added. A tied weight's replica has
// the same gradient as its home stage, so it is counted once. Returns the var.
std::string AddPartialSumOfSquares(BlockBuilder& b, const std::vector<Param>& params, const Program& fields,
                                   DataType norm, int home_stage) {
  std::set<std::string> replicas(fields.tied_replica().begin(), fields.tied_replica().end());
  std::map<DataType, std::vector<std::string>> grads;
  for (const auto& p : params) {
    if (!replicas.count(p.name)) grads[p.dtype].push_back(p.grad);
  }
  std::vector<std::string> partials;
  for (const auto& [dtype, names] : grads) {
    std::string sum = grads.size() == 1 ? "@grad_sumsq" : absl::StrCat("@grad_sumsq.", DtypeString(dtype));
    b.AddOp("sum_squares", names, {sum}, home_stage, OPTIMIZE);
    if (dtype != norm) {
      std::string cast = absl::StrCat(sum, ".", DtypeString(norm));
      b.AddOp("cast", {sum}, {cast}, home_stage, OPTIMIZE, {{"dtype", StringAttr(DtypeString(norm))}});
      sum = cast;
    }
    partials.push_back(sum);
  }
  std::string sumsq = "@grad_sumsq";
  if (partials.empty()) {
    // Only replicas here: this stage adds nothing to the global norm.
    AddZeroPartialNorm(b, norm, home_stage);
  } else if (partials.size() == 1) {
    sumsq = partials.front();
  } else {
    b.AddOp("add_n", partials, {sumsq}, home_stage, OPTIMIZE);
  }
  return sumsq;
}

// Clipping by the global norm over all parameters' gradients; on a pipeline
// the stages' partial sums of squares are summed with an allreduce. Sets
// each parameter's entry in `scale_of` to the clipping coefficient in its
// dtype, which its update multiplies the gradient by (attr grad_scale, as
// apex's fused optimizers fold clipping in): the gradients are read once,
// not scaled into copies first. Returns the var of the global sum of squares.
std::string AddGlobalNormClipping(BlockBuilder& b, const std::vector<Param>& params, const Optimizer& opt,
                                  const Program& fields, const CompileContext& ctx, int home_stage,
                                  std::map<std::string, std::string>* scale_of) {
  std::set<DataType> dtypes;
  for (const auto& p : params) dtypes.insert(p.dtype);
  const DataType norm = NormDtype(ctx, dtypes);
  std::string sumsq = AddPartialSumOfSquares(b, params, fields, norm, home_stage);
  if (ctx.num_stages() > 1) {
    b.AddOp("allreduce", {sumsq}, {"@grad_sumsq.all"}, home_stage, OPTIMIZE, {}, ctx.GroupAlong("pp"));
    sumsq = "@grad_sumsq.all";
  }
  const std::string coef = "@clip_coef";
  b.AddOp("clip_coefficient", {sumsq}, {coef}, home_stage, OPTIMIZE,
          {{"max_norm", FloatAttr(opt.clip_global_norm())}});
  std::map<DataType, std::string> coef_of = {{norm, coef}};
  for (const auto& p : params) {
    if (!coef_of.count(p.dtype)) {
      coef_of[p.dtype] = absl::StrCat(coef, ".", DtypeString(p.dtype));
      b.AddOp("cast", {coef}, {coef_of[p.dtype]}, home_stage, OPTIMIZE,
              {{"dtype", StringAttr(DtypeString(p.dtype))}});
    }
    (*scale_of)[p.name] = coef_of[p.dtype];
  }
  return sumsq;
}

// The optimizer's update of one parameter from its gradient `g`, with the
// state vars it keeps (velocity, moments); with `scale` (clipping's
// coefficient, or ""), the update reads g * scale (attr grad_scale).
void AddParamUpdate(BlockBuilder& b, const Optimizer& opt, const Param& p, const std::string& g, const std::string& lr,
                    const std::string& step_var, const std::string& scale) {
  const auto scaled = [&](std::vector<std::string> inputs, std::map<std::string, AttrValue> attrs) {
    if (!scale.empty()) {
      inputs.push_back(scale);
      attrs["grad_scale"] = BoolAttr(true);
    }
    return std::make_pair(std::move(inputs), std::move(attrs));
  };
  switch (opt.kind_case()) {
    case Optimizer::kSgd: {
      auto [in, attrs] = scaled({p.name, g, lr}, {{"weight_decay", FloatAttr(opt.weight_decay())}});
      b.AddOp("sgd_update", std::move(in), {p.name}, p.stage, OPTIMIZE, std::move(attrs));
      break;
    }
    case Optimizer::kMomentum: {
      std::string vel = absl::StrCat(p.name, "@velocity");
      b.AddVar(vel, p.dtype, p.shape, STATE);
      auto [in, attrs] = scaled({p.name, g, vel, lr}, {{"momentum", FloatAttr(opt.momentum().momentum())},
                                                       {"nesterov", BoolAttr(opt.momentum().nesterov())},
                                                       {"weight_decay", FloatAttr(opt.weight_decay())}});
      b.AddOp("momentum_update", std::move(in), {p.name, vel}, p.stage, OPTIMIZE, std::move(attrs));
      break;
    }
    case Optimizer::kAdam:
    case Optimizer::kAdamw: {
      const auto& a = opt.kind_case() == Optimizer::kAdam ? opt.adam() : opt.adamw();
      std::string m = absl::StrCat(p.name, "@moment1"), v = absl::StrCat(p.name, "@moment2");
      b.AddVar(m, p.dtype, p.shape, STATE);
      b.AddVar(v, p.dtype, p.shape, STATE);
      auto [in, attrs] =
          scaled({p.name, g, m, v, lr, step_var}, {{"beta1", FloatAttr(a.has_beta1() ? a.beta1() : 0.9)},
                                                   {"beta2", FloatAttr(a.has_beta2() ? a.beta2() : 0.999)},
                                                   {"epsilon", FloatAttr(a.has_epsilon() ? a.epsilon() : 1e-8)},
                                                   {"weight_decay", FloatAttr(opt.weight_decay())},
                                                   {"decoupled", BoolAttr(opt.kind_case() == Optimizer::kAdamw)}});
      b.AddOp("adam_update", std::move(in), {p.name, m, v}, p.stage, OPTIMIZE, std::move(attrs));
      break;
    }
    default:
      break;
  }
}

}  // namespace

absl::StatusOr<bool> OptimizerPass::Run(Graph& graph, const CompileContext& ctx) {
  const Program& fields = graph.program_fields();
  const Optimizer& opt = fields.optimizer();
  if (opt.kind_case() == Optimizer::KIND_NOT_SET) return false;
  if (fields.param_grad().empty() && (opt.clip_global_norm() <= 0 || ctx.num_stages() <= 1)) return false;
  BlockBuilder b(&graph);
  if (fields.param_grad().empty()) {
    // A stage that trains nothing still joins the other stages' allreduce of
    // the global gradient norm, with zero; without it they would wait forever.
    AddZeroPartialNorm(b, NormDtype(ctx, {}), ctx.stage());
    b.AddOp("allreduce", {"@grad_sumsq"}, {"@grad_sumsq.all"}, ctx.stage(), OPTIMIZE, {}, ctx.GroupAlong("pp"));
    // The loss's stage may report it; with every parameter frozen there is
    // no norm to report, as on one device (whose pass adds nothing).
    if (ctx.trains) graph.mutable_program_fields().set_grad_sumsq("@grad_sumsq.all");
    if (auto s = b.Finish(); !s.ok()) return s;
    return true;
  }
  absl::StatusOr<std::vector<Param>> params = TrainedParams(graph);
  if (!params.ok()) return params.status();

  const int home_stage = params->front().stage;
  LearningRates lrs(&b, opt, home_stage);
  for (const auto& p : *params) lrs.For(p.dtype);
  b.AddOp("increment", {lrs.step_var()}, {lrs.step_var()}, home_stage, OPTIMIZE);

  std::map<std::string, std::string> scale_of;  // clipping's coefficient by param, in its dtype
  if (opt.clip_global_norm() > 0) {
    // Its square root is reported as the step's grad_norm.
    graph.mutable_program_fields().set_grad_sumsq(
        AddGlobalNormClipping(b, *params, opt, fields, ctx, home_stage, &scale_of));
  }

  for (const auto& p : *params) {
    std::string lr = lrs.For(p.dtype);
    AddParamUpdate(b, opt, p, p.grad, lr, lrs.step_var(), scale_of.count(p.name) ? scale_of.at(p.name) : "");
  }
  if (auto s = b.Finish(); !s.ok()) return s;
  return true;
}

}  // namespace strata
