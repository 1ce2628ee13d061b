// The attention family: scaled_dot_product_attention (fused, optionally
// causal) and its backward op, which recomputes the probabilities from the
// saved per-row logsumexp instead of keeping the [T, T] matrix.

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
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
using nn_shape_checks::ExpectSameTypeArg;
using nn_shape_checks::ExpectStaticDims;
using nn_shape_checks::Invalid;

// The layout attr; an op without one (built by hand) is "bhtd", and an
// empty value a program wrote is refused, as the kernels refuse it.
absl::StatusOr<AttentionLayout> LayoutOf(const ShapeContext& ctx) {
  if (!ctx.op().attr().contains("layout")) return AttentionLayout::kBhtd;
  return ParseAttentionLayout(ctx.attr_string("layout"));
}

// Both attention ops' `scale`: finite, >= 0 (0: 1/sqrt(D)), and a float32
// (the kernels' scores are float).
absl::Status CheckScaleAttr(const ShapeContext& ctx) {
  const double scale = ctx.attr_float("scale");
  if (!std::isfinite(scale) || scale < 0 || InfiniteAsFloat32(scale)) {
    return Invalid(absl::StrCat("attr 'scale' must be finite, >= 0 (0: 1/sqrt(D)) and within float32's range "
                                "(the kernels' scores are float), got ", scale));
  }
  return absl::OkStatus();
}

// q, k, v (inputs 0-2) are one type [B, H, T, D], or [B, T, H, D] for layout
// "bthd" (B may be -1; F32, F64, or BF16 / F16 under mixed precision), and
// the attrs are sane.
absl::Status CheckQkv(const ShapeContext& ctx) {
  STRATA_ASSIGN_OR_RETURN(const AttentionLayout layout, LayoutOf(ctx));
  STRATA_RETURN_IF_ERROR(ExpectComputeFloatingArg(ctx, 0, "q"));
  STRATA_RETURN_IF_ERROR(
      ExpectRankArg(ctx, 0, "q", 4, layout == AttentionLayout::kBthd ? "[B, T, H, D]" : "[B, H, T, D]"));
  STRATA_RETURN_IF_ERROR(ExpectStaticDims(ctx, 0, "q", 1));
  STRATA_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 1, "k", 0, "q"));
  STRATA_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 2, "v", 0, "q"));
  STRATA_RETURN_IF_ERROR(CheckScaleAttr(ctx));
  return absl::OkStatus();
}

// The per-row logsumexp's type, [B, H, T] in both layouts: F32 when q is
// BF16 or F16 (an lse near 7 would be off by bf16's spacing there, 0.03, and
// every recomputed probability exp(s - lse) by 3%), else q's dtype.
TensorType LseType(const TensorType& q, AttentionLayout layout) {
  const AttentionShape d = AttentionDimsOf(q.shape, layout);
  return TensorType{IsHalfFloating(q.dtype) ? F32 : q.dtype, Dims{d.B, d.H, d.T}};
}

absl::Status AttentionShapeFn(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckQkv(ctx));
  STRATA_ASSIGN_OR_RETURN(const AttentionLayout layout, LayoutOf(ctx));
  ctx.set_output(0, ctx.input(0));
  ctx.set_output(1, LseType(ctx.input(0), layout));
  return absl::OkStatus();
}

// FLOPs of S = Q K^T and Y = P V (2 * 2 * B*H*T*T*D), about half the pairs
// when causal (T (T + 1) / 2 of T^2); the softmax's exps count as bytes.
double AttentionFlops(const CostContext& c, double gemms) {
  const TensorType& q = c.input(0);
  const auto layout_attr = c.op().attr().find("layout");
  const bool bthd = layout_attr != c.op().attr().end() && layout_attr->second.s() == "bthd";
  const AttentionShape dims = AttentionDimsOf(q.shape, bthd ? AttentionLayout::kBthd : AttentionLayout::kBhtd);
  const double b = dims.B, h = dims.H, t = dims.T, d = dims.D;
  const bool causal = c.op().attr().at("causal").b();
  const double pairs = causal ? t * (t + 1) / 2 : t * t;
  return gemms * 2 * b * h * pairs * d;
}

