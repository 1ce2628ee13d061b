// The matmul family: matmul, its backward helpers for a 2-D b shared over a
// batched a, and matmul_accumulate (weight gradients summed by the GEMM).

#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"
#include "compiler/ops/nn_shape_checks.h"

namespace strata {
namespace {

using nn_shape_checks::Dims;
using nn_shape_checks::ExpectComputeFloatingArg;
using nn_shape_checks::ExpectRankArg;
using nn_shape_checks::ExpectSameDtypeArg;
using nn_shape_checks::Invalid;
using nn_shape_checks::SameSize;
using nn_shape_checks::StoredOutputDtype;

// Sizes of y = op(a) @ op(b) where op transposes the last two dims when asked
// (the rule is proto/shape_rules.h's, shared with the kernels); the dtypes
// are the schema's to check.
absl::StatusOr<MatmulDims> CheckMatmul(const ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectComputeFloatingArg(ctx, 0, "a"));
  STRATA_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, "b", 0, "a"));
  return ResolveMatmul(ctx.input(0).shape, ctx.input(1).shape, ctx.attr_bool("transpose_a"),
                       ctx.attr_bool("transpose_b"));
}

absl::Status MatmulShape(ShapeContext& ctx) {
  auto d = CheckMatmul(ctx);
  if (!d.ok()) return d.status();
  Shape y = d->batch;
  y.push_back(d->m);
  y.push_back(d->n);
  ctx.set_output(0, TensorType{ctx.input(0).dtype, y});
  return absl::OkStatus();
}

// Forward, either gradient or a gradient accumulated in place, the three
// tensors are [M,K], [K,N] and [M,N] (times any batch dims), so
// M*N*K = sqrt of their sizes' product: FLOPs = 2 * sqrt(|a| * |b| * |y|).
double MatmulCost(const CostContext& ctx) {
  return 2 * std::sqrt(ElementCount(ctx.input(0)) * ElementCount(ctx.input(1)) * ElementCount(ctx.output(0)));
}

// Attrs as canonicalized ops carry them (missing: the schema default false).
bool BoolAttrOf(const Op& op, const char* name) {
  auto it = op.attr().find(name);
  return it != op.attr().end() && it->second.b();
}

// y = op(a) @ op(b). With G = dL/dy:
//   da = G @ op(b)^T, laid out as op(a) is;  db = op(a)^T @ G, laid out as op(b) is.
absl::Status MatmulGrad(GradBuilder& g) {
  const std::string& dy = g.output_grad(0);
  if (dy.empty()) return absl::OkStatus();
  const bool ta = BoolAttrOf(g.op(), "transpose_a"), tb = BoolAttrOf(g.op(), "transpose_b");
  const bool shared_b = g.input_type(1).shape.size() == 2 && g.input_type(0).shape.size() > 2;
  auto attrs = [](bool a, bool b) {
    return std::map<std::string, AttrValue>{{"transpose_a", BoolAttr(a)}, {"transpose_b", BoolAttr(b)}};
  };
  if (g.needs_input_grad(0)) {
    if (!ta) {
      // da = G @ op(b)^T: b stays 2-D when shared, so this is one GEMM too.
      g.Emit("matmul", {dy, g.input(1)}, {g.input_grad(0)}, attrs(false, !tb));
    } else if (!shared_b) {
      // da = op(b) @ G^T
      g.Emit("matmul", {g.input(1), dy}, {g.input_grad(0)}, attrs(tb, true));
    } else {
      g.Emit("matmul_shared_b_grad_a", {dy, g.input(1)}, {g.input_grad(0)}, attrs(ta, tb));
    }
  }
  if (g.needs_input_grad(1)) {
    if (shared_b) {
      // db sums over a's batch: one GEMM over the flattened batch.
      g.Emit("matmul_shared_b_grad_b", {g.input(0), dy}, {g.input_grad(1)}, attrs(ta, tb));
    } else if (!tb) {
      // db = op(a)^T @ G
      g.Emit("matmul", {g.input(0), dy}, {g.input_grad(1)}, attrs(!ta, false));
    } else {
      // db = G^T @ op(a)
      g.Emit("matmul", {dy, g.input(0)}, {g.input_grad(1)}, attrs(true, ta));
    }
  }
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("matmul")
                       .Input("a")
                       .Input("b")
                       .Output("y")
                       .Attr("transpose_a", false)
                       .Attr("transpose_b", false)
                       .Attr("allow_tf32", false)
                       .Shape(MatmulShape)
                       .Cost(MatmulCost)
                       .Grad(MatmulGrad)
                       .Doc("y = op(a) @ op(b), op transposing the last two dims when asked. a: [..., M, K], "
                            "b: [K, N] shared over a's batch, or [..., K, N] with a's batch dims."));

