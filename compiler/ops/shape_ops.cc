// Shape ops: reshape, flatten, transpose, concat, split, slice, and the
// backward-only helpers their gradients emit (reshape_like, concat_grad,
// split_grad, slice_grad). They move data and never change values.
//
// The batch dimension (-1) may pass through any of them, but no op may fold it
// into other dims or cut it: after such an op the -1 would no longer be "the
// batch size", which micro-batching and data parallelism rely on.
//
// The rules on plain shapes (reshape, flatten, transpose, split, slice) live in
// proto/shape_rules.h, where the kernels use them too.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"
#include "proto/shape_rules.h"

namespace strata {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

std::string Ints(absl::Span<const int64_t> v) { return absl::StrCat("[", absl::StrJoin(v, ", "), "]"); }

// "input 'x' (F32[-1, 784])"
std::string Describe(const ShapeContext& ctx, int i) {
  return absl::StrCat("input ", i, " '", ctx.op().input(i), "' (", ctx.input(i).ToString(), ")");
}

// ---- reshape ---------------------------------------------------------------

absl::Status ReshapeShape(ShapeContext& ctx) {
  auto out = ResolveReshape(ctx.input(0).shape, ctx.attr_ints("shape"));
  if (!out.ok()) return Invalid(absl::StrCat(Describe(ctx, 0), ": ", out.status().message()));
  ctx.set_output(0, TensorType{ctx.input(0).dtype, *out});
  return absl::OkStatus();
}

// dx = dy viewed with x's shape.
absl::Status ReshapeGrad(GradBuilder& g) {
  if (g.output_grad(0).empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  g.Emit("reshape_like", {g.output_grad(0), g.input(0)}, {g.input_grad(0)});
  return absl::OkStatus();
}

// reshape_like(dy, x): dy's values in x's shape; the element counts must agree.
absl::Status ReshapeLikeShape(ShapeContext& ctx) {
  const TensorType& dy = ctx.input(0);
  const TensorType& x = ctx.input(1);
  if (CountUnknown(dy.shape) != CountUnknown(x.shape) || KnownProduct(dy.shape) != KnownProduct(x.shape)) {
    return Invalid(absl::StrCat(Describe(ctx, 0), " does not have the element count of ", Describe(ctx, 1)));
  }
  ctx.set_output(0, TensorType{dy.dtype, x.shape});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("reshape")
                       .Input("x")
                       .Output("y")
                       .Attr("shape", AttrType::kInts)
                       .Shape(ReshapeShape)
                       .AliasesInput()
                       .Grad(ReshapeGrad)
                       .Doc("x's elements in another shape; in `shape` 0 copies the input dim at that position and "
                            "one -1 is inferred (the batch dim when x has one). Shares x's buffer."));

STRATA_REGISTER_OP(OpDef("reshape_like")
                       .Input("dy")
                       .Input("like")
                       .Output("dx")
                       .Shape(ReshapeLikeShape)
                       .AliasesInput()
                       .NotDifferentiable()
                       .Doc("dy viewed with the shape of `like` (the gradient of reshape and flatten)."));

// ---- flatten ---------------------------------------------------------------

absl::Status FlattenOpShape(ShapeContext& ctx) {
  const TensorType& x = ctx.input(0);
  if (x.shape.empty()) return Invalid(absl::StrCat(Describe(ctx, 0), " must have rank 1 or more"));
  auto out = FlattenShape(x.shape, ctx.attr_int("start_axis"), ctx.attr_int("end_axis"));
  if (!out.ok()) return Invalid(absl::StrCat(Describe(ctx, 0), ": ", out.status().message()));
  ctx.set_output(0, TensorType{x.dtype, *out});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("flatten")
                       .Input("x")
                       .Output("y")
                       .Attr("start_axis", 1)
                       .Attr("end_axis", -1)
                       .Shape(FlattenOpShape)
                       .AliasesInput()
                       .Grad(ReshapeGrad)
                       .Doc("Merges axes start_axis..end_axis (inclusive, negative counts from the end) into one. "
                            "Shares x's buffer."));

// ---- transpose -------------------------------------------------------------

absl::Status TransposeShape(ShapeContext& ctx) {
  const TensorType& x = ctx.input(0);
  auto perm = NormalizePerm(ctx.attr_ints("perm"), static_cast<int>(x.shape.size()));
  if (!perm.ok()) return Invalid(absl::StrCat(Describe(ctx, 0), ": ", perm.status().message()));
  Shape out;
  for (int64_t p : *perm) out.push_back(x.shape[p]);
  ctx.set_output(0, TensorType{x.dtype, out});
  return absl::OkStatus();
}

// y[i_0..] = x[i_perm...], so dx = transpose(dy, inverse(perm)).
absl::Status TransposeGrad(GradBuilder& g) {
  if (g.output_grad(0).empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  auto perm = NormalizePerm(Shape(g.op().attr().at("perm").list().i().begin(),
                                                 g.op().attr().at("perm").list().i().end()),
                            static_cast<int>(g.input_type(0).shape.size()));
  if (!perm.ok()) return perm.status();
  Shape inverse(perm->size());
  for (size_t i = 0; i < perm->size(); ++i) inverse[(*perm)[i]] = static_cast<int64_t>(i);
  g.Emit("transpose", {g.output_grad(0)}, {g.input_grad(0)}, {{"perm", IntsAttr(inverse)}});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("transpose")
                       .Input("x")
                       .Output("y")
                       .Attr("perm", AttrType::kInts)
                       .Shape(TransposeShape)
                       .Grad(TransposeGrad)
                       .Doc("Permutes the axes: y's axis i is x's axis perm[i]."));

// ---- concat ----------------------------------------------------------------

// The shape of inputs [first, last) of ctx concatenated along `axis` (attr).
absl::StatusOr<Shape> ConcatShape(const ShapeContext& ctx, int first, int last, int* axis_out) {
  const TensorType& x0 = ctx.input(first);
  const int rank = static_cast<int>(x0.shape.size());
  if (rank == 0) return Invalid(absl::StrCat(Describe(ctx, first), " is a scalar; concat needs rank 1 or more"));
  auto axis = NormalizeAxis(ctx.attr_int("axis"), rank, "attr 'axis'");
  if (!axis.ok()) return Invalid(absl::StrCat(Describe(ctx, first), ": ", axis.status().message()));
  Shape out = x0.shape;
  bool batch_on_axis = x0.shape[*axis] < 0;
  for (int i = first + 1; i < last; ++i) {
    const TensorType& x = ctx.input(i);
    if (x.dtype != x0.dtype) {
      return Invalid(absl::StrCat(Describe(ctx, i), " has another dtype than ", Describe(ctx, first)));
    }
    if (x.shape.size() != x0.shape.size()) {
      return Invalid(absl::StrCat(Describe(ctx, i), " has another rank than ", Describe(ctx, first)));
    }
    for (int d = 0; d < rank; ++d) {
      if (d != *axis && x.shape[d] != x0.shape[d]) {
        return Invalid(absl::StrCat(Describe(ctx, i), " differs from ", Describe(ctx, first), " in dim ", d,
                                    " (only the concat axis ", *axis, " may differ)"));
      }
    }
    batch_on_axis |= x.shape[*axis] < 0;
    out[*axis] += x.shape[*axis];
  }
  if (batch_on_axis && last - first > 1) {
    return Invalid(absl::StrCat("concat along axis ", *axis,
                                " which is the batch dim (-1) of an input: the result would not be batch-sized"));
  }
  if (axis_out != nullptr) *axis_out = *axis;
  return out;
}

absl::Status ConcatOpShape(ShapeContext& ctx) {
  auto out = ConcatShape(ctx, 0, ctx.num_inputs(), nullptr);
  if (!out.ok()) return out.status();
  ctx.set_output(0, TensorType{ctx.input(0).dtype, *out});
  return absl::OkStatus();
}

// dx_i = the slice of dy that x_i filled; sizes from the runtime inputs.
absl::Status ConcatGrad(GradBuilder& g) {
  if (g.output_grad(0).empty()) return absl::OkStatus();
  const int n = g.op().input_size();
  bool any = false;
  std::vector<std::string> inputs = {g.output_grad(0)}, outputs;
  for (int i = 0; i < n; ++i) {
    any |= g.needs_input_grad(i);
    inputs.push_back(g.input(i));
    outputs.push_back(g.needs_input_grad(i) ? g.input_grad(i) : g.Temp(absl::StrCat(g.input(i), "@unused_grad")));
  }
  if (!any) return absl::OkStatus();
  g.Emit("concat_grad", inputs, outputs, {{"axis", g.op().attr().at("axis")}});
  return absl::OkStatus();
}

// concat_grad(dy, xs...) -> dxs...: dy must be the concat of the xs' shapes.
absl::Status ConcatGradShape(ShapeContext& ctx) {
  if (ctx.num_outputs() != ctx.num_inputs() - 1) {
    return Invalid(absl::StrCat("concat_grad needs one output per input after dy: ", ctx.num_inputs() - 1,
                                " inputs, ", ctx.num_outputs(), " outputs"));
  }
  auto shape = ConcatShape(ctx, 1, ctx.num_inputs(), nullptr);
  if (!shape.ok()) return shape.status();
  if (ctx.input(0).dtype != ctx.input(1).dtype) {
    return Invalid(absl::StrCat(Describe(ctx, 0), " has another dtype than ", Describe(ctx, 1)));
  }
  if (*shape != ctx.input(0).shape) {
    return Invalid(absl::StrCat(Describe(ctx, 0), " is not the concatenation of the inputs after it (",
                                ShapeString(*shape), ")"));
  }
  for (int i = 1; i < ctx.num_inputs(); ++i) ctx.set_output(i - 1, TensorType{ctx.input(0).dtype, ctx.input(i).shape});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("concat")
                       .VariadicInput("xs")
                       .Output("y")
                       .Attr("axis", 0)
                       .Shape(ConcatOpShape)
                       .Grad(ConcatGrad)
                       .Doc("Joins the inputs along `axis` (negative counts from the end); other dims must agree."));

STRATA_REGISTER_OP(OpDef("concat_grad")
                       .Input("dy")
                       .VariadicInput("xs")
                       .VariadicOutput("dxs")
                       .Attr("axis", 0)
                       .Shape(ConcatGradShape)
                       .NotDifferentiable()
                       .Doc("Cuts dy along `axis` into pieces shaped like the xs (the gradient of concat)."));

// ---- split -----------------------------------------------------------------

absl::Status SplitShape(ShapeContext& ctx) {
  const TensorType& x = ctx.input(0);
  const int rank = static_cast<int>(x.shape.size());
  if (rank == 0) return Invalid(absl::StrCat(Describe(ctx, 0), " is a scalar; split needs rank 1 or more"));
  auto axis = NormalizeAxis(ctx.attr_int("axis"), rank, "attr 'axis'");
  if (!axis.ok()) return Invalid(absl::StrCat(Describe(ctx, 0), ": ", axis.status().message()));
  auto sizes = SplitSizes(x.shape[*axis], ctx.num_outputs(), ctx.attr_ints("sections"));
  if (!sizes.ok()) {
    return Invalid(absl::StrCat(Describe(ctx, 0), ", axis ", *axis, ": ", sizes.status().message()));
  }
  for (int i = 0; i < ctx.num_outputs(); ++i) {
    Shape shape = x.shape;
    shape[*axis] = (*sizes)[i];
    ctx.set_output(i, TensorType{x.dtype, shape});
  }
  return absl::OkStatus();
}

// dx = the output grads joined along the axis; pieces without one are zeros.
absl::Status SplitGrad(GradBuilder& g) {
  if (!g.needs_input_grad(0)) return absl::OkStatus();
  const int n = g.op().output_size();
  std::vector<std::string> dys;
  Shape present;
  for (int i = 0; i < n; ++i) {
    if (g.output_grad(i).empty()) continue;
    dys.push_back(g.output_grad(i));
    present.push_back(i);
  }
  if (dys.empty()) return absl::OkStatus();
  const AttrValue& axis = g.op().attr().at("axis");
  if (static_cast<int>(dys.size()) == n) {
    g.Emit("concat", dys, {g.input_grad(0)}, {{"axis", axis}});
    return absl::OkStatus();
  }
  // A split along the batch dim has one piece, so with a piece missing every
  // size along the axis is static.
  const int rank = static_cast<int>(g.input_type(0).shape.size());
  const int a = static_cast<int>(axis.i() < 0 ? axis.i() + rank : axis.i());
  Shape sections;
  for (int i = 0; i < n; ++i) sections.push_back(g.output_type(i).shape[a]);
  std::vector<std::string> inputs = {g.input(0)};
  inputs.insert(inputs.end(), dys.begin(), dys.end());
  g.Emit("split_grad", inputs, {g.input_grad(0)},
         {{"axis", axis}, {"sections", IntsAttr(sections)}, {"grad_outputs", IntsAttr(present)}});
  return absl::OkStatus();
}

// split_grad(x, dys...) -> dx: x's shape; dys[k] fills piece grad_outputs[k]
// of the split by `sections` along `axis`, the other pieces are zero.
absl::Status SplitGradShape(ShapeContext& ctx) {
  const TensorType& x = ctx.input(0);
  const int rank = static_cast<int>(x.shape.size());
  if (rank == 0) return Invalid(absl::StrCat(Describe(ctx, 0), " is a scalar; split_grad needs rank 1 or more"));
  auto axis = NormalizeAxis(ctx.attr_int("axis"), rank, "attr 'axis'");
  if (!axis.ok()) return Invalid(absl::StrCat(Describe(ctx, 0), ": ", axis.status().message()));
  std::vector<int64_t> sections = ctx.attr_ints("sections");
  std::vector<int64_t> which = ctx.attr_ints("grad_outputs");
  if (sections.empty() || x.shape[*axis] < 0) {
    return Invalid(absl::StrCat(Describe(ctx, 0), ": split_grad needs explicit attr 'sections' along a known dim"));
  }
  auto sizes = SplitSizes(x.shape[*axis], static_cast<int>(sections.size()), sections);
  if (!sizes.ok()) return Invalid(absl::StrCat(Describe(ctx, 0), ": ", sizes.status().message()));
  if (static_cast<int>(which.size()) != ctx.num_inputs() - 1) {
    return Invalid(absl::StrCat("attr 'grad_outputs' ", Ints(which), " must name one piece per dy (",
                                ctx.num_inputs() - 1, ")"));
  }
  for (size_t k = 0; k < which.size(); ++k) {
    if (which[k] < 0 || which[k] >= static_cast<int64_t>(sections.size()) || (k > 0 && which[k] <= which[k - 1])) {
      return Invalid(absl::StrCat("attr 'grad_outputs' ", Ints(which), " must be increasing piece indices below ",
                                  sections.size()));
    }
    const int i = static_cast<int>(k) + 1;
    Shape want = x.shape;
    want[*axis] = (*sizes)[which[k]];
    if (ctx.input(i).dtype != x.dtype) {
      return Invalid(absl::StrCat(Describe(ctx, i), " has another dtype than ", Describe(ctx, 0)));
    }
    if (ctx.input(i).shape != want) {
      return Invalid(absl::StrCat(Describe(ctx, i), " does not match piece ", which[k], " (",
                                  ShapeString(want), ")"));
    }
  }
  ctx.set_output(0, TensorType{x.dtype, x.shape});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("split")
                       .Input("x")
                       .VariadicOutput("ys")
                       .Attr("axis", 0)
                       .Attr("sections", std::vector<int64_t>{})
                       .Shape(SplitShape)
                       .Grad(SplitGrad)
                       .Doc("Cuts x along `axis` into one piece per output: equal parts, or the sizes in "
                            "`sections` (one entry may be -1: the rest)."));

STRATA_REGISTER_OP(OpDef("split_grad")
                       .Input("x")
                       .VariadicInput("dys")
                       .Output("dx")
                       .Attr("axis", 0)
                       .Attr("sections", AttrType::kInts)
                       .Attr("grad_outputs", AttrType::kInts)
                       .Shape(SplitGradShape)
                       .NotDifferentiable()
                       .Doc("The gradient of split when some pieces have no gradient: dys joined along `axis` "
                            "into pieces grad_outputs of `sections`, zeros elsewhere; x gives the shape."));

// ---- slice -----------------------------------------------------------------

absl::Status SliceOpShape(ShapeContext& ctx) {
  auto window =
      ResolveSlice(ctx.input(0).shape, ctx.attr_ints("axes"), ctx.attr_ints("starts"), ctx.attr_ints("ends"));
  if (!window.ok()) return Invalid(absl::StrCat(Describe(ctx, 0), ": ", window.status().message()));
  ctx.set_output(0, TensorType{ctx.input(0).dtype, window->size});
  return absl::OkStatus();
}

// dx = zeros shaped like x with dy in the sliced window.
absl::Status SliceGrad(GradBuilder& g) {
  if (g.output_grad(0).empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  g.Emit("slice_grad", {g.output_grad(0), g.input(0)}, {g.input_grad(0)}, g.ForwardAttrs());
  return absl::OkStatus();
}

// slice_grad(dy, x) -> dx: dy must be shaped like the slice of x.
absl::Status SliceGradShape(ShapeContext& ctx) {
  const TensorType& dy = ctx.input(0);
  const TensorType& x = ctx.input(1);
  auto window = ResolveSlice(x.shape, ctx.attr_ints("axes"), ctx.attr_ints("starts"), ctx.attr_ints("ends"));
  if (!window.ok()) return Invalid(absl::StrCat(Describe(ctx, 1), ": ", window.status().message()));
  if (window->size != dy.shape) {
    return Invalid(absl::StrCat(Describe(ctx, 0), " is not shaped like the slice of ", Describe(ctx, 1), " (",
                                ShapeString(window->size), ")"));
  }
  ctx.set_output(0, TensorType{dy.dtype, x.shape});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("slice")
                       .Input("x")
                       .Output("y")
                       .Attr("axes", AttrType::kInts)
                       .Attr("starts", AttrType::kInts)
                       .Attr("ends", AttrType::kInts)
                       .Shape(SliceOpShape)
                       .Grad(SliceGrad)
                       .Doc("x[starts[k]:ends[k]] along each axes[k], numpy style: negative indices count from "
                            "the end and out-of-range ones clamp."));

STRATA_REGISTER_OP(OpDef("slice_grad")
                       .Input("dy")
                       .Input("x")
                       .Output("dx")
                       .Attr("axes", AttrType::kInts)
                       .Attr("starts", AttrType::kInts)
                       .Attr("ends", AttrType::kInts)
                       .Shape(SliceGradShape)
                       .NotDifferentiable()
                       .Doc("Zeros shaped like x with dy in the window slice(x) read (the gradient of slice)."));

// ---- pad --------------------------------------------------------------------

// y = x with `after` zeros appended along `axis` (np.pad with (0, after) on
// that axis): what passes/pad_vocab makes of an LM head's weight so that the
// logits' rows start 16-byte aligned. The padded dim must be known.
absl::Status PadShape(ShapeContext& ctx) {
  const TensorType& x = ctx.input(0);
  const int rank = static_cast<int>(x.shape.size());
  if (rank == 0) return Invalid(absl::StrCat(Describe(ctx, 0), " is a scalar; pad needs rank 1 or more"));
  auto axis = NormalizeAxis(ctx.attr_int("axis"), rank, "attr 'axis'");
  if (!axis.ok()) return Invalid(absl::StrCat(Describe(ctx, 0), ": ", axis.status().message()));
  const int64_t after = ctx.attr_int("after");
  // The padded size must fit a dim (2^40 elements is far past any tensor).
  constexpr int64_t kMaxPaddedDim = int64_t{1} << 40;
  if (after < 0 || after > kMaxPaddedDim) {
    return Invalid(absl::StrCat("attr 'after' must be in [0, 2^40], got ", after));
  }
  if (x.shape[*axis] < 0) {
    return Invalid(absl::StrCat(Describe(ctx, 0), ": the padded axis ", *axis, " must have a known size"));
  }
  if (x.shape[*axis] > kMaxPaddedDim - after) {
    return Invalid(absl::StrCat(Describe(ctx, 0), ": axis ", *axis, " padded by ", after, " passes 2^40"));
  }
  Shape y = x.shape;
  y[*axis] += after;
  ctx.set_output(0, TensorType{x.dtype, y});
  return absl::OkStatus();
}

// dx = dy's first x-size entries along the axis.
absl::Status PadGrad(GradBuilder& g) {
  if (g.output_grad(0).empty() || !g.needs_input_grad(0)) return absl::OkStatus();
  const TensorType& x = g.input_type(0);
  const int rank = static_cast<int>(x.shape.size());
  const auto set = g.op().attr().find("axis");
  auto axis = NormalizeAxis(set == g.op().attr().end() ? 0 : set->second.i(), rank, "attr 'axis'");
  if (!axis.ok()) return axis.status();
  const int64_t axes[] = {*axis}, starts[] = {0}, ends[] = {x.shape[*axis]};
  g.Emit("slice", {g.output_grad(0)}, {g.input_grad(0)},
         {{"axes", IntsAttr(axes)}, {"starts", IntsAttr(starts)}, {"ends", IntsAttr(ends)}});
  return absl::OkStatus();
}

STRATA_REGISTER_OP(OpDef("pad")
                       .Input("x")
                       .Output("y")
                       .Attr("axis", 0)
                       .Attr("after", AttrType::kInt)
                       .Shape(PadShape)
                       .Grad(PadGrad)
                       .Doc("y = x with `after` zeros appended along `axis` (of known size): np.pad with (0, after) "
                            "on that axis. Its gradient is a slice of dy."));

}  // namespace
}  // namespace strata
