// Neural-network family: matmul, conv2d, pooling, layer_norm, losses,
// accuracy, dropout and embedding, with their backward helper ops.
//
// Shape functions reject every shape, dtype and attr value their kernels
// cannot handle, so kernels (kernels/cpu/<op>.cc) only re-check what the
// batch dimension (-1 here) may change at run time.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"

namespace strata {
namespace {

#define STRATA_NN_RETURN_IF_ERROR(expr) \
  do {                                  \
    absl::Status _status = (expr);      \
    if (!_status.ok()) return _status;  \
  } while (0)

using Dims = Shape;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

std::string DimsString(const Dims& d) { return absl::StrCat("[", absl::StrJoin(d, ", "), "]"); }

// Messages name the schema's argument, not its index.
absl::Status ExpectFloatingArg(const ShapeContext& ctx, int i, const char* name) {
  if (!IsFloating(ctx.input(i).dtype)) {
    return Invalid(absl::StrCat("input '", name, "' must be F32 or F64, got ", ctx.input(i).ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectDtypeArg(const ShapeContext& ctx, int i, const char* name, DataType dtype) {
  if (ctx.input(i).dtype != dtype) {
    return Invalid(absl::StrCat("input '", name, "' must be ", DataTypeName(dtype), ", got ",
                                ctx.input(i).ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectSameDtypeArg(const ShapeContext& ctx, int i, const char* name, int like, const char* like_name) {
  if (ctx.input(i).dtype != ctx.input(like).dtype) {
    return Invalid(absl::StrCat("input '", name, "' (", ctx.input(i).ToString(), ") must have the dtype of '",
                                like_name, "' (", ctx.input(like).ToString(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ExpectSameTypeArg(const ShapeContext& ctx, int i, const char* name, int like, const char* like_name) {
  if (ctx.input(i) != ctx.input(like)) {
    return Invalid(absl::StrCat("input '", name, "' must have the type of '", like_name, "' (",
                                ctx.input(like).ToString(), "), got ", ctx.input(i).ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectRankArg(const ShapeContext& ctx, int i, const char* name, int rank, const char* layout) {
  if (static_cast<int>(ctx.input(i).shape.size()) != rank) {
    return Invalid(absl::StrCat("input '", name, "' must have rank ", rank, " ", layout, ", got ",
                                ctx.input(i).ToString()));
  }
  return absl::OkStatus();
}

// Dims [from, rank) of input i must be known (> 0): only the batch dim may be -1.
absl::Status ExpectStaticDims(const ShapeContext& ctx, int i, const char* name, int from) {
  const Dims& s = ctx.input(i).shape;
  for (size_t d = from; d < s.size(); ++d) {
    if (s[d] <= 0) {
      return Invalid(absl::StrCat("input '", name, "' needs a known, positive size in dim ", d, ", got ",
                                  ctx.input(i).ToString()));
    }
  }
  return absl::OkStatus();
}

absl::Status ExpectScalarArg(const ShapeContext& ctx, int i, const char* name, DataType dtype) {
  const TensorType& t = ctx.input(i);
  if (t.dtype != dtype || !t.shape.empty()) {
    return Invalid(absl::StrCat("input '", name, "' must be a ", DataTypeName(dtype), " scalar (shape []), got ",
                                t.ToString()));
  }
  return absl::OkStatus();
}

// Two static sizes agree if equal; -1 (the batch dim) only agrees with -1.
bool SameSize(int64_t a, int64_t b) { return a == b; }

// A pair attr (one value per spatial dim) with every value >= `min`.
absl::StatusOr<Dims> PairAttr(const ShapeContext& ctx, const char* attr, int64_t min) {
  const std::vector<int64_t> attr_value = ctx.attr_ints(attr);
  Dims v(attr_value.begin(), attr_value.end());
  if (v.size() != 2) {
    return Invalid(absl::StrCat("attr '", attr, "' must hold 2 ints (height, width), got ", DimsString(v)));
  }
  for (int64_t x : v) {
    if (x < min) return Invalid(absl::StrCat("attr '", attr, "' values must be >= ", min, ", got ", DimsString(v)));
  }
  return v;
}

// ---------------------------------------------------------------------------
// matmul

// Sizes of y = op(a) @ op(b) where op transposes the last two dims when asked.
struct MatmulDims {
  Dims batch;  // a's leading dims (y's leading dims)
  int64_t m, k, n;
};

absl::StatusOr<MatmulDims> CheckMatmul(const ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, "a"));
  STRATA_NN_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, "b", 0, "a"));
  const Dims& a = ctx.input(0).shape;
  const Dims& b = ctx.input(1).shape;
  if (a.size() < 2) return Invalid(absl::StrCat("input 'a' must have rank >= 2, got ", ctx.input(0).ToString()));
  if (b.size() < 2) return Invalid(absl::StrCat("input 'b' must have rank >= 2, got ", ctx.input(1).ToString()));
  MatmulDims d;
  if (b.size() > 2) {
    if (a.size() != b.size()) {
      return Invalid(absl::StrCat("a batched 'b' (", ctx.input(1).ToString(), ") needs 'a' of the same rank, got ",
                                  ctx.input(0).ToString(), " (or make 'b' 2-D to share it over a's batch)"));
    }
    for (size_t i = 0; i + 2 < a.size(); ++i) {
      if (!SameSize(a[i], b[i])) {
        return Invalid(absl::StrCat("batch dims of 'a' ", ctx.input(0).ToString(), " and 'b' ",
                                    ctx.input(1).ToString(), " differ in dim ", i));
      }
    }
  }
  const bool ta = ctx.attr_bool("transpose_a"), tb = ctx.attr_bool("transpose_b");
  const size_t ra = a.size(), rb = b.size();
  d.batch.assign(a.begin(), a.end() - 2);
  d.m = ta ? a[ra - 1] : a[ra - 2];
  d.k = ta ? a[ra - 2] : a[ra - 1];
  const int64_t kb = tb ? b[rb - 1] : b[rb - 2];
  d.n = tb ? b[rb - 2] : b[rb - 1];
  if (!SameSize(d.k, kb)) {
    return Invalid(absl::StrCat("inner dims differ: 'a' ", ctx.input(0).ToString(), (ta ? " (transposed)" : ""),
                                " contributes K=", d.k, " but 'b' ", ctx.input(1).ToString(),
                                (tb ? " (transposed)" : ""), " contributes K=", kb));
  }
  return d;
}

absl::Status MatmulShape(ShapeContext& ctx) {
  auto d = CheckMatmul(ctx);
  if (!d.ok()) return d.status();
  Dims y = d->batch;
  y.push_back(d->m);
  y.push_back(d->n);
  ctx.set_output(0, TensorType{ctx.input(0).dtype, y});
  return absl::OkStatus();
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
                       .Shape(MatmulShape)
                       .Grad(MatmulGrad)
                       .Doc("y = op(a) @ op(b), op transposing the last two dims when asked. a: [..., M, K], "
                            "b: [K, N] shared over a's batch, or [..., K, N] with a's batch dims."));

// da for a batched, transposed a with a shared 2-D b: da[i] = op(b) @ dy[i]^T.
absl::Status MatmulSharedBGradAShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, "dy"));
  STRATA_NN_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, "b", 0, "dy"));
  const Dims& dy = ctx.input(0).shape;
  const Dims& b = ctx.input(1).shape;
  if (dy.size() < 3) return Invalid(absl::StrCat("input 'dy' must have rank >= 3, got ", ctx.input(0).ToString()));
  STRATA_NN_RETURN_IF_ERROR(ExpectRankArg(ctx, 1, "b", 2, "[K, N]"));
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
                       .Shape(MatmulSharedBGradAShape)
                       .NotDifferentiable()
                       .Doc("Backward of matmul with a shared 2-D b: dL/da, laid out as a (attrs of the forward op)."));

// db for a shared 2-D b: sum over the batch of op(a[i])^T @ dy[i].
absl::Status MatmulSharedBGradBShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, "a"));
  STRATA_NN_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, "dy", 0, "a"));
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
                       .Shape(MatmulSharedBGradBShape)
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
                       .Shape(MatmulAccumulateShape)
                       .Stateful()
                       .Doc("acc += op(a) @ op(b), in place, for 2-D a and b (weight gradients summed over "
                            "micro-batches)."));

// ---------------------------------------------------------------------------
// conv2d

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

// Inputs 0 and 1 of a conv op: one floating dtype, each of its ConvArg form.
absl::Status CheckConvInputs(const ShapeContext& ctx, const ConvArg& a, const ConvArg& b) {
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, a.name));
  STRATA_NN_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, b.name, 0, a.name));
  STRATA_NN_RETURN_IF_ERROR(ExpectRankArg(ctx, 0, a.name, 4, a.layout));
  STRATA_NN_RETURN_IF_ERROR(ExpectRankArg(ctx, 1, b.name, 4, b.layout));
  STRATA_NN_RETURN_IF_ERROR(ExpectStaticDims(ctx, 0, a.name, a.batched ? 1 : 0));
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
  const int64_t span = dilation * (kernel - 1) + 1;
  if (in + 2 * pad < span) {
    return Invalid(absl::StrCat("the ", dim, " of the (dilated) kernel, ", span, ", exceeds the padded input ", dim,
                                " ", in, " + 2*", pad, ": the output would be empty"));
  }
  return (in + 2 * pad - span) / stride + 1;
}

// [N, O, Ho, Wo] of conv2d on x [N, C, H, W] with w [O, C/groups, kh, kw].
absl::StatusOr<Dims> ConvOutput(const ConvAttrs& a, const Dims& x, const Dims& w) {
  if (x[1] != w[1] * a.groups) {
    return Invalid(absl::StrCat("'x' has ", x[1], " channels but 'w' ", DimsString(w), " with groups=", a.groups,
                                " expects ", w[1] * a.groups, " (w's dim 1 times groups)"));
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

absl::Status Conv2dShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(CheckConvInputs(ctx, kConvX, kConvW));
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
                       .Grad(Conv2dGrad)
                       .Doc("2-D cross-correlation, NCHW: x [N, C, H, W], w [O, C/groups, kh, kw] -> "
                            "[N, O, Ho, Wo]; symmetric zero padding. No bias: add a [O, 1, 1] one."));

absl::Status Conv2dGradInputShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(CheckConvInputs(ctx, kConvDy, kConvW));
  auto a = ReadConvAttrs(ctx);
  if (!a.ok()) return a.status();
  auto in = PairAttr(ctx, "input_size", 1);
  if (!in.ok()) return in.status();
  const Dims& dy = ctx.input(0).shape;
  const Dims& w = ctx.input(1).shape;
  Dims x{dy[0], w[1] * a->groups, (*in)[0], (*in)[1]};
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
                       .NotDifferentiable()
                       .Doc("Backward of conv2d: dL/dx [N, C, H, W] with [H, W] = input_size."));

absl::Status Conv2dGradFilterShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(CheckConvInputs(ctx, kConvX, kConvDy));
  auto a = ReadConvAttrs(ctx);
  if (!a.ok()) return a.status();
  auto k = PairAttr(ctx, "filter_size", 1);
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
                       .NotDifferentiable()
                       .Doc("Backward of conv2d: dL/dw [O, C/groups, kh, kw] with [kh, kw] = filter_size, "
                            "summed over the batch."));