// da for a batched, transposed a with a shared 2-D b: da[i] = op(b) @ dy[i]^T.
absl::Status MatmulSharedBGradAShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectComputeFloatingArg(ctx, 0, "dy"));
  STRATA_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, "b", 0, "dy"));
  const Dims& dy = ctx.input(0).shape;
  const Dims& b = ctx.input(1).shape;
  if (dy.size() < 3) return Invalid(absl::StrCat("input 'dy' must have rank >= 3, got ", ctx.input(0).ToString()));
  STRATA_RETURN_IF_ERROR(ExpectRankArg(ctx, 1, "b", 2, "[K, N]"));
  const bool ta = ctx.attr_bool("transpose_a"), tb = ctx.attr_bool("transpose_b");
  const int64_t k = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
  const int64_t m = dy[dy.size() - 2];
  if (!SameSize(dy.back(), n)) {
    return Invalid(absl::StrCat("input 'dy' ", ctx.input(0).ToString(), " must end in N=", n, " of 'b' ",
                                ctx.input(1).ToString()));
  }
  Dims da(dy.begin(), dy.end() - 2);
  if (ta) {
    da.push_back(k);
    da.push_back(m);
  } else {
    da.push_back(m);
    da.push_back(k);
  }
  ctx.set_output(0, TensorType{ctx.input(0).dtype, da});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("matmul_shared_b_grad_a")
                       .Input("dy")
                       .Input("b")
                       .Output("da")
                       .Attr("transpose_a", false)
                       .Attr("transpose_b", false)
                       .Attr("allow_tf32", false)
                       .Shape(MatmulSharedBGradAShape)
                       .Cost(MatmulCost)
                       .NotDifferentiable()
                       .Doc("Backward of matmul with a shared 2-D b: dL/da, laid out as a (attrs of the forward op)."));

// db for a shared 2-D b: sum over the batch of op(a[i])^T @ dy[i].
absl::Status MatmulSharedBGradBShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectComputeFloatingArg(ctx, 0, "a"));
  STRATA_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, "dy", 0, "a"));
  const Dims& a = ctx.input(0).shape;
  const Dims& dy = ctx.input(1).shape;
  if (a.size() < 2) return Invalid(absl::StrCat("input 'a' must have rank >= 2, got ", ctx.input(0).ToString()));
  if (dy.size() != a.size()) {
    return Invalid(absl::StrCat("input 'dy' ", ctx.input(1).ToString(), " must have the rank of 'a' ",
                                ctx.input(0).ToString()));
  }
  const bool ta = ctx.attr_bool("transpose_a"), tb = ctx.attr_bool("transpose_b");
  const size_t r = a.size();
  const int64_t m = ta ? a[r - 1] : a[r - 2], k = ta ? a[r - 2] : a[r - 1];
  for (size_t i = 0; i + 2 < r; ++i) {
    if (!SameSize(a[i], dy[i])) {
      return Invalid(absl::StrCat("batch dims of 'a' ", ctx.input(0).ToString(), " and 'dy' ",
                                  ctx.input(1).ToString(), " differ in dim ", i));
    }
  }
  if (!SameSize(dy[r - 2], m)) {
    return Invalid(absl::StrCat("input 'dy' ", ctx.input(1).ToString(), " must have M=", m, " rows like 'a' ",
                                ctx.input(0).ToString()));
  }
  const int64_t n = dy[r - 1];
  if (k < 0 || n < 0) {
    return Invalid(absl::StrCat("the shared weight's gradient needs static K and N, got 'a' ",
                                ctx.input(0).ToString(), " and 'dy' ", ctx.input(1).ToString()));
  }
  ctx.set_output(0, TensorType{ctx.input(0).dtype, tb ? Dims{n, k} : Dims{k, n}});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("matmul_shared_b_grad_b")
                       .Input("a")
                       .Input("dy")
                       .Output("db")
                       .Attr("transpose_a", false)
                       .Attr("transpose_b", false)
                       .Attr("allow_tf32", false)
                       .Shape(MatmulSharedBGradBShape)
                       .Cost(MatmulCost)
                       .NotDifferentiable()
                       .Doc("Backward of matmul with a shared 2-D b: dL/db summed over a's batch, laid out as b."));

