// CUDA kernels of the losses and metrics (kernels/cuda/losses.cu):
// softmax_cross_entropy, softmax_cross_entropy_grad and accuracy. The shape
// and dtype checks and their messages are kernels/cpu/losses.cc's; the
// labels' values live on the device and are not read on the host, so a label
// outside [0, C) gives NaN rather than the CPU's InvalidArgument
// (kernels/cuda/losses.h). softmax_cross_entropy and its backward also take
// BF16 / F16 logits (mixed precision): the loss and dloss are F32, dlogits
// the logits' type.

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cuda/losses.h"
#include "kernels/kernel_checks.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

using kernel_checks::CheckLogitsAndLabelShapes;

// R doubles of device scratch (one per row), from the device's allocator so
// its counters see them; the stream-ordered allocator lets the host free it
// once the kernels that use it are enqueued.
absl::StatusOr<Tensor> RowScratch(const KernelContext& ctx, int64_t rows) {
  if (rows == 0) return Tensor();
  Tensor t = Tensor::Empty(F64, Shape{rows}, &ctx.device());
  if (!t.defined()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory allocating ", rows, " F64 scratch elements on ", ctx.device().name()));
  }
  return t;
}

// The loss's (and dloss's) C++ type for logits of type T: float for 16-bit
// logits, else T (the schema's rule).
template <typename T>
using LossType = std::conditional_t<std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>, float, T>;

template <typename T>
constexpr DataType LossDtypeOf() {
  return std::is_same_v<LossType<T>, double> ? F64 : F32;
}

template <typename T>
class CudaSoftmaxCrossEntropyKernel : public ClassesAttrKernel {
 public:
  explicit CudaSoftmaxCrossEntropyKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& logits = ctx.input(0);
    int64_t R, C;
    STRATA_RETURN_IF_ERROR(CheckLogitsAndLabelShapes("softmax_cross_entropy", logits, ctx.input(1), &R, &C));
    STRATA_ASSIGN_OR_RETURN(const int64_t V, Classes("softmax_cross_entropy", C));
    STRATA_ASSIGN_OR_RETURN(Tensor * loss, ctx.AllocateOutput(0, LossDtypeOf<T>(), Shape{}));
    STRATA_ASSIGN_OR_RETURN(Tensor row_loss, RowScratch(ctx, R));
    return CudaStatus(cuda::LaunchSoftmaxCrossEntropy(loss->data<LossType<T>>(), logits.data<T>(),
                                                      ctx.input(1).data<int64_t>(), R, C, V, row_loss.data<double>(),
                                                      device->stream()),
                      "softmax_cross_entropy");
  }
};

// in_place: dlogits over the logits' buffer; each thread reads a value
// before it writes it, after the row's sums (losses.cu), so the numbers are
// the out-of-place ones.
template <typename T>
class CudaSoftmaxCrossEntropyGradKernel : public CrossEntropyGradAttrsKernel {
 public:
  explicit CudaSoftmaxCrossEntropyGradKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& logits = ctx.input(0);
    const Tensor& dloss = ctx.input(2);
    int64_t R, C;
    STRATA_RETURN_IF_ERROR(CheckLogitsAndLabelShapes("softmax_cross_entropy_grad", logits, ctx.input(1), &R, &C));
    STRATA_ASSIGN_OR_RETURN(const int64_t V, Classes("softmax_cross_entropy_grad", C));
    if (dloss.num_elements() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("softmax_cross_entropy_grad: dloss must be a scalar, got ",
                                                     ShapeString(dloss.shape())));
    }
    if (dloss.dtype() != LossDtypeOf<T>()) {
      return absl::InvalidArgumentError(absl::StrCat("softmax_cross_entropy_grad: dloss must be ",
                                                     DataTypeName(LossDtypeOf<T>()), " for ",
                                                     DataTypeName(logits.dtype()), " logits, got ",
                                                     DataTypeName(dloss.dtype())));
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * dlogits, Dlogits(ctx, logits, in_place_));
    return CudaStatus(
        cuda::LaunchSoftmaxCrossEntropyGrad(dlogits->data<T>(), logits.data<T>(), ctx.input(1).data<int64_t>(),
                                            dloss.data<LossType<T>>(), R, C, V, device->stream()),
        "softmax_cross_entropy_grad");
  }
};

template <typename T>
class CudaAccuracyKernel : public OpKernel {
 public:
  explicit CudaAccuracyKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(k_, AttrInt(op, "k"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& logits = ctx.input(0);
    int64_t R, C;
    STRATA_RETURN_IF_ERROR(CheckLogitsAndLabelShapes("accuracy", logits, ctx.input(1), &R, &C));
    STRATA_ASSIGN_OR_RETURN(Tensor * acc, ctx.AllocateOutput(0, logits.dtype(), Shape{}));
    STRATA_ASSIGN_OR_RETURN(Tensor row_correct, RowScratch(ctx, R));
    return CudaStatus(cuda::LaunchAccuracy(acc->data<T>(), logits.data<T>(), ctx.input(1).data<int64_t>(), R, C, k_,
                                           row_correct.data<double>(), device->stream()),
                      "accuracy");
  }

 private:
  int64_t k_ = 1;
};

// One double per row (all dims of logits but the last), for the memory plan.
absl::StatusOr<int64_t> RowScratchWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty() || def.input_types[0].shape.empty()) return int64_t{0};
  const Shape& logits = def.input_types[0].shape;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < logits.size(); ++d) rows *= logits[d];
  return rows * static_cast<int64_t>(sizeof(double));
}
STRATA_REGISTER_WORKSPACE("softmax_cross_entropy", DEVICE_CUDA, RowScratchWorkspace);
STRATA_REGISTER_WORKSPACE("accuracy", DEVICE_CUDA, RowScratchWorkspace);

STRATA_REGISTER_KERNEL("softmax_cross_entropy", DEVICE_CUDA, F32,
                       InitFactory<CudaSoftmaxCrossEntropyKernel<float>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy", DEVICE_CUDA, F64,
                       InitFactory<CudaSoftmaxCrossEntropyKernel<double>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy_grad", DEVICE_CUDA, F32,
                       InitFactory<CudaSoftmaxCrossEntropyGradKernel<float>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy_grad", DEVICE_CUDA, F64,
                       InitFactory<CudaSoftmaxCrossEntropyGradKernel<double>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy", DEVICE_CUDA, BF16,
                       InitFactory<CudaSoftmaxCrossEntropyKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy", DEVICE_CUDA, F16,
                       InitFactory<CudaSoftmaxCrossEntropyKernel<float16>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy_grad", DEVICE_CUDA, BF16,
                       InitFactory<CudaSoftmaxCrossEntropyGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy_grad", DEVICE_CUDA, F16,
                       InitFactory<CudaSoftmaxCrossEntropyGradKernel<float16>>());
STRATA_REGISTER_KERNEL("accuracy", DEVICE_CUDA, F32, InitFactory<CudaAccuracyKernel<float>>());
STRATA_REGISTER_KERNEL("accuracy", DEVICE_CUDA, F64, InitFactory<CudaAccuracyKernel<double>>());

}  // namespace
}  // namespace strata
