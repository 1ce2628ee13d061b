// scaled_dot_product_attention and its backward, per (batch, head) over
// q, k, v [B, H, T, D] (or [B, T, H, D] for layout "bthd": the same work
// reading a head's rows with a stride of H * D instead of D, so both layouts
// do the same arithmetic in the same order), in blocks of kRowBlock query rows: a block's scores
// S = scale * Q_blk K^T (only keys up to the block's last row when causal)
// go through a max-subtracted softmax in a [kRowBlock, T] scratch, so the
// [T, T] matrix is never whole; the forward keeps each row's logsumexp
// (lse) and the backward recomputes P = exp(S - lse) from it.
//
// Threads: the work items (forward: every (head, row block); backward: every
// head, since its row blocks add into the same dK and dV) are cut into at
// most IntraOpThreads() contiguous shares, one scratch each; within a share
// items run in order, so the sums' order depends on the shape only.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attr_kernels.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_kernel_util.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/widened.h"
#include "kernels/host_device.h"
#include "kernels/kernel_checks.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

using nn_kernels::InitFactory;
using nn_kernels::Scratch;
using softmax_rows::ExpShiftedSum;
using softmax_rows::ProbsAndScoreGrads;
using softmax_rows::RowMax;

constexpr int64_t kRowBlock = 64;

struct AttentionDims {
  int64_t B = 0, H = 0, T = 0, D = 0;
  bool bthd = false;
  // q, k, v (and their gradients) packed in one [B, T, pack, H, D] (the
  // qkv op's 3; 1 otherwise): their rows lie pack * H * D apart, y's and
  // dy's H * D.
  int64_t pack = 1;
  int64_t heads() const { return B * H; }
  // Where head `head` (b * H + h) starts in y and dy, and the stride between
  // its rows.
  int64_t offset(int64_t head) const { return bthd ? (head / H) * T * H * D + (head % H) * D : head * T * D; }
  int64_t ld() const { return bthd ? H * D : D; }
  // The same in q, k, v and their gradients (each from its own base pointer).
  int64_t qkv_offset(int64_t head) const {
    return bthd ? (head / H) * T * pack * H * D + (head % H) * D : head * T * D;
  }
  int64_t qkv_ld() const { return bthd ? pack * H * D : D; }
  int64_t row_blocks() const { return (T + kRowBlock - 1) / kRowBlock; }
  int64_t block_rows() const { return std::min(T, kRowBlock); }
};

// `items` cut into `parts` contiguous shares of `per`, parts <= threads.
struct Shares {
  int64_t parts = 0, per = 1;
  Shares(int64_t items, int threads) {
    const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, items));
    per = std::max<int64_t>(1, (items + t - 1) / t);
    parts = items == 0 ? 0 : (items + per - 1) / per;
  }
  // fn(share, item) for every item, the shares in parallel.
  template <typename F>
  void ForEach(int64_t items, const F& fn) const {
    ParallelFor(parts, 1, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        for (int64_t i = s * per; i < std::min(items, (s + 1) * per); ++i) fn(s, i);
      }
    });
  }
};

// Scratch elements per share: the forward's S/P block; the backward's P and dP blocks.
int64_t ScratchPerShare(const AttentionDims& d, bool grad) { return (grad ? 2 : 1) * d.block_rows() * d.T; }
int64_t ForwardItems(const AttentionDims& d) { return d.heads() * d.row_blocks(); }

using AttentionKernelBase = AttentionAttrsKernel;

AttentionDims DimsOf(const Shape& q, AttentionLayout layout) {
  const AttentionShape s = AttentionDimsOf(q, layout);
  return AttentionDims{s.B, s.H, s.T, s.D, layout == AttentionLayout::kBthd};
}

// Rows [r0, r1) of one head's scores, s[r - r0][0, c1) = scale * q_r . k_c
// (ld c1); a head's rows of q and k lie ld apart.
template <typename T>
void Scores(const T* q, const T* k, int64_t r0, int64_t r1, int64_t c1, int64_t D, int64_t ld, T scale, T* s) {
  SerialGemmOrScale(false, true, r1 - r0, c1, D, scale, q + r0 * ld, ld, k, ld, T(0), s, c1);
}

