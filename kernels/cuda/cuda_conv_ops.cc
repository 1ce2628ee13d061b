// CUDA kernels of the pooling ops (kernels/cuda/pool.cu): max_pool2d,
// avg_pool2d and their grads, with the dtypes, attrs, shape checks and
// messages of kernels/cpu/pool2d.cc (the attrs and checks live in
// kernels/pool2d_attrs.h) and its numbers bit for bit.
//
// conv2d, conv2d_grad_input and conv2d_grad_filter by cuDNN's legacy API,
// with the dtypes, attrs, checks and messages of kernels/cpu/conv2d.cc
// (kernels/conv2d_geometry.h). Deterministic algorithms only: forward
// IMPLICIT_PRECOMP_GEMM (IMPLICIT_GEMM where cuDNN does not support it for
// the shape), backward data ALGO_1, backward filter ALGO_1; CUDNN_FMA_MATH
// in F32 and F64 (no TF32 or other tensor-core rounding). BF16 and F16
// (mixed precision) store x, w, y and the gradients in 16 bits with the
// convolution's compute type CUDNN_DATA_FLOAT (products and sums in float,
// one rounding on the way out, as the CPU's widened kernels) and
// CUDNN_TENSOR_OP_MATH: tensor cores take 16-bit operands exactly, so they
// add no rounding of their own. One cuDNN handle per kernel, set
// to the device's stream at each call; the workspace cuDNN asks for is drawn
// from the device's allocator and declared to the memory plan.

#include <cudnn.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/conv2d_geometry.h"
#include "kernels/cuda/pool.h"
#include "kernels/pool2d_attrs.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/float16.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

using pool2d::PoolAttrs;
using pool2d::PoolGeometry;

cuda::Pool2dShape ShapeOf(const PoolGeometry& g) {
  return {g.planes, g.h, g.w, g.ho, g.wo, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw};
}

using CudaPoolKernel = pool2d::PoolAttrsKernel;

// y [N, C, Ho, Wo] = max (kMax) or mean over each window of x [N, C, H, W].
template <typename T, bool kMax>
class CudaPool2dKernel : public CudaPoolKernel {
 public:
  using CudaPoolKernel::CudaPoolKernel;

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    const char* name = kMax ? "max_pool2d" : "avg_pool2d";
    STRATA_ASSIGN_OR_RETURN(PoolGeometry g, attrs_.Geometry(x.shape(), name));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), Shape{x.dim(0), x.dim(1), g.ho, g.wo}));
    if constexpr (kMax) {
      return CudaStatus(cuda::LaunchMaxPool2d(y->data<T>(), x.data<T>(), ShapeOf(g), device->stream()), name);
    } else {
      return CudaStatus(
          cuda::LaunchAvgPool2d(y->data<T>(), x.data<T>(), ShapeOf(g), attrs_.exclusive, device->stream()), name);
    }
  }
};

// dx [N, C, H, W]: each dy to its window's maximum in x.
template <typename T>
class CudaMaxPool2dGradKernel : public CudaPoolKernel {
 public:
  using CudaPoolKernel::CudaPoolKernel;

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(PoolGeometry g, pool2d::MaxPoolGradGeometry(attrs_, x, dy));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, x.dtype(), x.shape()));
    return CudaStatus(
        cuda::LaunchMaxPool2dGrad(dx->data<T>(), x.data<T>(), dy.data<T>(), ShapeOf(g), device->stream()),
        "max_pool2d_grad");
  }
};

