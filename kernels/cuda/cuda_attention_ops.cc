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
//
// scaled_dot_product_attention_qkv and its gradient take q, k, v as the
// slots of one qkv [B, T, 3, H, D] (the qkv projection's output as it lies)
// and give dq, dk, dv as the slots of one dqkv, so that GPT-2's split and
// concat around attention go; y, dy [B, T, H, D] and lse [B, H, T] as for
// "bthd". The tensor-core flash kernels read and write the slots in place
// (cuda::HeadLayout's pack 3); every other path copies each slot into
// [B, H, T, D] scratch, runs the "bhtd" kernel and copies its outputs back,
// as ViaBhtd does for "bthd": the same values reach the same kernels, so
// both ops give the bits of the "bthd" op on q, k, v = the slots.

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
#include "kernels/cuda/unary_math.h"
#include "kernels/kernel_checks.h"
#include "proto/status_macros.h"
#include "proto/types.h"
#include "runtime/float16.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

// The GPU kernels' limits on B batches of H heads of D elements.
absl::Status CheckHeadLimits(int64_t B, int64_t H, int64_t D, const char* op) {
  if (D == 0 || D > cuda::kMaxHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": the CUDA kernel takes heads of 1 to ", cuda::kMaxHeadDim, " elements, got D = ", D));
  }
  if (B * H > 65535) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": the CUDA kernel takes at most 65535 (batch x heads), got ", B, " x ", H));
  }
  return absl::OkStatus();
}

// The same on q [B, H, T, D] (layout "bthd" reaches the kernels that check
// them through ViaBhtd's [B, H, T, D] copies).
absl::Status CheckLimits(const Tensor& q, const char* op) { return CheckHeadLimits(q.dim(0), q.dim(1), q.dim(3), op); }

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

// The flash gradient's score-gradient scratch (cuda::FlashScoreGradWords
// words; none where it is 0) and the launcher's pointer to it (null: none).
struct ScoreGradScratch {
  Tensor words;
  uint32_t* data() { return words.num_elements() > 0 ? reinterpret_cast<uint32_t*>(words.data<float>()) : nullptr; }
};
absl::StatusOr<ScoreGradScratch> AllocateScoreGradScratch(KernelContext& ctx, int64_t heads, int64_t T, int64_t D,
                                                          bool causal, const char* op) {
  const int64_t words = cuda::FlashScoreGradWords(heads, T, D, causal);
  if (words == 0) return ScoreGradScratch{};
  STRATA_ASSIGN_OR_RETURN(Tensor t, Scratch(ctx, F32, words, op));
  return ScoreGradScratch{std::move(t)};
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
      STRATA_ASSIGN_OR_RETURN(ScoreGradScratch ds, AllocateScoreGradScratch(ctx, heads, T_, D, causal_, kOp));
      return CudaStatus(
          cuda::LaunchFlashAttentionGrad(out[0], out[1], out[2], pq, pk, pv, py, plse, pdy, dlse, di.data<float>(),
                                         heads, T_, D, scale, causal_, stream, layout, ds.data()),
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

// The qkv ops' dims: qkv [B, T, 3, H, D].
struct QkvDims {
  int64_t B, T, H, D;
  int64_t heads() const { return B * H; }
  Shape y() const { return Shape{B, T, H, D}; }    // y, dy
  Shape lse() const { return Shape{B, H, T}; }     // lse, dlse
  Shape bhtd() const { return Shape{B, H, T, D}; }  // a slot's copy off the flash kernels
};
QkvDims QkvDimsOf(const Tensor& qkv) { return {qkv.dim(0), qkv.dim(1), qkv.dim(3), qkv.dim(4)}; }

// Between slot `slot` of qkv [B, T, 3, H, D] and a [B, H, T, D] tensor:
// `dst` = `src` over the box [B, H, T, D], the slot's strides qkv's with T
// and H swapped (into_slot: dst is the slot, else src).
absl::Status CopySlot(void* dst, const void* src, const Tensor& qkv, int slot, bool into_slot, const char* op,
                      cudaStream_t stream) {
  const QkvDims d = QkvDimsOf(qkv);
  const int64_t box[4] = {d.B, d.H, d.T, d.D};
  const int64_t slot_strides[4] = {d.T * 3 * d.H * d.D, d.D, 3 * d.H * d.D, 1};
  const int64_t bhtd_strides[4] = {d.H * d.T * d.D, d.T * d.D, d.D, 1};
  cuda::CopyPlan plan;
  if (!cuda::MakeCopyPlan(4, box, into_slot ? slot_strides : bhtd_strides, into_slot ? bhtd_strides : slot_strides,
                          &plan)) {
    return absl::InternalError(absl::StrCat(op, ": no copy plan for slot ", slot, " of ", ShapeString(qkv.shape())));
  }
  const int element_size = static_cast<int>(DataTypeSize(qkv.dtype()));
  return CudaStatus(cuda::LaunchStridedCopy(dst, src, element_size, plan, stream), op);
}

// Bytes from the start of qkv [B, T, 3, H, D] to slot `slot`'s first element.
int64_t SlotOffset(const Tensor& qkv, int slot) {
  return slot * qkv.dim(3) * qkv.dim(4) * static_cast<int64_t>(DataTypeSize(qkv.dtype()));
}

// Slot `slot` of qkv into `bhtd` [B, H, T, D].
absl::Status UnpackSlot(Tensor& bhtd, const Tensor& qkv, int slot, const char* op, cudaStream_t stream) {
  const char* from = static_cast<const char*>(qkv.raw_data()) + SlotOffset(qkv, slot);
  return CopySlot(bhtd.raw_data(), from, qkv, slot, false, op, stream);
}

// `bhtd` [B, H, T, D] into slot `slot` of qkv.
absl::Status PackSlot(Tensor& qkv, const Tensor& bhtd, int slot, const char* op, cudaStream_t stream) {
  char* to = static_cast<char*>(qkv.raw_data()) + SlotOffset(qkv, slot);
  return CopySlot(to, bhtd.raw_data(), qkv, slot, true, op, stream);
}

// The "bhtd" kernel's failures, named for the qkv op that ran it on copies.
absl::Status OnCopies(const absl::Status& s, const char* op) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(op, " (on [B, H, T, D] copies of the slots): ", s.message()));
}

