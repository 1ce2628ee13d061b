// Optimizer family: parameter updates (sgd, momentum, adam/adamw), the step
// counter, the learning-rate schedule and global-norm gradient clipping.
//
// The update ops are appended by the optimizer pass. They are stateful: their
// outputs name the same persistent vars as their param/moment inputs, and the
// kernels update those buffers in place. Semantics follow torch.optim exactly
// (kernels/cpu/optimizers_test.cc cross-checks against PyTorch).

#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

// Shape-function helpers: messages name the schema's argument, not its index.
absl::Status ExpectStaticFloating(const ShapeContext& ctx, int i, const char* name) {
  const TensorType& t = ctx.input(i);
  if (!IsFloating(t.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", name, "' must be F32 or F64, got ", t.ToString()));
  }
  for (int64_t d : t.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("input '", name, "' is persistent and needs a static shape, got ",
                                                     t.ToString(), " (no batch dimension)"));
    }
  }
  return absl::OkStatus();
}

// Input i must have exactly input `like`'s dtype and shape.
absl::Status ExpectSameType(const ShapeContext& ctx, int i, const char* name, int like, const char* like_name) {
  if (ctx.input(i) != ctx.input(like)) {
    return absl::InvalidArgumentError(absl::StrCat("input '", name, "' must have the type of '", like_name, "' (",
                                                   ctx.input(like).ToString(), "), got ",
                                                   ctx.input(i).ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectScalar(const ShapeContext& ctx, int i, const char* name, DataType dtype) {
  const TensorType& t = ctx.input(i);
  if (t.dtype != dtype || !t.shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("input '", name, "' must be a ", DataTypeName(dtype),
                                                   " scalar (shape []), got ", t.ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectAttrAtLeast(const ShapeContext& ctx, const char* attr, double low) {
  double v = ctx.attr_float(attr);
  if (!(v >= low) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("attr '", attr, "' must be a finite value >= ", low, ", got ", v));
  }
  return absl::OkStatus();
}

absl::Status ExpectAttrInUnitInterval(const ShapeContext& ctx, const char* attr) {
  double v = ctx.attr_float(attr);
  if (!(v >= 0.0 && v < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("attr '", attr, "' must be in [0, 1), got ", v));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Parameter updates.

// The optional last input `found_inf` (F32 scalar, nonzero: skip the
// update), when the op has more than `fixed` inputs: loss scaling's
// check_finite_and_unscale writes it, as Paddle's SkipUpdate.
absl::Status ExpectOptionalFoundInf(const ShapeContext& ctx, int fixed) {
  if (ctx.num_inputs() <= fixed) return absl::OkStatus();
  if (ctx.num_inputs() > fixed + 1) {
    return absl::InvalidArgumentError(absl::StrCat("expects ", fixed, " inputs, plus an optional found_inf, got ",
                                                   ctx.num_inputs(), " (a grad_scale input needs attr 'grad_scale')"));
  }
  return ExpectScalar(ctx, fixed, "found_inf", F32);
}

// With attr grad_scale, the scalar input `scale` at `i` (param's dtype):
// the update reads grad * scale, each element rounded once to param's dtype
// as a `mul` by it would be (global-norm clipping's coefficient, folded into
// the update as apex's fused optimizers fold it). Returns how many inputs
// that is (0 or 1), so the optional found_inf follows.
absl::StatusOr<int> ExpectGradScale(const ShapeContext& ctx, int i) {
  if (!ctx.attr_bool("grad_scale")) return 0;
  if (ctx.num_inputs() <= i) {
    return absl::InvalidArgumentError(absl::StrCat("attr 'grad_scale' needs input 'grad_scale' #", i,
                                                   " (a scalar of param's dtype), got ", ctx.num_inputs(), " inputs"));
  }
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, i, "grad_scale", ctx.input(0).dtype));
  return 1;
}

// The inputs every update op starts with: param, grad, then the `states`
// (velocity, moments) shaped like param, then the scalar lr.
absl::Status CheckUpdateInputs(const ShapeContext& ctx, std::initializer_list<const char*> states) {
  STRATA_RETURN_IF_ERROR(ExpectStaticFloating(ctx, 0, "param"));
  STRATA_RETURN_IF_ERROR(ExpectSameType(ctx, 1, "grad", 0, "param"));
  int i = 2;
  for (const char* state : states) STRATA_RETURN_IF_ERROR(ExpectSameType(ctx, i++, state, 0, "param"));
  return ExpectScalar(ctx, i, "lr", ctx.input(0).dtype);
}

// Attr copy_dtype: "" (none), or BF16 / F16: the op also writes output
// `copy`, param converted to that dtype after the update (mixed
// precision's 16-bit weight copy, written by the update instead of a cast
// after it: passes/hoist_param_casts.h).
absl::StatusOr<DataType> CopyDtype(const ShapeContext& ctx) {
  const std::string name = ctx.attr_string("copy_dtype");
  if (name.empty()) return DT_INVALID;
  DataType dtype = DT_INVALID;
  if (!DataType_Parse(name, &dtype) || (dtype != BF16 && dtype != F16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attr 'copy_dtype' must be \"\", \"BF16\" or \"F16\", got \"", name, "\""));
  }
  return dtype;
}

// Outputs param and its `num_states` states (inputs 2...), updated in place,
// then with attr copy_dtype the copy of param in that dtype.
absl::Status SetUpdateOutputs(ShapeContext& ctx, int num_states) {
  STRATA_ASSIGN_OR_RETURN(const DataType copy, CopyDtype(ctx));
  const int outputs = 1 + num_states + (copy != DT_INVALID ? 1 : 0);
  if (ctx.num_outputs() != outputs) {
    return absl::InvalidArgumentError(absl::StrCat("expects ", outputs, " outputs",
                                                   copy != DT_INVALID ? " (attr copy_dtype adds 'copy')" : "", ", got ",
                                                   ctx.num_outputs()));
  }
  ctx.set_output(0, ctx.input(0));
  for (int k = 0; k < num_states; ++k) ctx.set_output(1 + k, ctx.input(2 + k));
  if (copy != DT_INVALID) ctx.set_output(1 + num_states, TensorType{copy, ctx.input(0).shape});
  return absl::OkStatus();
}

absl::Status SgdUpdateShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckUpdateInputs(ctx, {}));
  STRATA_ASSIGN_OR_RETURN(const int scaled, ExpectGradScale(ctx, 3));
  STRATA_RETURN_IF_ERROR(ExpectOptionalFoundInf(ctx, 3 + scaled));
  STRATA_RETURN_IF_ERROR(ExpectAttrAtLeast(ctx, "weight_decay", 0.0));
  return SetUpdateOutputs(ctx, 0);
}

absl::Status MomentumUpdateShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckUpdateInputs(ctx, {"velocity"}));
  STRATA_ASSIGN_OR_RETURN(const int scaled, ExpectGradScale(ctx, 4));
  STRATA_RETURN_IF_ERROR(ExpectOptionalFoundInf(ctx, 4 + scaled));
  STRATA_RETURN_IF_ERROR(ExpectAttrAtLeast(ctx, "momentum", 0.0));
  STRATA_RETURN_IF_ERROR(ExpectAttrAtLeast(ctx, "weight_decay", 0.0));
  // As torch.optim.SGD: Nesterov needs a momentum to look ahead with.
  if (ctx.attr_bool("nesterov") && ctx.attr_float("momentum") <= 0.0) {
    return absl::InvalidArgumentError("attr 'nesterov' requires attr 'momentum' > 0");
  }
  return SetUpdateOutputs(ctx, 1);
}

absl::Status AdamUpdateShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckUpdateInputs(ctx, {"m", "v"}));
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, 5, "step", I64));
  STRATA_ASSIGN_OR_RETURN(const int scaled, ExpectGradScale(ctx, 6));
  STRATA_RETURN_IF_ERROR(ExpectOptionalFoundInf(ctx, 6 + scaled));
  STRATA_RETURN_IF_ERROR(ExpectAttrInUnitInterval(ctx, "beta1"));
  STRATA_RETURN_IF_ERROR(ExpectAttrInUnitInterval(ctx, "beta2"));
  STRATA_RETURN_IF_ERROR(ExpectAttrAtLeast(ctx, "epsilon", 0.0));
  STRATA_RETURN_IF_ERROR(ExpectAttrAtLeast(ctx, "weight_decay", 0.0));
  return SetUpdateOutputs(ctx, 2);
}

