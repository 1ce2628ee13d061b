// relu, gelu, tanh, sigmoid and their backward helpers.
// Threads: UnaryMap / BinaryMap split the flat element range into contiguous
// chunks of kElementwiseMinChunk or more.

#include <cmath>

#include "kernels/attr_kernels.h"
#include "kernels/cpu/elementwise.h"
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

// gelu's form is read once at prepare time.
template <typename T>
class GeluKernel : public GeluAttrKernel {
 public:
  using GeluAttrKernel::GeluAttrKernel;
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, x.shape()));
    if (tanh_) {
      UnaryMap(x.num_elements(), x.data<T>(), y->data<T>(), GeluTanhFn());
    } else {
      UnaryMap(x.num_elements(), x.data<T>(), y->data<T>(), GeluFn());
    }
    return absl::OkStatus();
  }
};

template <typename T>
class GeluGradKernel : public GeluAttrKernel {
 public:
  using GeluAttrKernel::GeluAttrKernel;
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckSameShapes(x, dy));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, DataTypeOf<T>::value, x.shape()));
    if (tanh_) {
      BinaryMap(x.num_elements(), x.data<T>(), dy.data<T>(), dx->data<T>(), GeluTanhGradFn());
    } else {
      BinaryMap(x.num_elements(), x.data<T>(), dy.data<T>(), dx->data<T>(), GeluGradFn());
    }
    return absl::OkStatus();
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
