// increment, lr_schedule: one thread each (scalars). adam, sgd, momentum: a
// grid-stride loop over the elements, 256 threads a block, at most
// kMaxBlocks blocks (their _multi forms: one block per chunk of one tensor,
// below); for adam, thread 0 of each block computes the scalars
// that depend on lr and step (in double, kernels/optimizer_math.h) into
// shared memory once, and the block's threads read them from there. The
// update kernels are templated on the copy's element type C (UpdateCopy):
// void for none, where the copy's code compiles away, else bfloat16 or
// float16, each element written from the param value just stored.

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cuda/optimizers.h"
#include "kernels/cuda/unary_math.h"
#include "kernels/loss_scaling_math.h"
#include "kernels/multi_tensor_table.h"
#include "kernels/optimizer_math.h"

namespace strata {
namespace cuda {

using kernel_math::AdamAttrs;
using kernel_math::AdamElement;
using kernel_math::AdamScalars;
using kernel_math::LearningRate;
using kernel_math::LrSchedule;
using kernel_math::MakeAdamScalars;
using kernel_math::MomentumElement;
using kernel_math::SgdElement;

namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 65536;

int64_t NumBlocks(int64_t n) { return std::min(kMaxBlocks, (n + kThreadsPerBlock - 1) / kThreadsPerBlock); }

// Whether loss scaling's flag (null: none) skips this update.
__device__ inline bool Skipped(const float* found_inf) {
  return found_inf != nullptr && kernel_math::SkipsUpdate(found_inf[0]);
}

// Gradient elements times *grad_scale where given (attr grad_scale), each
// rounded to T as a mul kernel rounds it; the scale read once a thread.
template <typename T>
struct GradScaleOf {
  __device__ explicit GradScaleOf(const T* grad_scale)
      : on(grad_scale != nullptr), scale(grad_scale != nullptr ? grad_scale[0] : T(1)) {}
  __device__ T operator()(T g) const { return on ? g * scale : g; }
  bool on;
  T scale;
};

// copy[i] = param[i] converted to C (the cast kernel's Convert) where the
// update writes a copy (C not void), right after the element's update: the
// element functions store param last, so the compiler reuses the value just
// stored rather than reading param again. With C void, nothing.
template <typename C, typename T>
__device__ inline void WriteCopy(C* copy, const T* param, int64_t i) {
  if constexpr (!std::is_void_v<C>) copy[i] = Convert<C>(param[i]);
}

// Returns launch(a null C*), C the copy's element type for `kind`: void
// (kNone), bfloat16 or float16.
template <typename Launch>
cudaError_t WithCopyType(UpdateCopy kind, Launch launch) {
  switch (kind) {
    case UpdateCopy::kBf16:
      return launch(static_cast<bfloat16*>(nullptr));
    case UpdateCopy::kF16:
      return launch(static_cast<float16*>(nullptr));
    case UpdateCopy::kNone:
      break;
  }
  return launch(static_cast<void*>(nullptr));
}

__global__ void IncrementKernel(int64_t* counter, int64_t by, const float* found_inf) {
  if (!Skipped(found_inf)) counter[0] += by;
}

template <typename T>
__global__ void LrScheduleKernel(T* lr, const int64_t* step, LrSchedule schedule, int64_t total_steps) {
  const int64_t s = step[0];
  lr[0] = s < 0 ? static_cast<T>(__longlong_as_double(0x7ff8000000000000LL))  // NaN: the CPU refuses step < 0
                : static_cast<T>(LearningRate(schedule, s, total_steps));
}

template <typename T, typename C>
__global__ void AdamKernel(T* param, T* m, T* v, const T* grad, const T* lr, const int64_t* step, AdamAttrs attrs,
                           int64_t n, const float* found_inf, const T* grad_scale, C* copy) {
  if (Skipped(found_inf)) return;
  const GradScaleOf<T> scaled(grad_scale);
  __shared__ AdamScalars<T> scalars;
  __shared__ bool bad_step;
  if (threadIdx.x == 0) {
    const int64_t s = step[0];
    bad_step = s < 1;
    scalars = MakeAdamScalars<T>(attrs, lr[0], s);
  }
  __syncthreads();
  const AdamScalars<T> s = scalars;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    if (bad_step) {
      param[i] = static_cast<T>(__longlong_as_double(0x7ff8000000000000LL));
    } else {
      AdamElement(s, scaled(grad[i]), &param[i], &m[i], &v[i]);
    }
    WriteCopy(copy, param, i);
  }
}

template <typename T, typename C>
__global__ void SgdKernel(T* param, const T* grad, const T* lr, T weight_decay, int64_t n, const float* found_inf,
                          const T* grad_scale, C* copy) {
  if (Skipped(found_inf)) return;
  const GradScaleOf<T> scaled(grad_scale);
  const T rate = lr[0];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    SgdElement(rate, weight_decay, scaled(grad[i]), &param[i]);
    WriteCopy(copy, param, i);
  }
}