STRATA_REGISTER_OP(OpDef("sgd_update")
                       .Input("param")
                       .Input("grad")
                       .Input("lr")
                       .OptionalInput("grad_scale")
                       .OptionalInput("found_inf")
                       .Output("param")
                       .OptionalOutput("copy")
                       .Attr("weight_decay", 0.0)
                       .Attr("grad_scale", false)
                       .Attr("copy_dtype", "")
                       .Shape(SgdUpdateShape)
                       .Stateful()
                       .NotDifferentiable()
                       .Doc("torch.optim.SGD without momentum, in place: g += weight_decay * p; p -= lr * g. "
                            "lr is a scalar of param's dtype. With attr grad_scale, input grad_scale (a scalar of "
                            "param's dtype) first scales g, rounded once (global-norm clipping's coefficient). With "
                            "found_inf nonzero, nothing changes (a step loss scaling skips). With attr copy_dtype "
                            "(BF16 or F16), output copy is the updated param in that dtype, as a cast rounds it."));

STRATA_REGISTER_OP(OpDef("momentum_update")
                       .Input("param")
                       .Input("grad")
                       .Input("velocity")
                       .Input("lr")
                       .OptionalInput("grad_scale")
                       .OptionalInput("found_inf")
                       .Output("param")
                       .Output("velocity")
                       .OptionalOutput("copy")
                       .Attr("momentum", 0.9)
                       .Attr("nesterov", false)
                       .Attr("weight_decay", 0.0)
                       .Attr("grad_scale", false)
                       .Attr("copy_dtype", "")
                       .Shape(MomentumUpdateShape)
                       .Stateful()
                       .NotDifferentiable()
                       .Doc("torch.optim.SGD with momentum (dampening 0), in place: g += weight_decay * p; "
                            "buf = momentum * buf + g; g = nesterov ? g + momentum * buf : buf; p -= lr * g. "
                            "velocity starts at zero. grad_scale and copy_dtype as sgd_update's. With found_inf "
                            "nonzero, nothing changes (a step loss scaling skips)."));