// acc += op(a) @ op(b) for 2-D a and b: a weight gradient summed over
// micro-batches by the GEMM itself (beta = 1), instead of a matmul into a
// fresh tensor and an accumulate that reads both back (Megatron-LM's
// gradient_accumulation_fusion). The micro-batch pass writes it.
absl::Status MatmulAccumulateShape(ShapeContext& ctx) {
  auto d = CheckMatmul(ctx);
  if (!d.ok()) return d.status();
  if (!d->batch.empty() || ctx.input(1).shape.size() != 2) {
    return Invalid(absl::StrCat("inputs 'a' ", ctx.input(0).ToString(), " and 'b' ", ctx.input(1).ToString(),
                                " must be 2-D"));
  }
  const TensorType want{ctx.input(0).dtype, Dims{d->m, d->n}};
  if (ctx.input(2) != want) {
    return Invalid(absl::StrCat("accumulator ", ctx.input(2).ToString(), " does not hold op(a) @ op(b) ",
                                want.ToString()));
  }
  ctx.set_output(0, ctx.input(2));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("matmul_accumulate")
                       .Input("a")
                       .Input("b")
                       .Input("acc")
                       .Output("acc")
                       .Attr("transpose_a", false)
                       .Attr("transpose_b", false)
                       .Attr("allow_tf32", false)
                       .Shape(MatmulAccumulateShape)
                       .Cost(MatmulCost)
                       .Stateful()
                       .Doc("acc += op(a) @ op(b), in place, for 2-D a and b (weight gradients summed over "
                            "micro-batches)."));

// y = a @ op(b) + bias for a [..., M, K] and a 2-D b: what the epilogue
// fusion (passes/fuse_epilogues) makes of matmul -> add (and of matmul ->
// cast -> add under mixed precision). bias [N] has y's dtype: a's, or F32
// when a and b are BF16/F16 (products and sums in float, never rounded to
// the low precision on the way). A bias of BF16/F16 a's own type (what
// passes/cast_bias makes of a 16-bit-storing op) is widened and added in
// float too: y of that type is the float sum rounded once.
absl::Status MatmulBiasShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectComputeFloatingArg(ctx, 0, "a"));
  STRATA_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, "b", 0, "a"));
  STRATA_RETURN_IF_ERROR(ExpectRankArg(ctx, 1, "b", 2, "[K, N] or, with transpose_b, [N, K]"));
  STRATA_RETURN_IF_ERROR(ExpectRankArg(ctx, 2, "bias", 1, "[N]"));
  const DataType a = ctx.input(0).dtype, bias = ctx.input(2).dtype;
  if (bias != a && !(IsHalfFloating(a) && bias == F32)) {
    return Invalid(absl::StrCat("input 'bias' is ", DataTypeName(bias), ", expected ", DataTypeName(a),
                                IsHalfFloating(a) ? " or F32" : ""));
  }
  auto d = ResolveMatmul(ctx.input(0).shape, ctx.input(1).shape, false, ctx.attr_bool("transpose_b"));
  if (!d.ok()) return d.status();
  if (!SameSize(ctx.input(2).shape[0], d->n)) {
    return Invalid(absl::StrCat("input 'bias' ", ctx.input(2).ToString(), " must have the N=", d->n, " of y"));
  }
  Shape y = d->batch;
  y.push_back(d->m);
  y.push_back(d->n);
  ctx.set_output(0, TensorType{bias, y});
  return absl::OkStatus();
}

// out_dtype "BF16" / "F16" (passes/fold_casts): y computed as without it,
// in float from 16-bit a and b and an F32 bias, then stored rounded to a's
// 16-bit type, as the cast it replaces would round it. Output `stored`'s
// dtype becomes that type.
absl::Status StoreOutputLow(ShapeContext& ctx, int stored) {
  const std::string name = ctx.attr_string("out_dtype");
  if (name.empty()) return absl::OkStatus();
  STRATA_ASSIGN_OR_RETURN(const DataType dtype, StoredOutputDtype(ctx, 2, "bias"));
  if (dtype != ctx.input(0).dtype) {
    return Invalid(absl::StrCat("attr 'out_dtype' ", name, " must be the 16-bit type of 'a' and 'b', got ",
                                ctx.input(0).ToString()));
  }
  ctx.set_output(stored, TensorType{dtype, ctx.outputs()[stored].shape});
  return absl::OkStatus();
}

