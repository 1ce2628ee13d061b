// CPU kernels of the shape ops (compiler/ops/shape_ops.cc): reshape, flatten
// and reshape_like share the input's buffer; transpose, concat, split, slice
// and their gradient helpers copy.
// Output shapes come from the schemas' own rules (proto/shape_rules.h), so a
// kernel refuses what its schema refuses, in the same words; the run-time
// checks are kernels/shape_op_checks.h's, which the CUDA kernels share.
//
// Threads: copies split the rows of the copied box (all dims but the last)
// into chunks of at least kMinChunkElements elements, so small tensors run
// inline; transpose splits its output rows the same way.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/attr_kernels.h"
#include "kernels/cpu/nn_kernel_util.h"
#include "kernels/shape_op_checks.h"
#include "kernels/view_kernels.h"
#include "proto/shape_rules.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

constexpr int64_t kMinChunkElements = 32768;

using shape_op_checks::ForOp;
using shape_op_checks::Invalid;

std::vector<int64_t> Strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

// Copies the box of size `box` at `src_at` in src (shape src_shape) to `dst_at`
// in dst (shape dst_shape). Same rank everywhere; the box fits in both.
template <typename T>
void CopyBox(T* dst, const Shape& dst_shape, const std::vector<int64_t>& dst_at, const T* src,
             const Shape& src_shape, const std::vector<int64_t>& src_at, const std::vector<int64_t>& box) {
  const int rank = static_cast<int>(box.size());
  for (int64_t b : box) {
    if (b == 0) return;
  }
  const std::vector<int64_t> dst_stride = Strides(dst_shape), src_stride = Strides(src_shape);
  int64_t dst_base = 0, src_base = 0;
  for (int d = 0; d < rank; ++d) {
    dst_base += dst_at[d] * dst_stride[d];
    src_base += src_at[d] * src_stride[d];
  }
  const int64_t row = rank == 0 ? 1 : box[rank - 1];  // contiguous in both
  const int outer_rank = std::max(rank - 1, 0);
  int64_t rows = 1;
  for (int d = 0; d < outer_rank; ++d) rows *= box[d];
  ParallelFor(rows, std::max<int64_t>(1, kMinChunkElements / row), [&](int64_t begin, int64_t end) {
    // Index of row `begin` in the box, then walk it like an odometer.
    std::vector<int64_t> index(outer_rank);
    int64_t rest = begin, dst_off = dst_base, src_off = src_base;
    for (int d = outer_rank - 1; d >= 0; --d) {
      index[d] = rest % box[d];
      rest /= box[d];
      dst_off += index[d] * dst_stride[d];
      src_off += index[d] * src_stride[d];
    }
    for (int64_t r = begin; r < end; ++r) {
      std::memcpy(dst + dst_off, src + src_off, row * sizeof(T));
      for (int d = outer_rank - 1; d >= 0; --d) {
        dst_off += dst_stride[d];
        src_off += src_stride[d];
        if (++index[d] < box[d]) break;
        dst_off -= box[d] * dst_stride[d];
        src_off -= box[d] * src_stride[d];
        index[d] = 0;
      }
    }
  });
}

std::vector<int64_t> Zeros(size_t n) { return std::vector<int64_t>(n, 0); }
std::vector<int64_t> Dims(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }

// Writes all of `part` into `whole` at `at`.
template <typename T>
void PutBox(Tensor* whole, const std::vector<int64_t>& at, const Tensor& part) {
  CopyBox<T>(whole->data<T>(), whole->shape(), at, part.data<T>(), part.shape(), Zeros(part.rank()),
             Dims(part.shape()));
}

// Fills all of `part` from `whole` at `at`.
template <typename T>
void TakeBox(Tensor* part, const Tensor& whole, const std::vector<int64_t>& at) {
  CopyBox<T>(part->data<T>(), part->shape(), Zeros(part->rank()), whole.data<T>(), whole.shape(), at,
             Dims(part->shape()));
}

