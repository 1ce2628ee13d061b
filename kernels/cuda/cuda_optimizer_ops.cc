// CUDA kernels of the optimizer family (kernels/cuda/optimizers.cu):
// increment, lr_schedule, adam_update, sgd_update, momentum_update. Attrs
// (kernels/optimizer_attrs.h), metadata checks and their messages are the
// CPU kernels'. The step and lr are read on the device, never on the host, so
// a step enqueues without waiting; the checks the CPU makes on their values (step >= 1 for
// adam, >= 0 for lr_schedule) poison the outputs with NaN instead
// (kernels/cuda/optimizers.h).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/optimizers.h"
#include "kernels/kernel_checks.h"
#include "kernels/optimizer_attrs.h"
#include "kernels/optimizer_math.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

using kernel_checks::ExpectLike;
using kernel_checks::ExpectScalar;
using kernel_checks::MutableData;

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
    STRATA_RETURN_IF_ERROR(
        CudaStatus(cuda::LaunchIncrement(MutableData<int64_t>(counter), by_, device->stream()), "increment"));
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

// adam_update(param, grad, m, v, lr, step) -> (param, m, v), in place.
template <typename T>
class CudaAdamUpdateKernel : public OpKernel {
 public:
  explicit CudaAdamUpdateKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadAdamAttrs(op));
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
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchAdamUpdate(MutableData<T>(param), MutableData<T>(m), MutableData<T>(v), ctx.input(1).data<T>(),
                               ctx.input(4).data<T>(), ctx.input(5).data<int64_t>(), attrs_, param.num_elements(),
                               device->stream()),
        "adam_update"));
    ctx.SetOutput(0, param);
    ctx.SetOutput(1, m);
    ctx.SetOutput(2, v);
    return absl::OkStatus();
  }

 private:
  kernel_math::AdamAttrs attrs_;
};

// sgd_update(param, grad, lr) -> param, in place.
template <typename T>
class CudaSgdUpdateKernel : public OpKernel {
 public:
  explicit CudaSgdUpdateKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadSgdAttrs(op));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "sgd_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "sgd_update", 2, "lr", DataTypeOf<T>::value));
    const Tensor& param = ctx.input(0);
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchSgdUpdate(MutableData<T>(param), ctx.input(1).data<T>(), ctx.input(2).data<T>(),
                              static_cast<T>(attrs_.weight_decay), param.num_elements(), device->stream()),
        "sgd_update"));
    ctx.SetOutput(0, param);
    return absl::OkStatus();
  }

 private:
  kernel_math::SgdAttrs attrs_;
};

// momentum_update(param, grad, velocity, lr) -> (param, velocity), in place.
template <typename T>
class CudaMomentumUpdateKernel : public OpKernel {
 public:
  explicit CudaMomentumUpdateKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_, ReadMomentumAttrs(op));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "momentum_update", 1, "grad", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectLike(ctx, "momentum_update", 2, "velocity", 0, "param"));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "momentum_update", 3, "lr", DataTypeOf<T>::value));
    const Tensor& param = ctx.input(0);
    const Tensor& velocity = ctx.input(2);
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchMomentumUpdate(MutableData<T>(param), MutableData<T>(velocity), ctx.input(1).data<T>(),
                                   ctx.input(3).data<T>(), static_cast<T>(attrs_.momentum),
                                   static_cast<T>(attrs_.weight_decay), attrs_.nesterov, param.num_elements(),
                                   device->stream()),
        "momentum_update"));
    ctx.SetOutput(0, param);
    ctx.SetOutput(1, velocity);
    return absl::OkStatus();
  }

 private:
  kernel_math::MomentumAttrs attrs_;
};

STRATA_REGISTER_KERNEL("increment", DEVICE_CUDA, I64, InitFactory<CudaIncrementKernel>());
// lr_schedule's only input is the I64 step, so its kernel key is I64 for both output dtypes.
STRATA_REGISTER_KERNEL("lr_schedule", DEVICE_CUDA, I64, InitFactory<CudaLrScheduleKernel>());
STRATA_REGISTER_KERNEL("adam_update", DEVICE_CUDA, F32, InitFactory<CudaAdamUpdateKernel<float>>());
STRATA_REGISTER_KERNEL("adam_update", DEVICE_CUDA, F64, InitFactory<CudaAdamUpdateKernel<double>>());
STRATA_REGISTER_KERNEL("sgd_update", DEVICE_CUDA, F32, InitFactory<CudaSgdUpdateKernel<float>>());
STRATA_REGISTER_KERNEL("sgd_update", DEVICE_CUDA, F64, InitFactory<CudaSgdUpdateKernel<double>>());
STRATA_REGISTER_KERNEL("momentum_update", DEVICE_CUDA, F32, InitFactory<CudaMomentumUpdateKernel<float>>());
STRATA_REGISTER_KERNEL("momentum_update", DEVICE_CUDA, F64, InitFactory<CudaMomentumUpdateKernel<double>>());

}  // namespace
}  // namespace strata
