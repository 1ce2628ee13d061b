// The "math" family: elementwise arithmetic with broadcasting, activations,
// softmax, reductions and small utility ops, with their backward helpers.
// The axis rules of softmax and the reductions live in proto/shape_rules.h,
// where their kernels use them too.

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"
#include "compiler/ops/nn_shape_checks.h"
#include "proto/shape_rules.h"

namespace strata {
namespace {

// ---------------------------------------------------------------------------
// Shape helpers. Messages name the argument or attr; the caller prefixes the
// op's location.

std::string DtypeList(const std::vector<DataType>& dtypes) {
  std::vector<std::string> names;
  for (DataType d : dtypes) names.push_back(DataTypeName(d));
  if (names.size() == 1) return names[0];
  std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

absl::Status ExpectDtype(const ShapeContext& ctx, int i, const char* name, std::initializer_list<DataType> allowed) {
  DataType d = ctx.input(i).dtype;
  if (std::find(allowed.begin(), allowed.end(), d) == allowed.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input '", name, "' must be ", DtypeList(std::vector<DataType>(allowed)), ", got ",
                     DataTypeName(d)));
  }
  return absl::OkStatus();
}

absl::Status ExpectFloat(const ShapeContext& ctx, int i, const char* name) {
  return ExpectDtype(ctx, i, name, {F32, F64});
}

absl::Status ExpectValidDtype(const ShapeContext& ctx, int i, const char* name) {
  return ExpectDtype(ctx, i, name, {F32, F64, I64, I32, BOOL});
}

absl::Status ExpectSameDtype(const ShapeContext& ctx, int a, const char* a_name, int b, const char* b_name) {
  if (ctx.input(a).dtype != ctx.input(b).dtype) {
    return absl::InvalidArgumentError(absl::StrCat("input '", a_name, "' is ", DataTypeName(ctx.input(a).dtype),
                                                   " but '", b_name, "' is ", DataTypeName(ctx.input(b).dtype),
                                                   "; they must match"));
  }
  return absl::OkStatus();
}

// z = f(x, y) with numpy broadcasting over the given dtypes.
ShapeFn BinaryShape(std::initializer_list<DataType> allowed) {
  std::vector<DataType> dtypes(allowed);
  return [dtypes](ShapeContext& ctx) -> absl::Status {
    if (auto s = ExpectSameDtype(ctx, 0, "x", 1, "y"); !s.ok()) return s;
    if (std::find(dtypes.begin(), dtypes.end(), ctx.input(0).dtype) == dtypes.end()) {
      return absl::InvalidArgumentError(absl::StrCat("inputs 'x' and 'y' must be ", DtypeList(dtypes), ", got ",
                                                     DataTypeName(ctx.input(0).dtype)));
    }
    auto shape = BroadcastShapes(ctx.input(0).shape, ctx.input(1).shape);
    if (!shape.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("x ", ShapeString(ctx.input(0).shape), " and y ",
                                                     ShapeString(ctx.input(1).shape),
                                                     " do not broadcast (numpy rules; -1 is the batch dim)"));
    }
    ctx.set_output(0, TensorType{ctx.input(0).dtype, *shape});
    return absl::OkStatus();
  };
}

// y = f(x) for floating x.
absl::Status UnaryFloatShape(ShapeContext& ctx) {
  if (auto s = ExpectFloat(ctx, 0, "x"); !s.ok()) return s;
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

// scale: floating x, and attrs the kernel can compute with: finite, and
// within float32's range for an F32 x (a NaN scale made every loss NaN, and
// the run blamed the learning rate).
absl::Status ScaleShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(UnaryFloatShape(ctx));
  const bool f32 = ctx.input(0).dtype == F32;
  for (const char* attr : {"scale", "bias"}) {
    const double v = ctx.attr_float(attr);
    if (!std::isfinite(v) || (f32 && InfiniteAsFloat32(v))) {
      return absl::InvalidArgumentError(absl::StrCat("attr '", attr, "' must be finite", f32
                                                         ? " and within float32's range (x is F32)" : "",
                                                     ", got ", v));
    }
  }
  return absl::OkStatus();
}