// Output i shaped `shape`, zero-filled: the gradient ops copy their dys into part of it.
absl::StatusOr<Tensor*> AllocateZeros(KernelContext& ctx, int i, DataType dtype, const Shape& shape) {
  STRATA_ASSIGN_OR_RETURN(Tensor * t, ctx.AllocateOutput(i, dtype, shape));
  std::memset(t->raw_data(), 0, t->bytes());
  return t;
}

// Builds a kernel with Init(const Op&) returning a Status.
template <typename K>
KernelFactory Factory() {
  return [](const KernelDef& def) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
    auto kernel = std::make_unique<K>();
    if (absl::Status s = kernel->Init(*def.op); !s.ok()) return s;
    return std::unique_ptr<OpKernel>(std::move(kernel));
  };
}

// Base of the shape kernels: keeps the op for error messages. Subclasses with
// attrs hide Init with one that calls this first.
using ShapeKernel = OpKeepingKernel;

// ---- reshape, flatten, reshape_like: views of the input's buffer -----------
// kernels/view_kernels.h, shared with the CUDA kernels.

// ---- transpose ---------------------------------------------------------------

template <typename T>
class TransposeKernel : public ShapeKernel {
 public:
  absl::Status Init(const Op& op) {
    op_ = op;
    STRATA_ASSIGN_OR_RETURN(perm_, AttrInts(op, "perm"));
    return absl::OkStatus();
  }
  // y[o_0, ..., o_{r-1}] = x[i] with i[perm[k]] = o[k].
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(const shape_op_checks::TransposeLayout layout,
                            shape_op_checks::ResolveTranspose(op_, DataTypeOf<T>::value, x, perm_));
    const int rank = x.rank();
    const Shape& perm = layout.perm;
    const Shape& out_shape = layout.out;
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), out_shape));
    if (x.num_elements() == 0) return absl::OkStatus();
    const std::vector<int64_t> x_stride = Strides(x.shape());
    std::vector<int64_t> step(rank);  // x stride along each y axis
    for (int k = 0; k < rank; ++k) step[k] = x_stride[perm[k]];
    const T* X = x.data<T>();
    T* Y = y->data<T>();
    const int64_t C = rank == 0 ? 1 : out_shape[rank - 1];  // y's innermost axis
    const int64_t inner_step = rank == 0 ? 1 : step[rank - 1];
    const int outer_rank = std::max(rank - 1, 0);
    const int64_t rows = x.num_elements() / C;
    ParallelFor(rows, std::max<int64_t>(1, kMinChunkElements / C), [&](int64_t begin, int64_t end) {
      std::vector<int64_t> index(outer_rank);
      int64_t rest = begin, x_off = 0;
      for (int d = outer_rank - 1; d >= 0; --d) {
        index[d] = rest % out_shape[d];
        rest /= out_shape[d];
        x_off += index[d] * step[d];
      }
      for (int64_t r = begin; r < end; ++r) {
        T* y_row = Y + r * C;
        const T* x_row = X + x_off;
        if (inner_step == 1) {
          std::memcpy(y_row, x_row, C * sizeof(T));
        } else {
          for (int64_t c = 0; c < C; ++c) y_row[c] = x_row[c * inner_step];
        }
        for (int d = outer_rank - 1; d >= 0; --d) {
          x_off += step[d];
          if (++index[d] < out_shape[d]) break;
          x_off -= out_shape[d] * step[d];
          index[d] = 0;
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> perm_;
};

// ---- concat, concat_grad, split, split_grad --------------------------------

// Copies the pieces, in order along `axis`, into `whole`.
template <typename T>
void GatherPieces(Tensor* whole, const std::vector<const Tensor*>& pieces, int axis) {
  std::vector<int64_t> at = Zeros(whole->rank());
  for (const Tensor* p : pieces) {
    PutBox<T>(whole, at, *p);
    at[axis] += p->dim(axis);
  }
}

// Copies `whole`, cut along `axis`, into the pieces.
template <typename T>
void ScatterPieces(const Tensor& whole, const std::vector<Tensor*>& pieces, int axis) {
  std::vector<int64_t> at = Zeros(whole.rank());
  for (Tensor* p : pieces) {
    TakeBox<T>(p, whole, at);
    at[axis] += p->dim(axis);
  }
}

// Base of concat, concat_grad, split and split_grad: reads "axis", and for
// the split ops (kSections) "sections".
template <bool kSections>
using AxisKernel = AxisAttrsKernel<kSections>;

template <typename T>
class ConcatKernel : public AxisKernel<false> {
 public:
  absl::Status Compute(KernelContext& ctx) override {
    std::vector<const Tensor*> xs;
    for (int i = 0; i < ctx.num_inputs(); ++i) xs.push_back(&ctx.input(i));
    STRATA_ASSIGN_OR_RETURN(const shape_op_checks::ConcatLayout layout,
                            shape_op_checks::ResolveConcat(op_, DataTypeOf<T>::value, axis_, xs));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, layout.out));
    GatherPieces<T>(y, xs, layout.axis);
    return absl::OkStatus();
  }
};

// concat_grad(dy, xs...) -> dxs: dxs[i] is shaped like xs[i].
template <typename T>
class ConcatGradKernel : public AxisKernel<false> {
 public:
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& dy = ctx.input(0);
    std::vector<const Tensor*> xs;
    for (int i = 1; i < ctx.num_inputs(); ++i) xs.push_back(&ctx.input(i));
    STRATA_ASSIGN_OR_RETURN(const int axis, shape_op_checks::ResolveConcatGrad(op_, DataTypeOf<T>::value, axis_, dy,
                                                                               xs, ctx.num_outputs()));
    std::vector<Tensor*> pieces;
    for (int i = 0; i < ctx.num_outputs(); ++i) {
      STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(i, dy.dtype(), xs[i]->shape()));
      pieces.push_back(dx);
    }
    ScatterPieces<T>(dy, pieces, axis);
    return absl::OkStatus();
  }
};

