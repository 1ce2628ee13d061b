// The pooling family: max_pool2d and avg_pool2d (NCHW) with their backward ops.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/ops/nn_shape_checks.h"
#include "proto/shape_rules.h"

namespace strata {
namespace {

using nn_shape_checks::Dims;
using nn_shape_checks::DimsString;
using nn_shape_checks::ExpectFloatingArg;
using nn_shape_checks::ExpectRankArg;
using nn_shape_checks::ExpectSameDtypeArg;
using nn_shape_checks::ExpectStaticDims;
using nn_shape_checks::Invalid;
using nn_shape_checks::PairAttr;

struct PoolAttrs {
  Dims kernel, strides, paddings;
};

absl::StatusOr<PoolAttrs> ReadPoolAttrs(const ShapeContext& ctx) {
  PoolAttrs a;
  auto k = PairAttr(ctx, "kernel_size", 1);
  if (!k.ok()) return k.status();
  a.kernel = *k;
  if (ctx.attr_ints("strides").empty()) {
    a.strides = a.kernel;
  } else {
    auto s = PairAttr(ctx, "strides", 1);
    if (!s.ok()) return s.status();
    a.strides = *s;
  }
  auto p = PairAttr(ctx, "paddings", 0);
  if (!p.ok()) return p.status();
  a.paddings = *p;
  for (int i = 0; i < 2; ++i) {
    // As torch: a window must never lie entirely in the padding.
    if (a.paddings[i] > a.kernel[i] / 2) {
      return Invalid(absl::StrCat("attr 'paddings' ", DimsString(a.paddings), " must be at most half of "
                                  "'kernel_size' ", DimsString(a.kernel)));
    }
  }
  return a;
}

absl::StatusOr<Dims> PoolOutput(const PoolAttrs& a, const Dims& x) {
  Dims y{x[0], x[1], 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t in = x[2 + i] + 2 * a.paddings[i];
    if (in < a.kernel[i]) {
      return Invalid(absl::StrCat("'kernel_size' ", DimsString(a.kernel), " exceeds the padded input ",
                                  DimsString({x[2] + 2 * a.paddings[0], x[3] + 2 * a.paddings[1]}),
                                  ": the output would be empty"));
    }
    y[2 + i] = WindowOutExtent(x[2 + i], a.kernel[i], a.strides[i], a.paddings[i]);
  }
  return y;
}

// The pooled shape of x under the op's attrs.
absl::StatusOr<Dims> PooledShape(const ShapeContext& ctx, const Dims& x) {
  auto a = ReadPoolAttrs(ctx);
  if (!a.ok()) return a.status();
  return PoolOutput(*a, x);
}

// The attrs the pooling ops share, in schema order.
OpDef& WithPoolAttrs(OpDef& def) {
  return def.Attr("kernel_size", AttrType::kInts).Attr("strides", std::vector<int64_t>{}).Attr("paddings", std::vector<int64_t>{0, 0});
}

absl::Status CheckPoolInput(const ShapeContext& ctx, int i, const char* name) {
  STRATA_RETURN_IF_ERROR(ExpectFloatingArg(ctx, i, name));
  STRATA_RETURN_IF_ERROR(ExpectRankArg(ctx, i, name, 4, "[N, C, H, W]"));
  return ExpectStaticDims(ctx, i, name, 1);
}

absl::Status Pool2dShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckPoolInput(ctx, 0, "x"));
  auto y = PooledShape(ctx, ctx.input(0).shape);
  if (!y.ok()) return y.status();
  ctx.set_output(0, TensorType{ctx.input(0).dtype, *y});
  return absl::OkStatus();
}

absl::Status MaxPool2dGrad(GradBuilder& g) {
  if (g.output_grad(0).empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  // The argmax is recomputed from x rather than kept from the forward pass.
  g.Emit("max_pool2d_grad", {g.input(0), g.output_grad(0)}, {g.input_grad(0)}, g.ForwardAttrs());
  return absl::OkStatus();
}

absl::Status AvgPool2dGrad(GradBuilder& g) {
  if (g.output_grad(0).empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  const Dims& x = g.input_type(0).shape;
  auto attrs = g.ForwardAttrs();
  attrs["input_size"] = IntsAttr({x[2], x[3]});
  g.Emit("avg_pool2d_grad", {g.output_grad(0)}, {g.input_grad(0)}, attrs);
  return absl::OkStatus();
}

STRATA_REGISTER_OP(WithPoolAttrs(OpDef("max_pool2d").Input("x").Output("y"))
                       .Shape(Pool2dShape)
                       .Grad(MaxPool2dGrad)
                       .Doc("Max over kernel_size windows of x [N, C, H, W]; strides [] means kernel_size; "
                            "padding never wins the max."));

STRATA_REGISTER_OP(WithPoolAttrs(OpDef("avg_pool2d").Input("x").Output("y"))
                       .Attr("exclusive", false)
                       .Shape(Pool2dShape)
                       .Grad(AvgPool2dGrad)
                       .Doc("Mean over kernel_size windows of x [N, C, H, W]; exclusive=false counts padding in "
                            "the divisor (torch count_include_pad=True)."));

absl::Status MaxPool2dGradShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckPoolInput(ctx, 0, "x"));
  STRATA_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, "dy", 0, "x"));
  auto y = PooledShape(ctx, ctx.input(0).shape);
  if (!y.ok()) return y.status();
  if (*y != ctx.input(1).shape) {
    return Invalid(absl::StrCat("input 'dy' ", ctx.input(1).ToString(), " is not the pooled shape ",
                                DimsString(*y), " of 'x' ", ctx.input(0).ToString()));
  }
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(WithPoolAttrs(OpDef("max_pool2d_grad").Input("x").Input("dy").Output("dx"))
                       .Shape(MaxPool2dGradShape)
                       .NotDifferentiable()
                       .Doc("Backward of max_pool2d: dy routed to each window's first maximum of x."));

absl::Status AvgPool2dGradShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckPoolInput(ctx, 0, "dy"));
  auto in = PairAttr(ctx, "input_size", 1, /*window=*/false);
  if (!in.ok()) return in.status();
  const Dims& dy = ctx.input(0).shape;
  Dims x{dy[0], dy[1], (*in)[0], (*in)[1]};
  auto y = PooledShape(ctx, x);
  if (!y.ok()) return y.status();
  if (*y != dy) {
    return Invalid(absl::StrCat("input 'dy' ", ctx.input(0).ToString(), " is not the pooled shape ",
                                DimsString(*y), " of an input ", DimsString(x)));
  }
  ctx.set_output(0, TensorType{ctx.input(0).dtype, x});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(WithPoolAttrs(OpDef("avg_pool2d_grad").Input("dy").Output("dx"))
                       .Attr("exclusive", false)
                       .Attr("input_size", AttrType::kInts)
                       .Shape(AvgPool2dGradShape)
                       .NotDifferentiable()
                       .Doc("Backward of avg_pool2d: dL/dx [N, C, H, W] with [H, W] = input_size."));

}  // namespace
}  // namespace strata
