// CUDA kernels of the nn ops (kernels/cuda/nn.cu): softmax, log_softmax and
// their grads, layer_norm(_grad), dropout(_grad) and embedding(_grad), with
// the dtypes, attrs, aliasing, shape checks and messages of kernels/cpu/
// softmax.cc, layer_norm.cc, dropout.cc and embedding.cc (the checks live in
// kernels/kernel_checks.h). The ids' values live on the device and are not
// read on the host: an id outside [0, V) gives NaN (kernels/cuda/nn.h) rather
// than the CPU's InvalidArgument.

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cuda/nn.h"
#include "kernels/kernel_checks.h"
#include "proto/shape_rules.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"
#include "runtime/philox.h"

namespace strata {
namespace {

using cuda::SoftmaxMode;

// Scratch of `elements` of `dtype` on the kernel's device, from its allocator
// so its counters see it; the stream-ordered allocator lets the host free it
// once the kernels that use it are enqueued.
absl::StatusOr<Tensor> DeviceScratch(const KernelContext& ctx, DataType dtype, int64_t elements) {
  if (elements == 0) return Tensor();
  Tensor t = Tensor::Empty(dtype, Shape{elements}, &ctx.device());
  if (!t.defined()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory allocating ", elements, " ", DataTypeName(dtype),
                                                     " scratch elements on ", ctx.device().name()));
  }
  return t;
}

template <typename T, SoftmaxMode kMode>
class CudaSoftmaxKernel : public OpKernel {
 public:
  static constexpr bool kGrad = kMode == SoftmaxMode::kSoftmaxGrad || kMode == SoftmaxMode::kLogSoftmaxGrad;
  static constexpr const char* kName = kMode == SoftmaxMode::kSoftmax       ? "softmax"
                                       : kMode == SoftmaxMode::kLogSoftmax  ? "log_softmax"
                                       : kMode == SoftmaxMode::kSoftmaxGrad ? "softmax_grad"
                                                                            : "log_softmax_grad";

  explicit CudaSoftmaxKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(axis_, AttrInt(op, "axis"));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& a = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(const int axis, NormalizeInputAxis(axis_, a.rank(), kGrad ? "y" : "x"));
    const T* b = nullptr;
    if constexpr (kGrad) {
      STRATA_RETURN_IF_ERROR(kernel_checks::CheckSameShapeAsY(a, ctx.input(1)));
      b = ctx.input(1).data<T>();
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * out, ctx.AllocateOutput(0, a.dtype(), a.shape()));
    int64_t M = 1, N = 1;
    for (int d = 0; d < axis; ++d) M *= a.dim(d);
    for (int d = axis + 1; d < a.rank(); ++d) N *= a.dim(d);
    return CudaStatus(cuda::LaunchSoftmax(kMode, out->data<T>(), a.data<T>(), b, M, a.dim(axis), N, device->stream()),
                      kName);
  }

 private:
  int64_t axis_ = -1;
};

using CudaLayerNormBase = EpsilonAttrKernel;

// y may be stored in BF16 / F16 for an F32 x (out_dtype: passes/fold_casts).
template <typename T>
class CudaLayerNormKernel : public StoredOutKernel<CudaLayerNormBase> {
 public:
  using StoredOutKernel<CudaLayerNormBase>::StoredOutKernel;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    const Tensor& gamma = ctx.input(1);
    const Tensor& beta = ctx.input(2);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormParam("layer_norm", x, gamma));
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormParam("layer_norm", x, beta));
    return WithStorage<T>(OutDtype<T>(), "layer_norm", "out_dtype",
                          [&](auto y) { return Run<decltype(y)>(ctx, device, x, gamma, beta); });
  }

 private:
  template <typename Y>
  absl::Status Run(KernelContext& ctx, CudaDevice* device, const Tensor& x, const Tensor& gamma, const Tensor& beta) {
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<Y>::value, x.shape()));
    const int64_t D = x.dim(x.rank() - 1), R = D == 0 ? 0 : x.num_elements() / D;
    return CudaStatus(cuda::LaunchLayerNorm(y->data<Y>(), x.data<T>(), gamma.data<T>(), beta.data<T>(), R, D, epsilon_,
                                            device->stream()),
                      "layer_norm");
  }
};

