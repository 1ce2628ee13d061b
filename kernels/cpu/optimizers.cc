// CPU kernels of the optimizer family (compiler/ops/optimizer_ops.cc):
// sgd_update, momentum_update, adam_update, increment, lr_schedule,
// sum_squares, sum_squares_grad and clip_coefficient.
//
// Update kernels write the param and moment buffers in place and hand the
// same tensors back as outputs (the ops are stateful). Elementwise loops are
// split over the intra-op pool in contiguous element ranges; scalar
// coefficients (bias corrections, step sizes) are computed once in double.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/kernel_checks.h"
#include "kernels/shared_math.h"
#include "proto/status_macros.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

// Elements per ParallelFor chunk: below this an update runs inline on the caller.
constexpr int64_t kElementwiseChunk = 1 << 14;
constexpr double kPi = 3.14159265358979323846;

// Kernels read their attrs in Init; a factory that reports a failed Init.
template <typename K>
KernelFactory InitFactory() {
  return [](const KernelDef& def) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
    auto kernel = std::make_unique<K>();
    if (def.op == nullptr) return absl::InternalError("kernel built without an op");
    if (absl::Status s = kernel->Init(*def.op); !s.ok()) return s;
    return std::unique_ptr<OpKernel>(std::move(kernel));
  };
}

using kernel_checks::ExpectInputDtype;
using kernel_checks::ExpectLike;
using kernel_checks::ExpectNamedInputDtype;
using kernel_checks::ExpectScalar;
using kernel_checks::MutableData;

// ---------------------------------------------------------------------------
// sgd_update(param, grad, lr) -> param:  g += wd * p;  p -= lr * g.
template <typename T>
class SgdUpdateKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(weight_decay_, AttrFloat(op, "weight_decay"));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "sgd_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "sgd_update", 2, "lr", DataTypeOf<T>::value));
    const Tensor& param_tensor = ctx.input(0);
    T* param = MutableData<T>(param_tensor);
    const T* grad = ctx.input(1).data<T>();
    const T lr = ctx.input(2).data<T>()[0];
    const T weight_decay = static_cast<T>(weight_decay_);
    const int64_t N = param_tensor.num_elements();
    ParallelFor(N, kElementwiseChunk, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T g = grad[i];
        if (weight_decay != 0) g += weight_decay * param[i];
        param[i] -= lr * g;
      }
    });
    ctx.SetOutput(0, param_tensor);
    return absl::OkStatus();
  }

 private:
  double weight_decay_ = 0;
};

// ---------------------------------------------------------------------------
// momentum_update(param, grad, velocity, lr) -> (param, velocity), torch.optim.SGD
// with dampening 0:  g += wd * p;  buf = momentum * buf + g;
// g = nesterov ? g + momentum * buf : buf;  p -= lr * g.
template <typename T>
class MomentumUpdateKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(momentum_, AttrFloat(op, "momentum"));
    STRATA_ASSIGN_OR_RETURN(nesterov_, AttrBool(op, "nesterov"));
    STRATA_ASSIGN_OR_RETURN(weight_decay_, AttrFloat(op, "weight_decay"));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "momentum_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "momentum_update", 2, "velocity", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "momentum_update", 3, "lr", DataTypeOf<T>::value));
    const Tensor& param_tensor = ctx.input(0);
    const Tensor& velocity_tensor = ctx.input(2);
    T* param = MutableData<T>(param_tensor);
    T* velocity = MutableData<T>(velocity_tensor);
    const T* grad = ctx.input(1).data<T>();
    const T lr = ctx.input(3).data<T>()[0];
    const T momentum = static_cast<T>(momentum_);
    const T weight_decay = static_cast<T>(weight_decay_);
    const bool nesterov = nesterov_;
    const int64_t N = param_tensor.num_elements();
    ParallelFor(N, kElementwiseChunk, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T g = grad[i];
        if (weight_decay != 0) g += weight_decay * param[i];
        const T buf = velocity[i] * momentum + g;
        velocity[i] = buf;
        const T step = nesterov ? g + momentum * buf : buf;
        param[i] -= lr * step;
      }
    });
    ctx.SetOutput(0, param_tensor);
    ctx.SetOutput(1, velocity_tensor);
    return absl::OkStatus();
  }

 private:
  double momentum_ = 0.9;
  bool nesterov_ = false;
  double weight_decay_ = 0;
};