// Pointers of one call: q, k, v (dq, dk, dv) lie as d.qkv_offset says, y
// and dy as d.offset says.
template <typename T>
struct AttentionOperands {
  const T *q, *k, *v;
  const T* y;     // the backward's
  const T* lse;   // the backward's
  const T* dy;    // the backward's
  const T* dlse;  // the backward's, or null
};

// y, lse from q, k, v (the forward's work; scratch holds ForwardItems
// shares of ScratchPerShare).
template <typename T>
void AttentionForward(const AttentionDims& d, const AttentionOperands<T>& in, T* py, T* plse, T* ps, T scale,
                      bool causal) {
  const int64_t items = ForwardItems(d);
  const Shares sh(items, IntraOpThreads());
  const int64_t per_share = ScratchPerShare(d, false);
  const int64_t T_ = d.T, D = d.D, nb = d.row_blocks(), ld = d.ld(), qld = d.qkv_ld();
  sh.ForEach(items, [&](int64_t share, int64_t item) {
    const int64_t head = item / nb, r0 = (item % nb) * kRowBlock, r1 = std::min(T_, r0 + kRowBlock);
    const int64_t c1 = causal ? r1 : T_;
    const int64_t off = d.offset(head), qoff = d.qkv_offset(head);
    T* s = ps + share * per_share;
    Scores(in.q + qoff, in.k + qoff, r0, r1, c1, D, qld, scale, s);
    for (int64_t r = r0; r < r1; ++r) {
      T* row = s + (r - r0) * c1;
      const int64_t n = causal ? r + 1 : T_;
      const T max = RowMax(row, n);
      const double sum = ExpShiftedSum(row, n, max);
      const T inv = static_cast<T>(1.0 / sum);
      for (int64_t c = 0; c < n; ++c) row[c] *= inv;
      std::fill(row + n, row + c1, T(0));
      plse[head * T_ + r] = static_cast<T>(max + std::log(sum));
    }
    SerialGemmOrScale(false, false, r1 - r0, D, c1, T(1), s, c1, in.v + qoff, qld, T(0), py + off + r0 * ld, ld);
  });
}

// dq, dk, dv (see the op's Doc; scratch holds d.heads() shares of
// ScratchPerShare).
template <typename T>
void AttentionBackward(const AttentionDims& d, const AttentionOperands<T>& in, T* pdq, T* pdk, T* pdv, T* ps,
                       T scale, bool causal) {
  const Shares sh(d.heads(), IntraOpThreads());
  const int64_t per_share = ScratchPerShare(d, true);
  const int64_t T_ = d.T, D = d.D, block = d.block_rows(), ld = d.ld(), qld = d.qkv_ld();
  sh.ForEach(d.heads(), [&](int64_t share, int64_t head) {
    const int64_t off = d.offset(head), qoff = d.qkv_offset(head);
    const T *q = in.q + qoff, *k = in.k + qoff, *v = in.v + qoff, *y = in.y + off, *dy = in.dy + off;
    T *dq = pdq + qoff, *dk = pdk + qoff, *dv = pdv + qoff;
    for (int64_t t = 0; t < T_; ++t) {
      std::fill(dk + t * qld, dk + t * qld + D, T(0));
      std::fill(dv + t * qld, dv + t * qld + D, T(0));
    }
    T* p = ps + share * per_share;
    T* dp = p + block * T_;
    for (int64_t r0 = 0; r0 < T_; r0 += kRowBlock) {
      const int64_t r1 = std::min(T_, r0 + kRowBlock), rows = r1 - r0;
      const int64_t c1 = causal ? r1 : T_;
      Scores(q, k, r0, r1, c1, D, qld, scale, p);
      SerialGemmOrScale(false, true, rows, c1, D, T(1), dy + r0 * ld, ld, v, qld, T(0), dp, c1);
      for (int64_t r = r0; r < r1; ++r) {
        T* prow = p + (r - r0) * c1;
        T* dprow = dp + (r - r0) * c1;
        const int64_t n = causal ? r + 1 : T_;
        const T row_lse = in.lse[head * T_ + r];
        double dot = 0;  // rowsum(dy * y), less dlse
        for (int64_t j = 0; j < D; ++j) dot += static_cast<double>(dy[r * ld + j]) * y[r * ld + j];
        if (in.dlse != nullptr) dot -= in.dlse[head * T_ + r];
        const T di = static_cast<T>(dot);
        ProbsAndScoreGrads(prow, dprow, n, row_lse, di);
        std::fill(prow + n, prow + c1, T(0));
        std::fill(dprow + n, dprow + c1, T(0));
      }
      // dq_blk = scale dS K;  dk[0, c1) += scale dS^T Q_blk;  dv[0, c1) += P^T dY_blk.
      SerialGemmOrScale(false, false, rows, D, c1, scale, dp, c1, k, qld, T(0), dq + r0 * qld, qld);
      SerialGemmOrScale(true, false, c1, D, rows, scale, dp, c1, q + r0 * qld, qld, T(1), dk, qld);
      SerialGemmOrScale(true, false, c1, D, rows, T(1), p, c1, dy + r0 * ld, ld, T(1), dv, qld);
    }
  });
}