template <typename T, typename C>
__global__ void MomentumKernel(T* param, T* velocity, const T* grad, const T* lr, T momentum, T weight_decay,
                               bool nesterov, int64_t n, const float* found_inf, const T* grad_scale, C* copy) {
  if (Skipped(found_inf)) return;
  const GradScaleOf<T> scaled(grad_scale);
  const T rate = lr[0];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    MomentumElement(rate, momentum, weight_decay, nesterov, scaled(grad[i]), &param[i], &velocity[i]);
    WriteCopy(copy, param, i);
  }
}

template <typename T>
cudaError_t LrSchedule1(T* lr, const int64_t* step, const LrSchedule& schedule, int64_t total_steps,
                        cudaStream_t stream) {
  LrScheduleKernel<T><<<1, 1, 0, stream>>>(lr, step, schedule, total_steps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Adam(T* param, T* m, T* v, const T* grad, const T* lr, const int64_t* step, const AdamAttrs& attrs,
                 int64_t n, const float* found_inf, cudaStream_t stream, const T* grad_scale, UpdateCopy copy_kind,
                 void* copy) {
  if (n <= 0) return cudaSuccess;
  return WithCopyType(copy_kind, [&](auto* tag) {
    using C = std::remove_pointer_t<decltype(tag)>;
    AdamKernel<T, C><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(param, m, v, grad, lr, step, attrs, n, found_inf,
                                                                    grad_scale, static_cast<C*>(copy));
    return cudaGetLastError();
  });
}

template <typename T>
cudaError_t Sgd(T* param, const T* grad, const T* lr, T weight_decay, int64_t n, const float* found_inf,
                cudaStream_t stream, const T* grad_scale, UpdateCopy copy_kind, void* copy) {
  if (n <= 0) return cudaSuccess;
  return WithCopyType(copy_kind, [&](auto* tag) {
    using C = std::remove_pointer_t<decltype(tag)>;
    SgdKernel<T, C><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(param, grad, lr, weight_decay, n, found_inf,
                                                                   grad_scale, static_cast<C*>(copy));
    return cudaGetLastError();
  });
}

template <typename T>
cudaError_t Momentum(T* param, T* velocity, const T* grad, const T* lr, T momentum, T weight_decay, bool nesterov,
                     int64_t n, const float* found_inf, cudaStream_t stream, const T* grad_scale, UpdateCopy copy_kind,
                     void* copy) {
  if (n <= 0) return cudaSuccess;
  return WithCopyType(copy_kind, [&](auto* tag) {
    using C = std::remove_pointer_t<decltype(tag)>;
    MomentumKernel<T, C><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(
        param, velocity, grad, lr, momentum, weight_decay, nesterov, n, found_inf, grad_scale, static_cast<C*>(copy));
    return cudaGetLastError();
  });
}

// ---------------------------------------------------------------------------
// Multi-tensor updates: tables of tensors (kernels/multi_tensor_table.h)
// passed by value, each block one chunk of one tensor. With a copy (C not
// void) the table has one more depth, the last: the copies' pointers, stored
// as T* (the table's one pointer type) and cast back to C* in the kernel.
template <typename C>
inline constexpr int kCopyDepth = std::is_void_v<C> ? 0 : 1;
// The largest table, adam's with copies (4 + 1 lists) of double, and the
// other kernel parameters (128 bytes at most) under 4 KiB.
static_assert(sizeof(TensorTable<double, 4 + 1>) + 128 <= 4096, "kernel parameters over 4 KiB");

// Tensor k's copy: the table's last depth, cast back; null where C is void
// (the table has no copy depth).
template <typename C, typename T, int kDepth>
__device__ inline C* CopyOf(const TensorTable<T, kDepth>& table, int k) {
  if constexpr (std::is_void_v<C>) {
    return nullptr;
  } else {
    return reinterpret_cast<C*>(table.ptr[kDepth - 1][k]);
  }
}

template <typename T, typename C>
__global__ void AdamMultiKernel(TensorTable<T, 4 + kCopyDepth<C>> table, const T* lr, const int64_t* step,
                                AdamAttrs attrs, const float* found_inf, const T* grad_scale) {
  if (Skipped(found_inf)) return;
  const GradScaleOf<T> scaled(grad_scale);
  __shared__ AdamScalars<T> scalars;
  __shared__ bool bad_step;
  if (threadIdx.x == 0) {
    const int64_t s = step[0];
    bad_step = s < 1;
    scalars = MakeAdamScalars<T>(attrs, lr[0], s);
  }
  __syncthreads();
  const AdamScalars<T> s = scalars;
  const int k = TensorOfBlock(table, blockIdx.x);
  int64_t lo, hi;
  ChunkOfBlock(table, k, blockIdx.x, &lo, &hi);
  T* param = table.ptr[0][k];
  const T* grad = table.ptr[1][k];
  T* m = table.ptr[2][k];
  T* v = table.ptr[3][k];
  C* copy = CopyOf<C>(table, k);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    if (bad_step) {
      param[i] = static_cast<T>(__longlong_as_double(0x7ff8000000000000LL));
    } else {
      AdamElement(s, scaled(grad[i]), &param[i], &m[i], &v[i]);
    }
    WriteCopy(copy, param, i);
  }
}

template <typename T, typename C>
__global__ void SgdMultiKernel(TensorTable<T, 2 + kCopyDepth<C>> table, const T* lr, T weight_decay,
                               const float* found_inf, const T* grad_scale) {
  if (Skipped(found_inf)) return;
  const GradScaleOf<T> scaled(grad_scale);
  const T rate = lr[0];
  const int k = TensorOfBlock(table, blockIdx.x);
  int64_t lo, hi;
  ChunkOfBlock(table, k, blockIdx.x, &lo, &hi);
  T* param = table.ptr[0][k];
  const T* grad = table.ptr[1][k];
  C* copy = CopyOf<C>(table, k);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    SgdElement(rate, weight_decay, scaled(grad[i]), &param[i]);
    WriteCopy(copy, param, i);
  }
}

