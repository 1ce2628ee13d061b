// CUDA kernels of the reductions and data-movement ops: reduce_sum,
// reduce_mean and broadcast_like (kernels/cuda/reduce.cu, strided_copy.cu);
// transpose, concat, concat_grad, split, split_grad, slice, slice_grad and
// pad (strided_copy.cu: bit-for-bit element copies); sum_squares,
// sum_squares_grad, clip_coefficient, mse_loss and mse_loss_grad
// (block_sums.cu: the CPU's fixed-block sums, bit for bit). Attrs, checks
// and messages are the CPU kernels' (kernels/shape_op_checks.h,
// kernel_checks.h, proto/shape_rules.h); only the loops run on the device.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cuda/block_sums.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/strided_copy.h"
#include "kernels/kernel_checks.h"
#include "kernels/shape_op_checks.h"
#include "proto/shape_rules.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

using kernel_checks::CheckPredAndTarget;
using kernel_checks::ExpectInputDtype;
using kernel_checks::ExpectNamedInputDtype;
using kernel_checks::ExpectOneElement;
using kernel_checks::ExpectScalar;

// Row-major element strides of `shape`.
std::vector<int64_t> Strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

// `doubles` F64 of device scratch from the device's allocator (so its
// counters see them); the stream-ordered allocator lets the host free it
// once the kernels that use it are enqueued. Undefined for none.
absl::StatusOr<Tensor> Scratch(const KernelContext& ctx, const char* op, int64_t doubles) {
  if (doubles == 0) return Tensor();
  Tensor t = Tensor::Empty(F64, Shape{doubles}, &ctx.device());
  if (!t.defined()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op, ": out of memory allocating ", doubles, " F64 scratch elements on ", ctx.device().name()));
  }
  return t;
}

// ---- strided copies ------------------------------------------------------------

// Copies the box `box` at `src_at` in src (row-major, shape src_shape) to
// `dst_at` in dst (shape dst_shape): kernels/cpu/shape_ops.cc's CopyBox.
absl::Status CopyBox(CudaDevice* device, const Op& op, Tensor* dst, const std::vector<int64_t>& dst_at,
                     const Tensor& src, const std::vector<int64_t>& src_at, const Shape& box) {
  const std::vector<int64_t> dst_stride = Strides(dst->shape()), src_stride = Strides(src.shape());
  int64_t dst_base = 0, src_base = 0;
  for (size_t d = 0; d < box.size(); ++d) {
    dst_base += dst_at[d] * dst_stride[d];
    src_base += src_at[d] * src_stride[d];
  }
  cuda::CopyPlan plan;
  if (!cuda::MakeCopyPlan(static_cast<int>(box.size()), box.data(), dst_stride.data(), src_stride.data(), &plan)) {
    return absl::UnimplementedError(absl::StrCat(op.type(), ": copying a box ", ShapeString(box), " needs more than ",
                                                 cuda::kMaxCopyDims, " dims after merging; the CUDA kernel does not"));
  }
  const int64_t size = static_cast<int64_t>(DataTypeSize(src.dtype()));
  return CudaStatus(cuda::LaunchStridedCopy(static_cast<char*>(dst->raw_data()) + dst_base * size,
                                            static_cast<const char*>(src.raw_data()) + src_base * size,
                                            static_cast<int>(size), plan, device->stream()),
                    op.type().c_str());
}

std::vector<int64_t> Zeros(size_t n) { return std::vector<int64_t>(n, 0); }

// Writes all of `part` into `whole` at `at`.
absl::Status PutBox(CudaDevice* device, const Op& op, Tensor* whole, const std::vector<int64_t>& at,
                    const Tensor& part) {
  return CopyBox(device, op, whole, at, part, Zeros(part.rank()), part.shape());
}

// Fills all of `part` from `whole` at `at`.
absl::Status TakeBox(CudaDevice* device, const Op& op, Tensor* part, const Tensor& whole,
                     const std::vector<int64_t>& at) {
  return CopyBox(device, op, part, Zeros(part->rank()), whole, at, part->shape());
}

