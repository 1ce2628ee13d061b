// CUDA kernels of scaled_dot_product_attention and its gradient
// (kernels/cuda/attention.cu): the GEMM path over chunks of heads where their
// scores fit the budget of attention.h, else the flash kernels; bf16 and fp16
// heads of 32, 64 or 128 take the tensor-core flash kernels
// (flash_attention.h); with the attrs, operand checks and messages of
// kernels/cpu/attention.cc. Heads of 0 or more than cuda::kMaxHeadDim elements,
// and more than 65535 (batch x heads), are refused naming the limit.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/kernel_checks.h"
#include "proto/status_macros.h"
#include "proto/types.h"
#include "runtime/float16.h"
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
    if (bthd()) return absl::UnimplementedError(absl::StrCat(op.type(), ": the CUDA kernels take layout \"bhtd\" only"));
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

// The GEMM path's [T, T] buffers, in bytes per score element
// (kernels/attention_budget.h).
int64_t ScoreBytes(DataType dtype, bool grad) {
  return AttentionScoreBytes(IsHalfFloating(dtype), static_cast<int64_t>(DataTypeSize(dtype)), grad);
}

// Heads per chunk of the GEMM path; 0: the flash kernels (F32, F64).
int64_t ChunkHeads(DataType dtype, bool grad, int64_t heads, int64_t T) {
  return cuda::AttentionChunkHeads(heads, T, ScoreBytes(dtype, grad), 1);
}

// STRATA_TENSOR_CORE_ATTENTION=1 in the environment turns the tensor-core
// flash kernels on for the process (they are off until they have run on a
// GPU), so a GPU session can try them in strata_gpu and bench/gpt2.py
// without a rebuild.
const bool kTensorCoreFromEnv = [] {
  const char* on = std::getenv("STRATA_TENSOR_CORE_ATTENTION");
  if (on != nullptr && std::string(on) == "1") cuda::FlashTensorCoreAttention().store(true);
  return true;
}();

// Whether 16-bit q [.., heads, .., D] takes the tensor-core flash kernels
// (else the GEMM path): one rule for the kernels and the workspace.
bool FlashTensorCorePath(DataType dtype, int64_t heads, int64_t D) {
  return IsHalfFloating(dtype) && cuda::FlashTensorCoreAttention().load() && cuda::FlashTensorCoreHeadDim(D) &&
         heads <= cuda::kFlashMaxHeads;
}

// The scratch tensor the GEMM path allocates for `chunk` heads: float for
// 16-bit q (its half-typed buffer in the last elements).
std::pair<DataType, int64_t> ScoreScratch(DataType dtype, bool grad, int64_t chunk, int64_t T) {
  const int64_t n = chunk * T * T;
  if (IsHalfFloating(dtype)) return {F32, (grad ? 2 * n : n) + (n + 1) / 2};
  return {dtype, grad ? 2 * n : n};
}

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
    const int64_t chunk = ChunkHeads(q.dtype(), false, heads, T_);
    if (chunk == 0) {
      return CudaStatus(cuda::LaunchAttention(y->data<T>(), lse->data<T>(), pq, pk, pv, heads, T_, D,
                                              ScaleFor(D), causal_, device->stream()),
                        kOp);
    }
    const auto [scratch_dtype, elements] = ScoreScratch(q.dtype(), false, chunk, T_);
    STRATA_ASSIGN_OR_RETURN(Tensor scores, Scratch(ctx, scratch_dtype, elements, kOp));
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
    const int64_t chunk = ChunkHeads(q.dtype(), true, heads, T_);
    if (chunk == 0) {
      return CudaStatus(cuda::LaunchAttentionGrad(dq, dk, dv, pq, pk, pv, py, plse, pdy, dlse, pdi, heads, T_, D,
                                                  ScaleFor(D), causal_, stream),
                        kOp);
    }
    STRATA_RETURN_IF_ERROR(CudaStatus(cuda::LaunchAttentionRowDots(pdi, py, pdy, dlse, heads * T_, D, stream), kOp));
    const auto [scratch_dtype, elements] = ScoreScratch(q.dtype(), true, chunk, T_);
    STRATA_ASSIGN_OR_RETURN(Tensor work, Scratch(ctx, scratch_dtype, elements, kOp));
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

// The CUDA type of a 16-bit storage type.
template <typename T>
struct CudaHalf;
template <>
struct CudaHalf<bfloat16> {
  using type = __nv_bfloat16;
};
template <>
struct CudaHalf<float16> {
  using type = __half;
};

absl::Status RefuseLongHalf(const char* op, int64_t T) {
  return absl::UnimplementedError(absl::StrCat(op, ": the CUDA kernel takes 16-bit heads whose [T, T] scores fit the ",
                                               "GEMM path's budget (", cuda::AttentionScoreBudget().load(),
                                               " bytes, four times for one head), got T = ", T));
}