// dx [N, C, input_size]: each dy spread evenly over its window.
template <typename T>
class CudaAvgPool2dGradKernel : public CudaPoolKernel {
 public:
  using CudaPoolKernel::CudaPoolKernel;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(CudaPoolKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(input_size_, AttrInts(op, "input_size"));
    if (input_size_.size() != 2) {
      return absl::InternalError(absl::StrCat(op.type(), ": attr 'input_size' was not validated"));
    }
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& dy = ctx.input(0);
    Shape xs;
    STRATA_ASSIGN_OR_RETURN(PoolGeometry g, pool2d::AvgPoolGradGeometry(attrs_, input_size_, dy, &xs));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, dy.dtype(), xs));
    return CudaStatus(
        cuda::LaunchAvgPool2dGrad(dx->data<T>(), dy.data<T>(), ShapeOf(g), attrs_.exclusive, device->stream()),
        "avg_pool2d_grad");
  }

 private:
  std::vector<int64_t> input_size_;
};

template <typename T>
using CudaMaxPool2dKernel = CudaPool2dKernel<T, true>;
template <typename T>
using CudaAvgPool2dKernel = CudaPool2dKernel<T, false>;

STRATA_REGISTER_KERNEL("max_pool2d", DEVICE_CUDA, F32, InitFactory<CudaMaxPool2dKernel<float>>());
STRATA_REGISTER_KERNEL("max_pool2d", DEVICE_CUDA, F64, InitFactory<CudaMaxPool2dKernel<double>>());
STRATA_REGISTER_KERNEL("max_pool2d_grad", DEVICE_CUDA, F32, InitFactory<CudaMaxPool2dGradKernel<float>>());
STRATA_REGISTER_KERNEL("max_pool2d_grad", DEVICE_CUDA, F64, InitFactory<CudaMaxPool2dGradKernel<double>>());
STRATA_REGISTER_KERNEL("avg_pool2d", DEVICE_CUDA, F32, InitFactory<CudaAvgPool2dKernel<float>>());
STRATA_REGISTER_KERNEL("avg_pool2d", DEVICE_CUDA, F64, InitFactory<CudaAvgPool2dKernel<double>>());
STRATA_REGISTER_KERNEL("avg_pool2d_grad", DEVICE_CUDA, F32, InitFactory<CudaAvgPool2dGradKernel<float>>());
STRATA_REGISTER_KERNEL("avg_pool2d_grad", DEVICE_CUDA, F64, InitFactory<CudaAvgPool2dGradKernel<double>>());


// ---------------------------------------------------------------- conv2d

using conv2d::ConvAttrs;
using conv2d::ConvGeometry;

enum class ConvPass { kForward, kGradInput, kGradFilter };

const char* PassName(ConvPass pass) {
  return pass == ConvPass::kForward     ? "conv2d"
         : pass == ConvPass::kGradInput ? "conv2d_grad_input"
                                        : "conv2d_grad_filter";
}

absl::Status CudnnStatus(cudnnStatus_t status, const char* op, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(op, ": ", what, ": ", cudnnGetErrorString(status)));
}

#define STRATA_CUDNN(call, op) STRATA_RETURN_IF_ERROR(CudnnStatus((call), (op), #call))

// The four descriptors of one convolution; destroyed with it.
struct ConvDescriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  size_t workspace_bytes = 0;

  ConvDescriptors() = default;
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;
  ~ConvDescriptors() {
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
    if (y != nullptr) cudnnDestroyTensorDescriptor(y);
    if (w != nullptr) cudnnDestroyFilterDescriptor(w);
    if (conv != nullptr) cudnnDestroyConvolutionDescriptor(conv);
  }
};

bool FitsInt(const ConvGeometry& g) {
  for (int64_t v : {g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.ho, g.wo, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.groups}) {
    if (v > INT32_MAX) return false;
  }
  return true;
}