// Output i shaped `shape`, zero-filled (all bits 0, as the CPU's memset).
absl::StatusOr<Tensor*> AllocateZeros(KernelContext& ctx, CudaDevice* device, const Op& op, int i, DataType dtype,
                                      const Shape& shape) {
  STRATA_ASSIGN_OR_RETURN(Tensor * t, ctx.AllocateOutput(i, dtype, shape));
  STRATA_RETURN_IF_ERROR(CudaStatus(
      cuda::LaunchFill(t->raw_data(), static_cast<int>(DataTypeSize(dtype)), 0, t->num_elements(), device->stream()),
      op.type().c_str()));
  return t;
}

// Base of the shape kernels: keeps the op for error messages.
using CudaShapeKernel = OpKeepingKernel;

template <typename T>
class CudaTransposeKernel : public CudaShapeKernel {
 public:
  using CudaShapeKernel::CudaShapeKernel;
  absl::Status Init(const Op& op) {
    op_ = op;
    STRATA_ASSIGN_OR_RETURN(perm_, AttrInts(op, "perm"));
    return absl::OkStatus();
  }
  // y[o] = x[i] with i[perm[k]] = o[k]: y's box read at x's strides permuted.
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(const shape_op_checks::TransposeLayout layout,
                            shape_op_checks::ResolveTranspose(op_, DataTypeOf<T>::value, x, perm_));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), layout.out));
    const int rank = x.rank();
    const std::vector<int64_t> x_stride = Strides(x.shape()), y_stride = Strides(layout.out);
    std::vector<int64_t> step(rank);  // x's stride along each y axis
    for (int k = 0; k < rank; ++k) step[k] = x_stride[layout.perm[k]];
    cuda::CopyPlan plan;
    if (!cuda::MakeCopyPlan(rank, layout.out.data(), y_stride.data(), step.data(), &plan)) {
      return absl::UnimplementedError(absl::StrCat("transpose: x ", ShapeString(x.shape()), " by perm ",
                                                   ShapeString(layout.perm), " moves more than ", cuda::kMaxCopyDims,
                                                   " groups of dims; the CUDA kernel does not"));
    }
    return CudaStatus(
        cuda::LaunchStridedCopy(y->raw_data(), x.raw_data(), static_cast<int>(sizeof(T)), plan, device->stream()),
        "transpose");
  }

 private:
  std::vector<int64_t> perm_;
};

// Base of concat, concat_grad, split and split_grad: reads "axis", and for
// the split ops (kSections) "sections".
template <bool kSections>
using CudaAxisKernel = AxisAttrsKernel<kSections>;

template <typename T>
class CudaConcatKernel : public CudaAxisKernel<false> {
 public:
  using CudaAxisKernel<false>::CudaAxisKernel;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    std::vector<const Tensor*> xs;
    for (int i = 0; i < ctx.num_inputs(); ++i) xs.push_back(&ctx.input(i));
    STRATA_ASSIGN_OR_RETURN(const shape_op_checks::ConcatLayout layout,
                            shape_op_checks::ResolveConcat(op_, DataTypeOf<T>::value, axis_, xs));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, layout.out));
    std::vector<int64_t> at = Zeros(layout.out.size());
    for (const Tensor* x : xs) {
      STRATA_RETURN_IF_ERROR(PutBox(device, op_, y, at, *x));
      at[layout.axis] += x->dim(layout.axis);
    }
    return absl::OkStatus();
  }
};

template <typename T>
class CudaConcatGradKernel : public CudaAxisKernel<false> {
 public:
  using CudaAxisKernel<false>::CudaAxisKernel;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& dy = ctx.input(0);
    std::vector<const Tensor*> xs;
    for (int i = 1; i < ctx.num_inputs(); ++i) xs.push_back(&ctx.input(i));
    STRATA_ASSIGN_OR_RETURN(const int axis, shape_op_checks::ResolveConcatGrad(op_, DataTypeOf<T>::value, axis_, dy, xs,
                                                                               ctx.num_outputs()));
    std::vector<int64_t> at = Zeros(dy.rank());
    for (int i = 0; i < ctx.num_outputs(); ++i) {
      STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(i, dy.dtype(), xs[i]->shape()));
      STRATA_RETURN_IF_ERROR(TakeBox(device, op_, dx, dy, at));
      at[axis] += dx->dim(axis);
    }
    return absl::OkStatus();
  }
};