STRATA_REGISTER_OP(OpDef("adam_update")
                       .Input("param")
                       .Input("grad")
                       .Input("m")
                       .Input("v")
                       .Input("lr")
                       .Input("step")
                       .OptionalInput("grad_scale")
                       .OptionalInput("found_inf")
                       .Output("param")
                       .Output("m")
                       .Output("v")
                       .OptionalOutput("copy")
                       .Attr("beta1", 0.9)
                       .Attr("beta2", 0.999)
                       .Attr("epsilon", 1e-8)
                       .Attr("weight_decay", 0.0)
                       .Attr("decoupled", false)
                       .Attr("grad_scale", false)
                       .Attr("copy_dtype", "")
                       .Shape(AdamUpdateShape)
                       .Stateful()
                       .NotDifferentiable()
                       .Doc("torch.optim.Adam (decoupled: AdamW, p *= 1 - lr * weight_decay first), in place. "
                            "step is the I64 1-based index of this update: m = b1 m + (1-b1) g; "
                            "v = b2 v + (1-b2) g^2; p -= lr / (1-b1^step) * m / (sqrt(v) / sqrt(1-b2^step) + eps). "
                            "grad_scale and copy_dtype as sgd_update's. With found_inf nonzero, nothing changes (a "
                            "step loss scaling skips)."));

