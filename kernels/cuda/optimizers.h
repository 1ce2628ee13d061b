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
// - adam_update with step < 1 writes NaN into every param element (and its
//   copy, below, the NaN converted) and leaves m and v as they were.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/loss_scaling_math.h"
#include "kernels/optimizer_math.h"

namespace strata {
namespace cuda {

// found_inf (every update below and increment): null, or loss scaling's F32
// flag on the device; where it is nonzero the op changes nothing
// (kernel_math::SkipsUpdate, the CPU kernels' rule), the copy included.

// The copy an update may also write (attr copy_dtype: mixed precision's
// 16-bit weight copy, written by the update instead of a cast after it):
// none, bfloat16 or float16. Every update launcher takes its kind and the
// copy's device buffer (n elements of that type, unused with kNone) last;
// each element of the copy is cuda::Convert (unary_math.h, the cast
// kernel's conversion) of the param element just updated, in the same loop.
enum class UpdateCopy { kNone, kBf16, kF16 };

// counter[0] += by: one thread.
cudaError_t LaunchIncrement(int64_t* counter, int64_t by, const float* found_inf, cudaStream_t stream);

// lr[0] = LearningRate(schedule, step[0], total_steps): one thread.
cudaError_t LaunchLrSchedule(float* lr, const int64_t* step, const kernel_math::LrSchedule& schedule, int64_t total_steps,
                             cudaStream_t stream);
cudaError_t LaunchLrSchedule(double* lr, const int64_t* step, const kernel_math::LrSchedule& schedule, int64_t total_steps,
                             cudaStream_t stream);

// param, m, v [n] updated in place from grad [n], lr [1] and step [1].
cudaError_t LaunchAdamUpdate(float* param, float* m, float* v, const float* grad, const float* lr, const int64_t* step,
                             const kernel_math::AdamAttrs& attrs, int64_t n, const float* found_inf,
                             cudaStream_t stream, const float* grad_scale = nullptr,
                             UpdateCopy copy_kind = UpdateCopy::kNone, void* copy = nullptr);
cudaError_t LaunchAdamUpdate(double* param, double* m, double* v, const double* grad, const double* lr,
                             const int64_t* step, const kernel_math::AdamAttrs& attrs, int64_t n,
                             const float* found_inf, cudaStream_t stream, const double* grad_scale = nullptr,
                             UpdateCopy copy_kind = UpdateCopy::kNone, void* copy = nullptr);

// param [n] updated in place from grad [n] and lr [1].
cudaError_t LaunchSgdUpdate(float* param, const float* grad, const float* lr, float weight_decay, int64_t n,
                            const float* found_inf, cudaStream_t stream, const float* grad_scale = nullptr,
                            UpdateCopy copy_kind = UpdateCopy::kNone, void* copy = nullptr);
cudaError_t LaunchSgdUpdate(double* param, const double* grad, const double* lr, double weight_decay, int64_t n,
                            const float* found_inf, cudaStream_t stream, const double* grad_scale = nullptr,
                            UpdateCopy copy_kind = UpdateCopy::kNone, void* copy = nullptr);

// param, velocity [n] updated in place from grad [n] and lr [1].
cudaError_t LaunchMomentumUpdate(float* param, float* velocity, const float* grad, const float* lr, float momentum,
                                 float weight_decay, bool nesterov, int64_t n, const float* found_inf,
                                 cudaStream_t stream, const float* grad_scale = nullptr,
                                 UpdateCopy copy_kind = UpdateCopy::kNone, void* copy = nullptr);
cudaError_t LaunchMomentumUpdate(double* param, double* velocity, const double* grad, const double* lr, double momentum,
                                 double weight_decay, bool nesterov, int64_t n, const float* found_inf,
                                 cudaStream_t stream, const double* grad_scale = nullptr,
                                 UpdateCopy copy_kind = UpdateCopy::kNone, void* copy = nullptr);

// Multi-tensor updates (adam_update_multi, sgd_update_multi,
// momentum_update_multi): `count` tensors, tensor i of n[i] elements, its
// param, grad and state pointers at index i of each array (host arrays; the
// tensors on the device). apex's multi_tensor_apply: the launcher packs up to
// 64 tensors' pointers and sizes into a table passed as a kernel parameter,
// each block one chunk of 16384 elements of one tensor
// (kernels/multi_tensor_table.h); more tensors take more launches. Each
// element gets the single kernels' math (the same functions, the same
// --fmad=false), lr and step read on the device, every block skipping on
// found_inf; adam with step < 1 writes NaN into every param element as the
// single kernel does. grad_scale (every update launcher; null: none): a
// device scalar every gradient element is multiplied by first, rounded to
// T as a mul kernel rounds it (attr grad_scale: clipping's coefficient).
// copy (with copy_kind other than kNone): a host array of `count` device
// buffers, copy[i] tensor i's copy (n[i] elements), written as the single
// launchers write theirs.
cudaError_t LaunchAdamUpdateMulti(float* const* param, float* const* m, float* const* v, const float* const* grad,
                                  const int64_t* n, int count, const float* lr, const int64_t* step,
                                  const kernel_math::AdamAttrs& attrs, const float* found_inf, cudaStream_t stream,
                                  const float* grad_scale = nullptr, UpdateCopy copy_kind = UpdateCopy::kNone,
                                  void* const* copy = nullptr);
cudaError_t LaunchAdamUpdateMulti(double* const* param, double* const* m, double* const* v, const double* const* grad,
                                  const int64_t* n, int count, const double* lr, const int64_t* step,
                                  const kernel_math::AdamAttrs& attrs, const float* found_inf, cudaStream_t stream,
                                  const double* grad_scale = nullptr, UpdateCopy copy_kind = UpdateCopy::kNone,
                                  void* const* copy = nullptr);
cudaError_t LaunchSgdUpdateMulti(float* const* param, const float* const* grad, const int64_t* n, int count,
                                 const float* lr, float weight_decay, const float* found_inf, cudaStream_t stream,
                                 const float* grad_scale = nullptr, UpdateCopy copy_kind = UpdateCopy::kNone,
                                 void* const* copy = nullptr);
cudaError_t LaunchSgdUpdateMulti(double* const* param, const double* const* grad, const int64_t* n, int count,
                                 const double* lr, double weight_decay, const float* found_inf, cudaStream_t stream,
                                 const double* grad_scale = nullptr, UpdateCopy copy_kind = UpdateCopy::kNone,
                                 void* const* copy = nullptr);
cudaError_t LaunchMomentumUpdateMulti(float* const* param, float* const* velocity, const float* const* grad,
                                      const int64_t* n, int count, const float* lr, float momentum, float weight_decay,
                                      bool nesterov, const float* found_inf, cudaStream_t stream,
                                      const float* grad_scale = nullptr, UpdateCopy copy_kind = UpdateCopy::kNone,
                                      void* const* copy = nullptr);
cudaError_t LaunchMomentumUpdateMulti(double* const* param, double* const* velocity, const double* const* grad,
                                      const int64_t* n, int count, const double* lr, double momentum,
                                      double weight_decay, bool nesterov, const float* found_inf, cudaStream_t stream,
                                      const double* grad_scale = nullptr, UpdateCopy copy_kind = UpdateCopy::kNone,
                                      void* const* copy = nullptr);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_OPTIMIZERS_H_