// y [B, H, T, D], lse [B, H, T] from q, k, v [B, H, T, D] (y, q, k, v
// [B, T, H, D] for "bthd").
template <typename T>
class AttentionKernel : public AttentionKernelBase {
 public:
  using AttentionKernelBase::AttentionKernelBase;

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(
        kernel_checks::CheckAttentionOperands(ctx, "scaled_dot_product_attention", false, layout_));
    const Tensor& q = ctx.input(0);
    const AttentionDims d = DimsOf(q.shape(), layout_);
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, q.dtype(), q.shape()));
    STRATA_ASSIGN_OR_RETURN(Tensor * lse, ctx.AllocateOutput(1, q.dtype(), Shape{d.B, d.H, d.T}));
    const Shares sh(ForwardItems(d), IntraOpThreads());
    STRATA_ASSIGN_OR_RETURN(Tensor scratch, Scratch(ctx, q.dtype(), sh.parts * ScratchPerShare(d, false)));
    const AttentionOperands<T> in{q.data<T>(), ctx.input(1).data<T>(), ctx.input(2).data<T>()};
    AttentionForward(d, in, y->data<T>(), lse->data<T>(), scratch.data<T>(), static_cast<T>(ScaleFor(d.D)),
                     causal_);
    return absl::OkStatus();
  }
};

// dq, dk, dv from q, k, v, y, lse, dy and optionally dlse (see the op's Doc).
template <typename T>
class AttentionGradKernel : public AttentionKernelBase {
 public:
  using AttentionKernelBase::AttentionKernelBase;

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(
        kernel_checks::CheckAttentionOperands(ctx, "scaled_dot_product_attention_grad", true, layout_));
    const Tensor& q = ctx.input(0);
    const AttentionDims d = DimsOf(q.shape(), layout_);
    Tensor* out[3];
    for (int i = 0; i < 3; ++i) {
      STRATA_ASSIGN_OR_RETURN(out[i], ctx.AllocateOutput(i, q.dtype(), q.shape()));
    }
    const Shares sh(d.heads(), IntraOpThreads());
    STRATA_ASSIGN_OR_RETURN(Tensor scratch, Scratch(ctx, q.dtype(), sh.parts * ScratchPerShare(d, true)));
    const AttentionOperands<T> in{q.data<T>(),
                                  ctx.input(1).data<T>(),
                                  ctx.input(2).data<T>(),
                                  ctx.input(3).data<T>(),
                                  ctx.input(4).data<T>(),
                                  ctx.input(5).data<T>(),
                                  ctx.num_inputs() > 6 ? ctx.input(6).data<T>() : nullptr};
    AttentionBackward(d, in, out[0]->data<T>(), out[1]->data<T>(), out[2]->data<T>(), scratch.data<T>(),
                      static_cast<T>(ScaleFor(d.D)), causal_);
    return absl::OkStatus();
  }
};

// The packed dims of qkv [B, T, 3, H, D].
AttentionDims PackedDimsOf(const Shape& qkv) {
  return AttentionDims{qkv[0], qkv[3], qkv[1], qkv[4], /*bthd=*/true, /*pack=*/3};
}

