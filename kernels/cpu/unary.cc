// exp, log, sqrt, square, neg, scale and sqrt_grad. The per-element math is
// kernels/cuda/unary_math.h's, shared with the CUDA kernels.
// Threads: UnaryMap / BinaryMap split the flat element range into contiguous
// chunks of kElementwiseMinChunk or more.

#include <cmath>

#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/unary_math.h"

namespace strata {
namespace {

using cuda::ExpFn;
using cuda::LogFn;
using cuda::NegFn;
using cuda::SqrtFn;
using cuda::SqrtGradFn;
using cuda::SquareFn;

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
    UnaryMap(x.num_elements(), x.data<T>(), (*y)->data<T>(), cuda::ScaleFn<T>{scale_, bias_});
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