// matmul_bias's optional `residual` (passes/fuse_epilogues): y's type
// exactly (no broadcasting), a float y (F32 or F64), and no out_dtype (the
// sum is the float y; cuBLASLt's C has D's type).
absl::Status ExpectResidual(ShapeContext& ctx) {
  const TensorType& y = ctx.outputs()[0];
  if (ctx.input(3) != y) {
    return Invalid(absl::StrCat("input 'residual' must have the type of y (", y.ToString(), "), got ",
                                ctx.input(3).ToString()));
  }
  if (y.dtype != F32 && y.dtype != F64) {
    return Invalid(absl::StrCat("input 'residual' needs an F32 or F64 y, got ", y.ToString()));
  }
  if (!ctx.attr_string("out_dtype").empty()) {
    return Invalid("input 'residual' and attr 'out_dtype' do not go together: the sum is stored in y's float type");
  }
  return absl::OkStatus();
}

absl::Status MatmulBiasStoredShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(MatmulBiasShape(ctx));
  if (ctx.num_inputs() > 3) STRATA_RETURN_IF_ERROR(ExpectResidual(ctx));
  return StoreOutputLow(ctx, 0);
}

// As matmul's for a and b (transpose_a false), and bias's the sum of dy
// down to [N]. With low-precision a and b under a float y there is none:
// the fusion runs after autodiff, and a program asks for one only by
// writing such an op itself.
absl::Status MatmulBiasGrad(GradBuilder& g) {
  const std::string& dy = g.output_grad(0);
  if (dy.empty()) return absl::OkStatus();
  if (auto stored = g.op().attr().find("out_dtype"); stored != g.op().attr().end() && !stored->second.s().empty()) {
    return absl::InvalidArgumentError(
        "matmul_bias with out_dtype has no gradient: fold-casts sets it after autodiff; write matmul_bias then cast");
  }
  if (g.op().input_size() > 3) {
    return absl::InvalidArgumentError(
        "matmul_bias with a residual has no gradient: fuse-epilogues sets it after autodiff; write matmul_bias then "
        "add");
  }
  if (IsHalfFloating(g.input_type(2).dtype) && g.needs_input_grad(2)) {
    // (A, b and dy of one 16-bit type: their gradients are matmul's.)
    return absl::InvalidArgumentError(absl::StrCat("matmul_bias with a ", DataTypeName(g.input_type(2).dtype),
                                                   " bias has no gradient for it: cast-bias makes it after "
                                                   "autodiff; write matmul, cast and add"));
  }
  if (g.input_type(0).dtype != g.input_type(2).dtype) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_bias of ", DataTypeName(g.input_type(0).dtype),
                                                   " operands into ", DataTypeName(g.input_type(2).dtype),
                                                   " has no gradient; write matmul, cast and add"));
  }
  STRATA_RETURN_IF_ERROR(MatmulGrad(g));
  if (g.needs_input_grad(2)) g.Emit("sum_to_like", {dy, g.input(2)}, {g.input_grad(2)});
  return absl::OkStatus();
}

double MatmulBiasCost(const CostContext& ctx) {
  // The epilogue's pass over y, and the residual's (read as cuBLASLt's C).
  return MatmulCost(ctx) + ElementCount(ctx.output(0)) * (ctx.num_inputs() > 3 ? 2 : 1);
}

STRATA_REGISTER_OP(OpDef("matmul_bias")
                       .Input("a")
                       .Input("b")
                       .Input("bias")
                       .OptionalInput("residual")
                       .Output("y")
                       .Attr("transpose_b", false)
                       .Attr("allow_tf32", false)
                       .Attr("out_dtype", "")
                       .Shape(MatmulBiasStoredShape)
                       .Cost(MatmulBiasCost)
                       .Grad(MatmulBiasGrad)
                       .Doc("y = a @ op(b) + bias: a [..., M, K], b [K, N] (or [N, K] with transpose_b) shared over "
                            "a's batch, bias [N] of y's dtype (a's, or F32 for BF16/F16 a and b; a BF16/F16 bias is "
                            "added in float, y rounded once). What the epilogue "
                            "fusion makes of matmul then add on a GPU. out_dtype \"BF16\" or \"F16\" (a's 16-bit "
                            "type, F32 bias) stores y rounded to that type, as a cast after it would "
                            "(passes/fold_casts). With `residual` (y's type, F32 or F64; no out_dtype), y is "
                            "residual + (a @ op(b) + bias), the add after it summed in the epilogue: a residual "
                            "connection's add (passes/fuse_epilogues; no gradient, the fusion runs after autodiff)."));