template <typename T>
class CudaSplitKernel : public CudaAxisKernel<true> {
 public:
  using CudaAxisKernel<true>::CudaAxisKernel;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(
        const shape_op_checks::SplitLayout layout,
        shape_op_checks::ResolveSplit(op_, DataTypeOf<T>::value, axis_, sections_, x, ctx.num_outputs()));
    std::vector<int64_t> at = Zeros(x.rank());
    for (int i = 0; i < ctx.num_outputs(); ++i) {
      Shape shape = x.shape();
      shape[layout.axis] = layout.sizes[i];
      STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(i, x.dtype(), shape));
      STRATA_RETURN_IF_ERROR(TakeBox(device, op_, y, x, at));
      at[layout.axis] += layout.sizes[i];
    }
    return absl::OkStatus();
  }
};

// split_grad(x, dys...) -> dx: zeros shaped like x, dys[k] in piece grad_outputs[k].
template <typename T>
class CudaSplitGradKernel : public CudaAxisKernel<true> {
 public:
  using CudaAxisKernel<true>::CudaAxisKernel;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(CudaAxisKernel<true>::Init(op));
    STRATA_ASSIGN_OR_RETURN(which_, AttrInts(op, "grad_outputs"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    std::vector<const Tensor*> dys;
    for (int i = 1; i < ctx.num_inputs(); ++i) dys.push_back(&ctx.input(i));
    STRATA_ASSIGN_OR_RETURN(
        const shape_op_checks::SplitGradLayout layout,
        shape_op_checks::ResolveSplitGrad(op_, DataTypeOf<T>::value, axis_, sections_, which_, x, dys));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, AllocateZeros(ctx, device, op_, 0, DataTypeOf<T>::value, x.shape()));
    for (size_t k = 0; k < dys.size(); ++k) {
      std::vector<int64_t> at = Zeros(x.rank());
      at[layout.axis] = layout.offsets[k];
      STRATA_RETURN_IF_ERROR(PutBox(device, op_, dx, at, *dys[k]));
    }
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> which_;
};

using CudaSliceBase = SliceAttrsKernel;

template <typename T>
class CudaSliceKernel : public CudaSliceBase {
 public:
  using CudaSliceBase::CudaSliceBase;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(const SliceWindow window,
                            shape_op_checks::ResolveSliceOf(op_, DataTypeOf<T>::value, x, axes_, starts_, ends_));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), window.size));
    return TakeBox(device, op_, y, x, std::vector<int64_t>(window.begin.begin(), window.begin.end()));
  }
};

template <typename T>
class CudaSliceGradKernel : public CudaSliceBase {
 public:
  using CudaSliceBase::CudaSliceBase;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& dy = ctx.input(0);
    const Tensor& x = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(const SliceWindow window,
                            shape_op_checks::ResolveSliceGrad(op_, DataTypeOf<T>::value, dy, x, axes_, starts_, ends_));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, AllocateZeros(ctx, device, op_, 0, dy.dtype(), x.shape()));
    return PutBox(device, op_, dx, std::vector<int64_t>(window.begin.begin(), window.begin.end()), dy);
  }
};

// ---- reductions --------------------------------------------------------------

