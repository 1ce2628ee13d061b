// The normalization family: layer_norm and its backward op.

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/ops/nn_shape_checks.h"

namespace strata {
namespace {

using nn_shape_checks::Dims;
using nn_shape_checks::ExpectFloatingArg;
using nn_shape_checks::ExpectSameDtypeOrHalfArg;
using nn_shape_checks::ExpectSameDtypeArg;
using nn_shape_checks::ExpectSameTypeArg;
using nn_shape_checks::Invalid;
using nn_shape_checks::StoredOutputDtype;

absl::Status CheckLayerNormArgs(const ShapeContext& ctx, int x, int gamma) {
  STRATA_RETURN_IF_ERROR(ExpectFloatingArg(ctx, x, "x"));
  const Dims& xs = ctx.input(x).shape;
  if (xs.empty() || xs.back() <= 0) {
    return Invalid(absl::StrCat("input 'x' needs rank >= 1 and a known last dim to normalize over, got ",
                                ctx.input(x).ToString()));
  }
  STRATA_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, gamma, "gamma", x, "x"));
  if (ctx.input(gamma).shape != Dims{xs.back()}) {
    return Invalid(absl::StrCat("input 'gamma' must have shape [", xs.back(), "] (x's last dim), got ",
                                ctx.input(gamma).ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectEpsilon(const ShapeContext& ctx) {
  const double eps = ctx.attr_float("epsilon");
  if (!(eps > 0) || !std::isfinite(eps)) {
    return Invalid(absl::StrCat("attr 'epsilon' must be a finite value > 0, got ", eps));
  }
  return absl::OkStatus();
}

absl::Status LayerNormShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckLayerNormArgs(ctx, 0, 1));
  STRATA_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 2, "beta", 1, "gamma"));
  STRATA_RETURN_IF_ERROR(ExpectEpsilon(ctx));
  STRATA_ASSIGN_OR_RETURN(const DataType y_dtype, StoredOutputDtype(ctx, 0, "x"));
  ctx.set_output(0, TensorType{y_dtype, ctx.input(0).shape});
  return absl::OkStatus();
}

// dx, dgamma, dbeta come from one helper that recomputes mean and rstd from x;
// outputs nobody wants go to temporaries.
absl::Status LayerNormGrad(GradBuilder& g) {
  const std::string& dy = g.output_grad(0);
  if (dy.empty()) return absl::OkStatus();
  if (!g.needs_input_grad(0) && !g.needs_input_grad(1) && !g.needs_input_grad(2)) return absl::OkStatus();
  std::vector<std::string> outs;
  const char* hints[] = {"layer_norm_dx", "layer_norm_dgamma", "layer_norm_dbeta"};
  for (int i = 0; i < 3; ++i) outs.push_back(g.needs_input_grad(i) ? g.input_grad(i) : g.Temp(hints[i]));
  std::map<std::string, AttrValue> attrs = g.ForwardAttrs();
  attrs.erase("out_dtype");  // dx is x's type; a 16-bit dy is read widened
  g.Emit("layer_norm_grad", {g.input(0), g.input(1), dy}, outs, attrs);
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("layer_norm")
                       .Input("x")
                       .Input("gamma")
                       .Input("beta")
                       .Output("y")
                       .Attr("epsilon", 1e-5)
                       .Attr("out_dtype", "")
                       .Shape(LayerNormShape)
                       .Grad(LayerNormGrad)
                       .Doc("y = (x - mean) / sqrt(var + epsilon) * gamma + beta over x's last dim (biased var). "
                            "out_dtype \"BF16\" or \"F16\" (F32 x only) stores y rounded to that type, as a cast "
                            "after the op would (passes/fold_casts)."));

absl::Status LayerNormGradShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckLayerNormArgs(ctx, 0, 1));
  STRATA_RETURN_IF_ERROR(ExpectSameDtypeOrHalfArg(ctx, 2, "dy", 0, "x"));
  if (ctx.input(2).shape != ctx.input(0).shape) {
    return Invalid(absl::StrCat("input 'dy' must have the shape of 'x' (", ctx.input(0).ToString(), "), got ",
                                ctx.input(2).ToString()));
  }
  STRATA_RETURN_IF_ERROR(ExpectEpsilon(ctx));
  if (ctx.num_inputs() > 3) STRATA_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 3, "residual", 0, "x"));
  ctx.set_output(0, ctx.input(0));
  ctx.set_output(1, ctx.input(1));
  ctx.set_output(2, ctx.input(1));
  // dx_low: dx stored again in out_dtype's 16-bit type; one without the other is refused.
  STRATA_ASSIGN_OR_RETURN(const DataType low, StoredOutputDtype(ctx, 0, "x"));
  const bool stored = low != ctx.input(0).dtype;
  if (stored != (ctx.num_outputs() > 3)) {
    return Invalid(stored ? "attr 'out_dtype' needs output 'dx_low' (dx stored again in that type)"
                          : "output 'dx_low' needs attr 'out_dtype' \"BF16\" or \"F16\"");
  }
  if (stored) ctx.set_output(3, TensorType{low, ctx.input(0).shape});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("layer_norm_grad")
                       .Input("x")
                       .Input("gamma")
                       .Input("dy")
                       .OptionalInput("residual")
                       .Output("dx")
                       .Output("dgamma")
                       .Output("dbeta")
                       .OptionalOutput("dx_low")
                       .Attr("epsilon", 1e-5)
                       .Attr("out_dtype", "")
                       .Shape(LayerNormGradShape)
                       .NotDifferentiable()
                       .Doc("Backward of layer_norm, recomputing mean and rstd from x. dy may be BF16 or F16 "
                            "for an F32 x (read widened: passes/fold_casts). With `residual` (x's type), dx is "
                            "residual + the layer norm's dx, summed in x's type as add_n sums them: the gradient "
                            "around a residual connection added where it is written (passes/fuse_epilogues). "
                            "With out_dtype \"BF16\" or \"F16\" (F32 x) and output `dx_low`, dx is also "
                            "stored in that type, each value rounded as a cast of dx would round it: the cast "
                            "for the 16-bit GEMMs, where the float dx flows on too (passes/fold_casts)."));

}  // namespace
}  // namespace strata
