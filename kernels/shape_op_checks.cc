#include "kernels/shape_op_checks.h"

#include "absl/strings/str_cat.h"
#include "proto/status_macros.h"

namespace strata {
namespace shape_op_checks {

absl::Status Invalid(const Op& op, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(op.type(), ": ", message));
}

absl::StatusOr<int> CheckAxis(const Op& op, int64_t axis, const Shape& shape) {
  return ForOp(op, NormalizeAxis(axis, static_cast<int>(shape.size()), "attr 'axis'"));
}

absl::Status CheckDtype(const Op& op, const Tensor& t, DataType dtype) {
  if (t.dtype() != dtype) {
    return Invalid(op, absl::StrCat("got ", DataTypeName(t.dtype()), " in a ", DataTypeName(dtype), " kernel"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TransposeLayout> ResolveTranspose(const Op& op, DataType dtype, const Tensor& x,
                                                 absl::Span<const int64_t> perm_attr) {
  STRATA_RETURN_IF_ERROR(CheckDtype(op, x, dtype));
  const int rank = x.rank();
  TransposeLayout layout;
  STRATA_ASSIGN_OR_RETURN(layout.perm, ForOp(op, NormalizePerm(perm_attr, rank)));
  layout.out.resize(rank);
  for (int k = 0; k < rank; ++k) layout.out[k] = x.dim(static_cast<int>(layout.perm[k]));
  return layout;
}

absl::StatusOr<int> CheckPieces(const Op& op, DataType dtype, int64_t axis_attr, const Shape& whole,
                                const std::vector<const Tensor*>& pieces) {
  const int rank = static_cast<int>(whole.size());
  STRATA_ASSIGN_OR_RETURN(const int axis, CheckAxis(op, axis_attr, whole));
  int64_t total = 0;
  for (const Tensor* p : pieces) {
    STRATA_RETURN_IF_ERROR(CheckDtype(op, *p, dtype));
    bool fits = p->rank() == rank;
    for (int d = 0; fits && d < rank; ++d) fits = d == axis || p->dim(d) == whole[d];
    if (!fits) {
      return Invalid(
          op, absl::StrCat(ShapeString(p->shape()), " is not a piece of ", ShapeString(whole), " along axis ", axis));
    }
    total += p->dim(axis);
  }
  if (total != whole[axis]) {
    return Invalid(op, absl::StrCat("pieces add up to ", total, " along axis ", axis, ", not ", whole[axis]));
  }
  return axis;
}

absl::StatusOr<ConcatLayout> ResolveConcat(const Op& op, DataType dtype, int64_t axis_attr,
                                           const std::vector<const Tensor*>& xs) {
  const Tensor& x0 = *xs.at(0);
  ConcatLayout layout;
  STRATA_ASSIGN_OR_RETURN(layout.axis, CheckAxis(op, axis_attr, x0.shape()));
  layout.out = x0.shape();
  layout.out[layout.axis] = 0;
  for (const Tensor* x : xs) {
    if (x->rank() == x0.rank()) layout.out[layout.axis] += x->dim(layout.axis);
  }
  STRATA_RETURN_IF_ERROR(CheckPieces(op, dtype, axis_attr, layout.out, xs).status());
  return layout;
}

absl::StatusOr<int> ResolveConcatGrad(const Op& op, DataType dtype, int64_t axis_attr, const Tensor& dy,
                                      const std::vector<const Tensor*>& xs, int num_outputs) {
  if (num_outputs != static_cast<int>(xs.size())) return Invalid(op, "needs one output per input after dy");
  STRATA_ASSIGN_OR_RETURN(const int axis, CheckPieces(op, dtype, axis_attr, dy.shape(), xs));
  STRATA_RETURN_IF_ERROR(CheckDtype(op, dy, dtype));
  return axis;
}

absl::StatusOr<SplitLayout> ResolveSplit(const Op& op, DataType dtype, int64_t axis_attr,
                                         absl::Span<const int64_t> sections, const Tensor& x, int num_outputs) {
  STRATA_RETURN_IF_ERROR(CheckDtype(op, x, dtype));
  SplitLayout layout;
  STRATA_ASSIGN_OR_RETURN(layout.axis, CheckAxis(op, axis_attr, x.shape()));
  STRATA_ASSIGN_OR_RETURN(layout.sizes, ForOp(op, SplitSizes(x.dim(layout.axis), num_outputs, sections)));
  return layout;
}

absl::StatusOr<SplitGradLayout> ResolveSplitGrad(const Op& op, DataType dtype, int64_t axis_attr,
                                                 absl::Span<const int64_t> sections,
                                                 absl::Span<const int64_t> grad_outputs, const Tensor& x,
                                                 const std::vector<const Tensor*>& dys) {
  SplitGradLayout layout;
  STRATA_ASSIGN_OR_RETURN(layout.axis, CheckAxis(op, axis_attr, x.shape()));
  STRATA_ASSIGN_OR_RETURN(const Shape sizes,
                          ForOp(op, SplitSizes(x.dim(layout.axis), static_cast<int>(sections.size()), sections)));
  if (grad_outputs.size() != dys.size()) return Invalid(op, "one dy per grad_outputs entry");
  std::vector<int64_t> offset(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) offset[i + 1] = offset[i] + sizes[i];
  for (size_t k = 0; k < grad_outputs.size(); ++k) {
    const Tensor& dy = *dys[k];
    const int64_t which = grad_outputs[k];
    if (which < 0 || which >= static_cast<int64_t>(sizes.size())) return Invalid(op, "bad grad_outputs");
    Shape want = x.shape();
    want[layout.axis] = sizes[which];
    if (dy.shape() != want || dy.dtype() != dtype) {
      return Invalid(op, absl::StrCat("dy ", ShapeString(dy.shape()), " is not piece ", which, " ", ShapeString(want)));
    }
    layout.offsets.push_back(offset[which]);
  }
  return layout;
}

absl::StatusOr<SliceWindow> ResolveSliceOf(const Op& op, DataType dtype, const Tensor& x,
                                           absl::Span<const int64_t> axes, absl::Span<const int64_t> starts,
                                           absl::Span<const int64_t> ends) {
  STRATA_RETURN_IF_ERROR(CheckDtype(op, x, dtype));
  return ForOp(op, ResolveSlice(x.shape(), axes, starts, ends));
}

absl::StatusOr<SliceWindow> ResolveSliceGrad(const Op& op, DataType dtype, const Tensor& dy, const Tensor& x,
                                             absl::Span<const int64_t> axes, absl::Span<const int64_t> starts,
                                             absl::Span<const int64_t> ends) {
  STRATA_RETURN_IF_ERROR(CheckDtype(op, dy, dtype));
  STRATA_ASSIGN_OR_RETURN(SliceWindow window, ForOp(op, ResolveSlice(x.shape(), axes, starts, ends)));
  if (dy.shape() != window.size) {
    return Invalid(op, absl::StrCat("dy ", ShapeString(dy.shape()), " is not the slice ", ShapeString(window.size)));
  }
  return window;
}

absl::StatusOr<BroadcastLikeLayout> ResolveBroadcastLike(absl::Span<const int64_t> axis, bool keepdim, bool mean,
                                                         const Tensor& dy, const Shape& x) {
  BroadcastLikeLayout layout;
  STRATA_ASSIGN_OR_RETURN(layout.reduced, ReducedAxes(axis, static_cast<int>(x.size()), "x"));
  if (dy.shape() != ReduceShape(x, layout.reduced, keepdim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dy ", ShapeString(dy.shape()), " is not x ", ShapeString(x), " reduced over the op's axis"));
  }
  int64_t count = 1;
  for (size_t d = 0; d < x.size(); ++d) {
    if (layout.reduced[d]) count *= x[d];
  }
  if (mean && count > 0) layout.factor = 1.0 / static_cast<double>(count);
  return layout;
}

}  // namespace shape_op_checks
}  // namespace strata
