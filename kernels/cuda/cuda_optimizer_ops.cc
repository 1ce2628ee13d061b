// CUDA kernels of the optimizer family (kernels/cuda/optimizers.cu):
// increment, lr_schedule, adam_update, sgd_update, momentum_update (and their
// _multi forms). Attrs
// (kernels/optimizer_attrs.h), metadata checks and their messages are the
// CPU kernels'. The step and lr are read on the device, never on the host, so
// a step enqueues without waiting; the checks the CPU makes on their values (step >= 1 for
// adam, >= 0 for lr_schedule) poison the outputs with NaN instead
// (kernels/cuda/optimizers.h). With attr copy_dtype the update launch also
// writes param's 16-bit copy (the op's last output, or n of them).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/loss_scaling.h"
#include "kernels/cuda/optimizers.h"
#include "kernels/cuda/unary.h"
#include "kernels/kernel_checks.h"
#include "kernels/optimizer_attrs.h"
#include "kernels/optimizer_math.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/float16.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

using kernel_checks::ExpectLike;
using kernel_checks::ExpectScalar;
using kernel_checks::GradScaleInput;
using kernel_checks::MutableData;

// Loss scaling's optional found_inf (input i, when the op has it): the device
// flag the launch reads, or null.
absl::StatusOr<const float*> FoundInf(const KernelContext& ctx, const char* op, int i) {
  if (ctx.num_inputs() <= i) return nullptr;
  STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, op, i, "found_inf", F32));
  return ctx.input(i).data<float>();
}

// Attr copy_dtype (ReadCopyDtype: DT_INVALID, BF16 or F16) as the update
// launchers take it.
cuda::UpdateCopy CopyKind(DataType dtype) {
  return dtype == BF16 ? cuda::UpdateCopy::kBf16 : dtype == F16 ? cuda::UpdateCopy::kF16 : cuda::UpdateCopy::kNone;
}

// Attr copy_dtype's output k, param's shape in `dtype` (DT_INVALID: the op
// has none, null): the buffer for the update launch to write. The one the
// executor hands in (a PARAM_COPY, which holds cast(param) already,
// rewritten in place so that a captured CUDA graph keeps writing it), else
// a new one that starts as cast(param): an update that found_inf skips
// (known on the device only) writes no copy, and the output is still
// defined, as the CPU kernels define it (their SkipCopy). The CPU kernels'
// words where output k is missing.
template <typename T>
absl::StatusOr<void*> PrepareCopy(KernelContext& ctx, const char* op, DataType dtype, int k, const Tensor& param,
                                  cudaStream_t stream) {
  if (dtype == DT_INVALID) return nullptr;
  if (ctx.num_outputs() <= k) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": attr copy_dtype needs output 'copy' #", k));
  }
  const void* handed_in = ctx.output(k)->defined() ? ctx.output(k)->raw_data() : nullptr;
  STRATA_ASSIGN_OR_RETURN(Tensor * out, ctx.AllocateOutput(k, dtype, param.shape()));
  const int64_t n = param.num_elements();
  if (out->raw_data() != handed_in) {
    const cudaError_t e = dtype == BF16 ? cuda::LaunchCast(out->data<bfloat16>(), param.data<T>(), n, stream)
                                        : cuda::LaunchCast(out->data<float16>(), param.data<T>(), n, stream);
    STRATA_RETURN_IF_ERROR(CudaStatus(e, op));
  }
  return out->raw_data();
}

// increment(counter) -> counter, in place: counter += by.
class CudaIncrementKernel : public OpKernel {
 public:
  explicit CudaIncrementKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(by_, AttrInt(op, "by"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "increment", 0, "counter", I64));
    const Tensor& counter = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(const float* found_inf, FoundInf(ctx, "increment", 1));
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchIncrement(MutableData<int64_t>(counter), by_, found_inf, device->stream()), "increment"));
    ctx.SetOutput(0, counter);
    return absl::OkStatus();
  }

 private:
  int64_t by_ = 1;
};