// ---------------------------------------------------------------------------
// Multi-tensor updates (the fuse-optimizer pass makes them for GPU plans):
// one op updating n parameters with the single op's math, apex's
// multi_tensor_apply / torch's fused AdamW the static-graph way. The inputs
// are the single op's, each tensor role n wide: n params, n grads, n of each
// state, then the single op's scalars once (lr; adam: step; with attr
// grad_scale its scalar) and its optional found_inf. The outputs are n
// params, then n of each state, in place, then with attr copy_dtype the n
// copies.

// The single op's shape function run on member i's inputs and outputs:
// every member is checked exactly as its single op would be.
absl::Status MultiUpdateShape(ShapeContext& ctx, int num_states, int num_scalars,
                              absl::Status (*single)(ShapeContext&)) {
  const int64_t n = ctx.attr_int("n");
  const int tensors = 2 + num_states;  // param, grad, states
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("attr 'n' must be >= 1, got ", n));
  if (ctx.attr_bool("grad_scale")) ++num_scalars;
  const int64_t fixed = tensors * n + num_scalars;
  if (ctx.num_inputs() != fixed && ctx.num_inputs() != fixed + 1) {
    return absl::InvalidArgumentError(absl::StrCat("expects ", tensors, " * n + ", num_scalars, " inputs (n = ", n,
                                                   "), plus an optional found_inf: ", fixed, " or ", fixed + 1,
                                                   ", got ", ctx.num_inputs()));
  }
  STRATA_ASSIGN_OR_RETURN(const DataType copy, CopyDtype(ctx));
  const int per_tensor = 1 + num_states + (copy != DT_INVALID ? 1 : 0);  // param, states, the copy
  if (ctx.num_outputs() != per_tensor * n) {
    return absl::InvalidArgumentError(absl::StrCat("expects ", per_tensor, " * n outputs (n = ", n,
                                                   copy != DT_INVALID ? ", attr copy_dtype adding copy[n]" : "",
                                                   "): ", per_tensor * n, ", got ", ctx.num_outputs()));
  }
  const int scalars_from = static_cast<int>(tensors * n);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<TensorType> in;
    for (int k = 0; k < tensors; ++k) in.push_back(ctx.input(static_cast<int>(k * n + i)));
    for (int k = scalars_from; k < ctx.num_inputs(); ++k) in.push_back(ctx.input(k));
    Op member;
    member.mutable_attr()->insert(ctx.op().attr().begin(), ctx.op().attr().end());
    for (int k = 0; k < per_tensor; ++k) member.add_output("");
    ShapeContext sub(member, std::move(in));
    if (absl::Status s = single(sub); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("tensor #", i, " of ", n, ": ", s.message()));
    }
    for (int k = 0; k < per_tensor; ++k) ctx.set_output(static_cast<int>(k * n + i), sub.outputs()[k]);
  }
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("sgd_update_multi")
                       .VariadicInput("tensors")
                       .VariadicOutput("updated")
                       .Attr("n", AttrType::kInt)
                       .Attr("grad_scale", false)
                       .Attr("copy_dtype", "")
                       .Attr("weight_decay", 0.0)
                       .Shape([](ShapeContext& ctx) { return MultiUpdateShape(ctx, 0, 1, SgdUpdateShape); })
                       .Stateful()
                       .NotDifferentiable()
                       .Doc("n sgd_updates in one op: inputs param[n], grad[n], lr, with attr grad_scale its "
                            "scalar, optional found_inf; outputs param[n], in place. Each tensor gets sgd_update's "
                            "math exactly; with attr copy_dtype, outputs copy[n] too."));