// The weight and bias gradients of y = a @ op(b) + bias, from the forward's
// a [..., M, K] and dy [..., M, N] (a's batch dims): db = the sum over a's
// folded rows of a^T @ dy, laid out as b ([K, N], or [N, K] with
// transpose_b), and dbias [N] = dy summed over every dim but the last. What
// the epilogue fusion (passes/fuse_epilogues) makes of the weight-gradient
// GEMM and the bias's sum_to_like over the same dy (cuBLASLt's BGRAD
// epilogue). With BF16/F16 a and dy both outputs are F32: the GEMM's sums
// never rounded to the low precision, the bias's sum over dy as given.
absl::Status MatmulBiasGradBShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(MatmulSharedBGradBShape(ctx));  // transpose_a: none, so false
  const DataType a = ctx.input(0).dtype;
  const DataType out = IsHalfFloating(a) ? F32 : a;
  const int64_t n = ctx.input(1).shape.back();
  ctx.set_output(0, TensorType{out, ctx.outputs()[0].shape});
  ctx.set_output(1, TensorType{out, Dims{n}});
  return absl::OkStatus();
}

// The GEMM's, plus the sum over dy.
double MatmulBiasGradBCost(const CostContext& ctx) { return MatmulCost(ctx) + ElementCount(ctx.input(1)); }

STRATA_REGISTER_OP(OpDef("matmul_bias_grad_b")
                       .Input("a")
                       .Input("dy")
                       .Output("db")
                       .Output("dbias")
                       .Attr("transpose_b", false)
                       .Attr("allow_tf32", false)
                       .Shape(MatmulBiasGradBShape)
                       .Cost(MatmulBiasGradBCost)
                       .NotDifferentiable()
                       .Doc("Backward of y = a @ op(b) + bias for a [..., M, K] and a 2-D b: db = a^T @ dy summed "
                            "over a's batch, laid out as b, and dbias [N] = dy summed over every dim but the last. "
                            "F32 outputs for BF16/F16 a and dy. What the epilogue fusion makes of the weight "
                            "gradient's GEMM and the bias gradient's sum_to_like on a GPU."));

// (y, z) = (gelu(z), a @ op(b) + bias), gelu's tanh form: what the epilogue
// fusion makes of matmul_bias (or matmul -> add) -> gelu(approximate "tanh")
// on a GPU (cuBLASLt's GELU_AUX_BIAS, whose GELU is that form). z is the
// pre-activation the backward's gelu_grad reads; both have matmul_bias's y
// type: F32 or F64, or with a bias of 16-bit a's type (passes/cast_bias)
// that type, z summed in float and y the gelu of the float z.
absl::Status MatmulBiasGeluShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(MatmulBiasShape(ctx));
  // z has the bias's type (MatmulBiasShape: a's, or F32 beside 16-bit a);
  // out_dtype and z_dtype need an F32 bias below.
  const TensorType z = ctx.outputs()[0];
  ctx.set_output(1, z);
  STRATA_RETURN_IF_ERROR(StoreOutputLow(ctx, 0));  // y
  // z_dtype "BF16" / "F16" (passes/fuse_epilogues, for a gelu mixed
  // precision runs in the low dtype): z stored rounded to a's 16-bit type,
  // y still the gelu of the float z.
  const std::string z_dtype = ctx.attr_string("z_dtype");
  if (z_dtype.empty()) return absl::OkStatus();
  DataType stored = DT_INVALID;
  if (!DataType_Parse(z_dtype, &stored) || (stored != BF16 && stored != F16) || stored != ctx.input(0).dtype ||
      ctx.input(2).dtype != F32) {
    return Invalid(absl::StrCat("attr 'z_dtype' must be \"\" or the 16-bit type of 'a' and 'b' over an F32 'bias', "
                                "got \"", z_dtype, "\" for ", ctx.input(0).ToString(), " and bias ",
                                ctx.input(2).ToString()));
  }
  ctx.set_output(1, TensorType{stored, z.shape});
  return absl::OkStatus();
}

