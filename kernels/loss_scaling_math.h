#ifndef STRATA_KERNELS_LOSS_SCALING_MATH_H_
#define STRATA_KERNELS_LOSS_SCALING_MATH_H_

// Dynamic loss scaling's math (torch.cuda.amp.GradScaler's, PaddlePaddle's
// check_finite_and_unscale and update_loss_scaling ops), once, as plain
// __host__ __device__ functions: the CPU kernels (kernels/cpu/
// loss_scaling.cc) call them, and a CUDA kernel will. No library calls, so
// both devices compute the same bits.

#include <cstdint>

#include "kernels/host_device.h"

namespace strata {
namespace kernel_math {

// Whether x is neither inf nor nan: x - x is 0 for finite x and nan
// otherwise (IEEE arithmetic; the kernels are not built with fast-math).
template <typename T>
STRATA_HOST_DEVICE inline bool IsFiniteValue(T x) {
  const T d = x - x;
  return d == d;
}

// The factor the gradients are multiplied by: 1 / scale in double, rounded
// to float, as GradScaler's `_scale.double().reciprocal().float()`.
STRATA_HOST_DEVICE inline float InverseLossScale(float scale) {
  return static_cast<float>(1.0 / static_cast<double>(scale));
}

// One element of check_finite_and_unscale: y = x * inv_scale; sets *found
// when x is not finite (never clears it).
template <typename T>
STRATA_HOST_DEVICE inline T UnscaleElement(T x, T inv_scale, bool* found) {
  if (!IsFiniteValue(x)) *found = true;
  return x * inv_scale;
}

// The smallest scale a back-off leaves: float32's least normal value
// (2^-126), whose reciprocal float32 still holds; below it the unscaled
// gradients would be inf (or 0 x inf), an update of NaN weights rather than
// a skipped one. Torch lets its scale reach 0.
constexpr float kMinLossScale = 1.17549435e-38f;

struct LossScalingAttrs {
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// update_loss_scaling (torch's _amp_update_scale_): after an overflow the
// scale backs off and the run of good steps restarts; after growth_interval
// good steps in a row it grows (unless growing would overflow float32).
// Products in double, rounded to float, as the CUDA kernel of torch computes
// `float * double`.
STRATA_HOST_DEVICE inline void UpdateLossScale(const LossScalingAttrs& a, bool found_inf, float* scale,
                                               int64_t* good_steps, int64_t* skipped_updates) {
  if (found_inf) {
    const float backed = static_cast<float>(static_cast<double>(*scale) * a.backoff_factor);
    *scale = backed >= kMinLossScale ? backed : kMinLossScale;
    *good_steps = 0;
    *skipped_updates += 1;
    return;
  }
  const int64_t good = *good_steps + 1;
  if (good >= a.growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(*scale) * a.growth_factor);
    if (IsFiniteValue(grown)) *scale = grown;
    *good_steps = 0;
  } else {
    *good_steps = good;
  }
}

// Whether an update op given found_inf skips its update.
STRATA_HOST_DEVICE inline bool SkipsUpdate(float found_inf) { return found_inf != 0.0f; }

}  // namespace kernel_math
}  // namespace strata

#endif  // STRATA_KERNELS_LOSS_SCALING_MATH_H_