// y = f(x) for floating x, or a BF16 / F16 x computed in float and rounded
// once to x's type (gelu under mixed precision).
absl::Status UnaryFloatOrHalfShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectDtype(ctx, 0, "x", {F32, F64, BF16, F16}));
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

// Backward helpers (a, dy) -> dx: `a` (the forward input or output) and dy
// have the same floating type, and so does dx.
ShapeFn PairGradShape(const char* a_name) {
  return [a_name](ShapeContext& ctx) -> absl::Status {
    if (auto s = ExpectFloat(ctx, 0, a_name); !s.ok()) return s;
    if (auto s = ExpectSameDtype(ctx, 0, a_name, 1, "dy"); !s.ok()) return s;
    if (ctx.input(0).shape != ctx.input(1).shape) {
      return absl::InvalidArgumentError(absl::StrCat("input '", a_name, "' ", ShapeString(ctx.input(0).shape),
                                                     " and 'dy' ", ShapeString(ctx.input(1).shape),
                                                     " must have the same shape"));
    }
    ctx.set_output(0, ctx.input(0));
    return absl::OkStatus();
  };
}

// gelu_grad(x, dy) -> dx: PairGradShape's rules, except that for an F32 x
// dy may be BF16 / F16 and out_dtype may store dx in BF16 / F16: the
// float32 math on the widened dy, dx rounded as a cast would round it
// (passes/fold_casts folds the casts around it under mixed precision).
absl::Status GeluGradPairShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectDtype(ctx, 0, "x", {F32, F64, BF16, F16}));
  STRATA_RETURN_IF_ERROR(nn_shape_checks::ExpectSameDtypeOrHalfArg(ctx, 1, "dy", 0, "x"));
  if (ctx.input(0).shape != ctx.input(1).shape) {
    return absl::InvalidArgumentError(absl::StrCat("input 'x' ", ShapeString(ctx.input(0).shape), " and 'dy' ",
                                                   ShapeString(ctx.input(1).shape), " must have the same shape"));
  }
  STRATA_ASSIGN_OR_RETURN(const DataType dx_dtype, nn_shape_checks::StoredOutputDtype(ctx, 0, "x"));
  ctx.set_output(0, TensorType{dx_dtype, ctx.input(0).shape});
  return absl::OkStatus();
}