// With P the probabilities and D_i = rowsum(dY * Y)_i:
//   dS = P * (dY V^T - D_i + dlse_i);  dQ = scale dS K;  dK = scale dS^T Q;  dV = P^T dY.
absl::Status AttentionGrad(GradBuilder& g) {
  std::string dy = g.output_grad(0);
  const std::string& dlse = g.output_grad(1);
  if (dy.empty() && dlse.empty()) return absl::OkStatus();
  if (!g.needs_input_grad(0) && !g.needs_input_grad(1) && !g.needs_input_grad(2)) return absl::OkStatus();
  if (dy.empty()) {
    dy = g.Temp("attention_zero_dy");
    g.Emit("fill_like", {g.output(0)}, {dy}, {{"value", FloatAttr(0.0)}});
  }
  std::vector<std::string> inputs = {g.input(0), g.input(1), g.input(2), g.output(0), g.output(1), dy};
  if (!dlse.empty()) inputs.push_back(dlse);
  std::vector<std::string> outs;
  const char* hints[] = {"attention_dq", "attention_dk", "attention_dv"};
  for (int i = 0; i < 3; ++i) outs.push_back(g.needs_input_grad(i) ? g.input_grad(i) : g.Temp(hints[i]));
  g.Emit("scaled_dot_product_attention_grad", std::move(inputs), outs, g.ForwardAttrs());
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("scaled_dot_product_attention")
                       .Input("q")
                       .Input("k")
                       .Input("v")
                       .Output("y")
                       .Output("lse")
                       .Attr("causal", true)
                       .Attr("scale", 0.0)
                       .Attr("allow_tf32", false)
                       .Attr("layout", "bhtd")
                       .Shape(AttentionShapeFn)
                       .Cost([](const CostContext& c) { return AttentionFlops(c, 2); })
                       .Grad(AttentionGrad)
                       .Doc("y = softmax(scale * q k^T + mask) v per (batch, head); q, k, v [B, H, T, D] of "
                            "one type (F32, F64, or BF16 / F16 under mixed precision); y has q's type. causal: "
                            "query t sees keys <= t. scale 0 means 1/sqrt(D). Output 1, lse [B, H, T], is each "
                            "row's logsumexp of the (scaled, masked) scores, kept for the backward op so that "
                            "the [T, T] probabilities are never stored; it is F32 when q is BF16 or F16, else "
                            "q's type. allow_tf32 "
                            "(set by passes/tf32 on GPU plans): a GPU's products of F32 q, k, v may round them "
                            "to TF32. layout \"bthd\" (set by passes/attention_layout): q, k, v and y are "
                            "[B, T, H, D] (a [B, T, H * D] projection's heads, read without a transpose); lse "
                            "stays [B, H, T]."));

absl::Status AttentionGradShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckQkv(ctx));
  STRATA_ASSIGN_OR_RETURN(const AttentionLayout layout, LayoutOf(ctx));
  STRATA_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 3, "y", 0, "q"));
  const TensorType lse = LseType(ctx.input(0), layout);
  if (ctx.input(4) != lse) {
    return Invalid(absl::StrCat("input 'lse' must be ", lse.ToString(), " ([B, H, T] of q), got ",
                                ctx.input(4).ToString()));
  }
  if (ctx.num_inputs() > 7) {
    return Invalid(absl::StrCat("takes dy and at most dlse after lse, got ", ctx.num_inputs() - 5, " gradients"));
  }
  STRATA_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 5, "grads[0] (dy)", 0, "q"));
  if (ctx.num_inputs() == 7 && ctx.input(6) != lse) {
    return Invalid(absl::StrCat("input 'grads[1]' (dlse) must be ", lse.ToString(), ", got ",
                                ctx.input(6).ToString()));
  }
  for (int i = 0; i < 3; ++i) ctx.set_output(i, ctx.input(0));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("scaled_dot_product_attention_grad")
                       .Input("q")
                       .Input("k")
                       .Input("v")
                       .Input("y")
                       .Input("lse")
                       .VariadicInput("grads")
                       .Output("dq")
                       .Output("dk")
                       .Output("dv")
                       .Attr("causal", true)
                       .Attr("scale", 0.0)
                       .Attr("allow_tf32", false)
                       .Attr("layout", "bhtd")
                       .Shape(AttentionGradShape)
                       .Cost([](const CostContext& c) { return AttentionFlops(c, 5); })
                       .NotDifferentiable()
                       .Doc("Backward of scaled_dot_product_attention: grads are dy, then dlse when lse has a "
                            "gradient. Recomputes P = exp(scale q k^T - lse) per row block; dS = P * (dy v^T - "
                            "rowsum(dy * y) + dlse); dq = scale dS k, dk = scale dS^T q, dv = P^T dy. lse and "
                            "dlse are F32 when q is BF16 or F16 (as the forward's lse), else q's type; y, dy "
                            "and dq, dk, dv have q's type. layout as the forward's (its gradient maker "
                            "passes it on): \"bthd\" makes y, dy, dq, dk, dv [B, T, H, D] too."));

// ---------------------------------------------------------------------------
// The packed form (FlashAttention's qkvpacked): one qkv [B, T, 3, H, D], the
// layout a [B, T, 3 * H * D] projection writes, read in place instead of
// split into q, k, v and their gradients concatenated back
// (passes/pack_qkv makes it on GPU plans).

// qkv (input 0) [B, T, 3, H, D] (B may be -1; F32, F64, BF16 or F16) and sane attrs.
absl::Status CheckPackedQkv(const ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectComputeFloatingArg(ctx, 0, "qkv"));
  STRATA_RETURN_IF_ERROR(ExpectRankArg(ctx, 0, "qkv", 5, "[B, T, 3, H, D]"));
  STRATA_RETURN_IF_ERROR(ExpectStaticDims(ctx, 0, "qkv", 1));
  if (ctx.input(0).shape[2] != 3) {
    return Invalid(absl::StrCat("input 'qkv' must be [B, T, 3, H, D] (q, k, v in dim 2), got ",
                                ctx.input(0).ToString()));
  }
  STRATA_RETURN_IF_ERROR(CheckScaleAttr(ctx));
  return absl::OkStatus();
}