// The limits of the paths off the tensor-core flash kernels, checked before
// any copy so that a refusal names the qkv op: F32 and F64 those of
// CheckLimits; 16-bit the GEMM path's budget.
absl::Status CheckQkvLimits(DataType dtype, const QkvDims& d, bool grad, const char* op) {
  if (!IsHalfFloating(dtype)) return CheckHeadLimits(d.B, d.H, d.D, op);
  if (ChunkHeads(dtype, grad, d.heads(), d.T) == 0) return RefuseLongHalf(op, d.T);
  return absl::OkStatus();
}

// The qkv ops' kernels over `Bhtd`, the "bhtd" kernel their unpacked
// copies run on: its attrs are the op's (causal, scale), its layout
// "bhtd" (the qkv ops have no layout attr: theirs is fixed).
template <typename Bhtd>
class QkvOnBhtd : public Bhtd {
 public:
  using Bhtd::Bhtd;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(Bhtd::Init(op));
    this->layout_ = AttentionLayout::kBhtd;
    return absl::OkStatus();
  }
};

// scaled_dot_product_attention_qkv for storage type T: `Bhtd` is the
// "bhtd" kernel the copies run on (its attrs are the op's; the qkv ops have
// no layout attr, so it reads "bhtd").
template <typename T, typename Bhtd>
class CudaAttentionQkvKernel : public QkvOnBhtd<Bhtd> {
 public:
  using QkvOnBhtd<Bhtd>::QkvOnBhtd;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckPackedAttentionOperands(ctx, kOp, false));
    const Tensor& qkv = ctx.input(0);
    const QkvDims d = QkvDimsOf(qkv);
    const DataType lse_dtype = IsHalfFloating(qkv.dtype()) ? F32 : qkv.dtype();
    if (qkv.num_elements() == 0) {  // nothing to compute: the outputs' shapes only
      STRATA_RETURN_IF_ERROR(ctx.AllocateOutput(0, qkv.dtype(), d.y()).status());
      return ctx.AllocateOutput(1, lse_dtype, d.lse()).status();
    }
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const cudaStream_t stream = device->stream();
    if constexpr (cuda::kIsHalf<T>) {
      if (FlashTensorCorePath(qkv.dtype(), d.heads(), d.D)) {
        using G = typename CudaHalf<T>::type;
        STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, qkv.dtype(), d.y()));
        STRATA_ASSIGN_OR_RETURN(Tensor * lse, ctx.AllocateOutput(1, F32, d.lse()));
        const G* q = reinterpret_cast<const G*>(qkv.data<T>());
        const int64_t slot = d.H * d.D;  // k's and v's slots start this far after q's
        return CudaStatus(cuda::LaunchFlashAttention(reinterpret_cast<G*>(y->data<T>()), lse->data<float>(), q,
                                                     q + slot, q + 2 * slot, d.heads(), d.T, d.D,
                                                     static_cast<float>(this->ScaleFor(d.D)), this->causal_, stream,
                                                     cuda::HeadLayout{d.H, true, 3}),
                          kOp);
      }
    }
    STRATA_RETURN_IF_ERROR(CheckQkvLimits(qkv.dtype(), d, false, kOp));
    Tensor slots[3];
    for (int i = 0; i < 3; ++i) {
      STRATA_ASSIGN_OR_RETURN(slots[i], Scratch(ctx, qkv.dtype(), NumElements(d.bhtd()), kOp));
      slots[i] = slots[i].Reshaped(d.bhtd());
      STRATA_RETURN_IF_ERROR(UnpackSlot(slots[i], qkv, i, kOp, stream));
    }
    const Tensor* inputs[3] = {&slots[0], &slots[1], &slots[2]};
    std::vector<Tensor> outputs(2);
    KernelContext inner(&ctx.run(), inputs, absl::MakeSpan(outputs));
    STRATA_RETURN_IF_ERROR(OnCopies(Bhtd::Compute(inner), kOp));
    for (Tensor& t : slots) t = Tensor();
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, qkv.dtype(), d.y()));
    STRATA_RETURN_IF_ERROR(SwapInto(*y, outputs[0], kOp, stream));
    ctx.SetOutput(1, std::move(outputs[1]));  // lse: [B, H, T] in both
    return absl::OkStatus();
  }

 private:
  static constexpr char kOp[] = "scaled_dot_product_attention_qkv";
};