// dy may be BF16 / F16 for an F32 x (read widened: passes/fold_casts); with
// out_dtype (F32 x) dx is also stored in BF16 / F16 as output 3, dx_low, by
// the same kernel (the cast of dx it replaces, bit for bit).
template <typename T>
class CudaLayerNormGradKernel : public StoredOutKernel<CudaLayerNormBase> {
 public:
  using StoredOutKernel<CudaLayerNormBase>::StoredOutKernel;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    const Tensor& gamma = ctx.input(1);
    const Tensor& dy = ctx.input(2);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormParam("layer_norm_grad", x, gamma));
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormDy(x, dy));
    if (ctx.num_inputs() > 3) STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormResidual(x, ctx.input(3)));
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormDxLow(x, out_dtype_, ctx.num_outputs()));
    return WithStorage<T>(dy.dtype(), "layer_norm_grad", "dy",
                          [&](auto d) { return Run<decltype(d)>(ctx, device, x, gamma, dy); });
  }

 private:
  template <typename DY>
  absl::Status Run(KernelContext& ctx, CudaDevice* device, const Tensor& x, const Tensor& gamma, const Tensor& dy) {
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, x.dtype(), x.shape()));
    STRATA_ASSIGN_OR_RETURN(Tensor * dgamma, ctx.AllocateOutput(1, x.dtype(), gamma.shape()));
    STRATA_ASSIGN_OR_RETURN(Tensor * dbeta, ctx.AllocateOutput(2, x.dtype(), gamma.shape()));
    const int64_t D = x.dim(x.rank() - 1), R = D == 0 ? 0 : x.num_elements() / D;
    STRATA_ASSIGN_OR_RETURN(Tensor scratch, DeviceScratch(ctx, F64, cuda::LayerNormGradScratchDoubles(R, D)));
    const T* residual = ctx.num_inputs() > 3 ? ctx.input(3).data<T>() : nullptr;
    double* pscratch = scratch.defined() ? scratch.data<double>() : nullptr;
    if constexpr (std::is_same_v<T, float>) {
      if (out_dtype_ != DT_INVALID) {
        STRATA_ASSIGN_OR_RETURN(Tensor * dx_low, ctx.AllocateOutput(3, out_dtype_, x.shape()));
        const auto launch = [&](auto* low) {
          return CudaStatus(cuda::LaunchLayerNormGrad(dx->data<T>(), low, dgamma->data<T>(), dbeta->data<T>(),
                                                      x.data<T>(), gamma.data<T>(), dy.data<DY>(), residual, R, D,
                                                      epsilon_, pscratch, device->stream()),
                            "layer_norm_grad");
        };
        return out_dtype_ == BF16 ? launch(dx_low->data<bfloat16>()) : launch(dx_low->data<float16>());
      }
    }
    return CudaStatus(cuda::LaunchLayerNormGrad(dx->data<T>(), dgamma->data<T>(), dbeta->data<T>(), x.data<T>(),
                                                gamma.data<T>(), dy.data<DY>(), residual, R, D, epsilon_, pscratch,
                                                device->stream()),
                      "layer_norm_grad");
  }
};

// dropout (x -> y) and dropout_grad (dy -> dx): the CPU's stream
// (kernels/cpu/dropout.cc), drawn on the device from runtime/philox.h.
template <typename T>
class CudaDropoutKernel : public DropoutAttrsKernel {
 public:
  using DropoutAttrsKernel::DropoutAttrsKernel;
  absl::Status Init(const Op& op) {
    name_ = op.type();
    return DropoutAttrsKernel::Init(op);
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    const RunContext& run = ctx.run();
    if (!run.training || p_ == 0.0) {
      ctx.SetOutput(0, x);  // the identity, sharing x's buffer, as on the CPU
      return absl::OkStatus();
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), x.shape()));
    const int64_t n = x.num_elements();
    if (n == 0) return absl::OkStatus();
    const int64_t per_sample = x.rank() == 0 ? 1 : n / x.dim(0);
    const uint64_t key = MixKey(run.seed, static_cast<uint64_t>(uid_));
    cuda::DropoutCounters counters;
    counters.device = run.random_counters;
    counters.step = static_cast<uint64_t>(run.step);
    counters.base = static_cast<uint64_t>(run.sample_offset * per_sample);
    counters.per_sample = static_cast<uint64_t>(per_sample);
    return CudaStatus(cuda::LaunchDropout(y->data<T>(), x.data<T>(), n, key, counters, p_,
                                          static_cast<T>(1.0 / (1.0 - p_)), device->stream()),
                      name_.c_str());
  }

 private:
  std::string name_;
};

template <typename T>
class CudaEmbeddingKernel : public OpKernel {
 public:
  explicit CudaEmbeddingKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& ids = ctx.input(0);
    const Tensor& table = ctx.input(1);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckEmbeddingTable(table));
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckIdsDtype("embedding", ids));
    const int64_t V = table.dim(0), D = table.dim(1);
    Shape ys = ids.shape();
    ys.push_back(D);
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, table.dtype(), ys));
    return CudaStatus(cuda::LaunchEmbedding(y->data<T>(), table.data<T>(), ids.data<int64_t>(), ids.num_elements(), V,
                                            D, device->stream()),
                      "embedding");
  }
};

template <typename T>
class CudaEmbeddingGradKernel : public EmbeddingGradAttrsKernel {
 public:
  using EmbeddingGradAttrsKernel::EmbeddingGradAttrsKernel;
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& ids = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckEmbeddingGradShapes(ids, dy));
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckIdsDtype("embedding_grad", ids));
    const int64_t D = dy.dim(dy.rank() - 1), n = ids.num_elements();
    STRATA_ASSIGN_OR_RETURN(Tensor * dtable, ctx.AllocateOutput(0, dy.dtype(), Shape{vocab_, D}));
    STRATA_ASSIGN_OR_RETURN(Tensor keys, DeviceScratch(ctx, I64, cuda::EmbeddingGradScratchKeys(n)));
    return CudaStatus(cuda::LaunchEmbeddingGrad(dtable->data<T>(), dy.data<T>(), ids.data<int64_t>(), n, vocab_, D,
                                                keys.defined() ? keys.data<int64_t>() : nullptr, device->stream()),
                      "embedding_grad");
  }
};