// bf16 or fp16 q, k, v (mixed precision): the tensor-core flash kernels
// where they take the head size, else the GEMM path, its products on tensor
// cores with float sums; on both, scores, softmax and lse in float, P
// rounded to q's type for P v (as FlashAttention does), y rounded once.
template <typename T>
class CudaHalfAttentionKernel : public CudaAttentionAttrsKernel {
 public:
  using CudaAttentionAttrsKernel::CudaAttentionAttrsKernel;
  absl::Status Compute(KernelContext& ctx) override {
    using G = typename CudaHalf<T>::type;
    constexpr char kOp[] = "scaled_dot_product_attention";
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, kOp, false));
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& q = ctx.input(0);
    // No head-size or head-count limit: the GEMM path has neither (CheckLimits is the flash kernels').
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, q.dtype(), q.shape()));
    STRATA_ASSIGN_OR_RETURN(Tensor * lse, ctx.AllocateOutput(1, F32, Shape{q.dim(0), q.dim(1), q.dim(2)}));
    const int64_t heads = q.dim(0) * q.dim(1), T_ = q.dim(2), D = q.dim(3);
    if (heads * T_ == 0) return absl::OkStatus();
    const G* pq = reinterpret_cast<const G*>(q.data<T>());
    const G* pk = reinterpret_cast<const G*>(ctx.input(1).data<T>());
    const G* pv = reinterpret_cast<const G*>(ctx.input(2).data<T>());
    G* py = reinterpret_cast<G*>(y->data<T>());
    const float scale = static_cast<float>(ScaleFor(D));
    const cudaStream_t stream = device->stream();
    if (FlashTensorCorePath(q.dtype(), heads, D)) {
      return CudaStatus(cuda::LaunchFlashAttention(py, lse->data<float>(), pq, pk, pv, heads, T_, D, scale, causal_,
                                                   stream),
                        kOp);
    }
    const int64_t chunk = ChunkHeads(q.dtype(), false, heads, T_);
    if (chunk == 0) return RefuseLongHalf(kOp, T_);
    const auto [scratch_dtype, elements] = ScoreScratch(q.dtype(), false, chunk, T_);
    STRATA_ASSIGN_OR_RETURN(Tensor scratch, Scratch(ctx, scratch_dtype, elements, kOp));
    float* s = scratch.data<float>();
    G* p = reinterpret_cast<G*>(s + chunk * T_ * T_);
    cuda::LtGemm& gemm = device->gemm();
    for (int64_t h0 = 0; h0 < heads; h0 += chunk) {
      const int64_t c = std::min(chunk, heads - h0), off = h0 * T_ * D;
      STRATA_RETURN_IF_ERROR(gemm.BatchedMatmul(s, pq + off, pk + off, c, T_, T_, D, false, true, scale, stream));
      STRATA_RETURN_IF_ERROR(
          CudaStatus(cuda::LaunchAttentionSoftmax(s, p, lse->data<float>() + h0 * T_, c, T_, causal_, stream), kOp));
      STRATA_RETURN_IF_ERROR(gemm.BatchedMatmul(py + off, p, pv + off, c, T_, D, T_, false, false, 1.0f, stream));
    }
    return absl::OkStatus();
  }
};