absl::Status SoftmaxShape(ShapeContext& ctx) {
  if (auto s = ExpectFloat(ctx, 0, "x"); !s.ok()) return s;
  auto axis = NormalizeInputAxis(ctx.attr_int("axis"), static_cast<int>(ctx.input(0).shape.size()), "x");
  if (!axis.ok()) return axis.status();
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

absl::Status SoftmaxGradShape(ShapeContext& ctx) {
  if (auto s = PairGradShape("y")(ctx); !s.ok()) return s;
  auto axis = NormalizeInputAxis(ctx.attr_int("axis"), static_cast<int>(ctx.input(0).shape.size()), "y");
  if (!axis.ok()) return axis.status();
  return absl::OkStatus();
}

ShapeFn ReduceOpShape(std::initializer_list<DataType> allowed) {
  std::vector<DataType> dtypes(allowed);
  return [dtypes](ShapeContext& ctx) -> absl::Status {
    const TensorType& x = ctx.input(0);
    if (std::find(dtypes.begin(), dtypes.end(), x.dtype) == dtypes.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input 'x' must be ", DtypeList(dtypes), ", got ", DataTypeName(x.dtype)));
    }
    auto reduced = ReducedAxes(ctx.attr_ints("axis"), static_cast<int>(x.shape.size()), "x");
    if (!reduced.ok()) return reduced.status();
    ctx.set_output(0, TensorType{x.dtype, ReduceShape(x.shape, *reduced, ctx.attr_bool("keepdim"))});
    return absl::OkStatus();
  };
}

// broadcast_like(dy, x): dy has the shape reduce_*(x, axis, keepdim) gave.
absl::Status BroadcastLikeShape(ShapeContext& ctx) {
  if (auto s = ExpectFloat(ctx, 0, "dy"); !s.ok()) return s;
  if (auto s = ExpectSameDtype(ctx, 0, "dy", 1, "x"); !s.ok()) return s;
  const TensorType& x = ctx.input(1);
  auto reduced = ReducedAxes(ctx.attr_ints("axis"), static_cast<int>(x.shape.size()), "x");
  if (!reduced.ok()) return reduced.status();
  Shape expected = ReduceShape(x.shape, *reduced, ctx.attr_bool("keepdim"));
  if (ctx.input(0).shape != expected) {
    return absl::InvalidArgumentError(absl::StrCat("input 'dy' has shape ", ShapeString(ctx.input(0).shape),
                                                   " but reducing x ", ShapeString(x.shape),
                                                   " with these axis/keepdim attrs gives ", ShapeString(expected)));
  }
  ctx.set_output(0, x);
  return absl::OkStatus();
}

// sum_to_like(x, like): like's shape must broadcast to x's.
absl::Status SumToLikeShape(ShapeContext& ctx) {
  if (auto s = ExpectSameDtype(ctx, 0, "x", 1, "like"); !s.ok()) return s;
  if (auto s = ExpectDtype(ctx, 0, "x", {F32, F64, I64}); !s.ok()) return s;
  absl::Span<const int64_t> x = ctx.input(0).shape;
  absl::Span<const int64_t> like = ctx.input(1).shape;
  bool ok = like.size() <= x.size();
  for (size_t i = 0; ok && i < like.size(); ++i) {
    int64_t l = like[i], d = x[x.size() - like.size() + i];
    ok = l == 1 || l == d;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("input 'like' ", ShapeString(like),
                                                   " does not broadcast to input 'x' ", ShapeString(x),
                                                   ", so x cannot be summed down to it"));
  }
  ctx.set_output(0, TensorType{ctx.input(0).dtype, Shape(like.begin(), like.end())});
  return absl::OkStatus();
}

absl::Status CastShape(ShapeContext& ctx) {
  if (auto s = ExpectDtype(ctx, 0, "x", {F32, F64, I64, I32, BOOL, BF16, F16}); !s.ok()) return s;
  std::string name = ctx.attr_string("dtype");
  DataType dtype = DT_INVALID;
  if (!DataType_Parse(name, &dtype) || dtype == DT_INVALID) {
    return absl::InvalidArgumentError(
        absl::StrCat("attr 'dtype' must be one of F32, F64, I64, I32, BOOL, BF16, F16, got '", name, "'"));
  }
  ctx.set_output(0, TensorType{dtype, ctx.input(0).shape});
  return absl::OkStatus();
}

absl::Status AddNShape(ShapeContext& ctx) {
  if (auto s = ExpectDtype(ctx, 0, "xs[0]", {F32, F64, I64, BF16, F16}); !s.ok()) return s;
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    if (ctx.input(i) != ctx.input(0)) {
      return absl::InvalidArgumentError(absl::StrCat("input 'xs[", i, "]' is ", ctx.input(i).ToString(),
                                                     " but 'xs[0]' is ", ctx.input(0).ToString(),
                                                     "; add_n needs identical types"));
    }
  }
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

absl::Status AnyDtypeSameShape(ShapeContext& ctx) {
  if (auto s = ExpectValidDtype(ctx, 0, "x"); !s.ok()) return s;
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

// fill_like: every dtype, the 16-bit floats too (autodiff fills the zero
// gradient of an unread 16-bit output with it: attention's y under mixed
// precision when only its lse reaches the loss).
absl::Status FillLikeShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectDtype(ctx, 0, "x", {F32, F64, I64, I32, BOOL, BF16, F16}));
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Gradient makers.

