// The embedding family: embedding (a table lookup by I64 ids) and its backward op.

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/ops/nn_shape_checks.h"

namespace strata {
namespace {

using nn_shape_checks::Dims;
using nn_shape_checks::ExpectDtypeArg;
using nn_shape_checks::ExpectFloatingArg;
using nn_shape_checks::ExpectRankArg;
using nn_shape_checks::ExpectStaticDims;
using nn_shape_checks::Invalid;

absl::Status EmbeddingShape(ShapeContext& ctx) {
  STRATA_RETURN_IF_ERROR(ExpectDtypeArg(ctx, 0, "ids", I64));
  STRATA_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 1, "table"));
  STRATA_RETURN_IF_ERROR(ExpectRankArg(ctx, 1, "table", 2, "[V, D]"));
  STRATA_RETURN_IF_ERROR(ExpectStaticDims(ctx, 1, "table", 0));
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
  STRATA_RETURN_IF_ERROR(ExpectDtypeArg(ctx, 0, "ids", I64));
  STRATA_RETURN_IF_ERROR(ExpectFloatingArg(ctx, 1, "dy"));
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
