// The convolution family: conv2d (NCHW, grouped, dilated) and its backward
// ops conv2d_grad_input and conv2d_grad_filter.

#include <cstdint>
#include <string>
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
using nn_shape_checks::ExpectComputeFloatingArg;
using nn_shape_checks::ExpectRankArg;
using nn_shape_checks::ExpectSameDtypeArg;
using nn_shape_checks::ExpectStaticDims;
using nn_shape_checks::Invalid;
using nn_shape_checks::PairAttr;
using nn_shape_checks::SameSize;

struct ConvAttrs {
  Dims strides, paddings, dilations;
  int64_t groups;
};

// An input of conv2d or its backward ops: rank 4, static but for the batch dim when `batched`.
struct ConvArg {
  const char* name;
  const char* layout;
  bool batched;
};
constexpr ConvArg kConvX{"x", "[N, C, H, W]", true}, kConvW{"w", "[O, C/groups, kh, kw]", false},
    kConvDy{"dy", "[N, O, Ho, Wo]", true};

// Inputs 0 and 1 of a conv op: one floating dtype (F32, F64, or BF16 / F16
// under mixed precision), each of its ConvArg form.
absl::Status CheckConvInputs(const ShapeContext& ctx, const ConvArg& a, const ConvArg& b) {
  STRATA_RETURN_IF_ERROR(ExpectComputeFloatingArg(ctx, 0, a.name));
  STRATA_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, b.name, 0, a.name));
  STRATA_RETURN_IF_ERROR(ExpectRankArg(ctx, 0, a.name, 4, a.layout));
  STRATA_RETURN_IF_ERROR(ExpectRankArg(ctx, 1, b.name, 4, b.layout));
  STRATA_RETURN_IF_ERROR(ExpectStaticDims(ctx, 0, a.name, a.batched ? 1 : 0));
  return ExpectStaticDims(ctx, 1, b.name, b.batched ? 1 : 0);
}

// The attrs conv2d and its backward ops share, in schema order.
OpDef& WithConvAttrs(OpDef& def) {
  return def.Attr("strides", std::vector<int64_t>{1, 1}).Attr("paddings", std::vector<int64_t>{0, 0}).Attr("dilations", std::vector<int64_t>{1, 1}).Attr("groups", 1);
}

absl::StatusOr<ConvAttrs> ReadConvAttrs(const ShapeContext& ctx) {
  ConvAttrs a;
  auto s = PairAttr(ctx, "strides", 1);
  if (!s.ok()) return s.status();
  auto p = PairAttr(ctx, "paddings", 0);
  if (!p.ok()) return p.status();
  auto d = PairAttr(ctx, "dilations", 1);
  if (!d.ok()) return d.status();
  a.strides = *s;
  a.paddings = *p;
  a.dilations = *d;
  a.groups = ctx.attr_int("groups");
  if (a.groups < 1) return Invalid(absl::StrCat("attr 'groups' must be >= 1, got ", a.groups));
  return a;
}

// Output size of one spatial dim; an error if the dilated kernel does not fit.
absl::StatusOr<int64_t> ConvOutSize(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation,
                                    const char* dim) {
  int64_t span = 0;
  if (__builtin_mul_overflow(dilation, kernel - 1, &span) || span > (int64_t{1} << 62)) {
    return Invalid(absl::StrCat("the ", dim, " of the kernel, ", kernel, ", dilated by ", dilation,
                                " does not fit in 64 bits"));
  }
  ++span;
  if (in + 2 * pad < span) {
    return Invalid(absl::StrCat("the ", dim, " of the (dilated) kernel, ", span, ", exceeds the padded input ", dim,
                                " ", in, " + 2*", pad, ": the output would be empty"));
  }
  return WindowOutExtent(in, kernel, stride, pad, dilation);
}

// [N, O, Ho, Wo] of conv2d on x [N, C, H, W] with w [O, C/groups, kh, kw].
absl::StatusOr<Dims> ConvOutput(const ConvAttrs& a, const Dims& x, const Dims& w) {
  int64_t channels = 0;
  const bool overflow = __builtin_mul_overflow(w[1], a.groups, &channels);
  if (overflow || x[1] != channels) {
    return Invalid(absl::StrCat("'x' has ", x[1], " channels but 'w' ", DimsString(w), " with groups=", a.groups,
                                " expects ", overflow ? "more than 2^63" : absl::StrCat(channels),
                                " (w's dim 1 times groups)"));
  }
  if (w[0] % a.groups != 0) {
    return Invalid(absl::StrCat("attr 'groups'=", a.groups, " must divide the ", w[0], " output channels of 'w' ",
                                DimsString(w)));
  }
  auto ho = ConvOutSize(x[2], w[2], a.strides[0], a.paddings[0], a.dilations[0], "height");
  if (!ho.ok()) return ho.status();
  auto wo = ConvOutSize(x[3], w[3], a.strides[1], a.paddings[1], a.dilations[1], "width");
  if (!wo.ok()) return wo.status();
  return Dims{x[0], w[0], *ho, *wo};
}

// Multiply-adds = elements of y (or dy) x the weight's elements per output
// channel: FLOPs = 2 * |y| * |w| / O for w [O, C/groups, kh, kw].
double ConvFlops(const TensorType& y, const TensorType& w) {
  if (w.shape.size() != 4 || w.shape[0] <= 0) return 0;
  return 2 * ElementCount(y) * (ElementCount(w) / static_cast<double>(w.shape[0]));
}

