// CUDA kernels of the pooling ops (kernels/cuda/pool.cu): max_pool2d,
// avg_pool2d and their grads, with the dtypes, attrs, shape checks and
// messages of kernels/cpu/pool2d.cc (the attrs and checks live in
// kernels/pool2d_attrs.h) and its numbers bit for bit.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/pool.h"
#include "kernels/pool2d_attrs.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

using pool2d::PoolAttrs;
using pool2d::PoolGeometry;

cuda::Pool2dShape ShapeOf(const PoolGeometry& g) {
  return {g.planes, g.h, g.w, g.ho, g.wo, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw};
}

class CudaPoolKernel : public OpKernel {
 public:
  explicit CudaPoolKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) { return attrs_.Read(op); }

 protected:
  PoolAttrs attrs_;
};

// y [N, C, Ho, Wo] = max (kMax) or mean over each window of x [N, C, H, W].
template <typename T, bool kMax>
class CudaPool2dKernel : public CudaPoolKernel {
 public:
  using CudaPoolKernel::CudaPoolKernel;

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    const char* name = kMax ? "max_pool2d" : "avg_pool2d";
    STRATA_ASSIGN_OR_RETURN(PoolGeometry g, attrs_.Geometry(x.shape(), name));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), Shape{x.dim(0), x.dim(1), g.ho, g.wo}));
    if constexpr (kMax) {
      return CudaStatus(cuda::LaunchMaxPool2d(y->data<T>(), x.data<T>(), ShapeOf(g), device->stream()), name);
    } else {
      return CudaStatus(
          cuda::LaunchAvgPool2d(y->data<T>(), x.data<T>(), ShapeOf(g), attrs_.exclusive, device->stream()), name);
    }
  }
};

// dx [N, C, H, W]: each dy to its window's maximum in x.
template <typename T>
class CudaMaxPool2dGradKernel : public CudaPoolKernel {
 public:
  using CudaPoolKernel::CudaPoolKernel;

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(PoolGeometry g, pool2d::MaxPoolGradGeometry(attrs_, x, dy));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, x.dtype(), x.shape()));
    return CudaStatus(
        cuda::LaunchMaxPool2dGrad(dx->data<T>(), x.data<T>(), dy.data<T>(), ShapeOf(g), device->stream()),
        "max_pool2d_grad");
  }
};

// dx [N, C, input_size]: each dy spread evenly over its window.
template <typename T>
class CudaAvgPool2dGradKernel : public CudaPoolKernel {
 public:
  using CudaPoolKernel::CudaPoolKernel;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(CudaPoolKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(input_size_, AttrInts(op, "input_size"));
    if (input_size_.size() != 2) {
      return absl::InternalError(absl::StrCat(op.type(), ": attr 'input_size' was not validated"));
    }
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& dy = ctx.input(0);
    Shape xs;
    STRATA_ASSIGN_OR_RETURN(PoolGeometry g, pool2d::AvgPoolGradGeometry(attrs_, input_size_, dy, &xs));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, dy.dtype(), xs));
    return CudaStatus(
        cuda::LaunchAvgPool2dGrad(dx->data<T>(), dy.data<T>(), ShapeOf(g), attrs_.exclusive, device->stream()),
        "avg_pool2d_grad");
  }

 private:
  std::vector<int64_t> input_size_;
};

template <typename T>
using CudaMaxPool2dKernel = CudaPool2dKernel<T, true>;
template <typename T>
using CudaAvgPool2dKernel = CudaPool2dKernel<T, false>;

STRATA_REGISTER_KERNEL("max_pool2d", DEVICE_CUDA, F32, InitFactory<CudaMaxPool2dKernel<float>>());
STRATA_REGISTER_KERNEL("max_pool2d", DEVICE_CUDA, F64, InitFactory<CudaMaxPool2dKernel<double>>());
STRATA_REGISTER_KERNEL("max_pool2d_grad", DEVICE_CUDA, F32, InitFactory<CudaMaxPool2dGradKernel<float>>());
STRATA_REGISTER_KERNEL("max_pool2d_grad", DEVICE_CUDA, F64, InitFactory<CudaMaxPool2dGradKernel<double>>());
STRATA_REGISTER_KERNEL("avg_pool2d", DEVICE_CUDA, F32, InitFactory<CudaAvgPool2dKernel<float>>());
STRATA_REGISTER_KERNEL("avg_pool2d", DEVICE_CUDA, F64, InitFactory<CudaAvgPool2dKernel<double>>());
STRATA_REGISTER_KERNEL("avg_pool2d_grad", DEVICE_CUDA, F32, InitFactory<CudaAvgPool2dGradKernel<float>>());
STRATA_REGISTER_KERNEL("avg_pool2d_grad", DEVICE_CUDA, F64, InitFactory<CudaAvgPool2dGradKernel<double>>());

}  // namespace
}  // namespace strata