// scaled_dot_product_attention_qkv: the bthd forward with k and v one and
// two heads' widths into each row of qkv (the same arithmetic in the same
// order: the unpacked op's bits).
template <typename T>
class PackedAttentionKernel : public AttentionKernelBase {
 public:
  using AttentionKernelBase::AttentionKernelBase;

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckPackedAttentionOperands(ctx, "scaled_dot_product_attention_qkv", false));
    const Tensor& qkv = ctx.input(0);
    const AttentionDims d = PackedDimsOf(qkv.shape());
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, qkv.dtype(), Shape{d.B, d.T, d.H, d.D}));
    STRATA_ASSIGN_OR_RETURN(Tensor * lse, ctx.AllocateOutput(1, qkv.dtype(), Shape{d.B, d.H, d.T}));
    const Shares sh(ForwardItems(d), IntraOpThreads());
    STRATA_ASSIGN_OR_RETURN(Tensor scratch, Scratch(ctx, qkv.dtype(), sh.parts * ScratchPerShare(d, false)));
    const T* base = qkv.data<T>();
    const AttentionOperands<T> in{base, base + d.H * d.D, base + 2 * d.H * d.D};
    AttentionForward(d, in, y->data<T>(), lse->data<T>(), scratch.data<T>(), static_cast<T>(ScaleFor(d.D)),
                     causal_);
    return absl::OkStatus();
  }
};

// scaled_dot_product_attention_qkv_grad: dq, dk, dv into dqkv's slots.
template <typename T>
class PackedAttentionGradKernel : public AttentionKernelBase {
 public:
  using AttentionKernelBase::AttentionKernelBase;

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(
        kernel_checks::CheckPackedAttentionOperands(ctx, "scaled_dot_product_attention_qkv_grad", true));
    const Tensor& qkv = ctx.input(0);
    const AttentionDims d = PackedDimsOf(qkv.shape());
    STRATA_ASSIGN_OR_RETURN(Tensor * dqkv, ctx.AllocateOutput(0, qkv.dtype(), qkv.shape()));
    const Shares sh(d.heads(), IntraOpThreads());
    STRATA_ASSIGN_OR_RETURN(Tensor scratch, Scratch(ctx, qkv.dtype(), sh.parts * ScratchPerShare(d, true)));
    const T* base = qkv.data<T>();
    const int64_t hd = d.H * d.D;
    const AttentionOperands<T> in{base,
                                  base + hd,
                                  base + 2 * hd,
                                  ctx.input(1).data<T>(),
                                  ctx.input(2).data<T>(),
                                  ctx.input(3).data<T>(),
                                  ctx.num_inputs() > 4 ? ctx.input(4).data<T>() : nullptr};
    T* out = dqkv->data<T>();
    AttentionBackward(d, in, out, out + hd, out + 2 * hd, scratch.data<T>(), static_cast<T>(ScaleFor(d.D)),
                      causal_);
    return absl::OkStatus();
  }
};

// The shares' scratch blocks, for the memory plan (a batch dim still -1
// counts as enough heads for every thread). BF16 and F16 run the float32
// kernel (WidenedKernel): its blocks are float32, and the widened copies of
// the inputs and outputs come on top.
absl::StatusOr<int64_t> AttentionWorkspace(const KernelDef& def, int threads) {
  const bool packed = def.op->type() == "scaled_dot_product_attention_qkv" ||
                      def.op->type() == "scaled_dot_product_attention_qkv_grad";
  if (def.input_types.empty() || def.input_types[0].shape.size() != (packed ? 5u : 4u)) return int64_t{0};
  const Shape& s = def.input_types[0].shape;
  const DataType dtype = def.input_types[0].dtype;
  const bool half = IsHalfFloating(dtype);
  const bool grad = def.op->type() == "scaled_dot_product_attention_grad" ||
                    def.op->type() == "scaled_dot_product_attention_qkv_grad";
  STRATA_ASSIGN_OR_RETURN(const AttentionLayout layout, AttentionLayoutAttr(*def.op));
  const AttentionDims d = packed ? PackedDimsOf(s) : DimsOf(s, layout);
  const int64_t items = d.B < 0 ? threads : grad ? d.heads() : ForwardItems(d);
  const Shares sh(items, threads);
  const int64_t blocks = sh.parts * ScratchPerShare(d, grad) * static_cast<int64_t>(DataTypeSize(half ? F32 : dtype));
  if (!half) return blocks;
  return WidenedWorkspaceOver(def, blocks);
}
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention", DEVICE_CPU, AttentionWorkspace);
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention_grad", DEVICE_CPU, AttentionWorkspace);
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention_qkv", DEVICE_CPU, AttentionWorkspace);
STRATA_REGISTER_WORKSPACE("scaled_dot_product_attention_qkv_grad", DEVICE_CPU, AttentionWorkspace);

STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CPU, F32, InitFactory<AttentionKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CPU, F64, InitFactory<AttentionKernel<double>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CPU, F32,
                       InitFactory<AttentionGradKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CPU, F64,
                       InitFactory<AttentionGradKernel<double>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv", DEVICE_CPU, F32,
                       InitFactory<PackedAttentionKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv", DEVICE_CPU, F64,
                       InitFactory<PackedAttentionKernel<double>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv_grad", DEVICE_CPU, F32,
                       InitFactory<PackedAttentionGradKernel<float>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv_grad", DEVICE_CPU, F64,
                       InitFactory<PackedAttentionGradKernel<double>>());

// BF16 and F16 (mixed precision): the float32 kernels on widened q, k, v (y,
// dy); lse and dlse are F32 already and pass as they are, and the forward's
// lse comes back F32, the other outputs rounded to the low dtype. The
// operands are checked before widening, which would hide a half lse.
template <typename Half, typename Inner, bool kGrad, bool kPacked = false>
class CheckedWidenedAttention : public WidenedKernel<Half, Inner> {
 public:
  using WidenedKernel<Half, Inner>::WidenedKernel;
  absl::Status Compute(KernelContext& ctx) override {
    if constexpr (kPacked) {
      STRATA_RETURN_IF_ERROR(kernel_checks::CheckPackedAttentionOperands(
          ctx, kGrad ? "scaled_dot_product_attention_qkv_grad" : "scaled_dot_product_attention_qkv", kGrad));
    } else {
      STRATA_RETURN_IF_ERROR(kernel_checks::CheckAttentionOperands(
          ctx, kGrad ? "scaled_dot_product_attention_grad" : "scaled_dot_product_attention", kGrad, layout_));
    }
    return WidenedKernel<Half, Inner>::Compute(ctx);
  }
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(layout_, AttentionLayoutAttr(op));
    return WidenedKernel<Half, Inner>::Init(op);
  }

 private:
  // The layout, for the checks before widening (the inner kernel reads its own).
  AttentionLayout layout_ = AttentionLayout::kBhtd;
};
template <typename Half>
using WidenedAttention = CheckedWidenedAttention<Half, AttentionKernel<float>, false>;
template <typename Half>
using WidenedAttentionGrad = CheckedWidenedAttention<Half, AttentionGradKernel<float>, true>;
STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CPU, BF16, InitFactory<WidenedAttention<bfloat16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention", DEVICE_CPU, F16, InitFactory<WidenedAttention<float16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CPU, BF16,
                       InitFactory<WidenedAttentionGrad<bfloat16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_grad", DEVICE_CPU, F16,
                       InitFactory<WidenedAttentionGrad<float16>>());
template <typename Half>
using WidenedPackedAttention = CheckedWidenedAttention<Half, PackedAttentionKernel<float>, false, true>;
template <typename Half>
using WidenedPackedAttentionGrad = CheckedWidenedAttention<Half, PackedAttentionGradKernel<float>, true, true>;
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv", DEVICE_CPU, BF16,
                       InitFactory<WidenedPackedAttention<bfloat16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv", DEVICE_CPU, F16,
                       InitFactory<WidenedPackedAttention<float16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv_grad", DEVICE_CPU, BF16,
                       InitFactory<WidenedPackedAttentionGrad<bfloat16>>());
STRATA_REGISTER_KERNEL("scaled_dot_product_attention_qkv_grad", DEVICE_CPU, F16,
                       InitFactory<WidenedPackedAttentionGrad<float16>>());

}  // namespace
}  // namespace strata