// lr_schedule(step) -> lr, keyed by I64 like the CPU's; the output dtype is
// the `dtype` attr.
class CudaLrScheduleKernel : public OpKernel {
 public:
  explicit CudaLrScheduleKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(const LrScheduleAttrs attrs, ReadLrScheduleAttrs(op));
    dtype_ = attrs.dtype;
    schedule_ = attrs.schedule;
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "lr_schedule", 0, "step", I64));
    const int64_t* step = ctx.input(0).data<int64_t>();
    STRATA_ASSIGN_OR_RETURN(Tensor * out, ctx.AllocateOutput(0, dtype_, {}));
    const int64_t total = ctx.run().total_steps;
    return CudaStatus(dtype_ == F32
                          ? cuda::LaunchLrSchedule(out->data<float>(), step, schedule_, total, device->stream())
                          : cuda::LaunchLrSchedule(out->data<double>(), step, schedule_, total, device->stream()),
                      "lr_schedule");
  }

 private:
  DataType dtype_ = F32;
  kernel_math::LrSchedule schedule_;
};

// adam_update(param, grad, m, v, lr, step) -> (param, m, v), in place; with
// attr copy_dtype also -> copy.
template <typename T>
class CudaAdamUpdateKernel : public OpKernel {
 public:
  explicit CudaAdamUpdateKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadAdamAttrs(op));
    STRATA_ASSIGN_OR_RETURN(copy_dtype_, ReadCopyDtype(op));
    scaled_ = ScalesGrad(op);
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "adam_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "adam_update", 2, "m", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "adam_update", 3, "v", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "adam_update", 4, "lr", DataTypeOf<T>::value));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "adam_update", 5, "step", I64));
    const Tensor& param = ctx.input(0);
    const Tensor& m = ctx.input(2);
    const Tensor& v = ctx.input(3);
    STRATA_ASSIGN_OR_RETURN(const T* scale, GradScaleInput<T>(ctx, "adam_update", scaled_, 6));
    STRATA_ASSIGN_OR_RETURN(const float* found_inf, FoundInf(ctx, "adam_update", 6 + scaled_));
    STRATA_ASSIGN_OR_RETURN(void* const copy,
                            PrepareCopy<T>(ctx, "adam_update", copy_dtype_, 3, param, device->stream()));
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchAdamUpdate(MutableData<T>(param), MutableData<T>(m), MutableData<T>(v), ctx.input(1).data<T>(),
                               ctx.input(4).data<T>(), ctx.input(5).data<int64_t>(), attrs_, param.num_elements(),
                               found_inf, device->stream(), scale, CopyKind(copy_dtype_), copy),
        "adam_update"));
    ctx.SetOutput(0, param);
    ctx.SetOutput(1, m);
    ctx.SetOutput(2, v);
    return absl::OkStatus();
  }

 private:
  kernel_math::AdamAttrs attrs_;
  DataType copy_dtype_ = DT_INVALID;
  bool scaled_ = false;
};

// sgd_update(param, grad, lr) -> param, in place; with attr copy_dtype also
// -> copy.
template <typename T>
class CudaSgdUpdateKernel : public OpKernel {
 public:
  explicit CudaSgdUpdateKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadSgdAttrs(op));
    STRATA_ASSIGN_OR_RETURN(copy_dtype_, ReadCopyDtype(op));
    scaled_ = ScalesGrad(op);
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "sgd_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "sgd_update", 2, "lr", DataTypeOf<T>::value));
    const Tensor& param = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(const T* scale, GradScaleInput<T>(ctx, "sgd_update", scaled_, 3));
    STRATA_ASSIGN_OR_RETURN(const float* found_inf, FoundInf(ctx, "sgd_update", 3 + scaled_));
    STRATA_ASSIGN_OR_RETURN(void* const copy,
                            PrepareCopy<T>(ctx, "sgd_update", copy_dtype_, 1, param, device->stream()));
    STRATA_RETURN_IF_ERROR(
        CudaStatus(cuda::LaunchSgdUpdate(MutableData<T>(param), ctx.input(1).data<T>(), ctx.input(2).data<T>(),
                                         static_cast<T>(attrs_.weight_decay), param.num_elements(), found_inf,
                                         device->stream(), scale, CopyKind(copy_dtype_), copy),
                   "sgd_update"));
    ctx.SetOutput(0, param);
    return absl::OkStatus();
  }

 private:
  kernel_math::SgdAttrs attrs_;
  DataType copy_dtype_ = DT_INVALID;
  bool scaled_ = false;
};

