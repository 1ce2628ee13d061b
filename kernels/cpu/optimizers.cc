// CPU kernels of the optimizer family (compiler/ops/optimizer_ops.cc):
// sgd_update, momentum_update, adam_update (and their _multi forms), increment, lr_schedule,
// sum_squares, sum_squares_grad and clip_coefficient.
//
// Update kernels write the param and moment buffers in place and hand the
// same tensors back as outputs (the ops are stateful). Elementwise loops are
// split over the intra-op pool in contiguous element ranges; scalar
// coefficients (bias corrections, step sizes) are computed once in double.
// Attrs, the schedule and each element's update are kernels/optimizer_attrs.h
// and kernels/optimizer_math.h, which the CUDA kernels share.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/unary_math.h"
#include "kernels/kernel_checks.h"
#include "kernels/loss_scaling_math.h"
#include "kernels/optimizer_attrs.h"
#include "kernels/optimizer_math.h"
#include "kernels/shared_math.h"
#include "proto/status_macros.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

// Elements per ParallelFor chunk: below this an update runs inline on the caller.
constexpr int64_t kElementwiseChunk = 1 << 14;

using kernel_checks::ExpectInputDtype;
using kernel_checks::ExpectLike;
using kernel_checks::ExpectNamedInputDtype;
using kernel_checks::ExpectScalar;
using kernel_checks::MutableData;

// Whether the optional input `found_inf` (input i, when the op has it) says
// this update is skipped: loss scaling found an inf or nan in the gradients.
absl::StatusOr<bool> SkipsUpdate(const KernelContext& ctx, const char* op, int i) {
  if (ctx.num_inputs() <= i) return false;
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, op, i, "found_inf", F32));
  return kernel_math::SkipsUpdate(ctx.input(i).data<float>()[0]);
}

// The scale of attr grad_scale, input i (param's dtype T), or 1 without it
// (grad * 1 is grad, bit for bit, but the loops below skip the multiply).
template <typename T>
absl::StatusOr<T> GradScale(const KernelContext& ctx, const char* op, bool scaled, int i) {
  STRATA_ASSIGN_OR_RETURN(const T* scale, kernel_checks::GradScaleInput<T>(ctx, op, scaled, i));
  return scale != nullptr ? *scale : T(1);
}

// Attr copy_dtype's output (the last, `k`): param's 16-bit copy, written
// after the update with the cast kernel's conversion (cuda::Convert), in
// the buffer the executor hands in (a PARAM_COPY) or a new one.
class CopyOut {
 public:
  // Output k of param's shape in `dtype` (DT_INVALID: the op has none).
  absl::Status Prepare(KernelContext& ctx, const char* op, DataType dtype, int k, const Tensor& param) {
    dtype_ = dtype;
    data_ = nullptr;
    if (dtype == DT_INVALID) return absl::OkStatus();
    if (ctx.num_outputs() <= k) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": attr copy_dtype needs output 'copy' #", k));
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * out, ctx.AllocateOutput(k, dtype, param.shape()));
    data_ = out->raw_data();
    return absl::OkStatus();
  }
  // Elements [begin, end) of the copy from the updated param.
  template <typename T>
  void Write(const T* param, int64_t begin, int64_t end) const {
    if (data_ == nullptr) return;
    if (dtype_ == BF16) {
      bfloat16* copy = static_cast<bfloat16*>(data_);
      for (int64_t i = begin; i < end; ++i) copy[i] = cuda::Convert<bfloat16>(param[i]);
    } else {
      float16* copy = static_cast<float16*>(data_);
      for (int64_t i = begin; i < end; ++i) copy[i] = cuda::Convert<float16>(param[i]);
    }
  }

 private:
  DataType dtype_ = DT_INVALID;
  void* data_ = nullptr;
};

