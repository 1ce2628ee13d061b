// CUDA kernels of scaled_dot_product_attention and its gradient
// (kernels/cuda/attention.cu): the GEMM path over chunks of heads where their
// scores fit the budget of attention.h, else the flash kernels; bf16 and fp16
// heads of 32, 64 or 128 take the tensor-core flash kernels
// (flash_attention.h); with the attrs, operand checks and messages of
// kernels/cpu/attention.cc. Heads of 0 or more than cuda::kMaxHeadDim elements,
// and more than 65535 (batch x heads), are refused naming the limit.
//
// Layout "bthd" ([B, T, H, D] q, k, v, y and gradients): the tensor-core
// flash kernels read and write it in place (cuda::HeadLayout). The GEMM
// path cannot: its cuBLASLt strided batches (kernels/cuda/gemm.h) take one
// batch stride per operand and no leading dimension, and a bthd head's rows
// lie H * D apart; nor do the F32/F64 kernels of attention.h take strides.
// Those paths transpose q, k, v (y, dy) into [B, H, T, D] scratch, run as
// for "bhtd" and transpose the outputs back (ViaBhtd): the graph's
// transposes moved into the kernel, the same traffic, bit for bit the
// "bhtd" results.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/strided_copy.h"
#include "kernels/kernel_checks.h"
#include "proto/status_macros.h"
#include "proto/types.h"
#include "runtime/float16.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

// The GPU kernels' limits on q [B, H, T, D] (layout "bthd" reaches the
// kernels that check them through ViaBhtd's [B, H, T, D] copies).
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

// dst [a, c, b, d] = src [a, b, c, d] with its dims 1 and 2 swapped
// (perm (0, 2, 1, 3), its own inverse): [B, T, H, D] <-> [B, H, T, D].
absl::Status SwapInto(Tensor& dst, const Tensor& src, const char* op, cudaStream_t stream) {
  const Shape& s = src.shape();
  const int64_t box[4] = {s[0], s[2], s[1], s[3]};
  const int64_t dst_strides[4] = {s[1] * s[2] * s[3], s[1] * s[3], s[3], 1};
  const int64_t src_strides[4] = {s[1] * s[2] * s[3], s[3], s[2] * s[3], 1};
  cuda::CopyPlan plan;
  if (!cuda::MakeCopyPlan(4, box, dst_strides, src_strides, &plan)) {
    return absl::InternalError(absl::StrCat(op, ": no copy plan for ", ShapeString(s)));
  }
  const int element_size = static_cast<int>(DataTypeSize(src.dtype()));
  return CudaStatus(cuda::LaunchStridedCopy(dst.raw_data(), src.raw_data(), element_size, plan, stream), op);
}

