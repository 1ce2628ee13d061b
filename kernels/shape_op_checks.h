#ifndef STRATA_KERNELS_SHAPE_OP_CHECKS_H_
#define STRATA_KERNELS_SHAPE_OP_CHECKS_H_

// The run-time checks of the shape ops (transpose, concat, split, slice and
// their gradients) and of broadcast_like, shared by the CPU kernels
// (kernels/cpu/shape_ops.cc, reduce.cc) and the CUDA kernels, so both refuse
// the same operands with the same words. Each Resolve* makes all of its op's
// checks, in the CPU kernel's order, and returns what the copy needs; the
// shape rules themselves are the schemas' (proto/shape_rules.h). Errors read
// "<op type>: <what>".

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/program.pb.h"
#include "proto/shape_rules.h"
#include "runtime/tensor.h"

namespace strata {
namespace shape_op_checks {

// InvalidArgument "<op type>: <message>".
absl::Status Invalid(const Op& op, absl::string_view message);

// A shape rule's value (proto/shape_rules.h), or its error naming the op.
template <typename V>
absl::StatusOr<V> ForOp(const Op& op, absl::StatusOr<V> value) {
  if (!value.ok()) return Invalid(op, value.status().message());
  return value;
}

// The op's `axis` attr in [0, rank of shape).
absl::StatusOr<int> CheckAxis(const Op& op, int64_t axis, const Shape& shape);

// A kernel over `dtype` reads or writes t: t must hold it.
absl::Status CheckDtype(const Op& op, const Tensor& t, DataType dtype);

// transpose(x): y[o] = x[i] with i[perm[k]] = o[k].
struct TransposeLayout {
  Shape perm;  // in [0, rank)
  Shape out;   // y's shape
};
absl::StatusOr<TransposeLayout> ResolveTranspose(const Op& op, DataType dtype, const Tensor& x,
                                                 absl::Span<const int64_t> perm_attr);

// `pieces` (of dtype) stack along the axis attr into `whole`; returns the axis.
absl::StatusOr<int> CheckPieces(const Op& op, DataType dtype, int64_t axis_attr, const Shape& whole,
                                const std::vector<const Tensor*>& pieces);

// concat(xs...) -> y: the axis and y's shape.
struct ConcatLayout {
  int axis = 0;
  Shape out;
};
absl::StatusOr<ConcatLayout> ResolveConcat(const Op& op, DataType dtype, int64_t axis_attr,
                                           const std::vector<const Tensor*>& xs);

// concat_grad(dy, xs...) -> dxs (dxs[i] shaped like xs[i]): the axis.
absl::StatusOr<int> ResolveConcatGrad(const Op& op, DataType dtype, int64_t axis_attr, const Tensor& dy,
                                      const std::vector<const Tensor*>& xs, int num_outputs);

// split(x) -> num_outputs pieces: the axis and the pieces' sizes along it.
struct SplitLayout {
  int axis = 0;
  Shape sizes;
};
absl::StatusOr<SplitLayout> ResolveSplit(const Op& op, DataType dtype, int64_t axis_attr,
                                         absl::Span<const int64_t> sections, const Tensor& x, int num_outputs);

// split_grad(x, dys...) -> dx: zeros shaped like x with dys[k] at offsets[k]
// along the axis (dys[k] is piece grad_outputs[k] of the split).
struct SplitGradLayout {
  int axis = 0;
  std::vector<int64_t> offsets;
};
absl::StatusOr<SplitGradLayout> ResolveSplitGrad(const Op& op, DataType dtype, int64_t axis_attr,
                                                 absl::Span<const int64_t> sections,
                                                 absl::Span<const int64_t> grad_outputs, const Tensor& x,
                                                 const std::vector<const Tensor*>& dys);

// slice(x) -> y: the window of x that y is.
absl::StatusOr<SliceWindow> ResolveSliceOf(const Op& op, DataType dtype, const Tensor& x,
                                           absl::Span<const int64_t> axes, absl::Span<const int64_t> starts,
                                           absl::Span<const int64_t> ends);

// slice_grad(dy, x) -> dx: zeros shaped like x with dy in the window.
absl::StatusOr<SliceWindow> ResolveSliceGrad(const Op& op, DataType dtype, const Tensor& dy, const Tensor& x,
                                             absl::Span<const int64_t> axes, absl::Span<const int64_t> starts,
                                             absl::Span<const int64_t> ends);

// broadcast_like(dy, x) -> dx = dy repeated over the dims that
// reduce_*(x, axis, keepdim) removed, times T(factor): the reduced dims of x,
// and factor = 1 / (elements each dy element stands for) for the mean (of a
// non-empty reduction), else 1.
struct BroadcastLikeLayout {
  std::vector<bool> reduced;
  double factor = 1.0;
};
absl::StatusOr<BroadcastLikeLayout> ResolveBroadcastLike(absl::Span<const int64_t> axis, bool keepdim, bool mean,
                                                         const Tensor& dy, const Shape& x);

}  // namespace shape_op_checks
}  // namespace strata

#endif  // STRATA_KERNELS_SHAPE_OP_CHECKS_H_
