// accumulate (acc += x) and fill_zero (x = 0), in place on persistent
// gradient buffers. Split over threads in contiguous chunks.

#include <cstring>

#include "kernels/cpu/elementwise.h"
#include "kernels/kernel_checks.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

template <typename T>
class AccumulateKernel : public OpKernel {
 public:
  explicit AccumulateKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& acc = ctx.input(0);
    const Tensor& x = ctx.input(1);
    if (absl::Status s = kernel_checks::CheckAccumulateOperands(acc, x); !s.ok()) return s;
    T* a = const_cast<T*>(acc.data<T>());  // stateful: updates the persistent buffer in place
    BinaryMap(acc.num_elements(), a, x.data<T>(), a, [](T u, T v) { return u + v; });
    ctx.SetOutput(0, acc);
    return absl::OkStatus();
  }
};

class FillZeroKernel : public OpKernel {
 public:
  explicit FillZeroKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    std::memset(const_cast<void*>(x.raw_data()), 0, x.bytes());
    ctx.SetOutput(0, x);
    return absl::OkStatus();
  }
};

STRATA_REGISTER_KERNEL("accumulate", DEVICE_CPU, F32, MakeFactory<AccumulateKernel<float>>());
STRATA_REGISTER_KERNEL("accumulate", DEVICE_CPU, F64, MakeFactory<AccumulateKernel<double>>());
STRATA_REGISTER_KERNEL("fill_zero", DEVICE_CPU, F32, MakeFactory<FillZeroKernel>());
STRATA_REGISTER_KERNEL("fill_zero", DEVICE_CPU, F64, MakeFactory<FillZeroKernel>());

}  // namespace
}  // namespace strata