// matmul_bias's, plus the gelu's pass over the output.
double MatmulBiasGeluCost(const CostContext& ctx) { return MatmulBiasCost(ctx) + ElementCount(ctx.output(0)); }

STRATA_REGISTER_OP(OpDef("matmul_bias_gelu")
                       .Input("a")
                       .Input("b")
                       .Input("bias")
                       .Output("y")
                       .Output("z")
                       .Attr("transpose_b", false)
                       .Attr("allow_tf32", false)
                       .Attr("out_dtype", "")
                       .Attr("z_dtype", "")
                       .Shape(MatmulBiasGeluShape)
                       .Cost(MatmulBiasGeluCost)
                       .NotDifferentiable()
                       .Doc("z = a @ op(b) + bias as matmul_bias computes it, and y = gelu(z) in the tanh form "
                            "(gelu's approximate \"tanh\"): a [..., M, K], a 2-D b, bias [N]; y and z F32 or F64, "
                            "or BF16/F16 for a bias of BF16/F16 a's type (z summed in float, y the gelu of the "
                            "float z, each rounded once). What the epilogue fusion makes of matmul, add and a "
                            "tanh-form gelu on a GPU, after autodiff (z stays for the backward's gelu_grad). "
                            "out_dtype \"BF16\" or \"F16\" (a's 16-bit type) stores y rounded to that type "
                            "(passes/fold_casts); z_dtype, the same type, stores z rounded (y stays the gelu of "
                            "the float z: cuBLASLt's aux in D's type)."));

// dz = gelu'(z) * (a @ op(b)), gelu's tanh form, for a [..., M, K], a 2-D b
// and z [..., M, N] of a's dtype: what the epilogue fusion makes of the
// GEMM of a gelu's output gradient (matmul(dy, W, transpose_b) in the
// backward of W's layer) and the gelu_grad(z, ·) reading it alone, on a GPU
// cuBLASLt's DGELU epilogue (its aux z). The product stays in the
// accumulation type (float for BF16/F16 operands, never rounded to 16 bits
// before the derivative multiplies it); dz has z's type, rounded once.
absl::Status MatmulGeluGradShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectComputeFloatingArg(ctx, 0, "a"));
  STRATA_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, "b", 0, "a"));
  STRATA_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 2, "z", 0, "a"));
  STRATA_RETURN_IF_ERROR(ExpectRankArg(ctx, 1, "b", 2, "[K, N] or, with transpose_b, [N, K]"));
  auto d = ResolveMatmul(ctx.input(0).shape, ctx.input(1).shape, false, ctx.attr_bool("transpose_b"));
  if (!d.ok()) return d.status();
  Shape y = d->batch;
  y.push_back(d->m);
  y.push_back(d->n);
  const Dims& z = ctx.input(2).shape;
  bool same = z.size() == y.size();
  for (size_t i = 0; same && i < z.size(); ++i) same = SameSize(z[i], y[i]);
  if (!same) {
    return Invalid(absl::StrCat("input 'z' ", ctx.input(2).ToString(), " must have the shape of a @ op(b) [",
                                absl::StrJoin(y, ", "), "]"));
  }
  ctx.set_output(0, TensorType{ctx.input(0).dtype, y});
  return absl::OkStatus();
}

// The GEMM's, plus the derivative's pass over z.
double MatmulGeluGradCost(const CostContext& ctx) { return MatmulCost(ctx) + ElementCount(ctx.input(2)); }

STRATA_REGISTER_OP(OpDef("matmul_gelu_grad")
                       .Input("a")
                       .Input("b")
                       .Input("z")
                       .Output("dz")
                       .Attr("transpose_b", false)
                       .Attr("allow_tf32", false)
                       .Shape(MatmulGeluGradShape)
                       .Cost(MatmulGeluGradCost)
                       .NotDifferentiable()
                       .Doc("dz = gelu_grad(z, a @ op(b)) in the tanh form (gelu's approximate \"tanh\"): a [..., M, "
                            "K], a 2-D b, z [..., M, N]; a, b, z and dz of one dtype. The product is kept in the "
                            "accumulation type (float for BF16/F16) and dz rounded once. What the epilogue fusion "
                            "makes of a GEMM whose output only a tanh-form gelu_grad reads, after autodiff "
                            "(cuBLASLt's DGELU epilogue on a GPU)."));

}  // namespace
}  // namespace strata
