// CUDA kernels of scaled_dot_product_attention and its gradient
// (kernels/cuda/attention.cu), with the attrs, operand checks and messages of
// kernels/cpu/attention.cc. Heads of 0 or more than cuda::kMaxHeadDim elements,
// and more than 65535 (batch x heads), are refused naming the limit.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cuda/attention.h"
#include "kernels/kernel_checks.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

// The GPU kernels' limits on q [B, H, T, D].
absl::Status CheckLimits(const Tensor& q, const char* op) {
  if (q.dim(3) == 0 || q.dim(3) > cuda::kMaxHeadDim) {
    return absl::UnimplementedError(absl::StrCat(op, ": the CUDA kernel takes heads of 1 to ", cuda::kMaxHeadDim,
                                                 " elements, got D = ", q.dim(3)));
  }
  if (q.dim(0) * q.dim(1) > 65535) {
    return absl::UnimplementedError(absl::StrCat(op, ": the CUDA kernel takes at most 65535 (batch x heads), got ",
                                                 q.dim(0), " x ", q.dim(1)));
  }
  return absl::OkStatus();
}

template <typename T>
class CudaAttentionKernel : public AttentionAttrsKernel {
 public:
  using AttentionAttrsKernel::AttentionAttrsKernel;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, "scaled_dot_product_attention", false));
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& q = ctx.input(0);
    STRATA_RETURN_IF_ERROR(CheckLimits(q, "scaled_dot_product_attention"));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, q.dtype(), q.shape()));
    STRATA_ASSIGN_OR_RETURN(Tensor * lse, ctx.AllocateOutput(1, q.dtype(), Shape{q.dim(0), q.dim(1), q.dim(2)}));
    return CudaStatus(cuda::LaunchAttention(y->data<T>(), lse->data<T>(), q.data<T>(), ctx.input(1).data<T>(),
                                            ctx.input(2).data<T>(), q.dim(0) * q.dim(1), q.dim(2), q.dim(3),
                                            ScaleFor(q.dim(3)), causal_, device->stream()),
                      "scaled_dot_product_attention");
  }
};

template <typename T>
class CudaAttentionGradKernel : public AttentionAttrsKernel {
 public:
  using AttentionAttrsKernel::AttentionAttrsKernel;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, "scaled_dot_product_attention_grad", true));
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& q = ctx.input(0);
    STRATA_RETURN_IF_ERROR(CheckLimits(q, "scaled_dot_product_attention_grad"));
    Tensor* out[3];
    for (int i = 0; i < 3; ++i) {
      STRATA_ASSIGN_OR_RETURN(out[i], ctx.AllocateOutput(i, q.dtype(), q.shape()));
    }
    const int64_t heads = q.dim(0) * q.dim(1), T_ = q.dim(2);
    Tensor di = Tensor::Empty(q.dtype(), Shape{cuda::AttentionGradScratch(heads, T_)}, &ctx.device());
    if (!di.defined() && heads * T_ > 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("scaled_dot_product_attention_grad: out of memory for ", heads * T_, " scratch elements on ",
                       ctx.device().name()));
    }
    const T* dlse = ctx.num_inputs() > 6 ? ctx.input(6).data<T>() : nullptr;
    return CudaStatus(
        cuda::LaunchAttentionGrad(out[0]->data<T>(), out[1]->data<T>(), out[2]->data<T>(), q.data<T>(),
                                  ctx.input(1).data<T>(), ctx.input(2).data<T>(), ctx.input(3).data<T>(),
                                  ctx.input(4).data<T>(), ctx.input(5).data<T>(), dlse,
                                  di.defined() ? di.data<T>() : nullptr, heads, T_, q.dim(3), ScaleFor(q.dim(3)),
                                  causal_, device->stream()),
        "scaled_dot_product_attention_grad");
  }
};

// The gradient's di, one element per query row, for the memory plan.
absl::StatusOr<int64_t> AttentionGradWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty() || def.input_types[0].shape.size() != 4) return int64_t{0};
  const Shape& s = def.input_types[0].shape;
  return cuda::AttentionGradScratch(s[0] * s[1], s[2]) * static_cast<int64_t>(DataTypeSize(def.input_types[0].dtype));
}
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention_grad", DEVICE_CUDA, AttentionGradWorkspace);

STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CUDA, F32, InitFactory<CudaAttentionKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CUDA, F64, InitFactory<CudaAttentionKernel<double>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CUDA, F32,
                       InitFactory<CudaAttentionGradKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CUDA, F64,
                       InitFactory<CudaAttentionGradKernel<double>>());

}  // namespace
}  // namespace strata