// A skipped update (found_inf) changes nothing, its copy included; a copy
// output not handed in is made from param, so that the op still defines it.
template <typename T>
absl::Status SkipCopy(KernelContext& ctx, const char* op, DataType dtype, int k, const Tensor& param) {
  if (dtype == DT_INVALID || (ctx.num_outputs() > k && ctx.output(k)->defined())) return absl::OkStatus();
  CopyOut copy;
  STRATA_RETURN_IF_ERROR(copy.Prepare(ctx, op, dtype, k, param));
  copy.Write(param.data<T>(), 0, param.num_elements());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// sgd_update(param, grad, lr) -> param:  g += wd * p;  p -= lr * g. With
// attr grad_scale, g = grad * scale first (each element rounded to T, as a
// mul kernel rounds it): clipping's coefficient.
template <typename T>
class SgdUpdateKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadSgdAttrs(op));
    STRATA_ASSIGN_OR_RETURN(copy_dtype_, ReadCopyDtype(op));
    scaled_ = ScalesGrad(op);
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "sgd_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "sgd_update", 2, "lr", DataTypeOf<T>::value));
    const Tensor& param_tensor = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(const T scale, GradScale<T>(ctx, "sgd_update", scaled_, 3));
    STRATA_ASSIGN_OR_RETURN(const bool skip, SkipsUpdate(ctx, "sgd_update", 3 + scaled_));
    if (skip) {
      ctx.SetOutput(0, param_tensor);
      return SkipCopy<T>(ctx, "sgd_update", copy_dtype_, 1, param_tensor);
    }
    CopyOut copy;
    STRATA_RETURN_IF_ERROR(copy.Prepare(ctx, "sgd_update", copy_dtype_, 1, param_tensor));
    T* param = MutableData<T>(param_tensor);
    const T* grad = ctx.input(1).data<T>();
    const T lr = ctx.input(2).data<T>()[0];
    const T weight_decay = static_cast<T>(attrs_.weight_decay);
    const int64_t N = param_tensor.num_elements();
    ParallelFor(N, kElementwiseChunk, [&](int64_t begin, int64_t end) {
      if (scaled_) {
        for (int64_t i = begin; i < end; ++i) kernel_math::SgdElement(lr, weight_decay, grad[i] * scale, &param[i]);
      } else {
        for (int64_t i = begin; i < end; ++i) kernel_math::SgdElement(lr, weight_decay, grad[i], &param[i]);
      }
      copy.Write(param, begin, end);
    });
    ctx.SetOutput(0, param_tensor);
    return absl::OkStatus();
  }

 private:
  kernel_math::SgdAttrs attrs_;
  DataType copy_dtype_ = DT_INVALID;
  bool scaled_ = false;
};

// ---------------------------------------------------------------------------
// momentum_update(param, grad, velocity, lr) -> (param, velocity), torch.optim.SGD
// with dampening 0:  g += wd * p;  buf = momentum * buf + g;
// g = nesterov ? g + momentum * buf : buf;  p -= lr * g.
template <typename T>
class MomentumUpdateKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadMomentumAttrs(op));
    STRATA_ASSIGN_OR_RETURN(copy_dtype_, ReadCopyDtype(op));
    scaled_ = ScalesGrad(op);
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "momentum_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "momentum_update", 2, "velocity", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "momentum_update", 3, "lr", DataTypeOf<T>::value));
    const Tensor& param_tensor = ctx.input(0);
    const Tensor& velocity_tensor = ctx.input(2);
    STRATA_ASSIGN_OR_RETURN(const T scale, GradScale<T>(ctx, "momentum_update", scaled_, 4));
    STRATA_ASSIGN_OR_RETURN(const bool skip, SkipsUpdate(ctx, "momentum_update", 4 + scaled_));
    if (skip) {
      ctx.SetOutput(0, param_tensor);
      ctx.SetOutput(1, velocity_tensor);
      return SkipCopy<T>(ctx, "momentum_update", copy_dtype_, 2, param_tensor);
    }
    CopyOut copy;
    STRATA_RETURN_IF_ERROR(copy.Prepare(ctx, "momentum_update", copy_dtype_, 2, param_tensor));
    T* param = MutableData<T>(param_tensor);
    T* velocity = MutableData<T>(velocity_tensor);
    const T* grad = ctx.input(1).data<T>();
    const T lr = ctx.input(3).data<T>()[0];
    const T momentum = static_cast<T>(attrs_.momentum);
    const T weight_decay = static_cast<T>(attrs_.weight_decay);
    const bool nesterov = attrs_.nesterov;
    const int64_t N = param_tensor.num_elements();
    ParallelFor(N, kElementwiseChunk, [&](int64_t begin, int64_t end) {
      if (scaled_) {
        for (int64_t i = begin; i < end; ++i) {
          kernel_math::MomentumElement(lr, momentum, weight_decay, nesterov, grad[i] * scale, &param[i], &velocity[i]);
        }
      } else {
        for (int64_t i = begin; i < end; ++i) {
          kernel_math::MomentumElement(lr, momentum, weight_decay, nesterov, grad[i], &param[i], &velocity[i]);
        }
      }
      copy.Write(param, begin, end);
    });
    ctx.SetOutput(0, param_tensor);
    ctx.SetOutput(1, velocity_tensor);
    return absl::OkStatus();
  }

 private:
  kernel_math::MomentumAttrs attrs_;
  DataType copy_dtype_ = DT_INVALID;
  bool scaled_ = false;
};

