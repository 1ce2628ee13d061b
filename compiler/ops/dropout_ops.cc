// The dropout family: dropout and its backward op.

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/ops/nn_shape_checks.h"

namespace strata {
namespace {

using nn_shape_checks::ExpectFloatingArg;
using nn_shape_checks::Invalid;

absl::Status DropoutShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, ctx.op().type() == "dropout" ? "x" : "dy"));
  double p = ctx.attr_float("p");
  if (!(p >= 0.0 && p < 1.0)) return Invalid(absl::StrCat("attr 'p' must be in [0, 1), got ", p));
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

// dx = dy * mask / (1 - p), the mask regenerated from the same Philox stream
// (the emitted op keeps the forward op's uid), so no mask tensor is kept.
absl::Status DropoutGrad(GradBuilder& g) {
  if (g.output_grad(0).empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  g.Emit("dropout_grad", {g.output_grad(0)}, {g.input_grad(0)}, g.ForwardAttrs());
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("dropout")
                       .Input("x")
                       .Output("y")
                       .Attr("p", 0.5)
                       .Shape(DropoutShape)
                       .Grad(DropoutGrad)
                       .Doc("Training: y = x * mask / (1 - p), each element kept with probability 1 - p by a "
                            "Philox stream keyed on (seed, op uid) and counted by (step, global sample, element); "
                            "identity in evaluation."));

STRATA_REGISTER_OP(OpDef("dropout_grad")
                       .Input("dy")
                       .Output("dx")
                       .Attr("p", 0.5)
                       .Shape(DropoutShape)
                       .NotDifferentiable()
                       .Doc("Backward of dropout: dy * mask / (1 - p) with the forward op's mask (same uid)."));

}  // namespace
}  // namespace strata