// ---------------------------------------------------------------------------
// adam_update(param, grad, m, v, lr, step) -> (param, m, v), torch.optim.Adam
// (decoupled: AdamW). step is the 1-based index of this update.
template <typename T>
class AdamUpdateKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(beta1_, AttrFloat(op, "beta1"));
    STRATA_ASSIGN_OR_RETURN(beta2_, AttrFloat(op, "beta2"));
    STRATA_ASSIGN_OR_RETURN(epsilon_, AttrFloat(op, "epsilon"));
    STRATA_ASSIGN_OR_RETURN(weight_decay_, AttrFloat(op, "weight_decay"));
    STRATA_ASSIGN_OR_RETURN(decoupled_, AttrBool(op, "decoupled"));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "adam_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "adam_update", 2, "m", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "adam_update", 3, "v", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "adam_update", 4, "lr", DataTypeOf<T>::value));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "adam_update", 5, "step", I64));
    const int64_t step = ctx.input(5).data<int64_t>()[0];
    if (step < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("adam_update: input 'step' is the 1-based index of this update and must be >= 1, got ", step));
    }
    const Tensor& param_tensor = ctx.input(0);
    const Tensor& m_tensor = ctx.input(2);
    const Tensor& v_tensor = ctx.input(3);
    T* param = MutableData<T>(param_tensor);
    T* m = MutableData<T>(m_tensor);
    T* v = MutableData<T>(v_tensor);
    const T* grad = ctx.input(1).data<T>();

    // The scalar arithmetic of torch's _single_tensor_adam(w), in double.
    const double lr = static_cast<double>(ctx.input(4).data<T>()[0]);
    const double bias_correction1 = 1.0 - std::pow(beta1_, static_cast<double>(step));
    const double bias_correction2 = 1.0 - std::pow(beta2_, static_cast<double>(step));
    const T step_size = static_cast<T>(lr / bias_correction1);
    const T bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
    const T decay_factor = static_cast<T>(1.0 - lr * weight_decay_);  // AdamW
    const T l2 = static_cast<T>(decoupled_ ? 0.0 : weight_decay_);     // Adam's L2 term
    const bool decoupled = decoupled_ && weight_decay_ != 0;
    const T beta1 = static_cast<T>(beta1_), one_minus_beta1 = static_cast<T>(1.0 - beta1_);
    const T beta2 = static_cast<T>(beta2_), one_minus_beta2 = static_cast<T>(1.0 - beta2_);
    const T epsilon = static_cast<T>(epsilon_);
    const int64_t N = param_tensor.num_elements();
    ParallelFor(N, kElementwiseChunk, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        T p = param[i];
        if (decoupled) p *= decay_factor;
        T g = grad[i];
        if (l2 != 0) g += l2 * p;
        const T m_new = m[i] * beta1 + one_minus_beta1 * g;
        const T v_new = v[i] * beta2 + one_minus_beta2 * g * g;
        m[i] = m_new;
        v[i] = v_new;
        const T denom = std::sqrt(v_new) / bias_correction2_sqrt + epsilon;
        param[i] = p - step_size * (m_new / denom);
      }
    });
    ctx.SetOutput(0, param_tensor);
    ctx.SetOutput(1, m_tensor);
    ctx.SetOutput(2, v_tensor);
    return absl::OkStatus();
  }

 private:
  double beta1_ = 0.9, beta2_ = 0.999, epsilon_ = 1e-8, weight_decay_ = 0;
  bool decoupled_ = false;
};

// ---------------------------------------------------------------------------
// increment(counter) -> counter, in place: counter += by.
class IncrementKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(by_, AttrInt(op, "by"));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "increment", 0, "counter", I64));
    const Tensor& counter = ctx.input(0);
    MutableData<int64_t>(counter)[0] += by_;
    ctx.SetOutput(0, counter);
    return absl::OkStatus();
  }

 private:
  int64_t by_ = 1;
};