// ---------------------------------------------------------------------------
// adam_update(param, grad, m, v, lr, step) -> (param, m, v), torch.optim.Adam
// (decoupled: AdamW). step is the 1-based index of this update.
// Adam's element loop over arrays that do not overlap (param, m and v are
// the op's own state tensors, updated in place; grad another tensor), the
// case fixed at compile time and compiled per ISA (STRATA_ISA_CLONES,
// elementwise.h): IEEE multiplies, divisions and square roots, the same
// bits on every clone (optimizers_test.AdamLoopEqualsTheElementFormulaBitForBit).
// kScaled: grad * scale (attr grad_scale), rounded to T first.
template <typename T, bool kDecoupled, bool kL2, bool kScaled>
static STRATA_ISA_CLONES void AdamLoop(int64_t n, kernel_math::AdamScalars<T> s, T scale, const T* __restrict grad,
                                       T* __restrict param, T* __restrict m, T* __restrict v) {
  for (int64_t i = 0; i < n; ++i) {
    const T g = kScaled ? grad[i] * scale : grad[i];
    kernel_math::AdamElementAs<kDecoupled, kL2>(s, g, &param[i], &m[i], &v[i]);
  }
}

template <typename T>
class AdamUpdateKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadAdamAttrs(op));
    STRATA_ASSIGN_OR_RETURN(copy_dtype_, ReadCopyDtype(op));
    scaled_ = ScalesGrad(op);
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "adam_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "adam_update", 2, "m", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "adam_update", 3, "v", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "adam_update", 4, "lr", DataTypeOf<T>::value));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "adam_update", 5, "step", I64));
    const int64_t step = ctx.input(5).data<int64_t>()[0];
    STRATA_ASSIGN_OR_RETURN(const T scale, GradScale<T>(ctx, "adam_update", scaled_, 6));
    // A skipped update's step count did not advance (it may still be 0).
    STRATA_ASSIGN_OR_RETURN(const bool skipped, SkipsUpdate(ctx, "adam_update", 6 + scaled_));
    if (step < 1 && !skipped) {
      return absl::InvalidArgumentError(
          absl::StrCat("adam_update: input 'step' is the 1-based index of this update and must be >= 1, got ", step));
    }
    const Tensor& param_tensor = ctx.input(0);
    const Tensor& m_tensor = ctx.input(2);
    const Tensor& v_tensor = ctx.input(3);
    if (skipped) {
      ctx.SetOutput(0, param_tensor);
      ctx.SetOutput(1, m_tensor);
      ctx.SetOutput(2, v_tensor);
      return SkipCopy<T>(ctx, "adam_update", copy_dtype_, 3, param_tensor);
    }
    CopyOut copy;
    STRATA_RETURN_IF_ERROR(copy.Prepare(ctx, "adam_update", copy_dtype_, 3, param_tensor));
    T* param = MutableData<T>(param_tensor);
    T* m = MutableData<T>(m_tensor);
    T* v = MutableData<T>(v_tensor);
    const T* grad = ctx.input(1).data<T>();

    // The scalar arithmetic of torch's _single_tensor_adam(w), in double.
    const kernel_math::AdamScalars<T> scalars = kernel_math::MakeAdamScalars<T>(attrs_, ctx.input(4).data<T>()[0], step);
    const int64_t N = param_tensor.num_elements();
    const auto run = [&](auto loop) {
      ParallelFor(N, kElementwiseChunk, [&](int64_t begin, int64_t end) {
        loop(end - begin, scalars, scale, grad + begin, param + begin, m + begin, v + begin);
        copy.Write(param, begin, end);
      });
    };
    const auto run_scaled = [&](auto scaled) {
      constexpr bool kScaled = decltype(scaled)::value;
      if (scalars.decoupled) {
        scalars.l2 != 0 ? run(AdamLoop<T, true, true, kScaled>) : run(AdamLoop<T, true, false, kScaled>);
      } else {
        scalars.l2 != 0 ? run(AdamLoop<T, false, true, kScaled>) : run(AdamLoop<T, false, false, kScaled>);
      }
    };
    if (scaled_) {
      run_scaled(std::true_type{});
    } else {
      run_scaled(std::false_type{});
    }
    ctx.SetOutput(0, param_tensor);
    ctx.SetOutput(1, m_tensor);
    ctx.SetOutput(2, v_tensor);
    return absl::OkStatus();
  }

 private:
  kernel_math::AdamAttrs attrs_;
  DataType copy_dtype_ = DT_INVALID;
  bool scaled_ = false;
};