// Its gradient: inputs qkv, y, lse, dy [, dlse]; dqkv [B, T, 3, H, D] holds
// dq, dk, dv in q's, k's and v's slots.
template <typename T, typename Bhtd>
class CudaAttentionQkvGradKernel : public QkvOnBhtd<Bhtd> {
 public:
  using QkvOnBhtd<Bhtd>::QkvOnBhtd;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckPackedAttentionOperands(ctx, kOp, true));
    const Tensor& qkv = ctx.input(0);
    const QkvDims d = QkvDimsOf(qkv);
    if (qkv.num_elements() == 0) return ctx.AllocateOutput(0, qkv.dtype(), qkv.shape()).status();
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const cudaStream_t stream = device->stream();
    if constexpr (cuda::kIsHalf<T>) {
      if (FlashTensorCorePath(qkv.dtype(), d.heads(), d.D)) {
        using G = typename CudaHalf<T>::type;
        STRATA_ASSIGN_OR_RETURN(Tensor * dqkv, ctx.AllocateOutput(0, qkv.dtype(), qkv.shape()));
        STRATA_ASSIGN_OR_RETURN(Tensor di, Scratch(ctx, F32, cuda::AttentionGradScratch(d.heads(), d.T), kOp));
        STRATA_ASSIGN_OR_RETURN(ScoreGradScratch ds,
                                AllocateScoreGradScratch(ctx, d.heads(), d.T, d.D, this->causal_, kOp));
        const auto at = [&ctx](int i) { return reinterpret_cast<const G*>(ctx.input(i).data<T>()); };
        const G *q = at(0), *y = at(1), *dy = at(3);
        G* dq = reinterpret_cast<G*>(dqkv->data<T>());
        const float* lse = ctx.input(2).data<float>();
        const float* dlse = ctx.num_inputs() > 4 ? ctx.input(4).data<float>() : nullptr;
        const int64_t slot = d.H * d.D;  // k's and v's slots start this far after q's
        return CudaStatus(cuda::LaunchFlashAttentionGrad(dq, dq + slot, dq + 2 * slot, q, q + slot, q + 2 * slot, y,
                                                         lse, dy, dlse, di.data<float>(), d.heads(), d.T, d.D,
                                                         static_cast<float>(this->ScaleFor(d.D)), this->causal_, stream,
                                                         cuda::HeadLayout{d.H, true, 3}, ds.data()),
                          kOp);
      }
    }
    STRATA_RETURN_IF_ERROR(CheckQkvLimits(qkv.dtype(), d, true, kOp));
    // The "bhtd" kernel's inputs: q, k, v, y, lse, dy [, dlse], the
    // [B, T, H, D] ones as [B, H, T, D] copies.
    const int n = ctx.num_inputs() + 2;
    std::vector<Tensor> copies(n);
    std::vector<const Tensor*> inputs(n);
    for (int i = 0; i < 3; ++i) {
      STRATA_ASSIGN_OR_RETURN(copies[i], Scratch(ctx, qkv.dtype(), NumElements(d.bhtd()), kOp));
      copies[i] = copies[i].Reshaped(d.bhtd());
      STRATA_RETURN_IF_ERROR(UnpackSlot(copies[i], qkv, i, kOp, stream));
      inputs[i] = &copies[i];
    }
    for (int i = 3; i < n; ++i) {
      const Tensor& t = ctx.input(i - 2);  // y, lse, dy, dlse
      inputs[i] = &t;
      if (i == 4 || i == 6) continue;  // lse, dlse: [B, H, T] in both
      STRATA_ASSIGN_OR_RETURN(copies[i], SwapHeadsAndTime(ctx, t, kOp, stream));
      inputs[i] = &copies[i];
    }
    std::vector<Tensor> outputs(3);
    KernelContext inner(&ctx.run(), inputs, absl::MakeSpan(outputs));
    STRATA_RETURN_IF_ERROR(OnCopies(Bhtd::Compute(inner), kOp));
    copies.clear();
    STRATA_ASSIGN_OR_RETURN(Tensor * dqkv, ctx.AllocateOutput(0, qkv.dtype(), qkv.shape()));
    for (int i = 0; i < 3; ++i) STRATA_RETURN_IF_ERROR(PackSlot(*dqkv, outputs[i], i, kOp, stream));
    return absl::OkStatus();
  }

 private:
  static constexpr char kOp[] = "scaled_dot_product_attention_qkv_grad";
};

