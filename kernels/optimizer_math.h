#ifndef STRATA_KERNELS_OPTIMIZER_MATH_H_
#define STRATA_KERNELS_OPTIMIZER_MATH_H_

// The optimizer family's math, once, for the CPU kernels
// (kernels/cpu/optimizers.cc) and the CUDA kernels (kernels/cuda/
// optimizers.cu): each op's attrs as a struct (read from an Op by
// kernels/optimizer_attrs.h), the learning-rate schedule, and one element's
// update, as plain __host__ __device__ functions. g++ compiles them into the
// CPU kernels, nvcc into the CUDA ones; the .cu files are built with
// --fmad=false so nvcc contracts no a * b + c into an FMA the CPU does not do
// (.bazelrc's -ffp-contract=off keeps g++ from contracting either, should
// a loop be compiled for a CPU with FMA). What can still differ
// between the devices: pow and cos in double (CUDA's are within 2 ulp,
// glibc's within 1), in the step and cosine schedules and Adam's bias
// corrections.

#include <cstdint>

#include "kernels/host_device.h"

namespace strata {
namespace kernel_math {

// ---------------------------------------------------------------------------
// lr_schedule: the rate for the update after `step` updates (0-based):
// linear warm-up, then constant, cosine decay to alpha * base_lr, or
// step decay by gamma every step_size updates.

enum class LrScheduleKind : int { kConstant = 0, kCosine = 1, kStep = 2 };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  double base_lr = 0, alpha = 0, gamma = 0.1;
  int64_t warmup_steps = 0, decay_steps = 0, step_size = 1;
};

// The rate for the update after `step` updates (0-based).
STRATA_HOST_DEVICE inline double LearningRate(const LrSchedule& s, int64_t step, int64_t total_steps) {
  constexpr double kPi = 3.14159265358979323846;
  if (step < s.warmup_steps) {
    return s.base_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  const int64_t t = step - s.warmup_steps;
  switch (s.kind) {
    case LrScheduleKind::kConstant:
      return s.base_lr;
    case LrScheduleKind::kStep:
      return s.base_lr * Pow(s.gamma, static_cast<double>(t / s.step_size));
    case LrScheduleKind::kCosine: {
      const int64_t decay_end = s.decay_steps > 0 ? s.decay_steps : total_steps;
      if (decay_end <= 0) return s.base_lr;  // run length unknown: no decay
      const int64_t D = decay_end - s.warmup_steps;
      if (D <= 0) return s.alpha * s.base_lr;
      const double progress = static_cast<double>(t < D ? t : D) / static_cast<double>(D);
      return s.base_lr * (s.alpha + (1.0 - s.alpha) * (1.0 + Cos(kPi * progress)) / 2.0);
    }
  }
  return s.base_lr;
}

// ---------------------------------------------------------------------------
// adam_update (torch.optim.Adam; decoupled: AdamW): the scalars that depend
// on lr and step (computed in double, then rounded to T, as torch's
// _single_tensor_adam does), and one element's update.

struct AdamAttrs {
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8, weight_decay = 0;
  bool decoupled = false;
};

template <typename T>
struct AdamScalars {
  T step_size, bias_correction2_sqrt, decay_factor, l2;
  bool decoupled;
  T beta1, one_minus_beta1, beta2, one_minus_beta2, epsilon;
};

// lr as read from the op's lr input, step (1-based) from its step input.
template <typename T>
STRATA_HOST_DEVICE inline AdamScalars<T> MakeAdamScalars(const AdamAttrs& a, T lr_in, int64_t step) {
  const double lr = static_cast<double>(lr_in);
  const double bias_correction1 = 1.0 - Pow(a.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - Pow(a.beta2, static_cast<double>(step));
  AdamScalars<T> s;
  s.step_size = static_cast<T>(lr / bias_correction1);
  s.bias_correction2_sqrt = static_cast<T>(Sqrt(bias_correction2));
  s.decay_factor = static_cast<T>(1.0 - lr * a.weight_decay);  // AdamW
  s.l2 = static_cast<T>(a.decoupled ? 0.0 : a.weight_decay);     // Adam's L2 term
  s.decoupled = a.decoupled && a.weight_decay != 0;
  s.beta1 = static_cast<T>(a.beta1);
  s.one_minus_beta1 = static_cast<T>(1.0 - a.beta1);
  s.beta2 = static_cast<T>(a.beta2);
  s.one_minus_beta2 = static_cast<T>(1.0 - a.beta2);
  s.epsilon = static_cast<T>(a.epsilon);
  return s;
}

// One element of param, m and v, updated in place, for the case
// (kDecoupled: s.decoupled, kL2: s.l2 != 0) fixed at compile time, so that
// a loop of it is one straight map (the CPU's loop vectorizes).
template <bool kDecoupled, bool kL2, typename T>
STRATA_HOST_DEVICE inline void AdamElementAs(const AdamScalars<T>& s, T grad, T* param, T* m, T* v) {
  T p = *param;
  if constexpr (kDecoupled) p *= s.decay_factor;
  T g = grad;
  if constexpr (kL2) g += s.l2 * p;
  const T m_new = *m * s.beta1 + s.one_minus_beta1 * g;
  const T v_new = *v * s.beta2 + s.one_minus_beta2 * g * g;
  *m = m_new;
  *v = v_new;
  const T denom = Sqrt(v_new) / s.bias_correction2_sqrt + s.epsilon;
  *param = p - s.step_size * (m_new / denom);
}

// The same, the case read from s.
template <typename T>
STRATA_HOST_DEVICE inline void AdamElement(const AdamScalars<T>& s, T grad, T* param, T* m, T* v) {
  if (s.decoupled) {
    if (s.l2 != 0) {
      AdamElementAs<true, true>(s, grad, param, m, v);
    } else {
      AdamElementAs<true, false>(s, grad, param, m, v);
    }
  } else if (s.l2 != 0) {
    AdamElementAs<false, true>(s, grad, param, m, v);
  } else {
    AdamElementAs<false, false>(s, grad, param, m, v);
  }
}

// sgd_update: g += wd * p; p -= lr * g.
struct SgdAttrs {
  double weight_decay = 0;
};

template <typename T>
STRATA_HOST_DEVICE inline void SgdElement(T lr, T weight_decay, T grad, T* param) {
  T g = grad;
  if (weight_decay != 0) g += weight_decay * *param;
  *param -= lr * g;
}

// momentum_update (torch.optim.SGD, dampening 0): g += wd * p;
// buf = momentum * buf + g; g = nesterov ? g + momentum * buf : buf;
// p -= lr * g.
struct MomentumAttrs {
  double momentum = 0.9, weight_decay = 0;
  bool nesterov = false;
};

template <typename T>
STRATA_HOST_DEVICE inline void MomentumElement(T lr, T momentum, T weight_decay, bool nesterov, T grad, T* param,
                                               T* velocity) {
  T g = grad;
  if (weight_decay != 0) g += weight_decay * *param;
  const T buf = *velocity * momentum + g;
  *velocity = buf;
  const T step = nesterov ? g + momentum * buf : buf;
  *param -= lr * step;
}

}  // namespace kernel_math
}  // namespace strata

#endif  // STRATA_KERNELS_OPTIMIZER_MATH_H_