// Its gradient, on the forward's path: di and dP in float, dS = P (dP - di)
// in float rounded to q's type for dq = scale dS k and dk = scale dS^T q;
// dv = P^T dy from P in q's type.
template <typename T>
class CudaHalfAttentionGradKernel : public CudaAttentionAttrsKernel {
 public:
  using CudaAttentionAttrsKernel::CudaAttentionAttrsKernel;
  absl::Status Compute(KernelContext& ctx) override {
    using G = typename CudaHalf<T>::type;
    constexpr char kOp[] = "scaled_dot_product_attention_grad";
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, kOp, true));
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& q = ctx.input(0);
    // No head-size or head-count limit: the GEMM path has neither (CheckLimits is the flash kernels').
    G* out[3];
    for (int i = 0; i < 3; ++i) {
      STRATA_ASSIGN_OR_RETURN(Tensor * t, ctx.AllocateOutput(i, q.dtype(), q.shape()));
      out[i] = reinterpret_cast<G*>(t->data<T>());
    }
    const int64_t heads = q.dim(0) * q.dim(1), T_ = q.dim(2), D = q.dim(3);
    if (heads * T_ == 0) return absl::OkStatus();
    const bool flash = FlashTensorCorePath(q.dtype(), heads, D);
    const int64_t chunk = flash ? 0 : ChunkHeads(q.dtype(), true, heads, T_);
    if (!flash && chunk == 0) return RefuseLongHalf(kOp, T_);
    const auto at = [&ctx](int i) { return reinterpret_cast<const G*>(ctx.input(i).data<T>()); };
    const G *pq = at(0), *pk = at(1), *pv = at(2), *py = at(3), *pdy = at(5);
    const float* plse = ctx.input(4).data<float>();
    const float* dlse = ctx.num_inputs() > 6 ? ctx.input(6).data<float>() : nullptr;
    STRATA_ASSIGN_OR_RETURN(Tensor di, Scratch(ctx, F32, cuda::AttentionGradScratch(heads, T_), kOp));
    const cudaStream_t stream = device->stream();
    const float scale = static_cast<float>(ScaleFor(D));
    if (flash) {
      return CudaStatus(cuda::LaunchFlashAttentionGrad(out[0], out[1], out[2], pq, pk, pv, py, plse, pdy, dlse,
                                                       di.data<float>(), heads, T_, D, scale, causal_, stream),
                        kOp);
    }
    STRATA_RETURN_IF_ERROR(
        CudaStatus(cuda::LaunchAttentionRowDots(di.data<float>(), py, pdy, dlse, heads * T_, D, stream), kOp));
    const auto [scratch_dtype, elements] = ScoreScratch(q.dtype(), true, chunk, T_);
    STRATA_ASSIGN_OR_RETURN(Tensor scratch, Scratch(ctx, scratch_dtype, elements, kOp));
    const int64_t n = chunk * T_ * T_;
    float* p = scratch.data<float>();
    float* dp = p + n;
    G* h = reinterpret_cast<G*>(p + 2 * n);
    cuda::LtGemm& gemm = device->gemm();
    for (int64_t h0 = 0; h0 < heads; h0 += chunk) {
      const int64_t c = std::min(chunk, heads - h0), off = h0 * T_ * D;
      STRATA_RETURN_IF_ERROR(gemm.BatchedMatmul(p, pq + off, pk + off, c, T_, T_, D, false, true, scale, stream));
      STRATA_RETURN_IF_ERROR(
          CudaStatus(cuda::LaunchAttentionProbs(p, h, plse + h0 * T_, c, T_, causal_, stream), kOp));
      STRATA_RETURN_IF_ERROR(
          gemm.BatchedMatmul(out[2] + off, h, pdy + off, c, T_, D, T_, true, false, 1.0f, stream));
      STRATA_RETURN_IF_ERROR(gemm.BatchedMatmul(dp, pdy + off, pv + off, c, T_, T_, D, false, true, 1.0f, stream));
      STRATA_RETURN_IF_ERROR(CudaStatus(
          cuda::LaunchAttentionScoreGrad(h, dp, p, di.data<float>() + h0 * T_, c, T_, stream), kOp));
      STRATA_RETURN_IF_ERROR(
          gemm.BatchedMatmul(out[0] + off, h, pk + off, c, T_, D, T_, false, false, scale, stream));
      STRATA_RETURN_IF_ERROR(
          gemm.BatchedMatmul(out[1] + off, h, pq + off, c, T_, D, T_, true, false, scale, stream));
    }
    return absl::OkStatus();
  }
};

// Scratch for the memory plan: the forward's scores on the GEMM path; the
// gradient's di (one element per query row) and, on the GEMM path, P and dS.
// The tensor-core flash kernels (FlashTensorCorePath) need di only.
absl::StatusOr<int64_t> ScoreWorkspace(const KernelDef& def, bool grad) {
  if (def.input_types.empty() || def.input_types[0].shape.size() != 4) return int64_t{0};
  const Shape& s = def.input_types[0].shape;
  const DataType dtype = def.input_types[0].dtype;
  const int64_t heads = s[0] * s[1], T = s[2];
  // di, in lse's type (float for 16-bit q).
  const DataType lse = IsHalfFloating(dtype) ? F32 : dtype;
  int64_t bytes = grad ? cuda::AttentionGradScratch(heads, T) * static_cast<int64_t>(DataTypeSize(lse)) : 0;
  const int64_t chunk = FlashTensorCorePath(dtype, heads, s[3]) ? 0 : ChunkHeads(dtype, grad, heads, T);
  if (chunk > 0) {
    const auto [scratch_dtype, elements] = ScoreScratch(dtype, grad, chunk, T);
    bytes += elements * static_cast<int64_t>(DataTypeSize(scratch_dtype));
  }
  return bytes;
}
absl::StatusOr<int64_t> AttentionWorkspace(const KernelDef& def, int) { return ScoreWorkspace(def, false); }
absl::StatusOr<int64_t> AttentionGradWorkspace(const KernelDef& def, int) { return ScoreWorkspace(def, true); }
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention", DEVICE_CUDA, AttentionWorkspace);
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention_grad", DEVICE_CUDA, AttentionGradWorkspace);

STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CUDA, F32, InitFactory<CudaAttentionKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CUDA, F64, InitFactory<CudaAttentionKernel<double>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CUDA, F32,
                       InitFactory<CudaAttentionGradKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CUDA, F64,
                       InitFactory<CudaAttentionGradKernel<double>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CUDA, BF16,
                       InitFactory<CudaHalfAttentionKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CUDA, F16,
                       InitFactory<CudaHalfAttentionKernel<float16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CUDA, BF16,
                       InitFactory<CudaHalfAttentionGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CUDA, F16,
                       InitFactory<CudaHalfAttentionGradKernel<float16>>());

}  // namespace
}  // namespace strata