// Scratch for the memory plan: the forward's scores on the GEMM path; the
// gradient's di (one element per query row) and, on the GEMM path, P and dS.
// The tensor-core flash kernels (FlashTensorCorePath) need di only. Off
// them, `copies` elements more: ViaBhtd's [B, H, T, D] copies for layout
// "bthd" (q, k, v (y, dy) and y (dq, dk, dv)), or the qkv ops' of the same.
int64_t PathWorkspace(DataType dtype, bool grad, int64_t heads, int64_t T, int64_t D, bool causal, int64_t copies) {
  // di, in lse's type (float for 16-bit q).
  const DataType lse = IsHalfFloating(dtype) ? F32 : dtype;
  int64_t bytes = grad ? cuda::AttentionGradScratch(heads, T) * static_cast<int64_t>(DataTypeSize(lse)) : 0;
  const bool flash = FlashTensorCorePath(dtype, heads, D);
  // The stored score gradients (StoredScoreGrads in the kernels above).
  if (grad && flash) bytes += 4 * cuda::FlashScoreGradWords(heads, T, D, causal);
  const int64_t chunk = flash ? 0 : ChunkHeads(dtype, grad, heads, T);
  if (chunk > 0) {
    const auto [scratch_dtype, elements] = ScoreScratch(dtype, grad, chunk, T);
    bytes += elements * static_cast<int64_t>(DataTypeSize(scratch_dtype));
  }
  if (!flash) bytes += copies * static_cast<int64_t>(DataTypeSize(dtype));
  return bytes;
}

// Four copies the size of q (eight for the gradient): q, k, v and y (q, k,
// v, y, dy and dq, dk, dv).
int64_t CopiesOfQ(int64_t q_elements, bool grad) { return (grad ? 8 : 4) * q_elements; }