// ---------------------------------------------------------------------------
// max_pool2d, avg_pool2d

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
    if (a.paddings[i] * 2 > a.kernel[i]) {
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
    y[2 + i] = (in - a.kernel[i]) / a.strides[i] + 1;
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
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, i, name));
  STRATA_NN_RETURN_IF_ERROR(ExpectRankArg(ctx, i, name, 4, "[N, C, H, W]"));
  return ExpectStaticDims(ctx, i, name, 1);
}

absl::Status Pool2dShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(CheckPoolInput(ctx, 0, "x"));
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
  STRATA_NN_RETURN_IF_ERROR(CheckPoolInput(ctx, 0, "x"));
  STRATA_NN_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, 1, "dy", 0, "x"));
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
  STRATA_NN_RETURN_IF_ERROR(CheckPoolInput(ctx, 0, "dy"));
  auto in = PairAttr(ctx, "input_size", 1);
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

// ---------------------------------------------------------------------------
// layer_norm

absl::Status CheckLayerNormArgs(const ShapeContext& ctx, int x, int gamma) {
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, x, "x"));
  const Dims& xs = ctx.input(x).shape;
  if (xs.empty() || xs.back() <= 0) {
    return Invalid(absl::StrCat("input 'x' needs rank >= 1 and a known last dim to normalize over, got ",
                                ctx.input(x).ToString()));
  }
  STRATA_NN_RETURN_IF_ERROR(ExpectSameDtypeArg(ctx, gamma, "gamma", x, "x"));
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
  STRATA_NN_RETURN_IF_ERROR(CheckLayerNormArgs(ctx, 0, 1));
  STRATA_NN_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 2, "beta", 1, "gamma"));
  STRATA_NN_RETURN_IF_ERROR(ExpectEpsilon(ctx));
  ctx.set_output(0, ctx.input(0));
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
  g.Emit("layer_norm_grad", {g.input(0), g.input(1), dy}, outs, g.ForwardAttrs());
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("layer_norm")
                       .Input("x")
                       .Input("gamma")
                       .Input("beta")
                       .Output("y")
                       .Attr("epsilon", 1e-5)
                       .Shape(LayerNormShape)
                       .Grad(LayerNormGrad)
                       .Doc("y = (x - mean) / sqrt(var + epsilon) * gamma + beta over x's last dim (biased var)."));