// momentum_update(param, grad, velocity, lr) -> (param, velocity), in place;
// with attr copy_dtype also -> copy.
template <typename T>
class CudaMomentumUpdateKernel : public OpKernel {
 public:
  explicit CudaMomentumUpdateKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadMomentumAttrs(op));
    STRATA_ASSIGN_OR_RETURN(copy_dtype_, ReadCopyDtype(op));
    scaled_ = ScalesGrad(op);
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "momentum_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "momentum_update", 2, "velocity", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "momentum_update", 3, "lr", DataTypeOf<T>::value));
    const Tensor& param = ctx.input(0);
    const Tensor& velocity = ctx.input(2);
    STRATA_ASSIGN_OR_RETURN(const T* scale, GradScaleInput<T>(ctx, "momentum_update", scaled_, 4));
    STRATA_ASSIGN_OR_RETURN(const float* found_inf, FoundInf(ctx, "momentum_update", 4 + scaled_));
    STRATA_ASSIGN_OR_RETURN(void* const copy,
                            PrepareCopy<T>(ctx, "momentum_update", copy_dtype_, 2, param, device->stream()));
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchMomentumUpdate(MutableData<T>(param), MutableData<T>(velocity), ctx.input(1).data<T>(),
                                   ctx.input(3).data<T>(), static_cast<T>(attrs_.momentum),
                                   static_cast<T>(attrs_.weight_decay), attrs_.nesterov, param.num_elements(),
                                   found_inf, device->stream(), scale, CopyKind(copy_dtype_), copy),
        "momentum_update"));
    ctx.SetOutput(0, param);
    ctx.SetOutput(1, velocity);
    return absl::OkStatus();
  }

 private:
  kernel_math::MomentumAttrs attrs_;
  DataType copy_dtype_ = DT_INVALID;
  bool scaled_ = false;
};