template <typename T, typename C>
__global__ void MomentumMultiKernel(TensorTable<T, 3 + kCopyDepth<C>> table, const T* lr, T momentum, T weight_decay,
                                    bool nesterov, const float* found_inf, const T* grad_scale) {
  if (Skipped(found_inf)) return;
  const GradScaleOf<T> scaled(grad_scale);
  const T rate = lr[0];
  const int k = TensorOfBlock(table, blockIdx.x);
  int64_t lo, hi;
  ChunkOfBlock(table, k, blockIdx.x, &lo, &hi);
  T* param = table.ptr[0][k];
  const T* grad = table.ptr[1][k];
  T* velocity = table.ptr[2][k];
  C* copy = CopyOf<C>(table, k);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    MomentumElement(rate, momentum, weight_decay, nesterov, scaled(grad[i]), &param[i], &velocity[i]);
    WriteCopy(copy, param, i);
  }
}

// The multi launchers' tables: the tensors' `lists` (param, grad, then the
// states: kDepth of them) and with a copy (C not void) the copies last, as T*.
// Calls launch(table, blocks) per table (ForEachTensorTable).
template <typename T, typename C, int kDepth, typename Launch>
cudaError_t ForEachTable(const T* const* const (&lists)[kDepth], void* const* copy, const int64_t* n, int count,
                         Launch launch) {
  if constexpr (std::is_void_v<C>) {
    return ForEachTensorTable<T, kDepth>(lists, n, count, launch);
  } else {
    std::vector<const T*> copies(count);
    for (int i = 0; i < count; ++i) copies[i] = reinterpret_cast<const T*>(copy[i]);
    const T* const* with_copies[kDepth + 1];
    for (int d = 0; d < kDepth; ++d) with_copies[d] = lists[d];
    with_copies[kDepth] = copies.data();
    return ForEachTensorTable<T, kDepth + 1>(with_copies, n, count, launch);
  }
}