absl::Status LayerNormGradShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(CheckLayerNormArgs(ctx, 0, 1));
  STRATA_NN_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 2, "dy", 0, "x"));
  STRATA_NN_RETURN_IF_ERROR(ExpectEpsilon(ctx));
  ctx.set_output(0, ctx.input(0));
  ctx.set_output(1, ctx.input(1));
  ctx.set_output(2, ctx.input(1));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("layer_norm_grad")
                       .Input("x")
                       .Input("gamma")
                       .Input("dy")
                       .Output("dx")
                       .Output("dgamma")
                       .Output("dbeta")
                       .Attr("epsilon", 1e-5)
                       .Shape(LayerNormGradShape)
                       .NotDifferentiable()
                       .Doc("Backward of layer_norm, recomputing mean and rstd from x."));

// ---------------------------------------------------------------------------
// Losses and metrics over logits [..., C] and I64 labels [...].

absl::Status CheckLogitsAndLabel(const ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, "logits"));
  const Dims& logits = ctx.input(0).shape;
  if (logits.size() < 2 || logits.back() <= 0) {
    return Invalid(absl::StrCat("input 'logits' must be [N, C] with a known number of classes C, got ",
                                ctx.input(0).ToString()));
  }
  STRATA_NN_RETURN_IF_ERROR(ExpectDtypeArg(ctx, 1, "label", I64));
  Dims want(logits.begin(), logits.end() - 1);
  if (ctx.input(1).shape != want) {
    return Invalid(absl::StrCat("input 'label' must have shape ", DimsString(want),
                                " (logits without the class dim), got ", ctx.input(1).ToString()));
  }
  return absl::OkStatus();
}