// sgd_update_multi, momentum_update_multi, adam_update_multi: n updates in
// one or a few launches (kernels/cuda/optimizers.h). Inputs param[n],
// grad[n], each of kStates states [n], kScalars scalars (lr; adam: step),
// attr grad_scale's scalar, the optional found_inf; outputs param[n], then
// each state [n], in place, then with attr copy_dtype the copies [n].
// Every member is checked with the single kernel's checks and words. The
// pointer lists are sized once, at Init.
template <typename T, int kStates, int kScalars>
class CudaMultiUpdateKernel : public OpKernel {
 public:
  explicit CudaMultiUpdateKernel(const char* name) : name_(name) {}

  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(n_, AttrInt(op, "n"));
    if (n_ < 1) return absl::InvalidArgumentError(absl::StrCat(name_, ": attr 'n' must be >= 1, got ", n_));
    scaled_ = ScalesGrad(op);
    STRATA_ASSIGN_OR_RETURN(copy_dtype_, ReadCopyDtype(op));
    outputs_ = 1 + kStates + (copy_dtype_ != DT_INVALID ? 1 : 0);
    for (auto& list : updated_) list.resize(n_);
    grad_.resize(n_);
    sizes_.resize(n_);
    if (copy_dtype_ != DT_INVALID) copies_.resize(n_);
    return absl::OkStatus();
  }

 protected:
  // Checks the operands and fills the lists: updated_[0] the params,
  // updated_[1 + k] state k, grad_ the gradients, sizes_ their elements.
  absl::Status Gather(const KernelContext& ctx, const float** found_inf, const T** grad_scale) {
    static const char* const kStateNames[2][2] = {{"velocity", ""}, {"m", "v"}};
    const int n = static_cast<int>(n_), tensors = 2 + kStates, fixed = tensors * n + kScalars + scaled_;
    if ((ctx.num_inputs() != fixed && ctx.num_inputs() != fixed + 1) || ctx.num_outputs() != outputs_ * n) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": ", ctx.num_inputs(), " inputs and ", ctx.num_outputs(),
                                                     " outputs do not fit n = ", n));
    }
    for (int i = 0; i < n; ++i) {
      STRATA_RETURN_IF_ERROR(ExpectLike(ctx, name_, n + i, "grad", i, "param"));
      updated_[0][i] = MutableData<T>(ctx.input(i));
      grad_[i] = ctx.input(n + i).data<T>();
      for (int k = 0; k < kStates; ++k) {
        STRATA_RETURN_IF_ERROR(
            ExpectLike(ctx, name_, (2 + k) * n + i, kStateNames[kStates > 0 ? kStates - 1 : 0][k], i, "param"));
        updated_[1 + k][i] = MutableData<T>(ctx.input((2 + k) * n + i));
      }
      sizes_[i] = ctx.input(i).num_elements();
    }
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, name_, tensors * n, "lr", DataTypeOf<T>::value));
    if (kScalars > 1) STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, name_, tensors * n + 1, "step", I64));
    STRATA_ASSIGN_OR_RETURN(*grad_scale, GradScaleInput<T>(ctx, name_, scaled_, tensors * n + kScalars));
    STRATA_ASSIGN_OR_RETURN(*found_inf, FoundInf(ctx, name_, fixed));
    return absl::OkStatus();
  }

  // With attr copy_dtype, after Gather: the copies (outputs (1 + kStates) * n
  // on), each prepared as the single kernel prepares its own, their buffers
  // into copies_.
  absl::Status PrepareCopies(KernelContext& ctx, cudaStream_t stream) {
    const int n = static_cast<int>(n_);
    for (int i = 0; i < static_cast<int>(copies_.size()); ++i) {
      STRATA_ASSIGN_OR_RETURN(copies_[i],
                              PrepareCopy<T>(ctx, name_, copy_dtype_, (1 + kStates) * n + i, ctx.input(i), stream));
    }
    return absl::OkStatus();
  }

  // Outputs: each param and state is its input, updated in place.
  void SetOutputs(KernelContext& ctx) const {
    const int n = static_cast<int>(n_);
    for (int i = 0; i < n; ++i) {
      ctx.SetOutput(i, ctx.input(i));
      for (int k = 0; k < kStates; ++k) ctx.SetOutput((1 + k) * n + i, ctx.input((2 + k) * n + i));
    }
  }

  const char* name_;
  int64_t n_ = 0;
  bool scaled_ = false;
  DataType copy_dtype_ = DT_INVALID;
  int outputs_ = 1 + kStates;  // a member's: param, states, with attr copy_dtype the copy
  std::vector<T*> updated_[1 + kStates];
  std::vector<void*> copies_;
  std::vector<const T*> grad_;
  std::vector<int64_t> sizes_;
};

template <typename T>
class CudaAdamUpdateMultiKernel : public CudaMultiUpdateKernel<T, 2, 2> {
 public:
  explicit CudaAdamUpdateMultiKernel(const KernelDef&) : CudaMultiUpdateKernel<T, 2, 2>("adam_update_multi") {}
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR((CudaMultiUpdateKernel<T, 2, 2>::Init(op)));
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadAdamAttrs(op));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const float* found_inf = nullptr;
    const T* scale = nullptr;
    STRATA_RETURN_IF_ERROR(this->Gather(ctx, &found_inf, &scale));
    STRATA_RETURN_IF_ERROR(this->PrepareCopies(ctx, device->stream()));
    const int n = static_cast<int>(this->n_);
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchAdamUpdateMulti(this->updated_[0].data(), this->updated_[1].data(), this->updated_[2].data(),
                                    this->grad_.data(), this->sizes_.data(), n, ctx.input(4 * n).data<T>(),
                                    ctx.input(4 * n + 1).data<int64_t>(), attrs_, found_inf, device->stream(), scale,
                                    CopyKind(this->copy_dtype_), this->copies_.data()),
        this->name_));
    this->SetOutputs(ctx);
    return absl::OkStatus();
  }

 private:
  kernel_math::AdamAttrs attrs_;
};