template <typename T>
cudaError_t AdamMulti(T* const* param, T* const* m, T* const* v, const T* const* grad, const int64_t* n, int count,
                      const T* lr, const int64_t* step, const AdamAttrs& attrs, const float* found_inf,
                      cudaStream_t stream, const T* grad_scale, UpdateCopy copy_kind, void* const* copy) {
  const T* const* lists[4] = {param, grad, m, v};
  return WithCopyType(copy_kind, [&](auto* tag) {
    using C = std::remove_pointer_t<decltype(tag)>;
    const auto launch = [&](const TensorTable<T, 4 + kCopyDepth<C>>& table, int64_t blocks) {
      AdamMultiKernel<T, C><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(table, lr, step, attrs,
                                                                                            found_inf, grad_scale);
      return cudaGetLastError();
    };
    return ForEachTable<T, C>(lists, copy, n, count, launch);
  });
}

template <typename T>
cudaError_t SgdMulti(T* const* param, const T* const* grad, const int64_t* n, int count, const T* lr, T weight_decay,
                     const float* found_inf, cudaStream_t stream, const T* grad_scale, UpdateCopy copy_kind,
                     void* const* copy) {
  const T* const* lists[2] = {param, grad};
  return WithCopyType(copy_kind, [&](auto* tag) {
    using C = std::remove_pointer_t<decltype(tag)>;
    const auto launch = [&](const TensorTable<T, 2 + kCopyDepth<C>>& table, int64_t blocks) {
      SgdMultiKernel<T, C><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(table, lr, weight_decay,
                                                                                           found_inf, grad_scale);
      return cudaGetLastError();
    };
    return ForEachTable<T, C>(lists, copy, n, count, launch);
  });
}

template <typename T>
cudaError_t MomentumMulti(T* const* param, T* const* velocity, const T* const* grad, const int64_t* n, int count,
                          const T* lr, T momentum, T weight_decay, bool nesterov, const float* found_inf,
                          cudaStream_t stream, const T* grad_scale, UpdateCopy copy_kind, void* const* copy) {
  const T* const* lists[3] = {param, grad, velocity};
  return WithCopyType(copy_kind, [&](auto* tag) {
    using C = std::remove_pointer_t<decltype(tag)>;
    const auto launch = [&](const TensorTable<T, 3 + kCopyDepth<C>>& table, int64_t blocks) {
      MomentumMultiKernel<T, C><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
          table, lr, momentum, weight_decay, nesterov, found_inf, grad_scale);
      return cudaGetLastError();
    };
    return ForEachTable<T, C>(lists, copy, n, count, launch);
  });
}

}  // namespace

cudaError_t LaunchIncrement(int64_t* counter, int64_t by, const float* found_inf, cudaStream_t stream) {
  IncrementKernel<<<1, 1, 0, stream>>>(counter, by, found_inf);
  return cudaGetLastError();
}

cudaError_t LaunchLrSchedule(float* lr, const int64_t* step, const LrSchedule& schedule, int64_t total_steps,
                             cudaStream_t stream) {
  return LrSchedule1(lr, step, schedule, total_steps, stream);
}
cudaError_t LaunchLrSchedule(double* lr, const int64_t* step, const LrSchedule& schedule, int64_t total_steps,
                             cudaStream_t stream) {
  return LrSchedule1(lr, step, schedule, total_steps, stream);
}

cudaError_t LaunchAdamUpdate(float* param, float* m, float* v, const float* grad, const float* lr, const int64_t* step,
                             const AdamAttrs& attrs, int64_t n, const float* found_inf, cudaStream_t stream,
                             const float* grad_scale, UpdateCopy copy_kind, void* copy) {
  return Adam(param, m, v, grad, lr, step, attrs, n, found_inf, stream, grad_scale, copy_kind, copy);
}
cudaError_t LaunchAdamUpdate(double* param, double* m, double* v, const double* grad, const double* lr,
                             const int64_t* step, const AdamAttrs& attrs, int64_t n, const float* found_inf,
                             cudaStream_t stream, const double* grad_scale, UpdateCopy copy_kind, void* copy) {
  return Adam(param, m, v, grad, lr, step, attrs, n, found_inf, stream, grad_scale, copy_kind, copy);
}