// ---------------------------------------------------------------------------
// sgd_update_multi, momentum_update_multi, adam_update_multi: n updates in
// one op (the fuse-optimizer pass's, for GPU plans; the CPU runs them for the
// parity tests and hand-built plans). Each member runs through the single
// op's kernel, its inputs and outputs picked out of the op's: the same
// checks, skip and per-element math, so the results are the unfused ops' bit
// for bit. Inputs: param[n], grad[n], then each of the `kStates` states [n],
// then `kScalars` scalars (lr; adam: step), grad_scale's with the attr, and
// the optional found_inf. Outputs: param[n], then each state [n], then
// with attr copy_dtype the copies [n].
template <typename Single, int kStates, int kScalars>
class MultiUpdateKernel : public OpKernel {
 public:
  explicit MultiUpdateKernel(const char* name) : name_(name) {}

  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(n_, AttrInt(op, "n"));
    if (n_ < 1) return absl::InvalidArgumentError(absl::StrCat(name_, ": attr 'n' must be >= 1, got ", n_));
    scalars_ = kScalars + (ScalesGrad(op) ? 1 : 0);
    STRATA_ASSIGN_OR_RETURN(const DataType copy, ReadCopyDtype(op));
    outputs_ = 1 + kStates + (copy != DT_INVALID ? 1 : 0);
    return single_.Init(op);
  }

  absl::Status Compute(KernelContext& ctx) override {
    const int n = static_cast<int>(n_);
    const int tensors = 2 + kStates, fixed = tensors * n + scalars_;
    if ((ctx.num_inputs() != fixed && ctx.num_inputs() != fixed + 1) || ctx.num_outputs() != outputs_ * n) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": ", ctx.num_inputs(), " inputs and ", ctx.num_outputs(),
                                                     " outputs do not fit n = ", n));
    }
    // A member's inputs: its param, grad and states, then the shared scalars.
    const int num_in = tensors + ctx.num_inputs() - tensors * n;
    std::array<const Tensor*, 2 + kStates + kScalars + 2> in;
    std::array<Tensor, 2 + kStates> out;  // param, states, the copy
    for (int k = tensors * n; k < ctx.num_inputs(); ++k) in[tensors + k - tensors * n] = &ctx.input(k);
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < tensors; ++k) in[k] = &ctx.input(k * n + i);
      // The buffers handed in (a PARAM_COPY's), as the single op gets them.
      for (int k = 0; k < outputs_; ++k) out[k] = *ctx.output(k * n + i);
      KernelContext member(&ctx.run(), absl::MakeConstSpan(in.data(), num_in), absl::MakeSpan(out.data(), outputs_));
      if (absl::Status s = single_.Compute(member); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat(name_, ": tensor #", i, " of ", n, ": ", s.message()));
      }
      for (int k = 0; k < outputs_; ++k) ctx.SetOutput(k * n + i, std::move(out[k]));
    }
    return absl::OkStatus();
  }

 private:
  const char* name_;
  int64_t n_ = 0;
  int scalars_ = kScalars;
  int outputs_ = 1 + kStates;  // a member's: param, states, with attr copy_dtype the copy
  Single single_;
};