// A scratch copy of `t` with its dims 1 and 2 swapped.
absl::StatusOr<Tensor> SwapHeadsAndTime(KernelContext& ctx, const Tensor& t, const char* op, cudaStream_t stream) {
  const Shape& s = t.shape();
  STRATA_ASSIGN_OR_RETURN(Tensor swapped, Scratch(ctx, t.dtype(), t.num_elements(), op));
  swapped = swapped.Reshaped(Shape{s[0], s[2], s[1], s[3]});
  STRATA_RETURN_IF_ERROR(SwapInto(swapped, t, op, stream));
  return swapped;
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
  // Layout "bthd" on a path without strided kernels (see the file comment):
  // q, k, v (y, dy) transposed into [B, H, T, D] scratch, `run` (the "bhtd"
  // kernel) on a context of those, y (dq, dk, dv) transposed back; lse and
  // dlse are [B, H, T] in both layouts and pass as they are.
  absl::Status ViaBhtd(KernelContext& ctx, bool grad, const char* op,
                       const std::function<absl::Status(KernelContext&)>& run) const {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const cudaStream_t stream = device->stream();
    const Tensor& q = ctx.input(0);
    if (q.num_elements() == 0) {  // nothing to compute: the outputs' shapes only
      for (int i = 0; i < ctx.num_outputs(); ++i) {
        const bool lse = !grad && i == 1;
        const DataType dtype = lse && IsHalfFloating(q.dtype()) ? F32 : q.dtype();
        STRATA_RETURN_IF_ERROR(
            ctx.AllocateOutput(i, dtype, lse ? Shape{q.dim(0), q.dim(2), q.dim(1)} : q.shape()).status());
      }
      return absl::OkStatus();
    }
    const int n = ctx.num_inputs();
    std::vector<Tensor> swapped(n);
    std::vector<const Tensor*> inputs(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& t = ctx.input(i);
      inputs[i] = &t;
      if (i == 4 || i == 6) continue;  // lse, dlse
      STRATA_ASSIGN_OR_RETURN(swapped[i], SwapHeadsAndTime(ctx, t, op, stream));
      inputs[i] = &swapped[i];
    }
    std::vector<Tensor> outputs(ctx.num_outputs());
    KernelContext inner(&ctx.run(), inputs, absl::MakeSpan(outputs));
    STRATA_RETURN_IF_ERROR(run(inner));
    swapped.clear();
    for (int i = 0; i < ctx.num_outputs(); ++i) {
      if (!grad && i == 1) {
        ctx.SetOutput(1, std::move(outputs[1]));  // lse
        continue;
      }
      const Tensor& t = outputs[i];
      const Shape& s = t.shape();
      STRATA_ASSIGN_OR_RETURN(Tensor * out, ctx.AllocateOutput(i, t.dtype(), Shape{s[0], s[2], s[1], s[3]}));
      STRATA_RETURN_IF_ERROR(SwapInto(*out, t, op, stream));
    }
    return absl::OkStatus();
  }

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
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, kOp, false, layout_));
    if (bthd()) return ViaBhtd(ctx, false, kOp, [this](KernelContext& c) { return ComputeBhtd(c); });
    return ComputeBhtd(ctx);
  }

 private:
  static constexpr char kOp[] = "scaled_dot_product_attention";
  absl::Status ComputeBhtd(KernelContext& ctx) {
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
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, kOp, true, layout_));
    if (bthd()) return ViaBhtd(ctx, true, kOp, [this](KernelContext& c) { return ComputeBhtd(c); });
    return ComputeBhtd(ctx);
  }

 private:
  static constexpr char kOp[] = "scaled_dot_product_attention_grad";
  absl::Status ComputeBhtd(KernelContext& ctx) {
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
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, kOp, false, layout_));
    const Tensor& q = ctx.input(0);
    if (bthd() && !FlashTensorCorePath(q.dtype(), q.dim(0) * q.dim(2), q.dim(3))) {
      return ViaBhtd(ctx, false, kOp, [this](KernelContext& c) { return ComputeIn(c, cuda::HeadLayout{}); });
    }
    return ComputeIn(ctx, bthd() ? cuda::HeadLayout{q.dim(2), true} : cuda::HeadLayout{});
  }

 private:
  static constexpr char kOp[] = "scaled_dot_product_attention";
  // `layout` "bthd" on the flash kernels only.
  absl::Status ComputeIn(KernelContext& ctx, const cuda::HeadLayout& layout) {
    using G = typename CudaHalf<T>::type;
    const AttentionLayout attention_layout = layout.bthd ? AttentionLayout::kBthd : AttentionLayout::kBhtd;
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, kOp, false, attention_layout));
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& q = ctx.input(0);
    const AttentionShape dims = AttentionDimsOf(q.shape(), attention_layout);
    // No head-size or head-count limit: the GEMM path has neither (CheckLimits is the flash kernels').
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, q.dtype(), q.shape()));
    STRATA_ASSIGN_OR_RETURN(Tensor * lse, ctx.AllocateOutput(1, F32, Shape{dims.B, dims.H, dims.T}));
    const int64_t heads = dims.B * dims.H, T_ = dims.T, D = dims.D;
    if (heads * T_ == 0) return absl::OkStatus();
    const G* pq = reinterpret_cast<const G*>(q.data<T>());
    const G* pk = reinterpret_cast<const G*>(ctx.input(1).data<T>());
    const G* pv = reinterpret_cast<const G*>(ctx.input(2).data<T>());
    G* py = reinterpret_cast<G*>(y->data<T>());
    const float scale = static_cast<float>(ScaleFor(D));
    const cudaStream_t stream = device->stream();
    if (FlashTensorCorePath(q.dtype(), heads, D)) {
      return CudaStatus(cuda::LaunchFlashAttention(py, lse->data<float>(), pq, pk, pv, heads, T_, D, scale, causal_,
                                                   stream, layout),
                        kOp);
    }
    if (layout.bthd) return absl::InternalError(absl::StrCat(kOp, ": layout \"bthd\" reached the GEMM path"));
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
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, kOp, true, layout_));
    const Tensor& q = ctx.input(0);
    if (bthd() && !FlashTensorCorePath(q.dtype(), q.dim(0) * q.dim(2), q.dim(3))) {
      return ViaBhtd(ctx, true, kOp, [this](KernelContext& c) { return ComputeIn(c, cuda::HeadLayout{}); });
    }
    return ComputeIn(ctx, bthd() ? cuda::HeadLayout{q.dim(2), true} : cuda::HeadLayout{});
  }

 private:
  static constexpr char kOp[] = "scaled_dot_product_attention_grad";
  // `layout` "bthd" on the flash kernels only.
  absl::Status ComputeIn(KernelContext& ctx, const cuda::HeadLayout& layout) {
    using G = typename CudaHalf<T>::type;
    const AttentionLayout attention_layout = layout.bthd ? AttentionLayout::kBthd : AttentionLayout::kBhtd;
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(ctx, kOp, true, attention_layout));
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& q = ctx.input(0);
    const AttentionShape dims = AttentionDimsOf(q.shape(), attention_layout);
    // No head-size or head-count limit: the GEMM path has neither (CheckLimits is the flash kernels').
    G* out[3];
    for (int i = 0; i < 3; ++i) {
      STRATA_ASSIGN_OR_RETURN(Tensor * t, ctx.AllocateOutput(i, q.dtype(), q.shape()));
      out[i] = reinterpret_cast<G*>(t->data<T>());
    }
    const int64_t heads = dims.B * dims.H, T_ = dims.T, D = dims.D;
    if (heads * T_ == 0) return absl::OkStatus();
    const bool flash = FlashTensorCorePath(q.dtype(), heads, D);
    if (layout.bthd && !flash) {
      return absl::InternalError(absl::StrCat(kOp, ": layout \"bthd\" reached the GEMM path"));
    }
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
                                                       di.data<float>(), heads, T_, D, scale, causal_, stream,
                                                       layout),
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
// Layout "bthd" off the flash kernels adds ViaBhtd's copies: q, k, v (y, dy)
// and y (dq, dk, dv) in [B, H, T, D].
absl::StatusOr<int64_t> ScoreWorkspace(const KernelDef& def, bool grad) {
  if (def.input_types.empty() || def.input_types[0].shape.size() != 4) return int64_t{0};
  const Shape& s = def.input_types[0].shape;
  const DataType dtype = def.input_types[0].dtype;
  AttentionLayout layout = AttentionLayout::kBhtd;  // a def without its op (tests) is "bhtd"
  if (def.op != nullptr) {
    STRATA_ASSIGN_OR_RETURN(layout, AttentionLayoutAttr(*def.op));
  }
  const AttentionShape dims = AttentionDimsOf(s, layout);
  const int64_t heads = dims.B * dims.H, T = dims.T;
  // di, in lse's type (float for 16-bit q).
  const DataType lse = IsHalfFloating(dtype) ? F32 : dtype;
  int64_t bytes = grad ? cuda::AttentionGradScratch(heads, T) * static_cast<int64_t>(DataTypeSize(lse)) : 0;
  const bool flash = FlashTensorCorePath(dtype, heads, s[3]);
  const int64_t chunk = flash ? 0 : ChunkHeads(dtype, grad, heads, T);
  if (chunk > 0) {
    const auto [scratch_dtype, elements] = ScoreScratch(dtype, grad, chunk, T);
    bytes += elements * static_cast<int64_t>(DataTypeSize(scratch_dtype));
  }
  if (layout == AttentionLayout::kBthd && !flash) {
    bytes += (grad ? 8 : 4) * NumElements(s) * static_cast<int64_t>(DataTypeSize(dtype));
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