// y's type: [B, T, H, D] of qkv's dtype (q's type in the "bthd" layout).
TensorType PackedYType(const TensorType& qkv) {
  const Dims& s = qkv.shape;
  return TensorType{qkv.dtype, Dims{s[0], s[1], s[3], s[4]}};
}

absl::Status PackedAttentionShapeFn(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckPackedQkv(ctx));
  const TensorType y = PackedYType(ctx.input(0));
  ctx.set_output(0, y);
  ctx.set_output(1, LseType(y, AttentionLayout::kBthd));
  return absl::OkStatus();
}

// As AttentionFlops, from qkv's dims.
double PackedAttentionFlops(const CostContext& c, double gemms) {
  const Dims& s = c.input(0).shape;
  const double b = s[0], t = s[1], h = s[3], d = s[4];
  const bool causal = c.op().attr().at("causal").b();
  const double pairs = causal ? t * (t + 1) / 2 : t * t;
  return gemms * 2 * b * h * pairs * d;
}

// The gradient as AttentionGrad's, packed: one dqkv.
absl::Status PackedAttentionGrad(GradBuilder& g) {
  std::string dy = g.output_grad(0);
  const std::string& dlse = g.output_grad(1);
  if ((dy.empty() && dlse.empty()) || !g.needs_input_grad(0)) return absl::OkStatus();
  if (dy.empty()) {
    dy = g.Temp("attention_zero_dy");
    g.Emit("fill_like", {g.output(0)}, {dy}, {{"value", FloatAttr(0.0)}});
  }
  std::vector<std::string> inputs = {g.input(0), g.output(0), g.output(1), dy};
  if (!dlse.empty()) inputs.push_back(dlse);
  g.Emit("scaled_dot_product_attention_qkv_grad", std::move(inputs), {g.input_grad(0)}, g.ForwardAttrs());
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("scaled_dot_product_attention_qkv")
                       .Input("qkv")
                       .Output("y")
                       .Output("lse")
                       .Attr("causal", true)
                       .Attr("scale", 0.0)
                       .Attr("allow_tf32", false)
                       .Shape(PackedAttentionShapeFn)
                       .Cost([](const CostContext& c) { return PackedAttentionFlops(c, 2); })
                       .Grad(PackedAttentionGrad)
                       .Doc("scaled_dot_product_attention of layout \"bthd\" on q, k, v packed in one qkv "
                            "[B, T, 3, H, D] (q = qkv[:, :, 0], k = qkv[:, :, 1], v = qkv[:, :, 2]: the "
                            "[B, T, 3 * H * D] output of a qkv projection, FlashAttention's qkvpacked form), "
                            "read in place. y [B, T, H, D] has qkv's type; lse [B, H, T] is F32 for BF16 or F16 "
                            "qkv, else qkv's type. The same bits as the unpacked op. passes/pack_qkv "
                            "makes it on GPU plans from split -> reshape -> attention."));

absl::Status PackedAttentionGradShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(CheckPackedQkv(ctx));
  const TensorType y = PackedYType(ctx.input(0));
  const TensorType lse = LseType(y, AttentionLayout::kBthd);
  if (ctx.input(1) != y) {
    return Invalid(absl::StrCat("input 'y' must be ", y.ToString(), " ([B, T, H, D] of qkv), got ",
                                ctx.input(1).ToString()));
  }
  if (ctx.input(2) != lse) {
    return Invalid(absl::StrCat("input 'lse' must be ", lse.ToString(), " ([B, H, T] of qkv), got ",
                                ctx.input(2).ToString()));
  }
  if (ctx.num_inputs() < 4 || ctx.num_inputs() > 5) {
    return Invalid(absl::StrCat("takes dy and at most dlse after lse, got ", ctx.num_inputs() - 3, " gradients"));
  }
  if (ctx.input(3) != y) {
    return Invalid(absl::StrCat("input 'grads[0]' (dy) must be ", y.ToString(), ", got ", ctx.input(3).ToString()));
  }
  if (ctx.num_inputs() == 5 && ctx.input(4) != lse) {
    return Invalid(absl::StrCat("input 'grads[1]' (dlse) must be ", lse.ToString(), ", got ",
                                ctx.input(4).ToString()));
  }
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("scaled_dot_product_attention_qkv_grad")
                       .Input("qkv")
                       .Input("y")
                       .Input("lse")
                       .VariadicInput("grads")
                       .Output("dqkv")
                       .Attr("causal", true)
                       .Attr("scale", 0.0)
                       .Attr("allow_tf32", false)
                       .Shape(PackedAttentionGradShape)
                       .Cost([](const CostContext& c) { return PackedAttentionFlops(c, 5); })
                       .NotDifferentiable()
                       .Doc("Backward of scaled_dot_product_attention_qkv: grads are dy, then dlse when lse has "
                            "a gradient; dqkv [B, T, 3, H, D] holds dq, dk, dv in q's, k's and v's slots, the "
                            "bits of scaled_dot_product_attention_grad's."));

}  // namespace
}  // namespace strata