cudaError_t LaunchSgdUpdate(float* param, const float* grad, const float* lr, float weight_decay, int64_t n,
                            const float* found_inf, cudaStream_t stream, const float* grad_scale, UpdateCopy copy_kind,
                            void* copy) {
  return Sgd(param, grad, lr, weight_decay, n, found_inf, stream, grad_scale, copy_kind, copy);
}
cudaError_t LaunchSgdUpdate(double* param, const double* grad, const double* lr, double weight_decay, int64_t n,
                            const float* found_inf, cudaStream_t stream, const double* grad_scale, UpdateCopy copy_kind,
                            void* copy) {
  return Sgd(param, grad, lr, weight_decay, n, found_inf, stream, grad_scale, copy_kind, copy);
}

cudaError_t LaunchMomentumUpdate(float* param, float* velocity, const float* grad, const float* lr, float momentum,
                                 float weight_decay, bool nesterov, int64_t n, const float* found_inf,
                                 cudaStream_t stream, const float* grad_scale, UpdateCopy copy_kind, void* copy) {
  return Momentum(param, velocity, grad, lr, momentum, weight_decay, nesterov, n, found_inf, stream, grad_scale,
                  copy_kind, copy);
}
cudaError_t LaunchMomentumUpdate(double* param, double* velocity, const double* grad, const double* lr, double momentum,
                                 double weight_decay, bool nesterov, int64_t n, const float* found_inf,
                                 cudaStream_t stream, const double* grad_scale, UpdateCopy copy_kind, void* copy) {
  return Momentum(param, velocity, grad, lr, momentum, weight_decay, nesterov, n, found_inf, stream, grad_scale,
                  copy_kind, copy);
}

cudaError_t LaunchAdamUpdateMulti(float* const* param, float* const* m, float* const* v, const float* const* grad,
                                  const int64_t* n, int count, const float* lr, const int64_t* step,
                                  const AdamAttrs& attrs, const float* found_inf, cudaStream_t stream,
                                  const float* grad_scale, UpdateCopy copy_kind, void* const* copy) {
  return AdamMulti(param, m, v, grad, n, count, lr, step, attrs, found_inf, stream, grad_scale, copy_kind, copy);
}
cudaError_t LaunchAdamUpdateMulti(double* const* param, double* const* m, double* const* v, const double* const* grad,
                                  const int64_t* n, int count, const double* lr, const int64_t* step,
                                  const AdamAttrs& attrs, const float* found_inf, cudaStream_t stream,
                                  const double* grad_scale, UpdateCopy copy_kind, void* const* copy) {
  return AdamMulti(param, m, v, grad, n, count, lr, step, attrs, found_inf, stream, grad_scale, copy_kind, copy);
}

cudaError_t LaunchSgdUpdateMulti(float* const* param, const float* const* grad, const int64_t* n, int count,
                                 const float* lr, float weight_decay, const float* found_inf, cudaStream_t stream,
                                 const float* grad_scale, UpdateCopy copy_kind, void* const* copy) {
  return SgdMulti(param, grad, n, count, lr, weight_decay, found_inf, stream, grad_scale, copy_kind, copy);
}
cudaError_t LaunchSgdUpdateMulti(double* const* param, const double* const* grad, const int64_t* n, int count,
                                 const double* lr, double weight_decay, const float* found_inf, cudaStream_t stream,
                                 const double* grad_scale, UpdateCopy copy_kind, void* const* copy) {
  return SgdMulti(param, grad, n, count, lr, weight_decay, found_inf, stream, grad_scale, copy_kind, copy);
}

cudaError_t LaunchMomentumUpdateMulti(float* const* param, float* const* velocity, const float* const* grad,
                                      const int64_t* n, int count, const float* lr, float momentum, float weight_decay,
                                      bool nesterov, const float* found_inf, cudaStream_t stream,
                                      const float* grad_scale, UpdateCopy copy_kind, void* const* copy) {
  return MomentumMulti(param, velocity, grad, n, count, lr, momentum, weight_decay, nesterov, found_inf, stream,
                       grad_scale, copy_kind, copy);
}
cudaError_t LaunchMomentumUpdateMulti(double* const* param, double* const* velocity, const double* const* grad,
                                      const int64_t* n, int count, const double* lr, double momentum,
                                      double weight_decay, bool nesterov, const float* found_inf, cudaStream_t stream,
                                      const double* grad_scale, UpdateCopy copy_kind, void* const* copy) {
  return MomentumMulti(param, velocity, grad, n, count, lr, momentum, weight_decay, nesterov, found_inf, stream,
                       grad_scale, copy_kind, copy);
}

}  // namespace cuda
}  // namespace strata
