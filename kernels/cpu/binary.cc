// add, sub, mul, div: z = f(x, y) with numpy broadcasting.
// Threads: BroadcastBinary splits the output rows (or one long row) into
// contiguous chunks; same-shape, scalar and row-bias operands all reduce to a
// single vectorized inner loop.

#include "kernels/cpu/elementwise.h"

namespace strata {
namespace {

struct AddFn {
  template <typename T>
  T operator()(T a, T b) const { return a + b; }
};
struct SubFn {
  template <typename T>
  T operator()(T a, T b) const { return a - b; }
};
struct MulFn {
  template <typename T>
  T operator()(T a, T b) const { return a * b; }
};
struct DivFn {
  template <typename T>
  T operator()(T a, T b) const { return a / b; }
};

template <typename T, typename F>
class BinaryKernel : public OpKernel {
 public:
  explicit BinaryKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& y = ctx.input(1);
    absl::StatusOr<BroadcastPlan> plan = MakeBroadcastPlan(x.shape(), y.shape());
    if (!plan.ok()) return plan.status();
    absl::StatusOr<Tensor*> z = ctx.AllocateOutput(0, DataTypeOf<T>::value, plan->out_shape);
    if (!z.ok()) return z.status();
    BroadcastBinary(*plan, x.data<T>(), y.data<T>(), (*z)->data<T>(), F());
    return absl::OkStatus();
  }
};

STRATA_REGISTER_KERNEL("add", DEVICE_CPU, F32, (MakeFactory<BinaryKernel<float, AddFn>>()));
STRATA_REGISTER_KERNEL("add", DEVICE_CPU, F64, (MakeFactory<BinaryKernel<double, AddFn>>()));
STRATA_REGISTER_KERNEL("add", DEVICE_CPU, I64, (MakeFactory<BinaryKernel<int64_t, AddFn>>()));
STRATA_REGISTER_KERNEL("sub", DEVICE_CPU, F32, (MakeFactory<BinaryKernel<float, SubFn>>()));
STRATA_REGISTER_KERNEL("sub", DEVICE_CPU, F64, (MakeFactory<BinaryKernel<double, SubFn>>()));
STRATA_REGISTER_KERNEL("sub", DEVICE_CPU, I64, (MakeFactory<BinaryKernel<int64_t, SubFn>>()));
STRATA_REGISTER_KERNEL("mul", DEVICE_CPU, F32, (MakeFactory<BinaryKernel<float, MulFn>>()));
STRATA_REGISTER_KERNEL("mul", DEVICE_CPU, F64, (MakeFactory<BinaryKernel<double, MulFn>>()));
STRATA_REGISTER_KERNEL("mul", DEVICE_CPU, I64, (MakeFactory<BinaryKernel<int64_t, MulFn>>()));
// Floating only: integer division by zero would trap.
STRATA_REGISTER_KERNEL("div", DEVICE_CPU, F32, (MakeFactory<BinaryKernel<float, DivFn>>()));
STRATA_REGISTER_KERNEL("div", DEVICE_CPU, F64, (MakeFactory<BinaryKernel<double, DivFn>>()));

}  // namespace
}  // namespace strata
