// The loss family: softmax_cross_entropy and mse_loss with their backward ops,
// and the accuracy metric, which checks logits and labels as the losses do.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/ops/nn_shape_checks.h"

namespace strata {
namespace {

using nn_shape_checks::Dims;
using nn_shape_checks::DimsString;
using nn_shape_checks::ExpectComputeFloatingArg;
using nn_shape_checks::ExpectDtypeArg;
using nn_shape_checks::ExpectFloatingArg;
using nn_shape_checks::ExpectSameTypeArg;
using nn_shape_checks::ExpectScalarArg;
using nn_shape_checks::Invalid;

// Losses and metrics over logits [..., C] and I64 labels [...]. `half`:
// the op also takes BF16 / F16 logits (softmax_cross_entropy and its
// backward, which mixed precision lets read the LM head's 16-bit output).

absl::Status CheckLogitsAndLabel(const ShapeContext& ctx, bool half = false) {
  STRATA_RETURN_IF_ERROR(half ? ExpectComputeFloatingArg(ctx, 0, "logits") : ExpectFloatingArg(ctx, 0, "logits"));
  const Dims& logits = ctx.input(0).shape;
  if (logits.size() < 2 || logits.back() <= 0) {
    return Invalid(absl::StrCat("input 'logits' must be [N, C] with a known number of classes C, got ",
                                ctx.input(0).ToString()));
  }
  STRATA_RETURN_IF_ERROR(ExpectDtypeArg(ctx, 1, "label", I64));
  Dims want(logits.begin(), logits.end() - 1);
  if (ctx.input(1).shape != want) {
    return Invalid(absl::StrCat("input 'label' must have shape ", DimsString(want),
                                " (logits without the class dim), got ", ctx.input(1).ToString()));
  }
  return absl::OkStatus();
}

// The loss's (and the backward's dloss) type: F32 when the logits are BF16
// or F16 (the math is float32, as attention's lse stays F32 for 16-bit q),
// else the logits' dtype.
DataType LossDtype(DataType logits) { return IsHalfFloating(logits) ? F32 : logits; }

// The `classes` attr: 0 (every column a class) or 1..C, the first columns
// (the rest padding of a row-aligned LM head, never read; passes/pad_vocab).
absl::Status CheckClasses(const ShapeContext& ctx) {
  const int64_t classes = ctx.attr_int("classes"), c = ctx.input(0).shape.back();
  if (classes < 0 || classes > c) {
    return Invalid(absl::StrCat("attr 'classes' must be 0 (every column) or in [1, ", c, "], got ", classes));
  }
  return absl::OkStatus();
}

absl::Status CrossEntropyShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckLogitsAndLabel(ctx, /*half=*/true));
  STRATA_RETURN_IF_ERROR(CheckClasses(ctx));
  ctx.set_output(0, TensorType{LossDtype(ctx.input(0).dtype), {}});
  return absl::OkStatus();
}

// dlogits = (softmax(logits) - onehot(label)) / N * dloss
absl::Status SoftmaxCrossEntropyGrad(GradBuilder& g) {
  if (g.output_grad(0).empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  g.Emit("softmax_cross_entropy_grad", {g.input(0), g.input(1), g.output_grad(0)}, {g.input_grad(0)},
         g.ForwardAttrs());
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("softmax_cross_entropy")
                       .Input("logits")
                       .Input("label")
                       .Output("loss")
                       .Attr("classes", 0)
                       .Shape(CrossEntropyShape)
                       .Grad(SoftmaxCrossEntropyGrad)
                       .Doc("Mean over samples of -log softmax(logits)[label]; logits [N, C], label [N] I64 in "
                            "[0, C) (checked at run time). Logits F32, F64, or BF16 / F16 under mixed precision "
                            "(read as they are, the math in float32); the loss is F32 for BF16 / F16 logits, else "
                            "the logits' type. classes V > 0: only the first V columns are classes (labels in "
                            "[0, V)); the rest are padding that is never read (passes/pad_vocab)."));

absl::Status SoftmaxCrossEntropyGradShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckLogitsAndLabel(ctx, /*half=*/true));
  STRATA_RETURN_IF_ERROR(CheckClasses(ctx));
  STRATA_RETURN_IF_ERROR(ExpectScalarArg(ctx, 2, "dloss", LossDtype(ctx.input(0).dtype)));
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("softmax_cross_entropy_grad")
                       .Input("logits")
                       .Input("label")
                       .Input("dloss")
                       .Output("dlogits")
                       .Attr("classes", 0)
                       .Attr("in_place", false)
                       .Shape(SoftmaxCrossEntropyGradShape)
                       .NotDifferentiable()
                       .Doc("Backward of softmax_cross_entropy: (softmax(logits) - onehot(label)) / N * dloss. "
                            "dloss is F32 for BF16 / F16 logits (the loss's type); dlogits has the logits' type, "
                            "computed in float32 and rounded once. classes V > 0: dlogits' padding columns [V, C) "
                            "are zero. in_place: dlogits is written over the logits' buffer (the logits' last "
                            "reader; passes/in_place_loss_grad), which the memory plan then counts once."));

absl::Status AccuracyShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckLogitsAndLabel(ctx));
  const int64_t k = ctx.attr_int("k"), c = ctx.input(0).shape.back();
  if (k < 1 || k > c) return Invalid(absl::StrCat("attr 'k' must be in [1, ", c, "] (the classes), got ", k));
  ctx.set_output(0, TensorType{ctx.input(0).dtype, {}});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("accuracy")
                       .Input("logits")
                       .Input("label")
                       .Output("accuracy")
                       .Attr("k", 1)
                       .Shape(AccuracyShape)
                       .NotDifferentiable()
                       .Doc("Fraction of samples whose label is among the top-k logits (fewer than k logits "
                            "strictly greater than the label's)."));

absl::Status MseLossShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, "pred"));
  STRATA_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 1, "target", 0, "pred"));
  ctx.set_output(0, TensorType{ctx.input(0).dtype, {}});
  return absl::OkStatus();
}

// d/dpred = 2 (pred - target) / n * dloss; d/dtarget is the same with the roles swapped.
absl::Status MseLossGrad(GradBuilder& g) {
  const std::string& dloss = g.output_grad(0);
  if (dloss.empty()) return absl::OkStatus();
  if (g.needs_input_grad(0)) g.Emit("mse_loss_grad", {g.input(0), g.input(1), dloss}, {g.input_grad(0)});
  if (g.needs_input_grad(1)) g.Emit("mse_loss_grad", {g.input(1), g.input(0), dloss}, {g.input_grad(1)});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("mse_loss")
                       .Input("pred")
                       .Input("target")
                       .Output("loss")
                       .Shape(MseLossShape)
                       .Grad(MseLossGrad)
                       .Doc("Mean over all elements of (pred - target)^2."));

absl::Status MseLossGradShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, "pred"));
  STRATA_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 1, "target", 0, "pred"));
  STRATA_RETURN_IF_ERROR(ExpectScalarArg(ctx, 2, "dloss", ctx.input(0).dtype));
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("mse_loss_grad")
                       .Input("pred")
                       .Input("target")
                       .Input("dloss")
                       .Output("dpred")
                       .Shape(MseLossGradShape)
                       .NotDifferentiable()
                       .Doc("Backward of mse_loss: 2 (pred - target) / n * dloss."));

}  // namespace
}  // namespace strata
