// The ops that have CUDA kernels, registered for DEVICE_CUDA: relu and its
// gradient (kernels/cuda/relu.cu) and matmul through the device's cuBLASLt
// handle (kernels/cuda/gemm.h). Each kernel enqueues on its device's compute
// stream and returns; errors of the launch come back at once, errors of the
// work at the device's next synchronisation.

#include <cuda_bf16.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/relu.h"
#include "kernels/kernel_checks.h"
#include "kernels/matmul_shape.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

template <typename T>
class CudaReluKernel : public OpKernel {
 public:
  explicit CudaReluKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), x.shape()));
    return CudaStatus(cuda::LaunchRelu(y->data<T>(), x.data<T>(), x.num_elements(), device->stream()), "relu");
  }
};

// inputs (y, dy): dx = y > 0 ? dy : 0, as on the CPU.
template <typename T>
class CudaReluGradKernel : public OpKernel {
 public:
  explicit CudaReluGradKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& y = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckSameShapes(y, dy));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, y.dtype(), y.shape()));
    return CudaStatus(
        cuda::LaunchReluGrad(dx->data<T>(), y.data<T>(), dy.data<T>(), y.num_elements(), device->stream()),
        "relu_grad");
  }
};

// The element type LtGemm takes for a tensor dtype's storage type.
template <typename T>
struct GemmType {
  using type = T;
};
template <>
struct GemmType<bfloat16> {
  using type = __nv_bfloat16;  // the same 16 bits
};

// y = op(a) @ op(b), as kernels/cpu/matmul.cc: x @ W with a batched x and a
// 2-D W is one GEMM over the folded rows; other batches are one GEMM per item.
template <typename T>
class CudaMatmulKernel : public OpKernel {
 public:
  explicit CudaMatmulKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(ta_, AttrBool(op, "transpose_a"));
    STRATA_ASSIGN_OR_RETURN(tb_, AttrBool(op, "transpose_b"));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    using G = typename GemmType<T>::type;
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(MatmulShape s, InferMatmulShape(a.shape(), b.shape(), ta_, tb_));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, a.dtype(), s.y));
    const G* pa = reinterpret_cast<const G*>(a.data<T>());
    const G* pb = reinterpret_cast<const G*>(b.data<T>());
    G* py = reinterpret_cast<G*>(y->data<T>());
    cuda::LtGemm& gemm = device->gemm();
    if (!s.b_batched && !ta_) {
      return gemm.Matmul(py, pa, pb, s.batch * s.m, s.n, s.k, false, tb_, device->stream());
    }
    for (int64_t i = 0; i < s.batch; ++i) {
      STRATA_RETURN_IF_ERROR(gemm.Matmul(py + i * s.m * s.n, pa + i * s.m * s.k, s.b_batched ? pb + i * s.k * s.n : pb,
                                         s.m, s.n, s.k, ta_, tb_, device->stream()));
    }
    return absl::OkStatus();
  }

 private:
  bool ta_ = false, tb_ = false;
};

STRATA_REGISTER_KERNEL("relu", DEVICE_CUDA, F32, MakeFactory<CudaReluKernel<float>>());
STRATA_REGISTER_KERNEL("relu", DEVICE_CUDA, F64, MakeFactory<CudaReluKernel<double>>());
STRATA_REGISTER_KERNEL("relu_grad", DEVICE_CUDA, F32, MakeFactory<CudaReluGradKernel<float>>());
STRATA_REGISTER_KERNEL("relu_grad", DEVICE_CUDA, F64, MakeFactory<CudaReluGradKernel<double>>());
STRATA_REGISTER_KERNEL("matmul", DEVICE_CUDA, F32, InitFactory<CudaMatmulKernel<float>>());
STRATA_REGISTER_KERNEL("matmul", DEVICE_CUDA, F64, InitFactory<CudaMatmulKernel<double>>());
STRATA_REGISTER_KERNEL("matmul", DEVICE_CUDA, BF16, InitFactory<CudaMatmulKernel<bfloat16>>());

}  // namespace
}  // namespace strata