// layer_norm_grad: each row's mean and rstd, and the per-block partial
// dgamma and dbeta (doubles); embedding_grad: the sort keys (int64, n rounded
// up to a power of two). For the memory plan.
absl::StatusOr<int64_t> LayerNormGradWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty() || def.input_types[0].shape.empty()) return int64_t{0};
  const Shape& x = def.input_types[0].shape;
  const int64_t d = x.back(), n = NumElements(x), rows = d == 0 ? 0 : n / d;
  return cuda::LayerNormGradScratchDoubles(rows, d) * static_cast<int64_t>(sizeof(double));
}
absl::StatusOr<int64_t> EmbeddingGradWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty()) return int64_t{0};
  return cuda::EmbeddingGradScratchKeys(NumElements(def.input_types[0].shape)) * static_cast<int64_t>(sizeof(int64_t));
}
STRATA_REGISTER_WORKSPACE("layer_norm_grad", DEVICE_CUDA, LayerNormGradWorkspace);
STRATA_REGISTER_WORKSPACE("embedding_grad", DEVICE_CUDA, EmbeddingGradWorkspace);

template <typename T>
using Softmax = CudaSoftmaxKernel<T, SoftmaxMode::kSoftmax>;
template <typename T>
using LogSoftmax = CudaSoftmaxKernel<T, SoftmaxMode::kLogSoftmax>;
template <typename T>
using SoftmaxGrad = CudaSoftmaxKernel<T, SoftmaxMode::kSoftmaxGrad>;
template <typename T>
using LogSoftmaxGrad = CudaSoftmaxKernel<T, SoftmaxMode::kLogSoftmaxGrad>;

STRATA_REGISTER_KERNEL("softmax", DEVICE_CUDA, F32, InitFactory<Softmax<float>>());
STRATA_REGISTER_KERNEL("softmax", DEVICE_CUDA, F64, InitFactory<Softmax<double>>());
STRATA_REGISTER_KERNEL("log_softmax", DEVICE_CUDA, F32, InitFactory<LogSoftmax<float>>());
STRATA_REGISTER_KERNEL("log_softmax", DEVICE_CUDA, F64, InitFactory<LogSoftmax<double>>());
STRATA_REGISTER_KERNEL("softmax_grad", DEVICE_CUDA, F32, InitFactory<SoftmaxGrad<float>>());
STRATA_REGISTER_KERNEL("softmax_grad", DEVICE_CUDA, F64, InitFactory<SoftmaxGrad<double>>());
STRATA_REGISTER_KERNEL("log_softmax_grad", DEVICE_CUDA, F32, InitFactory<LogSoftmaxGrad<float>>());
STRATA_REGISTER_KERNEL("log_softmax_grad", DEVICE_CUDA, F64, InitFactory<LogSoftmaxGrad<double>>());
STRATA_REGISTER_KERNEL("layer_norm", DEVICE_CUDA, F32, InitFactory<CudaLayerNormKernel<float>>());
STRATA_REGISTER_KERNEL("layer_norm", DEVICE_CUDA, F64, InitFactory<CudaLayerNormKernel<double>>());
STRATA_REGISTER_KERNEL("layer_norm_grad", DEVICE_CUDA, F32, InitFactory<CudaLayerNormGradKernel<float>>());
STRATA_REGISTER_KERNEL("layer_norm_grad", DEVICE_CUDA, F64, InitFactory<CudaLayerNormGradKernel<double>>());
STRATA_REGISTER_KERNEL("dropout", DEVICE_CUDA, F32, InitFactory<CudaDropoutKernel<float>>());
STRATA_REGISTER_KERNEL("dropout", DEVICE_CUDA, F64, InitFactory<CudaDropoutKernel<double>>());
STRATA_REGISTER_KERNEL("dropout_grad", DEVICE_CUDA, F32, InitFactory<CudaDropoutKernel<float>>());
STRATA_REGISTER_KERNEL("dropout_grad", DEVICE_CUDA, F64, InitFactory<CudaDropoutKernel<double>>());
STRATA_REGISTER_KERNEL("embedding", DEVICE_CUDA, F32, MakeFactory<CudaEmbeddingKernel<float>>());
STRATA_REGISTER_KERNEL("embedding", DEVICE_CUDA, F64, MakeFactory<CudaEmbeddingKernel<double>>());
STRATA_REGISTER_KERNEL("embedding_grad", DEVICE_CUDA, F32, InitFactory<CudaEmbeddingGradKernel<float>>());
STRATA_REGISTER_KERNEL("embedding_grad", DEVICE_CUDA, F64, InitFactory<CudaEmbeddingGradKernel<double>>());

}  // namespace
}  // namespace strata