// Whether the def's op is causal, for the gradient's stored score
// gradients; a def without its op or the attr (tests) is taken as not,
// whose store is the larger.
bool CausalOf(const KernelDef& def) {
  if (def.op == nullptr) return false;
  const auto it = def.op->attr().find("causal");
  return it != def.op->attr().end() && it->second.b();
}

absl::StatusOr<int64_t> ScoreWorkspace(const KernelDef& def, bool grad) {
  if (def.input_types.empty() || def.input_types[0].shape.size() != 4) return int64_t{0};
  const Shape& s = def.input_types[0].shape;
  AttentionLayout layout = AttentionLayout::kBhtd;  // a def without its op (tests) is "bhtd"
  if (def.op != nullptr) {
    STRATA_ASSIGN_OR_RETURN(layout, AttentionLayoutAttr(*def.op));
  }
  const bool causal = grad && CausalOf(def);
  const AttentionShape dims = AttentionDimsOf(s, layout);
  const int64_t copies = layout == AttentionLayout::kBthd ? CopiesOfQ(NumElements(s), grad) : 0;
  return PathWorkspace(def.input_types[0].dtype, grad, dims.B * dims.H, dims.T, s[3], causal, copies);
}
absl::StatusOr<int64_t> AttentionWorkspace(const KernelDef& def, int) { return ScoreWorkspace(def, false); }
absl::StatusOr<int64_t> AttentionGradWorkspace(const KernelDef& def, int) { return ScoreWorkspace(def, true); }
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention", DEVICE_CUDA, AttentionWorkspace);
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention_grad", DEVICE_CUDA, AttentionGradWorkspace);

// The qkv ops': the same rule on qkv [B, T, 3, H, D]; off the tensor-core
// flash kernels, the slots', y's (dy's) and outputs' [B, H, T, D] copies.
absl::StatusOr<int64_t> QkvWorkspace(const KernelDef& def, bool grad) {
  if (def.input_types.empty() || def.input_types[0].shape.size() != 5) return int64_t{0};
  const Shape& s = def.input_types[0].shape;
  const int64_t B = s[0], T = s[1], H = s[3], D = s[4];
  const bool causal = grad && CausalOf(def);
  return PathWorkspace(def.input_types[0].dtype, grad, B * H, T, D, causal, CopiesOfQ(B * T * H * D, grad));
}
absl::StatusOr<int64_t> AttentionQkvWorkspace(const KernelDef& def, int) { return QkvWorkspace(def, false); }
absl::StatusOr<int64_t> AttentionQkvGradWorkspace(const KernelDef& def, int) { return QkvWorkspace(def, true); }
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention_qkv", DEVICE_CUDA, AttentionQkvWorkspace);
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention_qkv_grad", DEVICE_CUDA, AttentionQkvGradWorkspace);

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

// The qkv ops' kernels run the "bhtd" ones on the copies (the macro takes no
// commas: one name each).
template <typename T>
using QkvKernel = CudaAttentionQkvKernel<T, CudaAttentionKernel<T>>;
template <typename T>
using HalfQkvKernel = CudaAttentionQkvKernel<T, CudaHalfAttentionKernel<T>>;
template <typename T>
using QkvGradKernel = CudaAttentionQkvGradKernel<T, CudaAttentionGradKernel<T>>;
template <typename T>
using HalfQkvGradKernel = CudaAttentionQkvGradKernel<T, CudaHalfAttentionGradKernel<T>>;
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv", DEVICE_CUDA, F32, InitFactory<QkvKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv", DEVICE_CUDA, F64, InitFactory<QkvKernel<double>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv", DEVICE_CUDA, BF16, InitFactory<HalfQkvKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv", DEVICE_CUDA, F16, InitFactory<HalfQkvKernel<float16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv_grad", DEVICE_CUDA, F32, InitFactory<QkvGradKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv_grad", DEVICE_CUDA, F64,
                       InitFactory<QkvGradKernel<double>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv_grad", DEVICE_CUDA, BF16,
                       InitFactory<HalfQkvGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv_grad", DEVICE_CUDA, F16,
                       InitFactory<HalfQkvGradKernel<float16>>());

}  // namespace
}  // namespace strata
