// CUDA kernels of the elementwise unary ops and the utilities around them:
// exp, log, neg, sqrt, square, scale, gelu (both forms), tanh, sigmoid and the gradients
// sqrt_grad, gelu_grad, tanh_grad, sigmoid_grad (gelu and gelu_grad also in
// BF16 / F16, mixed precision's; kernels/cuda/unary.cu over
// unary_math.h's functors, the CPU kernels' own math); add_n, cast,
// accumulate, fill_zero, fill_scalar; identity and the views reshape,
// flatten and reshape_like, which share the input's buffer as on the CPU
// (kernels/view_kernels.h: the same kernels). Checks and messages are the CPU
// kernels' (kernels/kernel_checks.h); each kernel enqueues on its device's
// compute stream and returns.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attr_kernels.h"
#include "kernels/cuda/binary.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/unary.h"
#include "kernels/cuda/unary_math.h"
#include "kernels/kernel_checks.h"
#include "kernels/view_kernels.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

const char* UnaryOpName(cuda::UnaryOp op) {
  switch (op) {
    case cuda::UnaryOp::kExp:
      return "exp";
    case cuda::UnaryOp::kLog:
      return "log";
    case cuda::UnaryOp::kNeg:
      return "neg";
    case cuda::UnaryOp::kSqrt:
      return "sqrt";
    case cuda::UnaryOp::kSquare:
      return "square";
    case cuda::UnaryOp::kGelu:
    case cuda::UnaryOp::kGeluTanh:
      return "gelu";
    case cuda::UnaryOp::kTanh:
      return "tanh";
    case cuda::UnaryOp::kSigmoid:
      return "sigmoid";
  }
  return "unary";
}

const char* UnaryGradOpName(cuda::UnaryGradOp op) {
  switch (op) {
    case cuda::UnaryGradOp::kSqrtGrad:
      return "sqrt_grad";
    case cuda::UnaryGradOp::kGeluGrad:
    case cuda::UnaryGradOp::kGeluTanhGrad:
      return "gelu_grad";
    case cuda::UnaryGradOp::kTanhGrad:
      return "tanh_grad";
    case cuda::UnaryGradOp::kSigmoidGrad:
      return "sigmoid_grad";
  }
  return "unary_grad";
}

// y = op(x) for the kernels below.
template <typename T>
absl::Status RunUnary(KernelContext& ctx, cuda::UnaryOp op) {
  STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
  const Tensor& x = ctx.input(0);
  STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, x.shape()));
  return CudaStatus(cuda::LaunchUnary(op, y->data<T>(), x.data<T>(), x.num_elements(), device->stream()),
                    UnaryOpName(op));
}

// dx = op(a, dy) for the kernels below.
template <typename T>
absl::Status RunUnaryGrad(KernelContext& ctx, cuda::UnaryGradOp op) {
  STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
  const Tensor& a = ctx.input(0);
  const Tensor& dy = ctx.input(1);
  STRATA_RETURN_IF_ERROR(kernel_checks::CheckSameShapes(a, dy));
  STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, DataTypeOf<T>::value, a.shape()));
  return CudaStatus(
      cuda::LaunchUnaryGrad(op, dx->data<T>(), a.data<T>(), dy.data<T>(), a.num_elements(), device->stream()),
      UnaryGradOpName(op));
}

// y = f(x), as kernels/cpu/elementwise.h's UnaryKernel.
template <typename T, cuda::UnaryOp kOp>
class CudaUnaryKernel : public OpKernel {
 public:
  explicit CudaUnaryKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override { return RunUnary<T>(ctx, kOp); }
};

// dx = f(a, dy), as kernels/cpu/elementwise.h's SameShapeBinaryKernel.
template <typename T, cuda::UnaryGradOp kOp>
class CudaUnaryGradKernel : public OpKernel {
 public:
  explicit CudaUnaryGradKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override { return RunUnaryGrad<T>(ctx, kOp); }
};

