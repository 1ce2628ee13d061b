#include "kernels/broadcast_plan.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/shape_rules.h"

namespace strata {

absl::StatusOr<BroadcastPlan> MakeBroadcastPlan(absl::Span<const int64_t> x, absl::Span<const int64_t> y) {
  absl::StatusOr<Shape> out = BroadcastShapes(x, y);
  if (!out.ok()) return out.status();
  return MakeBroadcastPlanTo(x, y, *out);
}

absl::StatusOr<BroadcastPlan> MakeBroadcastPlanTo(absl::Span<const int64_t> x, absl::Span<const int64_t> y,
                                                  absl::Span<const int64_t> out) {
  const size_t rank = out.size();
  BroadcastPlan plan;
  plan.out_shape.assign(out.begin(), out.end());
  // Per output dim, each input's element stride (0 where it is broadcast).
  auto strides_of = [&](absl::Span<const int64_t> in, const char* name) -> absl::StatusOr<std::vector<int64_t>> {
    if (in.size() > rank) {
      return absl::InvalidArgumentError(absl::StrCat(name, " shape ", ShapeString(in), " has more dims than ",
                                                     ShapeString(out)));
    }
    std::vector<int64_t> strides(rank, 0);
    int64_t stride = 1;
    for (size_t k = rank; k-- > rank - in.size();) {
      const int64_t d = in[k - (rank - in.size())];
      if (d != out[k] && d != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " shape ", ShapeString(in), " does not broadcast to ", ShapeString(out)));
      }
      strides[k] = d == 1 ? 0 : stride;
      stride *= d;
    }
    return strides;
  };
  auto sx = strides_of(x, "x");
  if (!sx.ok()) return sx.status();
  auto sy = strides_of(y, "y");
  if (!sy.ok()) return sy.status();

  if (NumElements(out) == 0) {
    plan.outer_count = 0;
    plan.inner = 0;
    return plan;
  }
  // Merge dims from the innermost out, dropping size-1 dims.
  struct Dim {
    int64_t size, x, y;
  };
  std::vector<Dim> merged;  // innermost first
  for (size_t k = rank; k-- > 0;) {
    if (out[k] == 1) continue;
    Dim d{out[k], (*sx)[k], (*sy)[k]};
    if (!merged.empty()) {
      Dim& in = merged.back();
      if (d.x == in.x * in.size && d.y == in.y * in.size) {
        in.size *= d.size;
        continue;
      }
    }
    merged.push_back(d);
  }
  if (merged.empty()) return plan;  // one element
  plan.inner = merged[0].size;
  plan.inner_x_stride = merged[0].x;
  plan.inner_y_stride = merged[0].y;
  for (size_t i = merged.size(); i-- > 1;) {
    plan.outer_dims.push_back(merged[i].size);
    plan.outer_x_strides.push_back(merged[i].x);
    plan.outer_y_strides.push_back(merged[i].y);
    plan.outer_count *= merged[i].size;
  }
  return plan;
}

}  // namespace strata