template <typename T>
class SplitKernel : public AxisKernel<true> {
 public:
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(
        const shape_op_checks::SplitLayout layout,
        shape_op_checks::ResolveSplit(op_, DataTypeOf<T>::value, axis_, sections_, x, ctx.num_outputs()));
    const int axis = layout.axis;
    std::vector<Tensor*> pieces;
    for (int i = 0; i < ctx.num_outputs(); ++i) {
      Shape shape = x.shape();
      shape[axis] = layout.sizes[i];
      STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(i, x.dtype(), shape));
      pieces.push_back(y);
    }
    ScatterPieces<T>(x, pieces, axis);
    return absl::OkStatus();
  }
};

// split_grad(x, dys...) -> dx: zeros shaped like x, dys[k] in piece grad_outputs[k].
template <typename T>
class SplitGradKernel : public AxisKernel<true> {
 public:
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(AxisKernel<true>::Init(op));
    STRATA_ASSIGN_OR_RETURN(which_, AttrInts(op, "grad_outputs"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    std::vector<const Tensor*> dys;
    for (int i = 1; i < ctx.num_inputs(); ++i) dys.push_back(&ctx.input(i));
    STRATA_ASSIGN_OR_RETURN(
        const shape_op_checks::SplitGradLayout layout,
        shape_op_checks::ResolveSplitGrad(op_, DataTypeOf<T>::value, axis_, sections_, which_, x, dys));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, AllocateZeros(ctx, 0, DataTypeOf<T>::value, x.shape()));
    for (size_t k = 0; k < dys.size(); ++k) {
      std::vector<int64_t> at = Zeros(x.rank());
      at[layout.axis] = layout.offsets[k];
      PutBox<T>(dx, at, *dys[k]);
    }
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> which_;
};

// ---- slice, slice_grad -----------------------------------------------------

using SliceBase = SliceAttrsKernel;

template <typename T>
class SliceKernel : public SliceBase {
 public:
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(const SliceWindow window, shape_op_checks::ResolveSliceOf(op_, DataTypeOf<T>::value, x,
                                                                                      axes_, starts_, ends_));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), window.size));
    TakeBox<T>(y, x, Dims(window.begin));
    return absl::OkStatus();
  }
};