STRATA_REGISTER_OP(OpDef("momentum_update_multi")
                       .VariadicInput("tensors")
                       .VariadicOutput("updated")
                       .Attr("n", AttrType::kInt)
                       .Attr("grad_scale", false)
                       .Attr("copy_dtype", "")
                       .Attr("momentum", 0.9)
                       .Attr("nesterov", false)
                       .Attr("weight_decay", 0.0)
                       .Shape([](ShapeContext& ctx) { return MultiUpdateShape(ctx, 1, 1, MomentumUpdateShape); })
                       .Stateful()
                       .NotDifferentiable()
                       .Doc("n momentum_updates in one op: inputs param[n], grad[n], velocity[n], lr, with attr "
                            "grad_scale its scalar, optional found_inf; outputs param[n], velocity[n], in place. "
                            "Each tensor gets momentum_update's math exactly; with attr copy_dtype, outputs copy[n] "
                            "too."));

STRATA_REGISTER_OP(OpDef("adam_update_multi")
                       .VariadicInput("tensors")
                       .VariadicOutput("updated")
                       .Attr("n", AttrType::kInt)
                       .Attr("grad_scale", false)
                       .Attr("copy_dtype", "")
                       .Attr("beta1", 0.9)
                       .Attr("beta2", 0.999)
                       .Attr("epsilon", 1e-8)
                       .Attr("weight_decay", 0.0)
                       .Attr("decoupled", false)
                       .Shape([](ShapeContext& ctx) { return MultiUpdateShape(ctx, 2, 2, AdamUpdateShape); })
                       .Stateful()
                       .NotDifferentiable()
                       .Doc("n adam_updates in one op (torch's fused Adam/AdamW): inputs param[n], grad[n], m[n], "
                            "v[n], lr, step, with attr grad_scale its scalar, optional found_inf; outputs param[n], "
                            "m[n], v[n], in place. Each tensor gets adam_update's math exactly; with attr "
                            "copy_dtype, outputs copy[n] too."));

// ---------------------------------------------------------------------------
// Step counter and learning-rate schedule.

absl::Status IncrementShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, 0, "counter", I64));
  STRATA_RETURN_IF_ERROR(ExpectOptionalFoundInf(ctx, 1));
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("increment")
                       .Input("counter")
                       .OptionalInput("found_inf")
                       .Output("counter")
                       .Attr("by", 1)
                       .Shape(IncrementShape)
                       .Stateful()
                       .NotDifferentiable()
                       .Doc("counter += by, in place, on an I64 scalar (the optimizer step count); with found_inf nonzero "
                            "it stays (a skipped step is no optimizer step)."));

absl::Status LrScheduleShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, 0, "step", I64));
  std::string dtype = ctx.attr_string("dtype");
  DataType out;
  if (dtype == "F32") {
    out = F32;
  } else if (dtype == "F64") {
    out = F64;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("attr 'dtype' must be \"F32\" or \"F64\", got \"", dtype, "\""));
  }
  STRATA_RETURN_IF_ERROR(ExpectAttrAtLeast(ctx, "base_lr", 0.0));
  int64_t warmup = ctx.attr_int("warmup_steps");
  if (warmup < 0) return absl::InvalidArgumentError(absl::StrCat("attr 'warmup_steps' must be >= 0, got ", warmup));
  std::string kind = ctx.attr_string("kind");
  if (kind == "cosine") {
    int64_t decay_steps = ctx.attr_int("decay_steps");
    if (decay_steps < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("attr 'decay_steps' must be >= 0 (0: the run's total steps), got ", decay_steps));
    }
    if (decay_steps > 0 && decay_steps <= warmup) {
      return absl::InvalidArgumentError(absl::StrCat("attr 'decay_steps' (", decay_steps,
                                                     ") must exceed attr 'warmup_steps' (", warmup,
                                                     "): the cosine decays over the steps after warm-up"));
    }
    double alpha = ctx.attr_float("alpha");
    if (!(alpha >= 0.0 && alpha <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("attr 'alpha' must be in [0, 1], got ", alpha));
    }
  } else if (kind == "step") {
    int64_t step_size = ctx.attr_int("step_size");
    if (step_size < 1) return absl::InvalidArgumentError(absl::StrCat("attr 'step_size' must be >= 1, got ", step_size));
    STRATA_RETURN_IF_ERROR(ExpectAttrAtLeast(ctx, "gamma", 0.0));
  } else if (kind != "constant") {
    return absl::InvalidArgumentError(
        absl::StrCat("attr 'kind' must be \"constant\", \"cosine\" or \"step\", got \"", kind, "\""));
  }
  ctx.set_output(0, TensorType{out, {}});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("lr_schedule")
                       .Input("step")
                       .Output("lr")
                       .Attr("dtype", "F32")
                       .Attr("base_lr", AttrType::kFloat)
                       .Attr("warmup_steps", 0)
                       .Attr("kind", "constant")
                       .Attr("decay_steps", 0)
                       .Attr("alpha", 0.0)
                       .Attr("step_size", 1)
                       .Attr("gamma", 0.1)
                       .Shape(LrScheduleShape)
                       .NotDifferentiable()
                       .Doc("The learning rate for the update after `step` (0-based) updates: linear warm-up "
                            "base_lr * (t+1) / warmup_steps, then constant, cosine to alpha * base_lr over "
                            "decay_steps - warmup_steps (decay_steps 0: the run's total steps), or "
                            "base_lr * gamma^floor(t' / step_size)."));