// Emits `type(inputs)` into dL/d(input i), summed over the dims along which
// input i was broadcast into output 0.
void EmitBroadcastGrad(GradBuilder& g, int i, const std::string& type, std::vector<std::string> inputs,
                       std::map<std::string, AttrValue> attrs = {}) {
  if (g.input_type(i).shape == g.output_type(0).shape) {
    if (type == "identity") {
      g.PassGrad(i, inputs[0]);  // the same tensor: shared, not copied
    } else {
      g.Emit(type, std::move(inputs), {g.input_grad(i)}, std::move(attrs));
    }
    return;
  }
  if (type == "identity") {
    g.Emit("sum_to_like", {inputs[0], g.input(i)}, {g.input_grad(i)});
    return;
  }
  std::string full = g.Temp(absl::StrCat(g.input(i), "@grad_full"));
  g.Emit(type, std::move(inputs), {full}, std::move(attrs));
  g.Emit("sum_to_like", {full, g.input(i)}, {g.input_grad(i)});
}

// z = x + y: dx = dz, dy = dz (each summed to its input's shape).
absl::Status AddGrad(GradBuilder& g) {
  std::string dz = g.output_grad(0);
  if (dz.empty()) return absl::OkStatus();
  for (int i = 0; i < 2; ++i) {
    if (g.needs_input_grad(i)) EmitBroadcastGrad(g, i, "identity", {dz});
  }
  return absl::OkStatus();
}

// z = x - y: dx = dz, dy = -dz.
absl::Status SubGrad(GradBuilder& g) {
  std::string dz = g.output_grad(0);
  if (dz.empty()) return absl::OkStatus();
  if (g.needs_input_grad(0)) EmitBroadcastGrad(g, 0, "identity", {dz});
  if (g.needs_input_grad(1)) EmitBroadcastGrad(g, 1, "neg", {dz});
  return absl::OkStatus();
}

// z = x * y: dx = dz * y, dy = dz * x.
absl::Status MulGrad(GradBuilder& g) {
  std::string dz = g.output_grad(0);
  if (dz.empty()) return absl::OkStatus();
  if (g.needs_input_grad(0)) EmitBroadcastGrad(g, 0, "mul", {dz, g.input(1)});
  if (g.needs_input_grad(1)) EmitBroadcastGrad(g, 1, "mul", {dz, g.input(0)});
  return absl::OkStatus();
}

// z = x / y: dx = dz / y, dy = -dz * x / y^2 = -(dz / y) * z.
absl::Status DivGrad(GradBuilder& g) {
  std::string dz = g.output_grad(0);
  if (dz.empty()) return absl::OkStatus();
  if (!g.needs_input_grad(1)) {
    if (g.needs_input_grad(0)) EmitBroadcastGrad(g, 0, "div", {dz, g.input(1)});
    return absl::OkStatus();
  }
  std::string dz_over_y = g.Temp("div@dz_over_y");
  g.Emit("div", {dz, g.input(1)}, {dz_over_y});
  if (g.needs_input_grad(0)) EmitBroadcastGrad(g, 0, "identity", {dz_over_y});
  std::string t = g.Temp("div@dz_z_over_y");
  g.Emit("mul", {dz_over_y, g.output(0)}, {t});
  EmitBroadcastGrad(g, 1, "neg", {t});
  return absl::OkStatus();
}

// A single-input op whose dx is `type(args)`; "$x", "$y" and "$dy" in args
// stand for the forward input, output and incoming gradient.
GradFn UnaryGrad(std::string type, std::vector<std::string> args,
                 std::map<std::string, AttrValue> attrs = {}) {
  return [type, args, attrs](GradBuilder& g) -> absl::Status {
    std::string dy = g.output_grad(0);
    if (dy.empty() || !g.needs_input_grad(0)) return absl::OkStatus();
    std::vector<std::string> inputs;
    for (const std::string& a : args) {
      inputs.push_back(a == "$x" ? g.input(0) : a == "$y" ? g.output(0) : dy);
    }
    g.Emit(type, inputs, {g.input_grad(0)}, attrs);
    return absl::OkStatus();
  };
}