absl::Status Conv2dShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckConvInputs(ctx, kConvX, kConvW));
  auto a = ReadConvAttrs(ctx);
  if (!a.ok()) return a.status();
  auto y = ConvOutput(*a, ctx.input(0).shape, ctx.input(1).shape);
  if (!y.ok()) return y.status();
  ctx.set_output(0, TensorType{ctx.input(0).dtype, *y});
  return absl::OkStatus();
}

// dx = conv2d_grad_input(dy, w), dw = conv2d_grad_filter(x, dy): the
// transposed convolution and the correlation of x with dy, both via im2col.
absl::Status Conv2dGrad(GradBuilder& g) {
  const std::string& dy = g.output_grad(0);
  if (dy.empty()) return absl::OkStatus();
  const Dims& x = g.input_type(0).shape;
  const Dims& w = g.input_type(1).shape;
  if (g.needs_input_grad(0)) {
    auto attrs = g.ForwardAttrs();
    attrs["input_size"] = IntsAttr({x[2], x[3]});
    g.Emit("conv2d_grad_input", {dy, g.input(1)}, {g.input_grad(0)}, attrs);
  }
  if (g.needs_input_grad(1)) {
    auto attrs = g.ForwardAttrs();
    attrs["filter_size"] = IntsAttr({w[2], w[3]});
    g.Emit("conv2d_grad_filter", {g.input(0), dy}, {g.input_grad(1)}, attrs);
  }
  return absl::OkStatus();
}

STRATA_REGISTER_OP(WithConvAttrs(OpDef("conv2d").Input("x").Input("w").Output("y"))
                       .Shape(Conv2dShape)
                       .Cost([](const CostContext& c) { return ConvFlops(c.output(0), c.input(1)); })
                       .Grad(Conv2dGrad)
                       .Doc("2-D cross-correlation, NCHW: x [N, C, H, W], w [O, C/groups, kh, kw] -> "
                            "[N, O, Ho, Wo]; symmetric zero padding. No bias: add a [O, 1, 1] one. F32, F64, or "
                            "BF16 / F16 under mixed precision (float32 math); y has x's type."));

absl::Status Conv2dGradInputShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckConvInputs(ctx, kConvDy, kConvW));
  auto a = ReadConvAttrs(ctx);
  if (!a.ok()) return a.status();
  auto in = PairAttr(ctx, "input_size", 1, /*window=*/false);
  if (!in.ok()) return in.status();
  const Dims& dy = ctx.input(0).shape;
  const Dims& w = ctx.input(1).shape;
  int64_t channels = 0;
  if (__builtin_mul_overflow(w[1], a->groups, &channels)) {
    return Invalid(absl::StrCat("'w' ", DimsString(w), " with groups=", a->groups, " means more than 2^63 input channels"));
  }
  Dims x{dy[0], channels, (*in)[0], (*in)[1]};
  auto y = ConvOutput(*a, x, w);
  if (!y.ok()) return y.status();
  if (*y != dy) {
    return Invalid(absl::StrCat("input 'dy' ", ctx.input(0).ToString(), " is not the output shape ",
                                DimsString(*y), " of conv2d on ", DimsString(x), " with 'w' ", DimsString(w)));
  }
  ctx.set_output(0, TensorType{ctx.input(0).dtype, x});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(WithConvAttrs(OpDef("conv2d_grad_input").Input("dy").Input("w").Output("dx"))
                       .Attr("input_size", AttrType::kInts)
                       .Shape(Conv2dGradInputShape)
                       .Cost([](const CostContext& c) { return ConvFlops(c.input(0), c.input(1)); })
                       .NotDifferentiable()
                       .Doc("Backward of conv2d: dL/dx [N, C, H, W] with [H, W] = input_size."));

absl::Status Conv2dGradFilterShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckConvInputs(ctx, kConvX, kConvDy));
  auto a = ReadConvAttrs(ctx);
  if (!a.ok()) return a.status();
  auto k = PairAttr(ctx, "filter_size", 1, /*window=*/false);
  if (!k.ok()) return k.status();
  const Dims& x = ctx.input(0).shape;
  const Dims& dy = ctx.input(1).shape;
  if (x[1] % a->groups != 0) {
    return Invalid(absl::StrCat("attr 'groups'=", a->groups, " must divide the ", x[1], " channels of 'x'"));
  }
  Dims w{dy[1], x[1] / a->groups, (*k)[0], (*k)[1]};
  auto y = ConvOutput(*a, x, w);
  if (!y.ok()) return y.status();
  if (!SameSize((*y)[0], dy[0]) || (*y)[1] != dy[1] || (*y)[2] != dy[2] || (*y)[3] != dy[3]) {
    return Invalid(absl::StrCat("input 'dy' ", ctx.input(1).ToString(), " is not the output shape ",
                                DimsString(*y), " of conv2d on 'x' ", ctx.input(0).ToString(), " with a filter ",
                                DimsString(w)));
  }
  ctx.set_output(0, TensorType{ctx.input(0).dtype, w});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(WithConvAttrs(OpDef("conv2d_grad_filter").Input("x").Input("dy").Output("dw"))
                       .Attr("filter_size", AttrType::kInts)
                       .Shape(Conv2dGradFilterShape)
                       .Cost([](const CostContext& c) { return ConvFlops(c.input(1), c.output(0)); })
                       .NotDifferentiable()
                       .Doc("Backward of conv2d: dL/dw [O, C/groups, kh, kw] with [kh, kw] = filter_size, "
                            "summed over the batch."));

}  // namespace
}  // namespace strata