// Sets up the descriptors of `g` for `pass` and finds its algorithm's
// workspace size (the same choice in the kernel and in the memory plan).
// Only for a non-empty convolution (g.n >= 1).
absl::Status Describe(cudnnHandle_t handle, const ConvGeometry& g, DataType dtype, ConvPass pass,
                      ConvDescriptors* d) {
  const char* op = PassName(pass);
  if (!FitsInt(g)) return absl::InvalidArgumentError(absl::StrCat(op, ": a dimension exceeds cuDNN's int range"));
  cudnnDataType_t type;  // of x, w and y
  switch (dtype) {
    case F64: type = CUDNN_DATA_DOUBLE; break;
    case F32: type = CUDNN_DATA_FLOAT; break;
    case BF16: type = CUDNN_DATA_BFLOAT16; break;
    case F16: type = CUDNN_DATA_HALF; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": cuDNN convolutions take F32, F64, BF16 or F16, got ", DataTypeName(dtype)));
  }
  const bool half = dtype == BF16 || dtype == F16;
  // The 16-bit types multiply and sum in float; F32 and F64 in their own type.
  const cudnnDataType_t compute = dtype == F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  STRATA_CUDNN(cudnnCreateTensorDescriptor(&d->x), op);
  STRATA_CUDNN(cudnnCreateTensorDescriptor(&d->y), op);
  STRATA_CUDNN(cudnnCreateFilterDescriptor(&d->w), op);
  STRATA_CUDNN(cudnnCreateConvolutionDescriptor(&d->conv), op);
  STRATA_CUDNN(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, type, static_cast<int>(g.n),
                                          static_cast<int>(g.c), static_cast<int>(g.h), static_cast<int>(g.w)),
               op);
  STRATA_CUDNN(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, type, static_cast<int>(g.n),
                                          static_cast<int>(g.o), static_cast<int>(g.ho), static_cast<int>(g.wo)),
               op);
  STRATA_CUDNN(cudnnSetFilter4dDescriptor(d->w, type, CUDNN_TENSOR_NCHW, static_cast<int>(g.o),
                                          static_cast<int>(g.c / g.groups), static_cast<int>(g.kh),
                                          static_cast<int>(g.kw)),
               op);
  STRATA_CUDNN(cudnnSetConvolution2dDescriptor(d->conv, static_cast<int>(g.ph), static_cast<int>(g.pw),
                                               static_cast<int>(g.sh), static_cast<int>(g.sw),
                                               static_cast<int>(g.dh), static_cast<int>(g.dw),
                                               CUDNN_CROSS_CORRELATION, compute),
               op);
  STRATA_CUDNN(cudnnSetConvolutionMathType(d->conv, half ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH), op);
  STRATA_CUDNN(cudnnSetConvolutionGroupCount(d->conv, static_cast<int>(g.groups)), op);
  switch (pass) {
    case ConvPass::kForward: {
      d->fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
      cudnnStatus_t st =
          cudnnGetConvolutionForwardWorkspaceSize(handle, d->x, d->w, d->conv, d->y, d->fwd, &d->workspace_bytes);
      // cuDNN 9 refines NOT_SUPPORTED into sub-codes (3001-3014: data type, layout, shape, ...).
      if (CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED) {
        d->fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
        st = cudnnGetConvolutionForwardWorkspaceSize(handle, d->x, d->w, d->conv, d->y, d->fwd, &d->workspace_bytes);
      }
      return CudnnStatus(st, op, "cudnnGetConvolutionForwardWorkspaceSize");
    }
    case ConvPass::kGradInput:
      STRATA_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d->w, d->y, d->conv, d->x,
                                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
                                                                &d->workspace_bytes),
                   op);
      return absl::OkStatus();
    case ConvPass::kGradFilter:
      STRATA_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, d->x, d->y, d->conv, d->w,
                                                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
                                                                  &d->workspace_bytes),
                   op);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// A cuDNN handle for the memory plan's workspace queries (no stream work).
absl::StatusOr<cudnnHandle_t> PlanHandle() {
  static std::once_flag once;
  static cudnnHandle_t handle = nullptr;
  static cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  std::call_once(once, [] { status = cudnnCreate(&handle); });
  if (status != CUDNN_STATUS_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudnnCreate: ", cudnnGetErrorString(status),
                     " (cuDNN sizes a convolution's workspace on a GPU: plan on the GPU machine, or with strata, "
                     "which leaves the kernels' scratch out)"));
  }
  return handle;
}