// ---------------------------------------------------------------------------
// Global-norm gradient clipping: sum_squares per group of gradients (one per
// pipeline stage), then clip_coefficient over the partial sums.

absl::Status SumSquaresShape(ShapeContext& ctx) {
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!IsFloating(ctx.input(i).dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("input 'x' #", i, " must be F32 or F64, got ", ctx.input(i).ToString()));
    }
    if (ctx.input(i).dtype != ctx.input(0).dtype) {
      return absl::InvalidArgumentError(absl::StrCat("inputs 'x' must share one dtype: #0 is ",
                                                     DataTypeName(ctx.input(0).dtype), ", #", i, " is ",
                                                     DataTypeName(ctx.input(i).dtype)));
    }
  }
  ctx.set_output(0, TensorType{ctx.input(0).dtype, {}});
  return absl::OkStatus();
}

// d/dx_i sum_j |x_j|^2 = 2 x_i dy.
absl::Status SumSquaresGrad(GradBuilder& g) {
  // A single-output op whose output gets no gradient contributes none.
  if (g.output_grad(0).empty()) return absl::OkStatus();
  for (int i = 0; i < g.op().input_size(); ++i) {
    if (g.needs_input_grad(i)) g.Emit("sum_squares_grad", {g.input(i), g.output_grad(0)}, {g.input_grad(i)});
  }
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("sum_squares")
                       .VariadicInput("x")
                       .Output("y")
                       .Shape(SumSquaresShape)
                       .Grad(SumSquaresGrad)
                       .Doc("Scalar sum of the squares of every element of every input (one float dtype)."));

absl::Status SumSquaresGradShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectFloating(ctx, 0));
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, 1, "dy", ctx.input(0).dtype));
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("sum_squares_grad")
                       .Input("x")
                       .Input("dy")
                       .Output("dx")
                       .Shape(SumSquaresGradShape)
                       .NotDifferentiable()
                       .Doc("Backward of sum_squares for one input: dx = 2 * x * dy (dy a scalar)."));

absl::Status ClipCoefficientShape(ShapeContext& ctx) {
  DataType dtype = ctx.input(0).dtype;
  if (!IsFloating(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("input 'sum_squares' #0 must be an F32 or F64 scalar, got ", ctx.input(0).ToString()));
  }
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (ctx.input(i).dtype != dtype || !ctx.input(i).shape.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("input 'sum_squares' #", i, " must be a ", DataTypeName(dtype),
                                                     " scalar (shape []), got ", ctx.input(i).ToString()));
    }
  }
  double max_norm = ctx.attr_float("max_norm");
  if (!(max_norm > 0.0) || !std::isfinite(max_norm)) {
    return absl::InvalidArgumentError(absl::StrCat("attr 'max_norm' must be a finite value > 0, got ", max_norm));
  }
  ctx.set_output(0, TensorType{dtype, {}});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("clip_coefficient")
                       .VariadicInput("sum_squares")
                       .Output("coef")
                       .Attr("max_norm", AttrType::kFloat)
                       .Shape(ClipCoefficientShape)
                       .NotDifferentiable()
                       .Doc("As torch.nn.utils.clip_grad_norm_: min(1, max_norm / (sqrt(sum of the partial sums "
                            "of squares) + 1e-6)), the factor every gradient is multiplied by."));

