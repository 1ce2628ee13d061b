// relu, gelu, tanh, sigmoid and their backward helpers.
// Threads: UnaryMap / BinaryMap split the flat element range into contiguous
// chunks of kElementwiseMinChunk or more.

#include <cmath>

#include "kernels/cpu/elementwise.h"

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

// The exact (erf) form, torch.nn.functional.gelu's default.
struct GeluFn {
  template <typename T>
  T operator()(T x) const { return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2))); }
};
// d/dx [x Phi(x)] = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
struct GeluGradFn {
  template <typename T>
  T operator()(T x, T dy) const {
    const T cdf = T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
    const T pdf = std::exp(T(-0.5) * x * x) * T(0.5 * M_2_SQRTPI * M_SQRT1_2);
    return dy * (cdf + x * pdf);
  }
};

struct TanhFn {
  template <typename T>
  T operator()(T x) const { return std::tanh(x); }
};
struct TanhGradFn {
  template <typename T>
  T operator()(T y, T dy) const { return dy * (T(1) - y * y); }
};

// Never exponentiates a large positive number, so no overflow to inf/inf.
struct SigmoidFn {
  template <typename T>
  T operator()(T x) const {
    if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
    const T e = std::exp(x);
    return e / (T(1) + e);
  }
};
struct SigmoidGradFn {
  template <typename T>
  T operator()(T y, T dy) const { return dy * y * (T(1) - y); }
};

STRATA_REGISTER_KERNEL("relu", DEVICE_CPU, F32, (MakeFactory<UnaryKernel<float, ReluFn>>()));
STRATA_REGISTER_KERNEL("relu", DEVICE_CPU, F64, (MakeFactory<UnaryKernel<double, ReluFn>>()));
STRATA_REGISTER_KERNEL("relu_grad", DEVICE_CPU, F32, (MakeFactory<SameShapeBinaryKernel<float, ReluGradFn>>()));
STRATA_REGISTER_KERNEL("relu_grad", DEVICE_CPU, F64, (MakeFactory<SameShapeBinaryKernel<double, ReluGradFn>>()));
STRATA_REGISTER_KERNEL("gelu", DEVICE_CPU, F32, (MakeFactory<UnaryKernel<float, GeluFn>>()));
STRATA_REGISTER_KERNEL("gelu", DEVICE_CPU, F64, (MakeFactory<UnaryKernel<double, GeluFn>>()));
STRATA_REGISTER_KERNEL("gelu_grad", DEVICE_CPU, F32, (MakeFactory<SameShapeBinaryKernel<float, GeluGradFn>>()));
STRATA_REGISTER_KERNEL("gelu_grad", DEVICE_CPU, F64, (MakeFactory<SameShapeBinaryKernel<double, GeluGradFn>>()));
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
