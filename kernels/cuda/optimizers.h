#ifndef STRATA_KERNELS_CUDA_OPTIMIZERS_H_
#define STRATA_KERNELS_CUDA_OPTIMIZERS_H_

// The optimizer family on the GPU: the step counter, the learning-rate
// schedule and the in-place updates (adam, sgd, momentum), with the math of
// kernels/optimizer_math.h (the CPU kernels' too). lr and step are device scalars that the
// kernels read on the device, so a step never waits for the host (and can be
// captured in a CUDA graph). Every launcher is asynchronous on `stream`.
//
// Inputs the CPU refuses at run time cannot return a status from the device;
// the kernels poison their outputs instead:
// - lr_schedule with step < 0 writes NaN;
// - adam_update with step < 1 writes NaN into every param element and leaves
//   m and v as they were.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/loss_scaling_math.h"
#include "kernels/optimizer_math.h"

namespace strata {
namespace cuda {

// found_inf (every update below and increment): null, or loss scaling's F32
// flag on the device; where it is nonzero the op changes nothing
// (kernel_math::SkipsUpdate, the CPU kernels' rule).

// counter[0] += by: one thread.
cudaError_t LaunchIncrement(int64_t* counter, int64_t by, const float* found_inf, cudaStream_t stream);

// lr[0] = LearningRate(schedule, step[0], total_steps): one thread.
cudaError_t LaunchLrSchedule(float* lr, const int64_t* step, const kernel_math::LrSchedule& schedule, int64_t total_steps,
                             cudaStream_t stream);
cudaError_t LaunchLrSchedule(double* lr, const int64_t* step, const kernel_math::LrSchedule& schedule, int64_t total_steps,
                             cudaStream_t stream);

// param, m, v [n] updated in place from grad [n], lr [1] and step [1].
cudaError_t LaunchAdamUpdate(float* param, float* m, float* v, const float* grad, const float* lr,
                             const int64_t* step, const kernel_math::AdamAttrs& attrs, int64_t n, const float* found_inf,
                             cudaStream_t stream);
cudaError_t LaunchAdamUpdate(double* param, double* m, double* v, const double* grad, const double* lr,
                             const int64_t* step, const kernel_math::AdamAttrs& attrs, int64_t n, const float* found_inf,
                             cudaStream_t stream);

// param [n] updated in place from grad [n] and lr [1].
cudaError_t LaunchSgdUpdate(float* param, const float* grad, const float* lr, float weight_decay, int64_t n,
                            const float* found_inf, cudaStream_t stream);
cudaError_t LaunchSgdUpdate(double* param, const double* grad, const double* lr, double weight_decay, int64_t n,
                            const float* found_inf, cudaStream_t stream);

// param, velocity [n] updated in place from grad [n] and lr [1].
cudaError_t LaunchMomentumUpdate(float* param, float* velocity, const float* grad, const float* lr, float momentum,
                                 float weight_decay, bool nesterov, int64_t n, const float* found_inf,
                                 cudaStream_t stream);
cudaError_t LaunchMomentumUpdate(double* param, double* velocity, const double* grad, const double* lr,
                                 double momentum, double weight_decay, bool nesterov, int64_t n,
                                 const float* found_inf, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_OPTIMIZERS_H_