// reduce_sum, reduce_mean: y = x summed over the axis attr (times 1 / count
// for the mean, in double, as kernels/cpu/reduce.cc's ReduceKernel).
template <typename T, bool kMean>
class CudaReduceKernel : public OpKernel {
 public:
  explicit CudaReduceKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(axis_, AttrInts(op, "axis"));
    STRATA_ASSIGN_OR_RETURN(keepdim_, AttrBool(op, "keepdim"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(const std::vector<bool> reduced, ReducedAxes(axis_, x.rank(), "x"));
    STRATA_ASSIGN_OR_RETURN(Tensor * y,
                            ctx.AllocateOutput(0, DataTypeOf<T>::value, ReduceShape(x.shape(), reduced, keepdim_)));
    cuda::ReducePlan plan;
    if constexpr (kMean) {
      int64_t count = 1;
      for (int d = 0; d < x.rank(); ++d) {
        if (reduced[d]) count *= x.dim(d);
      }
      plan.scale = 1.0 / static_cast<double>(count);  // count 0: nan, like torch
    }
    if (!cuda::MakeReducePlan(x.rank(), x.shape().data(), reduced, &plan)) {
      return absl::UnimplementedError(absl::StrCat(kMean ? "reduce_mean" : "reduce_sum", ": x ", ShapeString(x.shape()),
                                                   " alternates kept and reduced dims more than ", cuda::kMaxReduceDims,
                                                   " times; the CUDA kernel does not"));
    }
    return CudaStatus(cuda::LaunchReduceSum(y->data<T>(), x.data<T>(), plan, device->stream()),
                      kMean ? "reduce_mean" : "reduce_sum");
  }

 private:
  std::vector<int64_t> axis_;
  bool keepdim_ = false;
};

// dx = dy repeated over the dims reduce_*(x, axis, keepdim) removed, times
// 1 / count for the mean: dy read at stride 0 along the reduced dims.
template <typename T>
class CudaBroadcastLikeKernel : public OpKernel {
 public:
  explicit CudaBroadcastLikeKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(axis_, AttrInts(op, "axis"));
    STRATA_ASSIGN_OR_RETURN(keepdim_, AttrBool(op, "keepdim"));
    STRATA_ASSIGN_OR_RETURN(mean_, AttrBool(op, "mean"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& dy = ctx.input(0);
    const Shape& x = ctx.input(1).shape();
    STRATA_ASSIGN_OR_RETURN(const shape_op_checks::BroadcastLikeLayout layout,
                            shape_op_checks::ResolveBroadcastLike(axis_, keepdim_, mean_, dy, x));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, DataTypeOf<T>::value, x));
    const std::vector<int64_t> dx_stride = Strides(x);
    std::vector<int64_t> dy_stride = Strides(ReduceShape(x, layout.reduced, true));
    for (size_t d = 0; d < x.size(); ++d) {
      if (layout.reduced[d]) dy_stride[d] = 0;
    }
    cuda::CopyPlan plan;
    if (!cuda::MakeCopyPlan(static_cast<int>(x.size()), x.data(), dx_stride.data(), dy_stride.data(), &plan)) {
      return absl::UnimplementedError(absl::StrCat("broadcast_like: x ", ShapeString(x),
                                                   " alternates kept and repeated dims more than ", cuda::kMaxCopyDims,
                                                   " times; the CUDA kernel does not"));
    }
    return CudaStatus(
        cuda::LaunchStridedScale(dx->data<T>(), dy.data<T>(), static_cast<T>(layout.factor), plan, device->stream()),
        "broadcast_like");
  }

 private:
  std::vector<int64_t> axis_;
  bool keepdim_ = false, mean_ = false;
};

// ---- sum_squares, clip_coefficient, mse_loss ------------------------------------

template <typename T>
class CudaSumSquaresKernel : public OpKernel {
 public:
  explicit CudaSumSquaresKernel(const KernelDef&) {}
  absl::Status Init(const Op&) { return absl::OkStatus(); }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    std::vector<const T*> xs;
    std::vector<int64_t> ns;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      STRATA_RETURN_IF_ERROR(ExpectInputDtype(ctx, "sum_squares", i, DataTypeOf<T>::value));
      xs.push_back(ctx.input(i).data<T>());
      ns.push_back(ctx.input(i).num_elements());
    }
    const int count = static_cast<int>(xs.size());
    STRATA_ASSIGN_OR_RETURN(Tensor scratch,
                            Scratch(ctx, "sum_squares", cuda::SumSquaresScratchDoubles(ns.data(), count)));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, {}));
    return CudaStatus(
        cuda::LaunchSumSquares(y->data<T>(), xs.data(), ns.data(), count, scratch.data<double>(), device->stream()),
        "sum_squares");
  }
};

// sum_squares_grad(x, dy) -> dx = 2 * dy * x.
template <typename T>
class CudaSumSquaresGradKernel : public OpKernel {
 public:
  explicit CudaSumSquaresGradKernel(const KernelDef&) {}
  absl::Status Init(const Op&) { return absl::OkStatus(); }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "sum_squares_grad", 1, "dy", DataTypeOf<T>::value));
    STRATA_RETURN_IF_ERROR(ExpectNamedInputDtype(ctx, "sum_squares_grad", 0, "x", DataTypeOf<T>::value));
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, DataTypeOf<T>::value, x.shape()));
    return CudaStatus(cuda::LaunchSumSquaresGrad(dx->data<T>(), x.data<T>(), ctx.input(1).data<T>(), x.num_elements(),
                                                 device->stream()),
                      "sum_squares_grad");
  }
};

