// CUDA kernels of scaled_dot_product_attention and its gradient
// (kernels/cuda/attention.cu): the GEMM path over chunks of heads where their
// scores fit the budget of attention.h, else the flash kernels; with the attrs, operand checks and messages of
// kernels/cpu/attention.cc. Heads of 0 or more than cuda::kMaxHeadDim elements,
// and more than 65535 (batch x heads), are refused naming the limit.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"
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

// A scratch tensor of `elements` on the op's device, freed (stream-ordered)
// when the kernel returns.
absl::StatusOr<Tensor> Scratch(KernelContext& ctx, DataType dtype, int64_t elements, const char* op) {
  Tensor t = Tensor::Empty(dtype, Shape{elements}, &ctx.device());
  if (!t.defined() && elements > 0) {
    return absl::ResourceExhaustedError(absl::StrCat(op, ": out of memory for ", elements, " scratch elements on ",
                                                     ctx.device().name()));
  }
  return t;
}

// The CPU's attrs, and allow_tf32 (passes/tf32 on GPU plans when the
// strategy allows TF32): the GEMM path's float products then run on tensor
// cores with q, k, v, P and dS rounded to TF32.
class CudaAttentionAttrsKernel : public AttentionAttrsKernel {
 public:
  using AttentionAttrsKernel::AttentionAttrsKernel;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(AttentionAttrsKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(tf32_, AttrBool(op, "allow_tf32"));
    return absl::OkStatus();
  }

 protected:
  // One strided batch of c_i = alpha op(a_i) @ op(b_i); TF32 reaches float only.
  template <typename T>
  absl::Status Batched(cuda::LtGemm& gemm, T* c, const T* a, const T* b, int64_t batch, int64_t m, int64_t n,
                       int64_t k, bool ta, bool tb, T alpha, cudaStream_t stream) const {
    if constexpr (std::is_same_v<T, float>) {
      return gemm.BatchedMatmul(c, a, b, batch, m, n, k, ta, tb, alpha, stream, tf32_);
    } else {
      return gemm.BatchedMatmul(c, a, b, batch, m, n, k, ta, tb, alpha, stream);
    }
  }

  bool tf32_ = false;
};

template <typename T>
class CudaAttentionKernel : public CudaAttentionAttrsKernel {
 public:
  using CudaAttentionAttrsKernel::CudaAttentionAttrsKernel;
  absl::Status Compute(KernelContext& ctx) override {
    constexpr char kOp[] = "scaled_dot_product_attention";
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, kOp, false));
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& q = ctx.input(0);
    STRATA_RETURN_IF_ERROR(CheckLimits(q, kOp));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, q.dtype(), q.shape()));
    STRATA_ASSIGN_OR_RETURN(Tensor * lse, ctx.AllocateOutput(1, q.dtype(), Shape{q.dim(0), q.dim(1), q.dim(2)}));
    const int64_t heads = q.dim(0) * q.dim(1), T_ = q.dim(2), D = q.dim(3);
    const T *pq = q.data<T>(), *pk = ctx.input(1).data<T>(), *pv = ctx.input(2).data<T>();
    const int64_t chunk = cuda::AttentionChunkHeads(heads, T_, sizeof(T), 1);
    if (chunk == 0) {
      return CudaStatus(cuda::LaunchAttention(y->data<T>(), lse->data<T>(), pq, pk, pv, heads, T_, D,
                                              ScaleFor(D), causal_, device->stream()),
                        kOp);
    }
    STRATA_ASSIGN_OR_RETURN(Tensor scores, Scratch(ctx, q.dtype(), chunk * T_ * T_, kOp));
    T* s = scores.data<T>();
    cuda::LtGemm& gemm = device->gemm();
    const cudaStream_t stream = device->stream();
    for (int64_t h0 = 0; h0 < heads; h0 += chunk) {
      const int64_t c = std::min(chunk, heads - h0), off = h0 * T_ * D;
      STRATA_RETURN_IF_ERROR(Batched(gemm, s, pq + off, pk + off, c, T_, T_, D, false, true,
                                                static_cast<T>(ScaleFor(D)), stream));
      STRATA_RETURN_IF_ERROR(
          CudaStatus(cuda::LaunchAttentionSoftmax(s, lse->data<T>() + h0 * T_, c, T_, causal_, stream), kOp));
      STRATA_RETURN_IF_ERROR(
          Batched(gemm, y->data<T>() + off, s, pv + off, c, T_, D, T_, false, false, T(1), stream));
    }
    return absl::OkStatus();
  }
};