template <typename T>
class CudaSgdUpdateMultiKernel : public CudaMultiUpdateKernel<T, 0, 1> {
 public:
  explicit CudaSgdUpdateMultiKernel(const KernelDef&) : CudaMultiUpdateKernel<T, 0, 1>("sgd_update_multi") {}
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR((CudaMultiUpdateKernel<T, 0, 1>::Init(op)));
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadSgdAttrs(op));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const float* found_inf = nullptr;
    const T* scale = nullptr;
    STRATA_RETURN_IF_ERROR(this->Gather(ctx, &found_inf, &scale));
    STRATA_RETURN_IF_ERROR(this->PrepareCopies(ctx, device->stream()));
    const int n = static_cast<int>(this->n_);
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchSgdUpdateMulti(this->updated_[0].data(), this->grad_.data(), this->sizes_.data(), n,
                                   ctx.input(2 * n).data<T>(), static_cast<T>(attrs_.weight_decay), found_inf,
                                   device->stream(), scale, CopyKind(this->copy_dtype_), this->copies_.data()),
        this->name_));
    this->SetOutputs(ctx);
    return absl::OkStatus();
  }

 private:
  kernel_math::SgdAttrs attrs_;
};

template <typename T>
class CudaMomentumUpdateMultiKernel : public CudaMultiUpdateKernel<T, 1, 1> {
 public:
  explicit CudaMomentumUpdateMultiKernel(const KernelDef&) : CudaMultiUpdateKernel<T, 1, 1>("momentum_update_multi") {}
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR((CudaMultiUpdateKernel<T, 1, 1>::Init(op)));
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadMomentumAttrs(op));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const float* found_inf = nullptr;
    const T* scale = nullptr;
    STRATA_RETURN_IF_ERROR(this->Gather(ctx, &found_inf, &scale));
    STRATA_RETURN_IF_ERROR(this->PrepareCopies(ctx, device->stream()));
    const int n = static_cast<int>(this->n_);
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchMomentumUpdateMulti(
            this->updated_[0].data(), this->updated_[1].data(), this->grad_.data(), this->sizes_.data(), n,
            ctx.input(3 * n).data<T>(), static_cast<T>(attrs_.momentum), static_cast<T>(attrs_.weight_decay),
            attrs_.nesterov, found_inf, device->stream(), scale, CopyKind(this->copy_dtype_), this->copies_.data()),
        this->name_));
    this->SetOutputs(ctx);
    return absl::OkStatus();
  }

 private:
  kernel_math::MomentumAttrs attrs_;
};

// check_finite_and_unscale(scale, x...) -> (found_inf, y...): each gradient
// unscaled and checked by kernels/cuda/loss_scaling.cu into one device flag
// (an int of scratch), then the flag as the F32 found_inf. The CPU kernel's
// checks and words.
class CudaCheckFiniteAndUnscaleKernel : public OpKernel {
 public:
  explicit CudaCheckFiniteAndUnscaleKernel(const KernelDef&) {}
  absl::Status Init(const Op&) { return absl::OkStatus(); }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "check_finite_and_unscale", 0, "scale", F32));
    const float* scale = ctx.input(0).data<float>();
    Tensor flag = Tensor::Empty(I32, Shape{}, &ctx.device());
    if (!flag.defined()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("check_finite_and_unscale: out of memory for its flag on ", ctx.device().name()));
    }
    int* pflag = flag.data<int32_t>();
    STRATA_RETURN_IF_ERROR(CudaStatus(cuda::LaunchClearFlag(pflag, device->stream()), "check_finite_and_unscale"));
    for (int i = 1; i < ctx.num_inputs(); ++i) {
      const Tensor& x = ctx.input(i);
      if (x.dtype() != F32 && x.dtype() != F64) {
        return absl::InvalidArgumentError(absl::StrCat("check_finite_and_unscale: input 'x' #", i - 1,
                                                       " must be F32 or F64, got ", DataTypeName(x.dtype())));
      }
      STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(i, x.dtype(), x.shape()));
      const cudaError_t e =
          x.dtype() == F32
              ? cuda::LaunchUnscaleAndCheck(y->data<float>(), x.data<float>(), x.num_elements(), scale, pflag,
                                            device->stream())
              : cuda::LaunchUnscaleAndCheck(y->data<double>(), x.data<double>(), x.num_elements(), scale, pflag,
                                            device->stream());
      STRATA_RETURN_IF_ERROR(CudaStatus(e, "check_finite_and_unscale"));
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * found_inf, ctx.AllocateOutput(0, F32, {}));
    return CudaStatus(cuda::LaunchFlagToFoundInf(found_inf->data<float>(), pflag, device->stream()),
                      "check_finite_and_unscale");
  }
};