// gelu and gelu_grad: the form (approximate) read once at prepare time, then
// as CudaUnaryKernel and CudaUnaryGradKernel. A BF16 / F16 x (mixed
// precision's gelu in 16 bits, as torch autocast runs it): y of x's type,
// each element widened to float, the float functor, rounded once.
template <typename T>
class CudaGeluKernel : public GeluAttrKernel {
 public:
  using GeluAttrKernel::GeluAttrKernel;
  absl::Status Compute(KernelContext& ctx) override {
    const cuda::UnaryOp op = tanh_ ? cuda::UnaryOp::kGeluTanh : cuda::UnaryOp::kGelu;
    if constexpr (cuda::kIsHalf<T>) {
      STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
      const Tensor& x = ctx.input(0);
      STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, x.shape()));
      return CudaStatus(cuda::LaunchGeluWidened<T>(op, y->data<T>(), x.data<T>(), x.num_elements(), device->stream()),
                        "gelu");
    } else {
      return RunUnary<T>(ctx, op);
    }
  }
};

// For an F32 x, dy may be BF16 / F16 and out_dtype may store dx in BF16 /
// F16 (passes/fold_casts), as the CPU kernel. A BF16 / F16 x (mixed
// precision) takes a dy of its type and gives dx in it (the schema's rule;
// the CPU kernel refuses the rest alike).
template <typename T>
class CudaGeluGradKernel : public StoredOutKernel<GeluAttrKernel> {
 public:
  using StoredOutKernel<GeluAttrKernel>::StoredOutKernel;
  absl::Status Compute(KernelContext& ctx) override {
    const cuda::UnaryGradOp op = tanh_ ? cuda::UnaryGradOp::kGeluTanhGrad : cuda::UnaryGradOp::kGeluGrad;
    if constexpr (cuda::kIsHalf<T>) {
      STRATA_RETURN_IF_ERROR(kernel_checks::CheckHalfGeluGrad(DataTypeOf<T>::value, ctx.input(1).dtype(),
                                                              out_dtype_ != DT_INVALID));
      return Run<T, T>(ctx, op);
    } else {
      return WithStorage<T>(ctx.input(1).dtype(), "gelu_grad", "dy", [&](auto d) {
        return WithStorage<T>(OutDtype<T>(), "gelu_grad", "out_dtype",
                              [&](auto o) { return Run<decltype(d), decltype(o)>(ctx, op); });
      });
    }
  }

 private:
  // dy stored as DY, dx as DX: T's own kernel for a float or double T with
  // nothing stored apart, else the storage-templated one.
  template <typename DY, typename DX>
  absl::Status Run(KernelContext& ctx, cuda::UnaryGradOp op) {
    if constexpr (!cuda::kIsHalf<T> && std::is_same_v<DY, T> && std::is_same_v<DX, T>) {
      return RunUnaryGrad<T>(ctx, op);
    } else {
      STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
      const Tensor& x = ctx.input(0);
      const Tensor& dy = ctx.input(1);
      STRATA_RETURN_IF_ERROR(kernel_checks::CheckSameShapes(x, dy));
      STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, DataTypeOf<DX>::value, x.shape()));
      // T for a 16-bit x; float else (F64 takes the branch above: WithStorage
      // stores nothing apart for it).
      using X = std::conditional_t<cuda::kIsHalf<T>, T, float>;
      return CudaStatus(cuda::LaunchGeluGradStored<X, DY, DX>(op, dx->data<DX>(), x.data<X>(), dy.data<DY>(),
                                                              x.num_elements(), device->stream()),
                        "gelu_grad");
    }
  }
};

// y = scale * x + bias; the attrs read once and rounded to T, as on the CPU.
template <typename T>
class CudaScaleKernel : public OpKernel {
 public:
  explicit CudaScaleKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(const double scale, AttrFloat(op, "scale"));
    STRATA_ASSIGN_OR_RETURN(const double bias, AttrFloat(op, "bias"));
    scale_ = static_cast<T>(scale);
    bias_ = static_cast<T>(bias);
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, x.shape()));
    return CudaStatus(cuda::LaunchScale(y->data<T>(), x.data<T>(), scale_, bias_, x.num_elements(), device->stream()),
                      "scale");
  }

 private:
  T scale_ = T(1), bias_ = T(0);
};