// ---------------------------------------------------------------------------
// lr_schedule(step) -> lr. Keyed by I64 (its only input); the output dtype is
// the `dtype` attr.
class LrScheduleKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    std::string dtype, kind;
    STRATA_ASSIGN_OR_RETURN(dtype, AttrString(op, "dtype"));
    STRATA_ASSIGN_OR_RETURN(kind, AttrString(op, "kind"));
    STRATA_ASSIGN_OR_RETURN(base_lr_, AttrFloat(op, "base_lr"));
    STRATA_ASSIGN_OR_RETURN(warmup_steps_, AttrInt(op, "warmup_steps"));
    STRATA_ASSIGN_OR_RETURN(decay_steps_, AttrInt(op, "decay_steps"));
    STRATA_ASSIGN_OR_RETURN(alpha_, AttrFloat(op, "alpha"));
    STRATA_ASSIGN_OR_RETURN(step_size_, AttrInt(op, "step_size"));
    STRATA_ASSIGN_OR_RETURN(gamma_, AttrFloat(op, "gamma"));
    if (dtype == "F32") {
      dtype_ = F32;
    } else if (dtype == "F64") {
      dtype_ = F64;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("lr_schedule: attr 'dtype' must be F32 or F64, got ", dtype));
    }
    if (kind == "constant") {
      kind_ = Kind::kConstant;
    } else if (kind == "cosine") {
      kind_ = Kind::kCosine;
    } else if (kind == "step") {
      kind_ = Kind::kStep;
      if (step_size_ < 1) return absl::InvalidArgumentError("lr_schedule: attr 'step_size' must be >= 1");
    } else {
      return absl::InvalidArgumentError(absl::StrCat("lr_schedule: unknown attr 'kind' \"", kind, "\""));
    }
    if (warmup_steps_ < 0) return absl::InvalidArgumentError("lr_schedule: attr 'warmup_steps' must be >= 0");
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "lr_schedule", 0, "step", I64));
    const int64_t step = ctx.input(0).data<int64_t>()[0];
    if (step < 0) {
      return absl::InvalidArgumentError(absl::StrCat("lr_schedule: input 'step' must be >= 0, got ", step));
    }
    const double lr = LearningRate(step, ctx.run().total_steps);
    absl::StatusOr<Tensor*> out = ctx.AllocateOutput(0, dtype_, {});
    if (!out.ok()) return out.status();
    if (dtype_ == F32) {
      (*out)->data<float>()[0] = static_cast<float>(lr);
    } else {
      (*out)->data<double>()[0] = lr;
    }
    return absl::OkStatus();
  }

  // The rate for the update after `step` updates (0-based).
  double LearningRate(int64_t step, int64_t total_steps) const {
    if (step < warmup_steps_) {
      return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
    }
    const int64_t t = step - warmup_steps_;
    switch (kind_) {
      case Kind::kConstant:
        return base_lr_;
      case Kind::kStep:
        return base_lr_ * std::pow(gamma_, static_cast<double>(t / step_size_));
      case Kind::kCosine: {
        const int64_t decay_end = decay_steps_ > 0 ? decay_steps_ : total_steps;
        if (decay_end <= 0) return base_lr_;  // run length unknown: no decay
        const int64_t D = decay_end - warmup_steps_;
        // A run no longer than its warm-up has nothing left to decay over: the floor.
        if (D <= 0) return alpha_ * base_lr_;
        const double progress = static_cast<double>(std::min(t, D)) / static_cast<double>(D);
        return base_lr_ * (alpha_ + (1.0 - alpha_) * (1.0 + std::cos(kPi * progress)) / 2.0);
      }
    }
    return base_lr_;
  }

 private:
  enum class Kind { kConstant, kCosine, kStep };
  DataType dtype_ = F32;
  Kind kind_ = Kind::kConstant;
  double base_lr_ = 0, alpha_ = 0, gamma_ = 0.1;
  int64_t warmup_steps_ = 0, decay_steps_ = 0, step_size_ = 1;
};

// ---------------------------------------------------------------------------
// sum_squares(x...) -> y = sum_i sum_k x_i[k]^2, accumulated in double.
// Each input is cut into fixed blocks (kFixedSumBlock, kernels/shared_math.h)
// reduced in parallel; partial sums are then added in block order, so the
// result does not depend on the thread count.
template <typename T>
double SumOfSquares(const T* x, int64_t N) {
  const int64_t num_blocks = (N + kFixedSumBlock - 1) / kFixedSumBlock;
  std::vector<double> partial(num_blocks, 0.0);
  ParallelFor(num_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t lo = b * kFixedSumBlock, hi = std::min(N, lo + kFixedSumBlock);
      double s = 0;
      for (int64_t k = lo; k < hi; ++k) s += static_cast<double>(x[k]) * static_cast<double>(x[k]);
      partial[b] = s;
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

template <typename T>
class SumSquaresKernel : public OpKernel {
 public:
  absl::Status Init(const Op&) { return absl::OkStatus(); }

  absl::Status Compute(KernelContext& ctx) override {
    double total = 0;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const Tensor& x = ctx.input(i);
      STRATA_RETURN_IF_ERROR(ExpectInputDtype(ctx, "sum_squares", i, DataTypeOf<T>::value));
      total += SumOfSquares(x.data<T>(), x.num_elements());
    }
    absl::StatusOr<Tensor*> out = ctx.AllocateOutput(0, DataTypeOf<T>::value, {});
    if (!out.ok()) return out.status();
    (*out)->data<T>()[0] = static_cast<T>(total);
    return absl::OkStatus();
  }
};

// sum_squares_grad(x, dy) -> dx = 2 * x * dy, split over contiguous element ranges.
template <typename T>
class SumSquaresGradKernel : public OpKernel {
 public:
  absl::Status Init(const Op&) { return absl::OkStatus(); }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x_tensor = ctx.input(0);
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "sum_squares_grad", 1, "dy", DataTypeOf<T>::value));
    STRATA_RETURN_IF_ERROR(ExpectNamedInputDtype(ctx, "sum_squares_grad", 0, "x", DataTypeOf<T>::value));
    absl::StatusOr<Tensor*> out = ctx.AllocateOutput(0, DataTypeOf<T>::value, x_tensor.shape());
    if (!out.ok()) return out.status();
    T* dx = (*out)->data<T>();
    const T* x = x_tensor.data<T>();
    const T scale = 2 * ctx.input(1).data<T>()[0];
    ParallelFor(x_tensor.num_elements(), kElementwiseChunk, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dx[i] = scale * x[i];
    });
    return absl::OkStatus();
  }
};