// update_loss_scaling(found_inf, loss_scale, good_steps, skipped_updates) ->
// (loss_scale, good_steps, skipped_updates), in place, on the device.
class CudaUpdateLossScalingKernel : public OpKernel {
 public:
  explicit CudaUpdateLossScalingKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_.growth_factor, AttrFloat(op, "growth_factor"));
    STRATA_ASSIGN_OR_RETURN(attrs_.backoff_factor, AttrFloat(op, "backoff_factor"));
    STRATA_ASSIGN_OR_RETURN(attrs_.growth_interval, AttrInt(op, "growth_interval"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "update_loss_scaling", 0, "found_inf", F32));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "update_loss_scaling", 1, "loss_scale", F32));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "update_loss_scaling", 2, "good_steps", I64));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "update_loss_scaling", 3, "skipped_updates", I64));
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchUpdateLossScaling(ctx.input(0).data<float>(), MutableData<float>(ctx.input(1)),
                                      MutableData<int64_t>(ctx.input(2)), MutableData<int64_t>(ctx.input(3)), attrs_,
                                      device->stream()),
        "update_loss_scaling"));
    for (int k = 0; k < 3; ++k) ctx.SetOutput(k, ctx.input(k + 1));
    return absl::OkStatus();
  }

 private:
  kernel_math::LossScalingAttrs attrs_;
};

STRATA_REGISTER_KERNEL("increment", DEVICE_CUDA, I64, InitFactory<CudaIncrementKernel>());
// With its F32 found_inf input, increment's kernel key is F32 (the CPU's too).
STRATA_REGISTER_KERNEL("increment", DEVICE_CUDA, F32, InitFactory<CudaIncrementKernel>());
STRATA_REGISTER_KERNEL("check_finite_and_unscale", DEVICE_CUDA, F32, InitFactory<CudaCheckFiniteAndUnscaleKernel>());
STRATA_REGISTER_KERNEL("update_loss_scaling", DEVICE_CUDA, F32, InitFactory<CudaUpdateLossScalingKernel>());
// lr_schedule's only input is the I64 step, so its kernel key is I64 for both output dtypes.
STRATA_REGISTER_KERNEL("lr_schedule", DEVICE_CUDA, I64, InitFactory<CudaLrScheduleKernel>());
STRATA_REGISTER_KERNEL("adam_update", DEVICE_CUDA, F32, InitFactory<CudaAdamUpdateKernel<float>>());
STRATA_REGISTER_KERNEL("adam_update", DEVICE_CUDA, F64, InitFactory<CudaAdamUpdateKernel<double>>());
STRATA_REGISTER_KERNEL("sgd_update", DEVICE_CUDA, F32, InitFactory<CudaSgdUpdateKernel<float>>());
STRATA_REGISTER_KERNEL("sgd_update", DEVICE_CUDA, F64, InitFactory<CudaSgdUpdateKernel<double>>());
STRATA_REGISTER_KERNEL("momentum_update", DEVICE_CUDA, F32, InitFactory<CudaMomentumUpdateKernel<float>>());
STRATA_REGISTER_KERNEL("momentum_update", DEVICE_CUDA, F64, InitFactory<CudaMomentumUpdateKernel<double>>());
STRATA_REGISTER_KERNEL("adam_update_multi", DEVICE_CUDA, F32, InitFactory<CudaAdamUpdateMultiKernel<float>>());
STRATA_REGISTER_KERNEL("adam_update_multi", DEVICE_CUDA, F64, InitFactory<CudaAdamUpdateMultiKernel<double>>());
STRATA_REGISTER_KERNEL("sgd_update_multi", DEVICE_CUDA, F32, InitFactory<CudaSgdUpdateMultiKernel<float>>());
STRATA_REGISTER_KERNEL("sgd_update_multi", DEVICE_CUDA, F64, InitFactory<CudaSgdUpdateMultiKernel<double>>());
STRATA_REGISTER_KERNEL("momentum_update_multi", DEVICE_CUDA, F32, InitFactory<CudaMomentumUpdateMultiKernel<float>>());
STRATA_REGISTER_KERNEL("momentum_update_multi", DEVICE_CUDA, F64, InitFactory<CudaMomentumUpdateMultiKernel<double>>());

}  // namespace
}  // namespace strata