// y = xs[0] + xs[1] + ... in the CPU's order; one input is passed through
// (the output shares its buffer, as on the CPU).
template <typename T>
class CudaAddNKernel : public OpKernel {
 public:
  explicit CudaAddNKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAddNShapes(ctx));
    const Tensor& first = ctx.input(0);
    const int inputs = ctx.num_inputs();
    if (inputs == 1) {
      ctx.SetOutput(0, first);
      return absl::OkStatus();
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, first.shape()));
    std::vector<const T*> xs(inputs);
    for (int i = 0; i < inputs; ++i) xs[i] = ctx.input(i).data<T>();
    if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
      // Float partial sums between launches, past kAddNPerLaunch inputs.
      Tensor acc;
      if (inputs > cuda::kAddNPerLaunch && first.num_elements() > 0) {
        acc = Tensor::Empty(F32, Shape{first.num_elements()}, &ctx.device());
        if (!acc.defined()) {
          return absl::ResourceExhaustedError(absl::StrCat("add_n: out of memory for ", first.num_elements(),
                                                           " float partial sums on ", ctx.device().name()));
        }
      }
      return CudaStatus(cuda::LaunchAddN(y->data<T>(), xs.data(), inputs, first.num_elements(),
                                         acc.defined() ? acc.data<float>() : nullptr, device->stream()),
                        "add_n");
    } else {
      return CudaStatus(cuda::LaunchAddN(y->data<T>(), xs.data(), inputs, first.num_elements(), device->stream()),
                        "add_n");
    }
  }
};

// bf16 and fp16 add_n's float partial sums, past kAddNPerLaunch inputs.
absl::StatusOr<int64_t> AddNWorkspace(const KernelDef& def, int) {
  if (def.input_types.size() <= static_cast<size_t>(cuda::kAddNPerLaunch) ||
      !IsHalfFloating(def.input_types[0].dtype)) {
    return int64_t{0};
  }
  return NumElements(def.input_types[0].shape) * static_cast<int64_t>(sizeof(float));
}
STRATA_REGISTER_WORKSPACE("add_n", DEVICE_CUDA, AddNWorkspace);

// y = x converted to D; the same dtype shares x's buffer, as on the CPU.
template <typename S, typename D>
class CudaCastKernel : public OpKernel {
 public:
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if constexpr (std::is_same_v<S, D>) {
      ctx.SetOutput(0, x);
      return absl::OkStatus();
    } else {
      STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
      STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<D>::value, x.shape()));
      return CudaStatus(cuda::LaunchCast<S, D>(y->data<D>(), x.data<S>(), x.num_elements(), device->stream()), "cast");
    }
  }
};

template <typename S>
absl::StatusOr<std::unique_ptr<OpKernel>> CreateCudaCast(const KernelDef& def) {
  STRATA_ASSIGN_OR_RETURN(const DataType dtype, kernel_checks::CastTarget(*def.op));
  switch (dtype) {
    case F32:
      return std::unique_ptr<OpKernel>(new CudaCastKernel<S, float>());
    case F64:
      return std::unique_ptr<OpKernel>(new CudaCastKernel<S, double>());
    case I64:
      return std::unique_ptr<OpKernel>(new CudaCastKernel<S, int64_t>());
    case I32:
      return std::unique_ptr<OpKernel>(new CudaCastKernel<S, int32_t>());
    case BOOL:
      return std::unique_ptr<OpKernel>(new CudaCastKernel<S, bool>());
    case BF16:
      return std::unique_ptr<OpKernel>(new CudaCastKernel<S, bfloat16>());
    case F16:
      return std::unique_ptr<OpKernel>(new CudaCastKernel<S, float16>());
    default:
      break;
  }
  return absl::InternalError("cast: CastTarget returned a dtype cast does not convert to");
}