template <typename T>
class SgdUpdateMultiKernel : public MultiUpdateKernel<SgdUpdateKernel<T>, 0, 1> {
 public:
  SgdUpdateMultiKernel() : MultiUpdateKernel<SgdUpdateKernel<T>, 0, 1>("sgd_update_multi") {}
};
template <typename T>
class MomentumUpdateMultiKernel : public MultiUpdateKernel<MomentumUpdateKernel<T>, 1, 1> {
 public:
  MomentumUpdateMultiKernel() : MultiUpdateKernel<MomentumUpdateKernel<T>, 1, 1>("momentum_update_multi") {}
};
template <typename T>
class AdamUpdateMultiKernel : public MultiUpdateKernel<AdamUpdateKernel<T>, 2, 2> {
 public:
  AdamUpdateMultiKernel() : MultiUpdateKernel<AdamUpdateKernel<T>, 2, 2>("adam_update_multi") {}
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
    STRATA_ASSIGN_OR_RETURN(const bool skip, SkipsUpdate(ctx, "increment", 1));
    if (!skip) MutableData<int64_t>(counter)[0] += by_;
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
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadLrScheduleAttrs(op));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "lr_schedule", 0, "step", I64));
    const int64_t step = ctx.input(0).data<int64_t>()[0];
    if (step < 0) {
      return absl::InvalidArgumentError(absl::StrCat("lr_schedule: input 'step' must be >= 0, got ", step));
    }
    const double lr = kernel_math::LearningRate(attrs_.schedule, step, ctx.run().total_steps);
    absl::StatusOr<Tensor*> out = ctx.AllocateOutput(0, attrs_.dtype, {});
    if (!out.ok()) return out.status();
    if (attrs_.dtype == F32) {
      (*out)->data<float>()[0] = static_cast<float>(lr);
    } else {
      (*out)->data<double>()[0] = lr;
    }
    return absl::OkStatus();
  }

 private:
  LrScheduleAttrs attrs_;
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
STRATA_REGISTER_KERNEL("sgd_update_multi", DEVICE_CPU, F32, InitFactory<SgdUpdateMultiKernel<float>>());
STRATA_REGISTER_KERNEL("sgd_update_multi", DEVICE_CPU, F64, InitFactory<SgdUpdateMultiKernel<double>>());
STRATA_REGISTER_KERNEL("momentum_update_multi", DEVICE_CPU, F32, InitFactory<MomentumUpdateMultiKernel<float>>());
STRATA_REGISTER_KERNEL("momentum_update_multi", DEVICE_CPU, F64, InitFactory<MomentumUpdateMultiKernel<double>>());
STRATA_REGISTER_KERNEL("adam_update_multi", DEVICE_CPU, F32, InitFactory<AdamUpdateMultiKernel<float>>());
STRATA_REGISTER_KERNEL("adam_update_multi", DEVICE_CPU, F64, InitFactory<AdamUpdateMultiKernel<double>>());
STRATA_REGISTER_KERNEL("increment", DEVICE_CPU, I64, InitFactory<IncrementKernel>());
// With its F32 found_inf input, increment's kernel key (the first floating input's dtype) is F32.
STRATA_REGISTER_KERNEL("increment", DEVICE_CPU, F32, InitFactory<IncrementKernel>());
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