absl::Status ScalarLossShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(CheckLogitsAndLabel(ctx));
  ctx.set_output(0, TensorType{ctx.input(0).dtype, {}});
  return absl::OkStatus();
}

// dlogits = (softmax(logits) - onehot(label)) / N * dloss
absl::Status SoftmaxCrossEntropyGrad(GradBuilder& g) {
  if (g.output_grad(0).empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  g.Emit("softmax_cross_entropy_grad", {g.input(0), g.input(1), g.output_grad(0)}, {g.input_grad(0)});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("softmax_cross_entropy")
                       .Input("logits")
                       .Input("label")
                       .Output("loss")
                       .Shape(ScalarLossShape)
                       .Grad(SoftmaxCrossEntropyGrad)
                       .Doc("Mean over samples of -log softmax(logits)[label]; logits [N, C], label [N] I64 in "
                            "[0, C) (checked at run time)."));

absl::Status SoftmaxCrossEntropyGradShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(CheckLogitsAndLabel(ctx));
  STRATA_NN_RETURN_IF_ERROR(ExpectScalarArg(ctx, 2, "dloss", ctx.input(0).dtype));
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("softmax_cross_entropy_grad")
                       .Input("logits")
                       .Input("label")
                       .Input("dloss")
                       .Output("dlogits")
                       .Shape(SoftmaxCrossEntropyGradShape)
                       .NotDifferentiable()
                       .Doc("Backward of softmax_cross_entropy: (softmax(logits) - onehot(label)) / N * dloss."));