// acc += x in place on the persistent buffer (kernels/cuda/binary.cu's add,
// z aliasing x); the output is acc itself.
template <typename T>
class CudaAccumulateKernel : public OpKernel {
 public:
  explicit CudaAccumulateKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& acc = ctx.input(0);
    const Tensor& x = ctx.input(1);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckAccumulateOperands(acc, x));
    T* a = kernel_checks::MutableData<T>(acc);  // stateful: updates the persistent buffer in place
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchBinarySameShape(cuda::BinaryOp::kAdd, a, a, x.data<T>(), acc.num_elements(), device->stream()),
        "accumulate"));
    ctx.SetOutput(0, acc);
    return absl::OkStatus();
  }
};

// x = 0 in place; the output is x itself.
class CudaFillZeroKernel : public OpKernel {
 public:
  explicit CudaFillZeroKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    if (x.bytes() > 0) {
      STRATA_RETURN_IF_ERROR(
          CudaStatus(cudaMemsetAsync(const_cast<void*>(x.raw_data()), 0, x.bytes(), device->stream()), "fill_zero"));
    }
    ctx.SetOutput(0, x);
    return absl::OkStatus();
  }
};

// A scalar of the output dtype holding attr `value`, converted on the host
// exactly as Tensor::Fill converts it on the CPU.
class CudaFillScalarKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const KernelDef& def) {
    STRATA_ASSIGN_OR_RETURN(const double value, AttrFloat(*def.op, "value"));
    STRATA_ASSIGN_OR_RETURN(const DataType dtype, kernel_checks::FillScalarDtype(def));
    Tensor one = Tensor::Empty(dtype, Shape{}, GetCpuAllocator());
    if (!one.defined()) return absl::ResourceExhaustedError("fill_scalar: out of host memory");
    one.Fill(value);
    uint64_t bits = 0;
    std::memcpy(&bits, one.raw_data(), one.bytes());
    return std::unique_ptr<OpKernel>(new CudaFillScalarKernel(dtype, bits));
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, dtype_, {}));
    return CudaStatus(
        cuda::LaunchFill(y->raw_data(), static_cast<int>(DataTypeSize(dtype_)), bits_, 1, device->stream()),
        "fill_scalar");
  }

 private:
  CudaFillScalarKernel(DataType dtype, uint64_t bits) : dtype_(dtype), bits_(bits) {}
  DataType dtype_;
  uint64_t bits_;
};