template <typename T>
class CudaAttentionGradKernel : public CudaAttentionAttrsKernel {
 public:
  using CudaAttentionAttrsKernel::CudaAttentionAttrsKernel;
  absl::Status Compute(KernelContext& ctx) override {
    constexpr char kOp[] = "scaled_dot_product_attention_grad";
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, kOp, true));
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& q = ctx.input(0);
    STRATA_RETURN_IF_ERROR(CheckLimits(q, kOp));
    Tensor* out[3];
    for (int i = 0; i < 3; ++i) {
      STRATA_ASSIGN_OR_RETURN(out[i], ctx.AllocateOutput(i, q.dtype(), q.shape()));
    }
    const int64_t heads = q.dim(0) * q.dim(1), T_ = q.dim(2), D = q.dim(3);
    STRATA_ASSIGN_OR_RETURN(Tensor di, Scratch(ctx, q.dtype(), cuda::AttentionGradScratch(heads, T_), kOp));
    const T *pq = q.data<T>(), *pk = ctx.input(1).data<T>(), *pv = ctx.input(2).data<T>(),
            *py = ctx.input(3).data<T>(), *plse = ctx.input(4).data<T>(), *pdy = ctx.input(5).data<T>();
    const T* dlse = ctx.num_inputs() > 6 ? ctx.input(6).data<T>() : nullptr;
    T* pdi = di.defined() ? di.data<T>() : nullptr;
    T *dq = out[0]->data<T>(), *dk = out[1]->data<T>(), *dv = out[2]->data<T>();
    const cudaStream_t stream = device->stream();
    const int64_t chunk = cuda::AttentionChunkHeads(heads, T_, sizeof(T), 2);
    if (chunk == 0) {
      return CudaStatus(cuda::LaunchAttentionGrad(dq, dk, dv, pq, pk, pv, py, plse, pdy, dlse, pdi, heads, T_, D,
                                                  ScaleFor(D), causal_, stream),
                        kOp);
    }
    STRATA_RETURN_IF_ERROR(CudaStatus(cuda::LaunchAttentionRowDots(pdi, py, pdy, dlse, heads * T_, D, stream), kOp));
    STRATA_ASSIGN_OR_RETURN(Tensor work, Scratch(ctx, q.dtype(), 2 * chunk * T_ * T_, kOp));
    T* p = work.data<T>();
    T* ds = p + chunk * T_ * T_;
    const T scale = static_cast<T>(ScaleFor(D));
    cuda::LtGemm& gemm = device->gemm();
    for (int64_t h0 = 0; h0 < heads; h0 += chunk) {
      const int64_t c = std::min(chunk, heads - h0), off = h0 * T_ * D;
      // P again from the forward's lse; dv = P^T dy; dS = P (dy v^T - di).
      STRATA_RETURN_IF_ERROR(Batched(gemm, p, pq + off, pk + off, c, T_, T_, D, false, true, scale, stream));
      STRATA_RETURN_IF_ERROR(
          CudaStatus(cuda::LaunchAttentionProbs(p, plse + h0 * T_, c, T_, causal_, stream), kOp));
      STRATA_RETURN_IF_ERROR(Batched(gemm, dv + off, p, pdy + off, c, T_, D, T_, true, false, T(1), stream));
      STRATA_RETURN_IF_ERROR(Batched(gemm, ds, pdy + off, pv + off, c, T_, T_, D, false, true, T(1), stream));
      STRATA_RETURN_IF_ERROR(
          CudaStatus(cuda::LaunchAttentionScoreGrad(ds, p, pdi + h0 * T_, c, T_, stream), kOp));
      STRATA_RETURN_IF_ERROR(Batched(gemm, dq + off, ds, pk + off, c, T_, D, T_, false, false, scale, stream));
      STRATA_RETURN_IF_ERROR(Batched(gemm, dk + off, ds, pq + off, c, T_, D, T_, true, false, scale, stream));
    }
    return absl::OkStatus();
  }
};

// Scratch for the memory plan: the forward's scores on the GEMM path; the
// gradient's di (one element per query row) and, on the GEMM path, P and dS.
absl::StatusOr<int64_t> AttentionWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty() || def.input_types[0].shape.size() != 4) return int64_t{0};
  const Shape& s = def.input_types[0].shape;
  const int64_t elem = static_cast<int64_t>(DataTypeSize(def.input_types[0].dtype));
  return cuda::AttentionChunkHeads(s[0] * s[1], s[2], elem, 1) * s[2] * s[2] * elem;
}
absl::StatusOr<int64_t> AttentionGradWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty() || def.input_types[0].shape.size() != 4) return int64_t{0};
  const Shape& s = def.input_types[0].shape;
  const int64_t elem = static_cast<int64_t>(DataTypeSize(def.input_types[0].dtype));
  return (cuda::AttentionGradScratch(s[0] * s[1], s[2]) +
          2 * cuda::AttentionChunkHeads(s[0] * s[1], s[2], elem, 2) * s[2] * s[2]) *
         elem;
}
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention", DEVICE_CUDA, AttentionWorkspace);
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention_grad", DEVICE_CUDA, AttentionGradWorkspace);

STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CUDA, F32, InitFactory<CudaAttentionKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CUDA, F64, InitFactory<CudaAttentionKernel<double>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CUDA, F32,
                       InitFactory<CudaAttentionGradKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CUDA, F64,
                       InitFactory<CudaAttentionGradKernel<double>>());

}  // namespace
}  // namespace strata