// ---------------------------------------------------------------------------
// Dynamic loss scaling (F16 mixed precision), as PaddlePaddle's static AMP
// names the ops and torch.cuda.amp.GradScaler computes them.

absl::Status CheckFiniteAndUnscaleShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, 0, "scale", F32));
  const int n = ctx.num_inputs() - 1;
  if (ctx.num_outputs() != n + 1) {
    return absl::InvalidArgumentError(absl::StrCat("expects one output 'y' per input 'x' (", n, ") after 'found_inf', got ",
                                                   ctx.num_outputs() - 1));
  }
  ctx.set_output(0, TensorType{F32, {}});
  for (int i = 1; i <= n; ++i) {
    const TensorType& x = ctx.input(i);
    if (x.dtype != F32 && x.dtype != F64) {
      return absl::InvalidArgumentError(absl::StrCat("input 'x' #", i - 1, " must be F32 or F64 (master gradients), got ",
                                                     x.ToString()));
    }
    ctx.set_output(i, x);
  }
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("check_finite_and_unscale")
                       .Input("scale")
                       .VariadicInput("x")
                       .Output("found_inf")
                       .VariadicOutput("y")
                       .Shape(CheckFiniteAndUnscaleShape)
                       .NotDifferentiable()
                       .Doc("Loss scaling's unscale (torch's _amp_foreach_non_finite_check_and_unscale_): "
                            "y_i = x_i * float(1 / scale); found_inf = 1 (F32) if any element of any x_i is "
                            "inf or nan, else 0."));

absl::Status UpdateLossScalingShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, 0, "found_inf", F32));
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, 1, "loss_scale", F32));
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, 2, "good_steps", I64));
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, 3, "skipped_updates", I64));
  const double growth = ctx.attr_float("growth_factor"), backoff = ctx.attr_float("backoff_factor");
  if (!(growth > 1.0) || !std::isfinite(growth)) {
    return absl::InvalidArgumentError(absl::StrCat("attr 'growth_factor' must be a finite value > 1, got ", growth));
  }
  if (!(backoff > 0.0 && backoff < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("attr 'backoff_factor' must be in (0, 1), got ", backoff));
  }
  const int64_t interval = ctx.attr_int("growth_interval");
  if (interval < 1) return absl::InvalidArgumentError(absl::StrCat("attr 'growth_interval' must be >= 1, got ", interval));
  for (int i = 0; i < 3; ++i) ctx.set_output(i, ctx.input(i + 1));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("update_loss_scaling")
                       .Input("found_inf")
                       .Input("loss_scale")
                       .Input("good_steps")
                       .Input("skipped_updates")
                       .Output("loss_scale")
                       .Output("good_steps")
                       .Output("skipped_updates")
                       .Attr("growth_factor", 2.0)
                       .Attr("backoff_factor", 0.5)
                       .Attr("growth_interval", 2000)
                       .Shape(UpdateLossScalingShape)
                       .Stateful()
                       .NotDifferentiable()
                       .Doc("GradScaler.update (torch's _amp_update_scale_), in place: with found_inf nonzero "
                            "loss_scale *= backoff_factor, good_steps = 0, skipped_updates += 1; else "
                            "good_steps += 1, and when it reaches growth_interval loss_scale *= growth_factor "
                            "(kept only if finite) and good_steps = 0."));

#undef STRATA_RETURN_IF_ERROR

}  // namespace
}  // namespace strata
