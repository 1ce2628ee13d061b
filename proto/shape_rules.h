#ifndef STRATA_PROTO_SHAPE_RULES_H_
#define STRATA_PROTO_SHAPE_RULES_H_

// The shape rules an op's schema (compiler/ops/, at compile time, where -1 is
// the batch dim) and its kernels (kernels/, at run time, on concrete shapes)
// share, so both accept the same attrs and shapes and refuse the rest with the
// same words. Functions of plain shapes and attr values; messages name the
// attr or input, and the caller prefixes the op.

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/types.h"

namespace strata {

// ---- axes -------------------------------------------------------------------

// The dim in [0, rank) that `axis` in [-rank, rank) names (negative counts
// from the end). `what` names the attr: "attr 'axis' = 3 is out of range for
// rank 2 (expected -2 to 1)".
absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank, absl::string_view what);

// The same for the `axis` attr of an op along one axis of its input named
// `input` (softmax and its kin): "input 'x' must have rank >= 1, got a
// scalar", "attr 'axis' is 2, out of range for input 'x' of rank 2 (expected
// -2..1)".
absl::StatusOr<int> NormalizeInputAxis(int64_t axis, int rank, absl::string_view input);

// ---- reductions (reduce_sum, reduce_mean, broadcast_like) -------------------

// Per-dim flags of the dims an `axis` list attr reduces in input `input` of
// rank `rank`: negative axes count from the end, an empty list reduces all
// dims, a dim listed twice is an error.
absl::StatusOr<std::vector<bool>> ReducedAxes(absl::Span<const int64_t> axis, int rank, absl::string_view input);

// `shape` with the `reduced` dims removed, or kept as 1 with `keepdim`.
Shape ReduceShape(absl::Span<const int64_t> shape, const std::vector<bool>& reduced, bool keepdim);

// ---- broadcasting ---------------------------------------------------------------

// Numpy broadcasting of two shapes: aligned at the last dim, a 1 stretches to
// the other's size; anything else is "shapes A and B do not broadcast". The
// elementwise ops' schemas and both devices' kernels (kernels/broadcast_plan)
// use it.
absl::StatusOr<Shape> BroadcastShapes(absl::Span<const int64_t> a, absl::Span<const int64_t> b);

// ---- matmul -----------------------------------------------------------------------

// y = op(a) @ op(b), op transposing the last two dims when asked: a is
// [..., M, K], b is [K, N] shared over a's batch or [..., K, N] with a's
// batch dims. Errors name the inputs 'a' and 'b' with their shapes. The
// matmul schema and both devices' kernels (kernels/matmul_shape.h) use it.
struct MatmulDims {
  Shape batch;  // a's leading dims, y's too
  int64_t m = 0, k = 0, n = 0;
  bool b_batched = false;  // b has a's batch dims (else one 2-D b is shared)
};
absl::StatusOr<MatmulDims> ResolveMatmul(absl::Span<const int64_t> a, absl::Span<const int64_t> b, bool transpose_a,
                                         bool transpose_b);

// ---- reshape, flatten, transpose ----------------------------------------------

// reshape's output shape: `spec` (the `shape` attr) against the input shape
// `in`; 0 copies the input dim at that position, one -1 is inferred. With the
// batch dim (-1) in `in` it must go to a 0 or the -1 entry, and the inferred
// dim is then exactly the batch dim (the other dims hold one batch entry).
absl::StatusOr<Shape> ResolveReshape(absl::Span<const int64_t> in, absl::Span<const int64_t> spec);

// The product of a shape's known (non-negative) dims, and how many are
// unknown (-1, the batch dim at compile time).
int64_t KnownProduct(absl::Span<const int64_t> shape);
int CountUnknown(absl::Span<const int64_t> shape);

// sum_to_like: the dims of x that summing x to `like`'s shape reduces (x's
// leading dims beyond like's rank, and the dims where like has 1 and x
// not), by the broadcasting rule; `*any` says whether any of them sums more
// than one element (else the result is x reshaped). InvalidArgument when
// like does not broadcast to x.
absl::StatusOr<std::vector<bool>> SumToLikeDims(absl::Span<const int64_t> x, absl::Span<const int64_t> like,
                                                bool* any);

// flatten's output shape: `in` with axes start_axis..end_axis (inclusive,
// negative counts from the end) merged into one. The batch dim may only be
// "merged" with dims of size 1.
absl::StatusOr<Shape> FlattenShape(absl::Span<const int64_t> in, int64_t start_axis, int64_t end_axis);

// transpose's `perm` attr normalized to [0, rank): one entry per dim, each dim
// once.
absl::StatusOr<Shape> NormalizePerm(absl::Span<const int64_t> perm, int rank);

// ---- split, slice -------------------------------------------------------------

// Sizes of the `n` pieces split cuts a dim of size `dim` (-1: the batch dim)
// into: equal parts when `sections` is empty, else `sections` with at most
// one -1 (the rest).
absl::StatusOr<Shape> SplitSizes(int64_t dim, int n, absl::Span<const int64_t> sections);

// Ends at or beyond this read "to the end" of a slice (INT32_MAX, INT64_MAX...).
inline constexpr int64_t kSliceToTheEnd = std::numeric_limits<int32_t>::max();

// The window slice reads: its first index and size along each dim of `in`.
// Axis axes[k] reads [starts[k], ends[k]) numpy style: negative indices count
// from the end and out-of-range ones clamp. The batch dim can only be read
// whole ([0, kSliceToTheEnd or more)); its size stays -1.
struct SliceWindow {
  Shape begin;
  Shape size;
};
absl::StatusOr<SliceWindow> ResolveSlice(absl::Span<const int64_t> in, absl::Span<const int64_t> axes,
                                         absl::Span<const int64_t> starts, absl::Span<const int64_t> ends);

// ---- scaled_dot_product_attention ---------------------------------------------

// The order of q, k, v, y and their gradients' dims (attr 'layout'): kBhtd
// "bhtd" [B, H, T, D] (the default) or kBthd "bthd" [B, T, H, D], the
// layout of a [B, T, H * D] projection split into heads without a
// transpose. lse is [B, H, T] in both.
enum class AttentionLayout { kBhtd, kBthd };

// The layout attr's value; another string is refused naming the two
// ("attr 'layout' must be "bhtd" ([B, H, T, D]) or "bthd" ...").
absl::StatusOr<AttentionLayout> ParseAttentionLayout(absl::string_view layout);

// B, H, T, D of a rank-4 q in `layout`.
struct AttentionShape {
  int64_t B = 0, H = 0, T = 0, D = 0;
};
inline AttentionShape AttentionDimsOf(absl::Span<const int64_t> q, AttentionLayout layout) {
  return layout == AttentionLayout::kBthd ? AttentionShape{q[0], q[2], q[1], q[3]}
                                          : AttentionShape{q[0], q[1], q[2], q[3]};
}

// Output extent of a convolution or pooling window (kernel, stride, pad,
// dilation) sliding over an input extent `in` (floor mode, as torch's
// ceil_mode=False); 0 when the dilated window exceeds the padded input. The
// schema (compiler/ops) refuses that case; the CPU and CUDA kernels
// (kernels/conv2d_geometry.h, kernels/pool2d_attrs.h) call this too.
inline constexpr int64_t WindowOutExtent(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                                         int64_t dilation = 1) {
  return in + 2 * pad < dilation * (kernel - 1) + 1 ? 0 : (in + 2 * pad - (dilation * (kernel - 1) + 1)) / stride + 1;
}

}  // namespace strata

#endif  // STRATA_PROTO_SHAPE_RULES_H_
