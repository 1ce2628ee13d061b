#ifndef STRATA_KERNELS_CUDA_LOSS_SCALING_H_
#define STRATA_KERNELS_CUDA_LOSS_SCALING_H_

// Dynamic loss scaling on the GPU: check_finite_and_unscale and
// update_loss_scaling with kernels/loss_scaling_math.h's math (the CPU
// kernels'), so both devices compute the same bits. The scale, the flag and
// the counters stay on the device: a step never waits for the host for them.
// Asynchronous on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/loss_scaling_math.h"

namespace strata {
namespace cuda {

// *flag = 0: before the gradients of one check_finite_and_unscale.
cudaError_t LaunchClearFlag(int* flag, cudaStream_t stream);

// y = x * InverseLossScale(scale[0]) over n elements; *flag = 1 where some x
// is inf or nan (every writer writes 1: no race changes the result).
cudaError_t LaunchUnscaleAndCheck(float* y, const float* x, int64_t n, const float* scale, int* flag,
                                  cudaStream_t stream);
cudaError_t LaunchUnscaleAndCheck(double* y, const double* x, int64_t n, const float* scale, int* flag,
                                  cudaStream_t stream);

// found_inf[0] = *flag ? 1 : 0.
cudaError_t LaunchFlagToFoundInf(float* found_inf, const int* flag, cudaStream_t stream);

// UpdateLossScale on the device scalars: one thread.
cudaError_t LaunchUpdateLossScaling(const float* found_inf, float* scale, int64_t* good_steps,
                                    int64_t* skipped_updates, const kernel_math::LossScalingAttrs& attrs,
                                    cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_LOSS_SCALING_H_
