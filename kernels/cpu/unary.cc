// exp, log, sqrt, square, neg, scale and sqrt_grad.
// Threads: UnaryMap / BinaryMap split the flat element range into contiguous
// chunks of kElementwiseMinChunk or more.

#include <cmath>

#include "kernels/cpu/elementwise.h"

namespace strata {
namespace {

struct ExpFn {
  template <typename T>
  T operator()(T x) const { return std::exp(x); }
};
struct LogFn {
  template <typename T>
  T operator()(T x) const { return std::log(x); }
};
struct SqrtFn {
  template <typename T>
  T operator()(T x) const { return std::sqrt(x); }
};
struct SqrtGradFn {
  template <typename T>
  T operator()(T y, T dy) const { return dy * T(0.5) / y; }
};
struct SquareFn {
  template <typename T>
  T operator()(T x) const { return x * x; }
};
struct NegFn {
  template <typename T>
  T operator()(T x) const { return -x; }
};

// y = scale * x + bias, attrs read once at prepare time.
template <typename T>
class ScaleKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const KernelDef& def) {
    absl::StatusOr<double> scale = AttrFloat(*def.op, "scale");
    if (!scale.ok()) return scale.status();
    absl::StatusOr<double> bias = AttrFloat(*def.op, "bias");
    if (!bias.ok()) return bias.status();
    return std::unique_ptr<OpKernel>(new ScaleKernel(static_cast<T>(*scale), static_cast<T>(*bias)));
  }
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    absl::StatusOr<Tensor*> y = ctx.AllocateOutput(0, DataTypeOf<T>::value, x.shape());
    if (!y.ok()) return y.status();
    const T scale = scale_, bias = bias_;
    UnaryMap(x.num_elements(), x.data<T>(), (*y)->data<T>(), [scale, bias](T v) { return scale * v + bias; });
    return absl::OkStatus();
  }

 private:
  ScaleKernel(T scale, T bias) : scale_(scale), bias_(bias) {}
  T scale_, bias_;
};

STRATA_REGISTER_KERNEL("exp", DEVICE_CPU, F32, (MakeFactory<UnaryKernel<float, ExpFn>>()));
STRATA_REGISTER_KERNEL("exp", DEVICE_CPU, F64, (MakeFactory<UnaryKernel<double, ExpFn>>()));
STRATA_REGISTER_KERNEL("log", DEVICE_CPU, F32, (MakeFactory<UnaryKernel<float, LogFn>>()));
STRATA_REGISTER_KERNEL("log", DEVICE_CPU, F64, (MakeFactory<UnaryKernel<double, LogFn>>()));
STRATA_REGISTER_KERNEL("sqrt", DEVICE_CPU, F32, (MakeFactory<UnaryKernel<float, SqrtFn>>()));
STRATA_REGISTER_KERNEL("sqrt", DEVICE_CPU, F64, (MakeFactory<UnaryKernel<double, SqrtFn>>()));
STRATA_REGISTER_KERNEL("sqrt_grad", DEVICE_CPU, F32, (MakeFactory<SameShapeBinaryKernel<float, SqrtGradFn>>()));
STRATA_REGISTER_KERNEL("sqrt_grad", DEVICE_CPU, F64, (MakeFactory<SameShapeBinaryKernel<double, SqrtGradFn>>()));
STRATA_REGISTER_KERNEL("square", DEVICE_CPU, F32, (MakeFactory<UnaryKernel<float, SquareFn>>()));
STRATA_REGISTER_KERNEL("square", DEVICE_CPU, F64, (MakeFactory<UnaryKernel<double, SquareFn>>()));
STRATA_REGISTER_KERNEL("neg", DEVICE_CPU, F32, (MakeFactory<UnaryKernel<float, NegFn>>()));
STRATA_REGISTER_KERNEL("neg", DEVICE_CPU, F64, (MakeFactory<UnaryKernel<double, NegFn>>()));
STRATA_REGISTER_KERNEL("scale", DEVICE_CPU, F32, ScaleKernel<float>::Create);
STRATA_REGISTER_KERNEL("scale", DEVICE_CPU, F64, ScaleKernel<double>::Create);

}  // namespace
}  // namespace strata