absl::StatusOr<int64_t> CudaConvWorkspace(const KernelDef& def, int) {
  STRATA_ASSIGN_OR_RETURN(ConvGeometry g, conv2d::DefGeometry(def));
  if (g.n == 0) return int64_t{0};
  const std::string& type = def.op->type();
  const ConvPass pass = type == "conv2d"              ? ConvPass::kForward
                        : type == "conv2d_grad_input" ? ConvPass::kGradInput
                                                      : ConvPass::kGradFilter;
  STRATA_ASSIGN_OR_RETURN(cudnnHandle_t handle, PlanHandle());
  ConvDescriptors d;
  STRATA_RETURN_IF_ERROR(Describe(handle, g, def.input_types[0].dtype, pass, &d));
  return static_cast<int64_t>((d.workspace_bytes + 7) / 8 * 8);  // the kernel draws whole int64s
}

STRATA_REGISTER_WORKSPACE("conv2d", DEVICE_CUDA, CudaConvWorkspace);
STRATA_REGISTER_WORKSPACE("conv2d_grad_input", DEVICE_CUDA, CudaConvWorkspace);
STRATA_REGISTER_WORKSPACE("conv2d_grad_filter", DEVICE_CUDA, CudaConvWorkspace);

// The three conv kernels: attrs, the two-int size attr of the backward ops,
// and the kernel's cuDNN handle (created at the first call).
template <typename T, ConvPass kPass>
class CudaConvKernel : public OpKernel {
 public:
  explicit CudaConvKernel(const KernelDef&) {}
  ~CudaConvKernel() override {
    if (handle_ != nullptr) cudnnDestroy(handle_);
  }
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(conv2d::ReadConvAttrs(op, &attrs_));
    if (kPass != ConvPass::kForward) {
      const char* name = kPass == ConvPass::kGradInput ? "input_size" : "filter_size";
      STRATA_ASSIGN_OR_RETURN(size_, AttrInts(op, name));
      if (size_.size() != 2) {
        return absl::InternalError(absl::StrCat(op.type(), ": attr '", name, "' was not validated"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const char* op = PassName(kPass);
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    ConvGeometry g;
    Shape out_shape;
    if (kPass == ConvPass::kForward) {
      STRATA_ASSIGN_OR_RETURN(g, conv2d::MakeGeometry(attrs_, a.shape(), b.shape(), "conv2d"));
      out_shape = Shape{g.n, g.o, g.ho, g.wo};
    } else if (kPass == ConvPass::kGradInput) {
      STRATA_ASSIGN_OR_RETURN(g, conv2d::GradInputGeometry(attrs_, size_, a, b));
      out_shape = Shape{g.n, g.c, g.h, g.w};
    } else {
      STRATA_ASSIGN_OR_RETURN(g, conv2d::GradFilterGeometry(attrs_, size_, a, b));
      out_shape = Shape{g.o, g.c / g.groups, g.kh, g.kw};
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * out, ctx.AllocateOutput(0, a.dtype(), out_shape));
    if (g.n == 0) {
      // No images: an empty y or dx, a zero dw (the CPU's).
      if (out->num_elements() == 0) return absl::OkStatus();
      return CudaStatus(cudaMemsetAsync(out->data<T>(), 0, out->num_elements() * sizeof(T), device->stream()), op);
    }
    if (handle_ == nullptr) STRATA_CUDNN(cudnnCreate(&handle_), op);
    STRATA_CUDNN(cudnnSetStream(handle_, device->stream()), op);
    ConvDescriptors d;
    STRATA_RETURN_IF_ERROR(Describe(handle_, g, a.dtype(), kPass, &d));
    Tensor workspace;
    if (d.workspace_bytes > 0) {
      workspace = Tensor::Empty(I64, Shape{static_cast<int64_t>((d.workspace_bytes + 7) / 8)}, &ctx.device());
      if (!workspace.defined()) {
        return absl::ResourceExhaustedError(absl::StrCat(op, ": out of memory allocating ", d.workspace_bytes,
                                                         " bytes of cuDNN workspace on ", ctx.device().name()));
      }
    }
    void* ws = d.workspace_bytes > 0 ? workspace.raw_data() : nullptr;
    // cuDNN's alpha and beta are double for double data, float otherwise (the 16-bit types included).
    using Scale = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const Scale one = 1, zero = 0;
    if (kPass == ConvPass::kForward) {
      STRATA_CUDNN(cudnnConvolutionForward(handle_, &one, d.x, a.data<T>(), d.w, b.data<T>(), d.conv, d.fwd, ws,
                                           d.workspace_bytes, &zero, d.y, out->data<T>()),
                   op);
    } else if (kPass == ConvPass::kGradInput) {
      STRATA_CUDNN(cudnnConvolutionBackwardData(handle_, &one, d.w, b.data<T>(), d.y, a.data<T>(), d.conv,
                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, ws, d.workspace_bytes, &zero, d.x,
                                                out->data<T>()),
                   op);
    } else {
      STRATA_CUDNN(cudnnConvolutionBackwardFilter(handle_, &one, d.x, a.data<T>(), d.y, b.data<T>(), d.conv,
                                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, ws, d.workspace_bytes, &zero,
                                                  d.w, out->data<T>()),
                   op);
    }
    return absl::OkStatus();
  }

 private:
  ConvAttrs attrs_;
  std::vector<int64_t> size_;
  cudnnHandle_t handle_ = nullptr;
};

template <typename T>
using CudaConv2dKernel = CudaConvKernel<T, ConvPass::kForward>;
template <typename T>
using CudaConv2dGradInputKernel = CudaConvKernel<T, ConvPass::kGradInput>;
template <typename T>
using CudaConv2dGradFilterKernel = CudaConvKernel<T, ConvPass::kGradFilter>;

STRATA_REGISTER_KERNEL("conv2d", DEVICE_CUDA, F32, InitFactory<CudaConv2dKernel<float>>());
STRATA_REGISTER_KERNEL("conv2d", DEVICE_CUDA, F64, InitFactory<CudaConv2dKernel<double>>());
STRATA_REGISTER_KERNEL("conv2d_grad_input", DEVICE_CUDA, F32, InitFactory<CudaConv2dGradInputKernel<float>>());
STRATA_REGISTER_KERNEL("conv2d_grad_input", DEVICE_CUDA, F64, InitFactory<CudaConv2dGradInputKernel<double>>());
STRATA_REGISTER_KERNEL("conv2d_grad_filter", DEVICE_CUDA, F32, InitFactory<CudaConv2dGradFilterKernel<float>>());
STRATA_REGISTER_KERNEL("conv2d_grad_filter", DEVICE_CUDA, F64, InitFactory<CudaConv2dGradFilterKernel<double>>());
STRATA_REGISTER_KERNEL("conv2d", DEVICE_CUDA, BF16, InitFactory<CudaConv2dKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("conv2d", DEVICE_CUDA, F16, InitFactory<CudaConv2dKernel<float16>>());
STRATA_REGISTER_KERNEL("conv2d_grad_input", DEVICE_CUDA, BF16, InitFactory<CudaConv2dGradInputKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("conv2d_grad_input", DEVICE_CUDA, F16, InitFactory<CudaConv2dGradInputKernel<float16>>());
STRATA_REGISTER_KERNEL("conv2d_grad_filter", DEVICE_CUDA, BF16, InitFactory<CudaConv2dGradFilterKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("conv2d_grad_filter", DEVICE_CUDA, F16, InitFactory<CudaConv2dGradFilterKernel<float16>>());

}  // namespace
}  // namespace strata
