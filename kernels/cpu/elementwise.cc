#include "kernels/cpu/elementwise.h"

namespace strata {

absl::StatusOr<std::vector<bool>> ReducedDims(absl::Span<const int64_t> axis, int rank) {
  std::vector<bool> reduced(rank, axis.empty());
  for (int64_t a : axis) {
    if (a < -rank || a >= rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("axis ", a, " is out of range for rank ", rank, " (expected ", -rank, "..", rank - 1, ")"));
    }
    const int64_t d = a < 0 ? a + rank : a;
    if (reduced[d]) return absl::InvalidArgumentError(absl::StrCat("axis lists dim ", d, " twice"));
    reduced[d] = true;
  }
  return reduced;
}

Shape ReducedShape(absl::Span<const int64_t> shape, const std::vector<bool>& reduced, bool keepdim) {
  Shape out;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!reduced[i]) {
      out.push_back(shape[i]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

}  // namespace strata