// ---------------------------------------------------------------------------
// clip_coefficient(sum_squares...) -> coef = min(1, max_norm / (sqrt(sum) + 1e-6))
// with the inputs summed in order in double; the formula is ClipCoefficient
// (kernels/shared_math.h), which the CUDA kernel calls too.
template <typename T>
class ClipCoefficientKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(max_norm_, AttrFloat(op, "max_norm"));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    double sum = 0;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "clip_coefficient", i, "sum_squares", DataTypeOf<T>::value));
      sum += static_cast<double>(ctx.input(i).data<T>()[0]);
    }
    absl::StatusOr<Tensor*> out = ctx.AllocateOutput(0, DataTypeOf<T>::value, {});
    if (!out.ok()) return out.status();
    (*out)->data<T>()[0] = static_cast<T>(ClipCoefficient(sum, max_norm_));
    return absl::OkStatus();
  }

 private:
  double max_norm_ = 1.0;
};

#undef STRATA_ASSIGN_OR_RETURN
#undef STRATA_RETURN_IF_ERROR

STRATA_REGISTER_KERNEL("sgd_update", DEVICE_CPU, F32, InitFactory<SgdUpdateKernel<float>>());
STRATA_REGISTER_KERNEL("sgd_update", DEVICE_CPU, F64, InitFactory<SgdUpdateKernel<double>>());
STRATA_REGISTER_KERNEL("momentum_update", DEVICE_CPU, F32, InitFactory<MomentumUpdateKernel<float>>());
STRATA_REGISTER_KERNEL("momentum_update", DEVICE_CPU, F64, InitFactory<MomentumUpdateKernel<double>>());
STRATA_REGISTER_KERNEL("adam_update", DEVICE_CPU, F32, InitFactory<AdamUpdateKernel<float>>());
STRATA_REGISTER_KERNEL("adam_update", DEVICE_CPU, F64, InitFactory<AdamUpdateKernel<double>>());
STRATA_REGISTER_KERNEL("increment", DEVICE_CPU, I64, InitFactory<IncrementKernel>());
// lr_schedule's only input is the I64 step, so its kernel key is I64 for both output dtypes.
STRATA_REGISTER_KERNEL("lr_schedule", DEVICE_CPU, I64, InitFactory<LrScheduleKernel>());
STRATA_REGISTER_KERNEL("sum_squares", DEVICE_CPU, F32, InitFactory<SumSquaresKernel<float>>());
STRATA_REGISTER_KERNEL("sum_squares", DEVICE_CPU, F64, InitFactory<SumSquaresKernel<double>>());
STRATA_REGISTER_KERNEL("sum_squares_grad", DEVICE_CPU, F32, InitFactory<SumSquaresGradKernel<float>>());
STRATA_REGISTER_KERNEL("sum_squares_grad", DEVICE_CPU, F64, InitFactory<SumSquaresGradKernel<double>>());
STRATA_REGISTER_KERNEL("clip_coefficient", DEVICE_CPU, F32, InitFactory<ClipCoefficientKernel<float>>());
STRATA_REGISTER_KERNEL("clip_coefficient", DEVICE_CPU, F64, InitFactory<ClipCoefficientKernel<double>>());

}  // namespace
}  // namespace strata