// clip_coefficient(sum_squares...) -> coef: ClipCoefficient (kernels/shared_math.h)
// of the inputs' sum, on the device.
template <typename T>
class CudaClipCoefficientKernel : public OpKernel {
 public:
  explicit CudaClipCoefficientKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(max_norm_, AttrFloat(op, "max_norm"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    std::vector<const T*> sums;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "clip_coefficient", i, "sum_squares", DataTypeOf<T>::value));
      sums.push_back(ctx.input(i).data<T>());
    }
    STRATA_ASSIGN_OR_RETURN(Tensor scratch, Scratch(ctx, "clip_coefficient", 1));
    STRATA_ASSIGN_OR_RETURN(Tensor * coef, ctx.AllocateOutput(0, DataTypeOf<T>::value, {}));
    return CudaStatus(cuda::LaunchClipCoefficient(coef->data<T>(), sums.data(), static_cast<int>(sums.size()),
                                                  max_norm_, scratch.data<double>(), device->stream()),
                      "clip_coefficient");
  }

 private:
  double max_norm_ = 1.0;
};

// loss [] = mean of (pred - target)^2.
template <typename T>
class CudaMseLossKernel : public OpKernel {
 public:
  explicit CudaMseLossKernel(const KernelDef&) {}
  absl::Status Init(const Op&) { return absl::OkStatus(); }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& pred = ctx.input(0);
    const Tensor& target = ctx.input(1);
    STRATA_RETURN_IF_ERROR(CheckPredAndTarget("mse_loss", pred, target));
    STRATA_ASSIGN_OR_RETURN(Tensor * loss, ctx.AllocateOutput(0, pred.dtype(), Shape{}));
    const int64_t n = pred.num_elements();
    STRATA_ASSIGN_OR_RETURN(Tensor scratch, Scratch(ctx, "mse_loss", cuda::MseLossScratchDoubles(n)));
    return CudaStatus(cuda::LaunchMseLoss(loss->data<T>(), pred.data<T>(), target.data<T>(), n, scratch.data<double>(),
                                          device->stream()),
                      "mse_loss");
  }
};

// dpred = (pred - target) * (2 * dloss / n).
template <typename T>
class CudaMseLossGradKernel : public OpKernel {
 public:
  explicit CudaMseLossGradKernel(const KernelDef&) {}
  absl::Status Init(const Op&) { return absl::OkStatus(); }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& pred = ctx.input(0);
    const Tensor& target = ctx.input(1);
    const Tensor& dloss = ctx.input(2);
    STRATA_RETURN_IF_ERROR(CheckPredAndTarget("mse_loss_grad", pred, target));
    STRATA_RETURN_IF_ERROR(ExpectOneElement("mse_loss_grad", "dloss", dloss));
    STRATA_ASSIGN_OR_RETURN(Tensor * dpred, ctx.AllocateOutput(0, pred.dtype(), pred.shape()));
    return CudaStatus(cuda::LaunchMseLossGrad(dpred->data<T>(), pred.data<T>(), target.data<T>(), dloss.data<T>(),
                                              pred.num_elements(), device->stream()),
                      "mse_loss_grad");
  }
};

// The scratch the sums draw, for the memory plan.
absl::StatusOr<int64_t> SumSquaresWorkspace(const KernelDef& def, int) {
  std::vector<int64_t> ns;
  for (const TensorType& t : def.input_types) ns.push_back(NumElements(t.shape));
  return cuda::SumSquaresScratchDoubles(ns.data(), static_cast<int>(ns.size())) * static_cast<int64_t>(sizeof(double));
}
absl::StatusOr<int64_t> ClipCoefficientWorkspace(const KernelDef&, int) { return int64_t{sizeof(double)}; }
absl::StatusOr<int64_t> MseLossWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty()) return int64_t{0};
  return cuda::MseLossScratchDoubles(NumElements(def.input_types[0].shape)) * static_cast<int64_t>(sizeof(double));
}
STRATA_REGISTER_WORKSPACE("sum_squares", DEVICE_CUDA, SumSquaresWorkspace);
STRATA_REGISTER_WORKSPACE("clip_coefficient", DEVICE_CUDA, ClipCoefficientWorkspace);
STRATA_REGISTER_WORKSPACE("mse_loss", DEVICE_CUDA, MseLossWorkspace);