template <typename T>
class SliceGradKernel : public SliceBase {
 public:
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& dy = ctx.input(0);
    const Tensor& x = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(
        const SliceWindow window,
        shape_op_checks::ResolveSliceGrad(op_, DataTypeOf<T>::value, dy, x, axes_, starts_, ends_));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, AllocateZeros(ctx, 0, dy.dtype(), x.shape()));
    PutBox<T>(dx, Dims(window.begin), dy);
    return absl::OkStatus();
  }
};

// pad: zeros shaped like y with x in its leading box.
template <typename T>
class PadKernel : public PadAttrsKernel {
 public:
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    int axis = 0;
    STRATA_ASSIGN_OR_RETURN(const Shape y_shape, PaddedShape(x, &axis));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, AllocateZeros(ctx, 0, x.dtype(), y_shape));
    PutBox<T>(y, Zeros(x.rank()), x);
    return absl::OkStatus();
  }
};

STRATA_REGISTER_KERNEL("pad", DEVICE_CPU, F32, Factory<PadKernel<float>>());
STRATA_REGISTER_KERNEL("pad", DEVICE_CPU, F64, Factory<PadKernel<double>>());
STRATA_REGISTER_KERNEL("pad", DEVICE_CPU, I64, Factory<PadKernel<int64_t>>());
STRATA_REGISTER_KERNEL("pad", DEVICE_CPU, BF16, Factory<PadKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("pad", DEVICE_CPU, F16, Factory<PadKernel<float16>>());
STRATA_REGISTER_KERNEL("reshape", DEVICE_CPU, F32, InitFactory<view_kernels::ReshapeKernel>());
STRATA_REGISTER_KERNEL("reshape", DEVICE_CPU, F64, InitFactory<view_kernels::ReshapeKernel>());
STRATA_REGISTER_KERNEL("reshape", DEVICE_CPU, I64, InitFactory<view_kernels::ReshapeKernel>());
STRATA_REGISTER_KERNEL("flatten", DEVICE_CPU, F32, InitFactory<view_kernels::FlattenKernel>());
STRATA_REGISTER_KERNEL("flatten", DEVICE_CPU, F64, InitFactory<view_kernels::FlattenKernel>());
STRATA_REGISTER_KERNEL("flatten", DEVICE_CPU, I64, InitFactory<view_kernels::FlattenKernel>());
STRATA_REGISTER_KERNEL("reshape_like", DEVICE_CPU, F32, InitFactory<view_kernels::ReshapeLikeKernel>());
STRATA_REGISTER_KERNEL("reshape_like", DEVICE_CPU, F64, InitFactory<view_kernels::ReshapeLikeKernel>());
STRATA_REGISTER_KERNEL("reshape_like", DEVICE_CPU, I64, InitFactory<view_kernels::ReshapeLikeKernel>());

STRATA_REGISTER_KERNEL("transpose", DEVICE_CPU, F32, Factory<TransposeKernel<float>>());
STRATA_REGISTER_KERNEL("transpose", DEVICE_CPU, F64, Factory<TransposeKernel<double>>());
STRATA_REGISTER_KERNEL("transpose", DEVICE_CPU, I64, Factory<TransposeKernel<int64_t>>());

STRATA_REGISTER_KERNEL("concat", DEVICE_CPU, F32, Factory<ConcatKernel<float>>());
STRATA_REGISTER_KERNEL("concat", DEVICE_CPU, F64, Factory<ConcatKernel<double>>());
STRATA_REGISTER_KERNEL("concat", DEVICE_CPU, I64, Factory<ConcatKernel<int64_t>>());
STRATA_REGISTER_KERNEL("concat_grad", DEVICE_CPU, F32, Factory<ConcatGradKernel<float>>());
STRATA_REGISTER_KERNEL("concat_grad", DEVICE_CPU, F64, Factory<ConcatGradKernel<double>>());
STRATA_REGISTER_KERNEL("concat_grad", DEVICE_CPU, I64, Factory<ConcatGradKernel<int64_t>>());

STRATA_REGISTER_KERNEL("split", DEVICE_CPU, F32, Factory<SplitKernel<float>>());
STRATA_REGISTER_KERNEL("split", DEVICE_CPU, F64, Factory<SplitKernel<double>>());
STRATA_REGISTER_KERNEL("split", DEVICE_CPU, I64, Factory<SplitKernel<int64_t>>());
STRATA_REGISTER_KERNEL("split_grad", DEVICE_CPU, F32, Factory<SplitGradKernel<float>>());
STRATA_REGISTER_KERNEL("split_grad", DEVICE_CPU, F64, Factory<SplitGradKernel<double>>());
STRATA_REGISTER_KERNEL("split_grad", DEVICE_CPU, I64, Factory<SplitGradKernel<int64_t>>());

// The moves a mixed-precision program makes in its low dtype (passes/
// commute_casts: q, k and v split and transposed in bf16, and their
// gradients concatenated): bytes moved, the same code for 2-byte elements.
STRATA_REGISTER_KERNEL("reshape", DEVICE_CPU, BF16, InitFactory<view_kernels::ReshapeKernel>());
STRATA_REGISTER_KERNEL("reshape", DEVICE_CPU, F16, InitFactory<view_kernels::ReshapeKernel>());
STRATA_REGISTER_KERNEL("flatten", DEVICE_CPU, BF16, InitFactory<view_kernels::FlattenKernel>());
STRATA_REGISTER_KERNEL("flatten", DEVICE_CPU, F16, InitFactory<view_kernels::FlattenKernel>());
STRATA_REGISTER_KERNEL("reshape_like", DEVICE_CPU, BF16, InitFactory<view_kernels::ReshapeLikeKernel>());
STRATA_REGISTER_KERNEL("reshape_like", DEVICE_CPU, F16, InitFactory<view_kernels::ReshapeLikeKernel>());
STRATA_REGISTER_KERNEL("transpose", DEVICE_CPU, BF16, Factory<TransposeKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("transpose", DEVICE_CPU, F16, Factory<TransposeKernel<float16>>());
STRATA_REGISTER_KERNEL("concat", DEVICE_CPU, BF16, Factory<ConcatKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("concat", DEVICE_CPU, F16, Factory<ConcatKernel<float16>>());
STRATA_REGISTER_KERNEL("concat_grad", DEVICE_CPU, BF16, Factory<ConcatGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("concat_grad", DEVICE_CPU, F16, Factory<ConcatGradKernel<float16>>());
STRATA_REGISTER_KERNEL("split", DEVICE_CPU, BF16, Factory<SplitKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("split", DEVICE_CPU, F16, Factory<SplitKernel<float16>>());
STRATA_REGISTER_KERNEL("split_grad", DEVICE_CPU, BF16, Factory<SplitGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("split_grad", DEVICE_CPU, F16, Factory<SplitGradKernel<float16>>());

STRATA_REGISTER_KERNEL("slice", DEVICE_CPU, F32, Factory<SliceKernel<float>>());
STRATA_REGISTER_KERNEL("slice", DEVICE_CPU, F64, Factory<SliceKernel<double>>());
STRATA_REGISTER_KERNEL("slice", DEVICE_CPU, I64, Factory<SliceKernel<int64_t>>());
STRATA_REGISTER_KERNEL("slice_grad", DEVICE_CPU, F32, Factory<SliceGradKernel<float>>());
STRATA_REGISTER_KERNEL("slice_grad", DEVICE_CPU, F64, Factory<SliceGradKernel<double>>());
STRATA_REGISTER_KERNEL("slice_grad", DEVICE_CPU, I64, Factory<SliceGradKernel<int64_t>>());
// 16-bit slices: the pad op's gradient under mixed precision (passes/pad_vocab).
STRATA_REGISTER_KERNEL("slice", DEVICE_CPU, BF16, Factory<SliceKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("slice", DEVICE_CPU, F16, Factory<SliceKernel<float16>>());
STRATA_REGISTER_KERNEL("slice_grad", DEVICE_CPU, BF16, Factory<SliceGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("slice_grad", DEVICE_CPU, F16, Factory<SliceGradKernel<float16>>());

}  // namespace
}  // namespace strata
