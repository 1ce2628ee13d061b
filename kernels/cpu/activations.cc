// relu, gelu, tanh, sigmoid and their backward helpers.
// Threads: UnaryMap / BinaryMap split the flat element range into contiguous
// chunks of kElementwiseMinChunk or more.

#include <cmath>
#include <type_traits>

#include "kernels/attr_kernels.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/kernel_checks.h"
#include "kernels/cuda/unary_math.h"

namespace strata {
namespace {

struct ReluFn {
  // std::max keeps nan as nan, like torch.
  template <typename T>
  T operator()(T x) const { return std::max(x, T(0)); }
};
struct ReluGradFn {
  template <typename T>
  T operator()(T y, T dy) const { return y > T(0) ? dy : T(0); }
};

// gelu (the exact erf form, or the tanh form), tanh, sigmoid and their
// gradients: the math is kernels/cuda/unary_math.h's, shared with the CUDA
// kernels.
using cuda::GeluFn;
using cuda::GeluGradFn;
using cuda::GeluTanhFn;
using cuda::GeluTanhGradFn;
using cuda::SigmoidFn;
using cuda::SigmoidGradFn;
using cuda::TanhFn;
using cuda::TanhGradFn;

// gelu's form is read once at prepare time. X: x's and y's storage; a
// BF16 / F16 x (mixed precision runs gelu in the low dtype) is widened, the
// float functor applied and y rounded once as the cast kernel rounds.
template <typename T, typename X = T>
class GeluKernel : public GeluAttrKernel {
 public:
  using GeluAttrKernel::GeluAttrKernel;
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<X>::value, x.shape()));
    if (tanh_) {
      UnaryMap(x.num_elements(), x.data<X>(), y->data<X>(), Widened(GeluTanhFn()));
    } else {
      UnaryMap(x.num_elements(), x.data<X>(), y->data<X>(), Widened(GeluFn()));
    }
    return absl::OkStatus();
  }

 private:
  // f on x widened to T, stored as X (for X = T, f itself).
  template <typename F>
  static auto Widened(F f) {
    return [f](X x) { return cuda::Convert<X>(f(cuda::Convert<T>(x))); };
  }
};

// gelu_grad: for an F32 x, dy may be BF16 / F16 (read widened) and
// out_dtype may store dx in BF16 / F16 (the float result rounded as the cast
// kernel rounds it), so the op equals cast, gelu_grad, cast bit for bit
// (passes/fold_casts). X: x's storage; a BF16 / F16 x takes a dy of its
// type and gives dx in it (the schema's rule), the math in T on the widened
// values.
template <typename T, typename X = T>
class GeluGradKernel : public StoredOutKernel<GeluAttrKernel> {
 public:
  using StoredOutKernel<GeluAttrKernel>::StoredOutKernel;
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckSameShapes(x, dy));
    if constexpr (!std::is_same_v<X, T>) {
      STRATA_RETURN_IF_ERROR(kernel_checks::CheckHalfGeluGrad(x.dtype(), dy.dtype(), out_dtype_ != DT_INVALID));
      return Run<X, X>(ctx, x, dy);
    } else {
      return WithStorage<T>(dy.dtype(), "gelu_grad", "dy", [&](auto d) {
        return WithStorage<T>(OutDtype<T>(), "gelu_grad", "out_dtype",
                              [&](auto o) { return Run<decltype(d), decltype(o)>(ctx, x, dy); });
      });
    }
  }

 private:
  template <typename DY, typename DX>
  absl::Status Run(KernelContext& ctx, const Tensor& x, const Tensor& dy) {
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, DataTypeOf<DX>::value, x.shape()));
    if (tanh_) {
      BinaryMap(x.num_elements(), x.data<X>(), dy.data<DY>(), dx->data<DX>(), Stored<DX>(GeluTanhGradFn()));
    } else {
      BinaryMap(x.num_elements(), x.data<X>(), dy.data<DY>(), dx->data<DX>(), Stored<DX>(GeluGradFn()));
    }
    return absl::OkStatus();
  }

  // f on x and dy widened to T, its result stored as DX (for X = DY = DX =
  // T, f itself).
  template <typename DX, typename F>
  static auto Stored(F f) {
    return [f](X x, auto dy) { return cuda::Convert<DX>(f(cuda::Convert<T>(x), cuda::Convert<T>(dy))); };
  }
};

STRATA_REGISTER_KERNEL("relu", DEVICE_CPU, F32, (MakeFactory<UnaryKernel<float, ReluFn>>()));
STRATA_REGISTER_KERNEL("relu", DEVICE_CPU, F64, (MakeFactory<UnaryKernel<double, ReluFn>>()));
STRATA_REGISTER_KERNEL("relu_grad", DEVICE_CPU, F32, (MakeFactory<SameShapeBinaryKernel<float, ReluGradFn>>()));
STRATA_REGISTER_KERNEL("relu_grad", DEVICE_CPU, F64, (MakeFactory<SameShapeBinaryKernel<double, ReluGradFn>>()));
STRATA_REGISTER_KERNEL("gelu", DEVICE_CPU, F32, InitFactory<GeluKernel<float>>());
STRATA_REGISTER_KERNEL("gelu", DEVICE_CPU, F64, InitFactory<GeluKernel<double>>());
STRATA_REGISTER_KERNEL("gelu_grad", DEVICE_CPU, F32, InitFactory<GeluGradKernel<float>>());
STRATA_REGISTER_KERNEL("gelu_grad", DEVICE_CPU, F64, InitFactory<GeluGradKernel<double>>());
STRATA_REGISTER_KERNEL("gelu", DEVICE_CPU, BF16, (InitFactory<GeluKernel<float, bfloat16>>()));
STRATA_REGISTER_KERNEL("gelu", DEVICE_CPU, F16, (InitFactory<GeluKernel<float, float16>>()));
STRATA_REGISTER_KERNEL("gelu_grad", DEVICE_CPU, BF16, (InitFactory<GeluGradKernel<float, bfloat16>>()));
STRATA_REGISTER_KERNEL("gelu_grad", DEVICE_CPU, F16, (InitFactory<GeluGradKernel<float, float16>>()));
STRATA_REGISTER_KERNEL("tanh", DEVICE_CPU, F32, (MakeFactory<UnaryKernel<float, TanhFn>>()));
STRATA_REGISTER_KERNEL("tanh", DEVICE_CPU, F64, (MakeFactory<UnaryKernel<double, TanhFn>>()));
STRATA_REGISTER_KERNEL("tanh_grad", DEVICE_CPU, F32, (MakeFactory<SameShapeBinaryKernel<float, TanhGradFn>>()));
STRATA_REGISTER_KERNEL("tanh_grad", DEVICE_CPU, F64, (MakeFactory<SameShapeBinaryKernel<double, TanhGradFn>>()));
STRATA_REGISTER_KERNEL("sigmoid", DEVICE_CPU, F32, (MakeFactory<UnaryKernel<float, SigmoidFn>>()));
STRATA_REGISTER_KERNEL("sigmoid", DEVICE_CPU, F64, (MakeFactory<UnaryKernel<double, SigmoidFn>>()));
STRATA_REGISTER_KERNEL("sigmoid_grad", DEVICE_CPU, F32, (MakeFactory<SameShapeBinaryKernel<float, SigmoidGradFn>>()));
STRATA_REGISTER_KERNEL("sigmoid_grad", DEVICE_CPU, F64, (MakeFactory<SameShapeBinaryKernel<double, SigmoidGradFn>>()));

}  // namespace
}  // namespace strata