// The dtypes the CPU registers for each op (kernels/cpu/reduce.cc,
// shape_ops.cc, optimizers.cc, losses.cc).
STRATA_REGISTER_KERNEL("reduce_sum", DEVICE_CUDA, F32, (InitFactory<CudaReduceKernel<float, false>>()));
STRATA_REGISTER_KERNEL("reduce_sum", DEVICE_CUDA, F64, (InitFactory<CudaReduceKernel<double, false>>()));
STRATA_REGISTER_KERNEL("reduce_sum", DEVICE_CUDA, I64, (InitFactory<CudaReduceKernel<int64_t, false>>()));
STRATA_REGISTER_KERNEL("reduce_mean", DEVICE_CUDA, F32, (InitFactory<CudaReduceKernel<float, true>>()));
STRATA_REGISTER_KERNEL("reduce_mean", DEVICE_CUDA, F64, (InitFactory<CudaReduceKernel<double, true>>()));
STRATA_REGISTER_KERNEL("broadcast_like", DEVICE_CUDA, F32, InitFactory<CudaBroadcastLikeKernel<float>>());
STRATA_REGISTER_KERNEL("broadcast_like", DEVICE_CUDA, F64, InitFactory<CudaBroadcastLikeKernel<double>>());

STRATA_REGISTER_KERNEL("transpose", DEVICE_CUDA, F32, InitFactory<CudaTransposeKernel<float>>());
STRATA_REGISTER_KERNEL("transpose", DEVICE_CUDA, F64, InitFactory<CudaTransposeKernel<double>>());
STRATA_REGISTER_KERNEL("transpose", DEVICE_CUDA, I64, InitFactory<CudaTransposeKernel<int64_t>>());
STRATA_REGISTER_KERNEL("concat", DEVICE_CUDA, F32, InitFactory<CudaConcatKernel<float>>());
STRATA_REGISTER_KERNEL("concat", DEVICE_CUDA, F64, InitFactory<CudaConcatKernel<double>>());
STRATA_REGISTER_KERNEL("concat", DEVICE_CUDA, I64, InitFactory<CudaConcatKernel<int64_t>>());
STRATA_REGISTER_KERNEL("concat_grad", DEVICE_CUDA, F32, InitFactory<CudaConcatGradKernel<float>>());
STRATA_REGISTER_KERNEL("concat_grad", DEVICE_CUDA, F64, InitFactory<CudaConcatGradKernel<double>>());
STRATA_REGISTER_KERNEL("concat_grad", DEVICE_CUDA, I64, InitFactory<CudaConcatGradKernel<int64_t>>());
STRATA_REGISTER_KERNEL("split", DEVICE_CUDA, F32, InitFactory<CudaSplitKernel<float>>());
STRATA_REGISTER_KERNEL("split", DEVICE_CUDA, F64, InitFactory<CudaSplitKernel<double>>());
STRATA_REGISTER_KERNEL("split", DEVICE_CUDA, I64, InitFactory<CudaSplitKernel<int64_t>>());
STRATA_REGISTER_KERNEL("split_grad", DEVICE_CUDA, F32, InitFactory<CudaSplitGradKernel<float>>());
STRATA_REGISTER_KERNEL("split_grad", DEVICE_CUDA, F64, InitFactory<CudaSplitGradKernel<double>>());
STRATA_REGISTER_KERNEL("split_grad", DEVICE_CUDA, I64, InitFactory<CudaSplitGradKernel<int64_t>>());
// The moves of a mixed-precision program's low dtype (passes/commute_casts):
// the same byte copies for 2-byte elements.
STRATA_REGISTER_KERNEL("transpose", DEVICE_CUDA, BF16, InitFactory<CudaTransposeKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("transpose", DEVICE_CUDA, F16, InitFactory<CudaTransposeKernel<float16>>());
STRATA_REGISTER_KERNEL("concat", DEVICE_CUDA, BF16, InitFactory<CudaConcatKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("concat", DEVICE_CUDA, F16, InitFactory<CudaConcatKernel<float16>>());
STRATA_REGISTER_KERNEL("concat_grad", DEVICE_CUDA, BF16, InitFactory<CudaConcatGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("concat_grad", DEVICE_CUDA, F16, InitFactory<CudaConcatGradKernel<float16>>());
STRATA_REGISTER_KERNEL("split", DEVICE_CUDA, BF16, InitFactory<CudaSplitKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("split", DEVICE_CUDA, F16, InitFactory<CudaSplitKernel<float16>>());
STRATA_REGISTER_KERNEL("split_grad", DEVICE_CUDA, BF16, InitFactory<CudaSplitGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("split_grad", DEVICE_CUDA, F16, InitFactory<CudaSplitGradKernel<float16>>());
// pad: zeros shaped like y with x in its leading box, as the CPU's.
template <typename T>
class CudaPadKernel : public PadAttrsKernel {
 public:
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    int axis = 0;
    STRATA_ASSIGN_OR_RETURN(const Shape y_shape, PaddedShape(x, &axis));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, AllocateZeros(ctx, device, op_, 0, x.dtype(), y_shape));
    return PutBox(device, op_, y, std::vector<int64_t>(x.rank(), 0), x);
  }
};

STRATA_REGISTER_KERNEL("pad", DEVICE_CUDA, F32, InitFactory<CudaPadKernel<float>>());
STRATA_REGISTER_KERNEL("pad", DEVICE_CUDA, F64, InitFactory<CudaPadKernel<double>>());
STRATA_REGISTER_KERNEL("pad", DEVICE_CUDA, I64, InitFactory<CudaPadKernel<int64_t>>());
STRATA_REGISTER_KERNEL("pad", DEVICE_CUDA, BF16, InitFactory<CudaPadKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("pad", DEVICE_CUDA, F16, InitFactory<CudaPadKernel<float16>>());
STRATA_REGISTER_KERNEL("slice", DEVICE_CUDA, F32, InitFactory<CudaSliceKernel<float>>());
STRATA_REGISTER_KERNEL("slice", DEVICE_CUDA, F64, InitFactory<CudaSliceKernel<double>>());
STRATA_REGISTER_KERNEL("slice", DEVICE_CUDA, I64, InitFactory<CudaSliceKernel<int64_t>>());
STRATA_REGISTER_KERNEL("slice_grad", DEVICE_CUDA, F32, InitFactory<CudaSliceGradKernel<float>>());
STRATA_REGISTER_KERNEL("slice_grad", DEVICE_CUDA, F64, InitFactory<CudaSliceGradKernel<double>>());
STRATA_REGISTER_KERNEL("slice_grad", DEVICE_CUDA, I64, InitFactory<CudaSliceGradKernel<int64_t>>());
// 16-bit slices: the pad op's gradient under mixed precision (passes/pad_vocab).
STRATA_REGISTER_KERNEL("slice", DEVICE_CUDA, BF16, InitFactory<CudaSliceKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("slice", DEVICE_CUDA, F16, InitFactory<CudaSliceKernel<float16>>());
STRATA_REGISTER_KERNEL("slice_grad", DEVICE_CUDA, BF16, InitFactory<CudaSliceGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("slice_grad", DEVICE_CUDA, F16, InitFactory<CudaSliceGradKernel<float16>>());

STRATA_REGISTER_KERNEL("sum_squares", DEVICE_CUDA, F32, InitFactory<CudaSumSquaresKernel<float>>());
STRATA_REGISTER_KERNEL("sum_squares", DEVICE_CUDA, F64, InitFactory<CudaSumSquaresKernel<double>>());
STRATA_REGISTER_KERNEL("sum_squares_grad", DEVICE_CUDA, F32, InitFactory<CudaSumSquaresGradKernel<float>>());
STRATA_REGISTER_KERNEL("sum_squares_grad", DEVICE_CUDA, F64, InitFactory<CudaSumSquaresGradKernel<double>>());
STRATA_REGISTER_KERNEL("clip_coefficient", DEVICE_CUDA, F32, InitFactory<CudaClipCoefficientKernel<float>>());
STRATA_REGISTER_KERNEL("clip_coefficient", DEVICE_CUDA, F64, InitFactory<CudaClipCoefficientKernel<double>>());
STRATA_REGISTER_KERNEL("mse_loss", DEVICE_CUDA, F32, InitFactory<CudaMseLossKernel<float>>());
STRATA_REGISTER_KERNEL("mse_loss", DEVICE_CUDA, F64, InitFactory<CudaMseLossKernel<double>>());
STRATA_REGISTER_KERNEL("mse_loss_grad", DEVICE_CUDA, F32, InitFactory<CudaMseLossGradKernel<float>>());
STRATA_REGISTER_KERNEL("mse_loss_grad", DEVICE_CUDA, F64, InitFactory<CudaMseLossGradKernel<double>>());

}  // namespace
}  // namespace strata