using cuda::UnaryGradOp;
using cuda::UnaryOp;
STRATA_REGISTER_KERNEL("exp", DEVICE_CUDA, F32, (MakeFactory<CudaUnaryKernel<float, UnaryOp::kExp>>()));
STRATA_REGISTER_KERNEL("exp", DEVICE_CUDA, F64, (MakeFactory<CudaUnaryKernel<double, UnaryOp::kExp>>()));
STRATA_REGISTER_KERNEL("log", DEVICE_CUDA, F32, (MakeFactory<CudaUnaryKernel<float, UnaryOp::kLog>>()));
STRATA_REGISTER_KERNEL("log", DEVICE_CUDA, F64, (MakeFactory<CudaUnaryKernel<double, UnaryOp::kLog>>()));
STRATA_REGISTER_KERNEL("neg", DEVICE_CUDA, F32, (MakeFactory<CudaUnaryKernel<float, UnaryOp::kNeg>>()));
STRATA_REGISTER_KERNEL("neg", DEVICE_CUDA, F64, (MakeFactory<CudaUnaryKernel<double, UnaryOp::kNeg>>()));
STRATA_REGISTER_KERNEL("sqrt", DEVICE_CUDA, F32, (MakeFactory<CudaUnaryKernel<float, UnaryOp::kSqrt>>()));
STRATA_REGISTER_KERNEL("sqrt", DEVICE_CUDA, F64, (MakeFactory<CudaUnaryKernel<double, UnaryOp::kSqrt>>()));
STRATA_REGISTER_KERNEL("square", DEVICE_CUDA, F32, (MakeFactory<CudaUnaryKernel<float, UnaryOp::kSquare>>()));
STRATA_REGISTER_KERNEL("square", DEVICE_CUDA, F64, (MakeFactory<CudaUnaryKernel<double, UnaryOp::kSquare>>()));
STRATA_REGISTER_KERNEL("gelu", DEVICE_CUDA, F32, InitFactory<CudaGeluKernel<float>>());
STRATA_REGISTER_KERNEL("gelu", DEVICE_CUDA, F64, InitFactory<CudaGeluKernel<double>>());
STRATA_REGISTER_KERNEL("gelu", DEVICE_CUDA, BF16, InitFactory<CudaGeluKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("gelu", DEVICE_CUDA, F16, InitFactory<CudaGeluKernel<float16>>());
STRATA_REGISTER_KERNEL("tanh", DEVICE_CUDA, F32, (MakeFactory<CudaUnaryKernel<float, UnaryOp::kTanh>>()));
STRATA_REGISTER_KERNEL("tanh", DEVICE_CUDA, F64, (MakeFactory<CudaUnaryKernel<double, UnaryOp::kTanh>>()));
STRATA_REGISTER_KERNEL("sigmoid", DEVICE_CUDA, F32, (MakeFactory<CudaUnaryKernel<float, UnaryOp::kSigmoid>>()));
STRATA_REGISTER_KERNEL("sigmoid", DEVICE_CUDA, F64, (MakeFactory<CudaUnaryKernel<double, UnaryOp::kSigmoid>>()));
STRATA_REGISTER_KERNEL("sqrt_grad", DEVICE_CUDA, F32,
                       (MakeFactory<CudaUnaryGradKernel<float, UnaryGradOp::kSqrtGrad>>()));
STRATA_REGISTER_KERNEL("sqrt_grad", DEVICE_CUDA, F64,
                       (MakeFactory<CudaUnaryGradKernel<double, UnaryGradOp::kSqrtGrad>>()));
STRATA_REGISTER_KERNEL("gelu_grad", DEVICE_CUDA, F32, InitFactory<CudaGeluGradKernel<float>>());
STRATA_REGISTER_KERNEL("gelu_grad", DEVICE_CUDA, F64, InitFactory<CudaGeluGradKernel<double>>());
STRATA_REGISTER_KERNEL("gelu_grad", DEVICE_CUDA, BF16, InitFactory<CudaGeluGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("gelu_grad", DEVICE_CUDA, F16, InitFactory<CudaGeluGradKernel<float16>>());
STRATA_REGISTER_KERNEL("tanh_grad", DEVICE_CUDA, F32,
                       (MakeFactory<CudaUnaryGradKernel<float, UnaryGradOp::kTanhGrad>>()));
STRATA_REGISTER_KERNEL("tanh_grad", DEVICE_CUDA, F64,
                       (MakeFactory<CudaUnaryGradKernel<double, UnaryGradOp::kTanhGrad>>()));
STRATA_REGISTER_KERNEL("sigmoid_grad", DEVICE_CUDA, F32,
                       (MakeFactory<CudaUnaryGradKernel<float, UnaryGradOp::kSigmoidGrad>>()));
STRATA_REGISTER_KERNEL("sigmoid_grad", DEVICE_CUDA, F64,
                       (MakeFactory<CudaUnaryGradKernel<double, UnaryGradOp::kSigmoidGrad>>()));

STRATA_REGISTER_KERNEL("scale", DEVICE_CUDA, F32, InitFactory<CudaScaleKernel<float>>());
STRATA_REGISTER_KERNEL("scale", DEVICE_CUDA, F64, InitFactory<CudaScaleKernel<double>>());
STRATA_REGISTER_KERNEL("add_n", DEVICE_CUDA, F32, MakeFactory<CudaAddNKernel<float>>());
STRATA_REGISTER_KERNEL("add_n", DEVICE_CUDA, F64, MakeFactory<CudaAddNKernel<double>>());
STRATA_REGISTER_KERNEL("add_n", DEVICE_CUDA, I64, MakeFactory<CudaAddNKernel<int64_t>>());
STRATA_REGISTER_KERNEL("add_n", DEVICE_CUDA, BF16, MakeFactory<CudaAddNKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("add_n", DEVICE_CUDA, F16, MakeFactory<CudaAddNKernel<float16>>());
STRATA_REGISTER_KERNEL("fill_scalar", DEVICE_CUDA, F32, CudaFillScalarKernel::Create);
STRATA_REGISTER_KERNEL("fill_scalar", DEVICE_CUDA, F64, CudaFillScalarKernel::Create);
STRATA_REGISTER_KERNEL("identity", DEVICE_CUDA, F32, MakeFactory<view_kernels::IdentityKernel>());
STRATA_REGISTER_KERNEL("identity", DEVICE_CUDA, F64, MakeFactory<view_kernels::IdentityKernel>());
STRATA_REGISTER_KERNEL("identity", DEVICE_CUDA, I64, MakeFactory<view_kernels::IdentityKernel>());
STRATA_REGISTER_KERNEL("identity", DEVICE_CUDA, I32, MakeFactory<view_kernels::IdentityKernel>());
STRATA_REGISTER_KERNEL("identity", DEVICE_CUDA, BOOL, MakeFactory<view_kernels::IdentityKernel>());
STRATA_REGISTER_KERNEL("accumulate", DEVICE_CUDA, F32, MakeFactory<CudaAccumulateKernel<float>>());
STRATA_REGISTER_KERNEL("accumulate", DEVICE_CUDA, F64, MakeFactory<CudaAccumulateKernel<double>>());
STRATA_REGISTER_KERNEL("fill_zero", DEVICE_CUDA, F32, MakeFactory<CudaFillZeroKernel>());
STRATA_REGISTER_KERNEL("fill_zero", DEVICE_CUDA, F64, MakeFactory<CudaFillZeroKernel>());
STRATA_REGISTER_KERNEL("cast", DEVICE_CUDA, F32, CreateCudaCast<float>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CUDA, F64, CreateCudaCast<double>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CUDA, I64, CreateCudaCast<int64_t>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CUDA, I32, CreateCudaCast<int32_t>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CUDA, BOOL, CreateCudaCast<bool>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CUDA, BF16, CreateCudaCast<bfloat16>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CUDA, F16, CreateCudaCast<float16>);
STRATA_REGISTER_KERNEL("reshape", DEVICE_CUDA, F32, InitFactory<view_kernels::ReshapeKernel>());
STRATA_REGISTER_KERNEL("reshape", DEVICE_CUDA, F64, InitFactory<view_kernels::ReshapeKernel>());
STRATA_REGISTER_KERNEL("reshape", DEVICE_CUDA, I64, InitFactory<view_kernels::ReshapeKernel>());
STRATA_REGISTER_KERNEL("flatten", DEVICE_CUDA, F32, InitFactory<view_kernels::FlattenKernel>());
STRATA_REGISTER_KERNEL("flatten", DEVICE_CUDA, F64, InitFactory<view_kernels::FlattenKernel>());
STRATA_REGISTER_KERNEL("flatten", DEVICE_CUDA, I64, InitFactory<view_kernels::FlattenKernel>());
STRATA_REGISTER_KERNEL("reshape_like", DEVICE_CUDA, F32, InitFactory<view_kernels::ReshapeLikeKernel>());
STRATA_REGISTER_KERNEL("reshape_like", DEVICE_CUDA, F64, InitFactory<view_kernels::ReshapeLikeKernel>());
STRATA_REGISTER_KERNEL("reshape_like", DEVICE_CUDA, I64, InitFactory<view_kernels::ReshapeLikeKernel>());
STRATA_REGISTER_KERNEL("reshape", DEVICE_CUDA, BF16, InitFactory<view_kernels::ReshapeKernel>());
STRATA_REGISTER_KERNEL("reshape", DEVICE_CUDA, F16, InitFactory<view_kernels::ReshapeKernel>());
STRATA_REGISTER_KERNEL("flatten", DEVICE_CUDA, BF16, InitFactory<view_kernels::FlattenKernel>());
STRATA_REGISTER_KERNEL("flatten", DEVICE_CUDA, F16, InitFactory<view_kernels::FlattenKernel>());
STRATA_REGISTER_KERNEL("reshape_like", DEVICE_CUDA, BF16, InitFactory<view_kernels::ReshapeLikeKernel>());
STRATA_REGISTER_KERNEL("reshape_like", DEVICE_CUDA, F16, InitFactory<view_kernels::ReshapeLikeKernel>());

}  // namespace
}  // namespace strata
