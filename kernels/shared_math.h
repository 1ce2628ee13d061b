#ifndef STRATA_KERNELS_SHARED_MATH_H_
#define STRATA_KERNELS_SHARED_MATH_H_

// Math the CPU kernels and the CUDA kernels both call, so the two round
// alike: the block size of the fixed-block sums (sum_squares, mse_loss) and
// the scalar formulas of clip_coefficient and mse_loss_grad. Plain C++ for
// g++, __host__ __device__ for nvcc.

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace strata {

// sum_squares and mse_loss sum each block of this many elements in index
// order (in double), then add the blocks' sums in block order; the order,
// hence the rounding, depends on the element count only.
inline constexpr int64_t kFixedSumBlock = 1 << 14;

// clip_coefficient: min(1, max_norm / (sqrt(sum_squares) + 1e-6)),
// torch.nn.utils.clip_grad_norm_'s clamped factor. A NaN norm stays NaN (as
// torch.clamp leaves it) so divergence shows instead of being masked.
STRATA_HOST_DEVICE inline double ClipCoefficient(double sum_squares, double max_norm) {
#ifdef __CUDA_ARCH__
  const double norm = sqrt(sum_squares);
#else
  const double norm = std::sqrt(sum_squares);
#endif
  const double coef = max_norm / (norm + 1e-6);
  return coef != coef ? coef : (1.0 < coef ? 1.0 : coef);  // std::isnan, std::min
}

// mse_loss_grad: dpred = (pred - target) * MseGradScale(dloss, n), the scale
// 2 * dloss / n computed in double and rounded to T once.
template <typename T>
STRATA_HOST_DEVICE inline T MseGradScale(T dloss, int64_t n) {
  return static_cast<T>(2.0 * static_cast<double>(dloss) / static_cast<double>(n));
}

}  // namespace strata

#endif  // STRATA_KERNELS_SHARED_MATH_H_