// gelu's two forms: "none" (erf) or "tanh". Anything else is refused here,
// at shape inference, so a bad program fails at compile time naming the op.
ShapeFn GeluShape(ShapeFn inner) {
  return [inner](ShapeContext& ctx) -> absl::Status {
    // Absent only on an op built by hand (validation fills in "none"); an
    // empty value a program wrote is refused, as the kernels refuse it.
    const bool given = ctx.op().attr().contains("approximate");
    const std::string approximate = ctx.attr_string("approximate");
    if (given && approximate != "none" && approximate != "tanh") {
      return absl::InvalidArgumentError(
          absl::StrCat("attr 'approximate' must be \"none\" or \"tanh\", got \"", approximate, "\""));
    }
    return inner(ctx);
  };
}

// y = gelu(x): dx = gelu_grad(x, dy) of the same form.
absl::Status GeluGrad(GradBuilder& g) {
  std::string dy = g.output_grad(0);
  if (dy.empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  const auto& attrs = g.op().attr();
  auto it = attrs.find("approximate");
  const std::string approximate = it == attrs.end() ? "none" : it->second.s();
  g.Emit("gelu_grad", {g.input(0), dy}, {g.input_grad(0)}, {{"approximate", StringAttr(approximate)}});
  return absl::OkStatus();
}

// y = scale * x + bias: dx = scale * dy.
absl::Status ScaleGrad(GradBuilder& g) {
  std::string dy = g.output_grad(0);
  if (dy.empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  const auto& attrs = g.op().attr();
  auto it = attrs.find("scale");
  double scale = it == attrs.end() ? 1.0 : it->second.f();
  g.Emit("scale", {dy}, {g.input_grad(0)}, {{"scale", FloatAttr(scale)}, {"bias", FloatAttr(0.0)}});
  return absl::OkStatus();
}

// y = x^2: dx = 2 x dy.
absl::Status SquareGrad(GradBuilder& g) {
  std::string dy = g.output_grad(0);
  if (dy.empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  std::string t = g.Temp("square@dy_x");
  g.Emit("mul", {dy, g.input(0)}, {t});
  g.Emit("scale", {t}, {g.input_grad(0)}, {{"scale", FloatAttr(2.0)}});
  return absl::OkStatus();
}

// softmax / log_softmax: the helper takes (y, dy) and the same axis.
GradFn SoftmaxLikeGrad(std::string helper) {
  return [helper](GradBuilder& g) -> absl::Status {
    std::string dy = g.output_grad(0);
    if (dy.empty() || !g.needs_input_grad(0)) return absl::OkStatus();
    g.Emit(helper, {g.output(0), dy}, {g.input_grad(0)}, g.ForwardAttrs());
    return absl::OkStatus();
  };
}

// reduce_sum / reduce_mean: dx = broadcast dy back over the reduced dims
// (divided by their runtime element count for the mean).
GradFn ReduceGrad(bool mean) {
  return [mean](GradBuilder& g) -> absl::Status {
    std::string dy = g.output_grad(0);
    if (dy.empty() || !g.needs_input_grad(0)) return absl::OkStatus();
    std::map<std::string, AttrValue> attrs = g.ForwardAttrs();
    attrs["mean"] = BoolAttr(mean);
    g.Emit("broadcast_like", {dy, g.input(0)}, {g.input_grad(0)}, attrs);
    return absl::OkStatus();
  };
}

// cast: dx = cast(dy) back to x's dtype (F32 -> BF16 -> F32 included, as
// mixed precision needs); casting from or to an integer type stops the
// gradient.
absl::Status CastGrad(GradBuilder& g) {
  std::string dy = g.output_grad(0);
  if (dy.empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  const auto floating = [](DataType d) { return IsFloating(d) || IsHalfFloating(d); };
  if (!floating(g.input_type(0).dtype) || !floating(g.output_type(0).dtype)) return absl::OkStatus();
  g.Emit("cast", {dy}, {g.input_grad(0)}, {{"dtype", StringAttr(DataTypeName(g.input_type(0).dtype))}});
  return absl::OkStatus();
}

// y = sum_i xs[i]: dxs[i] = dy.
absl::Status AddNGrad(GradBuilder& g) {
  std::string dy = g.output_grad(0);
  if (dy.empty()) return absl::OkStatus();
  for (int i = 0; i < g.op().input_size(); ++i) {
    if (g.needs_input_grad(i)) g.PassGrad(i, dy);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Registrations.

STRATA_REGISTER_OP(OpDef("add").Input("x").Input("y").Output("z")
                       .Shape(BinaryShape({F32, F64, I64}))
                       .Grad(AddGrad)
                       .Doc("z = x + y with numpy broadcasting."));
STRATA_REGISTER_OP(OpDef("sub").Input("x").Input("y").Output("z")
                       .Shape(BinaryShape({F32, F64, I64}))
                       .Grad(SubGrad)
                       .Doc("z = x - y with numpy broadcasting."));
STRATA_REGISTER_OP(OpDef("mul").Input("x").Input("y").Output("z")
                       .Shape(BinaryShape({F32, F64, I64}))
                       .Grad(MulGrad)
                       .Doc("z = x * y with numpy broadcasting."));
STRATA_REGISTER_OP(OpDef("div").Input("x").Input("y").Output("z")
                       .Shape(BinaryShape({F32, F64}))
                       .Grad(DivGrad)
                       .Doc("z = x / y with numpy broadcasting (floating types only)."));
STRATA_REGISTER_OP(OpDef("sum_to_like").Input("x").Input("like").Output("y")
                       .Shape(SumToLikeShape)
                       .NotDifferentiable()
                       .Doc("Sums x over the dims along which `like` was broadcast to x's shape: "
                            "the gradient of a broadcasting op. Runtime shapes decide."));

STRATA_REGISTER_OP(OpDef("scale").Input("x").Output("y")
                       .Attr("scale", 1.0).Attr("bias", 0.0)
                       .Shape(ScaleShape)
                       .Grad(ScaleGrad)
                       .Doc("y = scale * x + bias."));

STRATA_REGISTER_OP(OpDef("relu").Input("x").Output("y")
                       .Shape(UnaryFloatShape)
                       .Grad(UnaryGrad("relu_grad", {"$y", "$dy"}))
                       .Doc("y = max(x, 0)."));
STRATA_REGISTER_OP(OpDef("relu_grad").Input("y").Input("dy").Output("dx")
                       .Shape(PairGradShape("y"))
                       .NotDifferentiable()
                       .Doc("dx = dy where y > 0, else 0 (y: relu's output)."));
STRATA_REGISTER_OP(OpDef("gelu").Input("x").Output("y")
                       .Attr("approximate", "none")
                       .Shape(GeluShape(UnaryFloatOrHalfShape))
                       .Grad(GeluGrad)
                       .Doc("y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), the exact form (approximate \"none\"), "
                            "or with approximate \"tanh\" 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), "
                            "PyTorch's F.gelu(approximate='tanh') and GPT-2's gelu_new."));
STRATA_REGISTER_OP(OpDef("gelu_grad").Input("x").Input("dy").Output("dx")
                       .Attr("approximate", "none")
                       .Attr("out_dtype", "")
                       .Shape(GeluShape(GeluGradPairShape))
                       .NotDifferentiable()
                       .Doc("dx = dy * (Phi(x) + x * phi(x)), or the tanh form's derivative with approximate "
                            "\"tanh\" (as gelu's). For an F32 x, dy may be BF16 or F16 (read widened) and "
                            "out_dtype \"BF16\" or \"F16\" stores dx rounded to that type (passes/fold_casts). A BF16 "
                            "or F16 x takes a dy of its type and gives dx in it, the math in F32 on the widened "
                            "values."));
STRATA_REGISTER_OP(OpDef("tanh").Input("x").Output("y")
                       .Shape(UnaryFloatShape)
                       .Grad(UnaryGrad("tanh_grad", {"$y", "$dy"}))
                       .Doc("y = tanh(x)."));
STRATA_REGISTER_OP(OpDef("tanh_grad").Input("y").Input("dy").Output("dx")
                       .Shape(PairGradShape("y"))
                       .NotDifferentiable()
                       .Doc("dx = dy * (1 - y^2) (y: tanh's output)."));
STRATA_REGISTER_OP(OpDef("sigmoid").Input("x").Output("y")
                       .Shape(UnaryFloatShape)
                       .Grad(UnaryGrad("sigmoid_grad", {"$y", "$dy"}))
                       .Doc("y = 1 / (1 + exp(-x))."));
STRATA_REGISTER_OP(OpDef("sigmoid_grad").Input("y").Input("dy").Output("dx")
                       .Shape(PairGradShape("y"))
                       .NotDifferentiable()
                       .Doc("dx = dy * y * (1 - y) (y: sigmoid's output)."));
STRATA_REGISTER_OP(OpDef("exp").Input("x").Output("y")
                       .Shape(UnaryFloatShape)
                       .Grad(UnaryGrad("mul", {"$dy", "$y"}))
                       .Doc("y = exp(x)."));
STRATA_REGISTER_OP(OpDef("log").Input("x").Output("y")
                       .Shape(UnaryFloatShape)
                       .Grad(UnaryGrad("div", {"$dy", "$x"}))
                       .Doc("y = ln(x) (nan below 0, -inf at 0)."));
STRATA_REGISTER_OP(OpDef("sqrt").Input("x").Output("y")
                       .Shape(UnaryFloatShape)
                       .Grad(UnaryGrad("sqrt_grad", {"$y", "$dy"}))
                       .Doc("y = sqrt(x)."));
STRATA_REGISTER_OP(OpDef("sqrt_grad").Input("y").Input("dy").Output("dx")
                       .Shape(PairGradShape("y"))
                       .NotDifferentiable()
                       .Doc("dx = dy / (2 y) (y: sqrt's output)."));
STRATA_REGISTER_OP(OpDef("square").Input("x").Output("y")
                       .Shape(UnaryFloatShape)
                       .Grad(SquareGrad)
                       .Doc("y = x^2."));
STRATA_REGISTER_OP(OpDef("neg").Input("x").Output("y")
                       .Shape(UnaryFloatShape)
                       .Grad(UnaryGrad("neg", {"$dy"}))
                       .Doc("y = -x."));

STRATA_REGISTER_OP(OpDef("softmax").Input("x").Output("y")
                       .Attr("axis", -1)
                       .Shape(SoftmaxShape)
                       .Grad(SoftmaxLikeGrad("softmax_grad"))
                       .Doc("y = exp(x) / sum(exp(x)) along `axis`."));
STRATA_REGISTER_OP(OpDef("softmax_grad").Input("y").Input("dy").Output("dx")
                       .Attr("axis", -1)
                       .Shape(SoftmaxGradShape)
                       .NotDifferentiable()
                       .Doc("dx = y * (dy - sum(dy * y)) along `axis` (y: softmax's output)."));
STRATA_REGISTER_OP(OpDef("log_softmax").Input("x").Output("y")
                       .Attr("axis", -1)
                       .Shape(SoftmaxShape)
                       .Grad(SoftmaxLikeGrad("log_softmax_grad"))
                       .Doc("y = x - log(sum(exp(x))) along `axis`."));
STRATA_REGISTER_OP(OpDef("log_softmax_grad").Input("y").Input("dy").Output("dx")
                       .Attr("axis", -1)
                       .Shape(SoftmaxGradShape)
                       .NotDifferentiable()
                       .Doc("dx = dy - exp(y) * sum(dy) along `axis` (y: log_softmax's output)."));

STRATA_REGISTER_OP(OpDef("reduce_sum").Input("x").Output("y")
                       .Attr("axis", std::vector<int64_t>{}).Attr("keepdim", false)
                       .Shape(ReduceOpShape({F32, F64, I64}))
                       .Grad(ReduceGrad(/*mean=*/false))
                       .Doc("Sum over `axis` (empty: all dims; negative counts from the end); reduced "
                            "dims are kept as 1 with keepdim."));
STRATA_REGISTER_OP(OpDef("reduce_mean").Input("x").Output("y")
                       .Attr("axis", std::vector<int64_t>{}).Attr("keepdim", false)
                       .Shape(ReduceOpShape({F32, F64}))
                       .Grad(ReduceGrad(/*mean=*/true))
                       .Doc("Mean over `axis` (empty: all dims; negative counts from the end); reduced "
                            "dims are kept as 1 with keepdim."));
STRATA_REGISTER_OP(OpDef("broadcast_like").Input("dy").Input("x").Output("dx")
                       .Attr("axis", std::vector<int64_t>{}).Attr("keepdim", false).Attr("mean", false)
                       .Shape(BroadcastLikeShape)
                       .NotDifferentiable()
                       .Doc("The gradient of reduce_sum/reduce_mean(x, axis, keepdim): dy repeated over "
                            "the reduced dims to x's shape, divided by their runtime count when `mean`."));

STRATA_REGISTER_OP(OpDef("cast").Input("x").Output("y")
                       .Attr("dtype", AttrType::kString)
                       .Shape(CastShape)
                       .Grad(CastGrad)
                       .Doc("Converts x to `dtype` (F32, F64, I64, I32, BOOL, BF16, F16). To BF16/F16 rounds to "
                            "nearest even (through float32); floating to integer "
                            "truncates toward zero (nan gives 0, saturating); nonzero is true."));
STRATA_REGISTER_OP(OpDef("add_n").VariadicInput("xs").Output("y")
                       .Shape(AddNShape)
                       .Grad(AddNGrad)
                       .Doc("y = xs[0] + xs[1] + ... over inputs of identical type."));
STRATA_REGISTER_OP(OpDef("fill_scalar").Output("y")
                       .Attr("dtype", AttrType::kString)
                       .Attr("value", 0.0)
                       .Shape([](ShapeContext& ctx) -> absl::Status {
                         std::string name = ctx.attr_string("dtype");
                         DataType dtype = DT_INVALID;
                         if (!DataType_Parse(name, &dtype) || !IsFloating(dtype)) {
                           return absl::InvalidArgumentError(
                               absl::StrCat("attr 'dtype' must be F32 or F64, got '", name, "'"));
                         }
                         ctx.set_output(0, TensorType{dtype, {}});
                         return absl::OkStatus();
                       })
                       .NotDifferentiable()
                       .Doc("A scalar of `dtype` (F32 or F64) holding `value`."));
STRATA_REGISTER_OP(OpDef("fill_like").Input("x").Output("y")
                       .Attr("value", 1.0)
                       .Shape(FillLikeShape)
                       .NotDifferentiable()
                       .Doc("A tensor of x's type filled with `value` (seeds dL/dloss)."));
STRATA_REGISTER_OP(OpDef("identity").Input("x").Output("y")
                       .Shape(AnyDtypeSameShape)
                       .AliasesInput()
                       .Grad(UnaryGrad("identity", {"$dy"}))
                       .Doc("y = x, sharing x's buffer."));

}  // namespace
}  // namespace strata