absl::Status AccuracyShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(CheckLogitsAndLabel(ctx));
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
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, "pred"));
  STRATA_NN_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 1, "target", 0, "pred"));
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
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, "pred"));
  STRATA_NN_RETURN_IF_ERROR(ExpectSameTypeArg(ctx, 1, "target", 0, "pred"));
  STRATA_NN_RETURN_IF_ERROR(ExpectScalarArg(ctx, 2, "dloss", ctx.input(0).dtype));
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

// ---------------------------------------------------------------------------
// dropout

absl::Status DropoutShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 0, ctx.op().type() == "dropout" ? "x" : "dy"));
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

// ---------------------------------------------------------------------------
// embedding

absl::Status EmbeddingShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(ExpectDtypeArg(ctx, 0, "ids", I64));
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 1, "table"));
  STRATA_NN_RETURN_IF_ERROR(ExpectRankArg(ctx, 1, "table", 2, "[V, D]"));
  STRATA_NN_RETURN_IF_ERROR(ExpectStaticDims(ctx, 1, "table", 0));
  Dims y = ctx.input(0).shape;
  y.push_back(ctx.input(1).shape[1]);
  ctx.set_output(0, TensorType{ctx.input(1).dtype, y});
  return absl::OkStatus();
}

// dtable[v] = sum of dy over the positions whose id is v.
absl::Status EmbeddingGrad(GradBuilder& g) {
  if (g.output_grad(0).empty() || !g.needs_input_grad(1)) return absl::OkStatus();
  g.Emit("embedding_grad", {g.input(0), g.output_grad(0)}, {g.input_grad(1)},
         {{"num_embeddings", IntAttr(g.input_type(1).shape[0])}});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("embedding")
                       .Input("ids")
                       .Input("table")
                       .Output("y")
                       .Shape(EmbeddingShape)
                       .Grad(EmbeddingGrad)
                       .Doc("Rows of table [V, D] picked by I64 ids [...] -> [..., D]; ids outside [0, V) are "
                            "an error at run time."));

absl::Status EmbeddingGradShape(ShapeContext& ctx) {
  STRATA_NN_RETURN_IF_ERROR(ExpectDtypeArg(ctx, 0, "ids", I64));
  STRATA_NN_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 1, "dy"));
  const Dims& ids = ctx.input(0).shape;
  const Dims& dy = ctx.input(1).shape;
  if (dy.size() != ids.size() + 1 || !std::equal(ids.begin(), ids.end(), dy.begin()) || dy.back() <= 0) {
    return Invalid(absl::StrCat("input 'dy' must have the shape of 'ids' ", ctx.input(0).ToString(),
                                " plus a known embedding dim, got ", ctx.input(1).ToString()));
  }
  const int64_t v = ctx.attr_int("num_embeddings");
  if (v < 1) return Invalid(absl::StrCat("attr 'num_embeddings' must be >= 1, got ", v));
  ctx.set_output(0, TensorType{ctx.input(1).dtype, {v, dy.back()}});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("embedding_grad")
                       .Input("ids")
                       .Input("dy")
                       .Output("dtable")
                       .Attr("num_embeddings", AttrType::kInt)
                       .Shape(EmbeddingGradShape)
                       .NotDifferentiable()
                       .Doc("Backward of embedding: dense [num_embeddings, D] scatter-add of dy by ids."));

}  // namespace
}  // namespace strata
