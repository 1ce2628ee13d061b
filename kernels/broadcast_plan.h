#ifndef STRATA_KERNELS_BROADCAST_PLAN_H_
#define STRATA_KERNELS_BROADCAST_PLAN_H_

// numpy broadcasting of two operands, as one loop plan that the CPU kernels
// (kernels/cpu/elementwise.h) and the CUDA kernels (kernels/cuda/binary.h)
// both walk, so both accept and refuse the same shapes with the same words.

#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/tensor.h"

namespace strata {

// Loop structure of z = f(x, y) under numpy broadcasting, with adjacent dims
// merged wherever both inputs are laid out alike. What is left is an odometer
// over `outer_dims` around one contiguous inner loop whose input strides are
// 0 (broadcast) or 1: same shape, scalar and row-bias cases all become a
// single vectorizable inner loop.
struct BroadcastPlan {
  Shape out_shape;
  absl::InlinedVector<int64_t, 6> outer_dims;
  absl::InlinedVector<int64_t, 6> outer_x_strides;
  absl::InlinedVector<int64_t, 6> outer_y_strides;
  int64_t outer_count = 1;
  int64_t inner = 1;
  int64_t inner_x_stride = 1;  // 0 or 1
  int64_t inner_y_stride = 1;  // 0 or 1
};

// x and y broadcast against each other; InvalidArgument if they do not.
absl::StatusOr<BroadcastPlan> MakeBroadcastPlan(absl::Span<const int64_t> x, absl::Span<const int64_t> y);
// x and y each broadcast to `out` (which is not widened).
absl::StatusOr<BroadcastPlan> MakeBroadcastPlanTo(absl::Span<const int64_t> x, absl::Span<const int64_t> y,
                                                  absl::Span<const int64_t> out);

}  // namespace strata

#endif  // STRATA_KERNELS_BROADCAST_PLAN_H_
