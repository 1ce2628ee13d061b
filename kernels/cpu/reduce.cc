// reduce_sum, reduce_mean, and the backward helpers sum_to_like (sums a
// broadcast result back to an operand's shape) and broadcast_like (repeats a
// reduced gradient over the reduced dims).
// Threads: ReduceSum splits outputs (or fixed K blocks whose partial sums are
// combined in order, so results do not depend on the thread count);
// broadcast_like splits output rows like BroadcastBinary.

#include "kernels/cpu/elementwise.h"
#include "kernels/shape_op_checks.h"
#include "proto/shape_rules.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

template <typename T, bool kMean>
class ReduceKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const KernelDef& def) {
    absl::StatusOr<std::vector<int64_t>> axis = AttrInts(*def.op, "axis");
    if (!axis.ok()) return axis.status();
    absl::StatusOr<bool> keepdim = AttrBool(*def.op, "keepdim");
    if (!keepdim.ok()) return keepdim.status();
    return std::unique_ptr<OpKernel>(new ReduceKernel(*axis, *keepdim));
  }

  absl::Status Compute(KernelContext& ctx) override {
    using Acc = AccumulatorOf<T>;
    const Tensor& x = ctx.input(0);
    absl::StatusOr<std::vector<bool>> reduced = ReducedAxes(axis_, x.rank(), "x");
    if (!reduced.ok()) return reduced.status();
    absl::StatusOr<Tensor*> y = ctx.AllocateOutput(0, DataTypeOf<T>::value, ReduceShape(x.shape(), *reduced, keepdim_));
    if (!y.ok()) return y.status();
    Acc scale = Acc(1);
    if constexpr (kMean) {
      int64_t count = 1;
      for (int d = 0; d < x.rank(); ++d) {
        if ((*reduced)[d]) count *= x.dim(d);
      }
      scale = Acc(1) / static_cast<Acc>(count);  // count 0: nan, like torch
    }
    ReduceSum(x.data<T>(), x.shape(), *reduced, (*y)->data<T>(), scale);
    return absl::OkStatus();
  }

 private:
  ReduceKernel(std::vector<int64_t> axis, bool keepdim) : axis_(std::move(axis)), keepdim_(keepdim) {}
  std::vector<int64_t> axis_;
  bool keepdim_;
};

// y = x summed over the dims along which `like` broadcasts to x.
template <typename T>
class SumToLikeKernel : public OpKernel {
 public:
  explicit SumToLikeKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Shape& like = ctx.input(1).shape();
    bool any = false;
    STRATA_ASSIGN_OR_RETURN(const std::vector<bool> reduced, SumToLikeDims(x.shape(), like, &any));
    if (!any) {
      ctx.SetOutput(0, x.Reshaped(like));  // nothing was broadcast: share the buffer
      return absl::OkStatus();
    }
    absl::StatusOr<Tensor*> y = ctx.AllocateOutput(0, DataTypeOf<T>::value, like);
    if (!y.ok()) return y.status();
    ReduceSum(x.data<T>(), x.shape(), reduced, (*y)->data<T>(), AccumulatorOf<T>(1));
    return absl::OkStatus();
  }
};

// dx = dy repeated over the dims reduce_*(x, axis, keepdim) removed, times
// 1 / count for the mean.
template <typename T>
class BroadcastLikeKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const KernelDef& def) {
    absl::StatusOr<std::vector<int64_t>> axis = AttrInts(*def.op, "axis");
    if (!axis.ok()) return axis.status();
    absl::StatusOr<bool> keepdim = AttrBool(*def.op, "keepdim");
    if (!keepdim.ok()) return keepdim.status();
    absl::StatusOr<bool> mean = AttrBool(*def.op, "mean");
    if (!mean.ok()) return mean.status();
    return std::unique_ptr<OpKernel>(new BroadcastLikeKernel(*axis, *keepdim, *mean));
  }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& dy = ctx.input(0);
    const Shape& x = ctx.input(1).shape();
    STRATA_ASSIGN_OR_RETURN(const shape_op_checks::BroadcastLikeLayout layout,
                            shape_op_checks::ResolveBroadcastLike(axis_, keepdim_, mean_, dy, x));
    absl::StatusOr<BroadcastPlan> plan = MakeBroadcastPlanTo(ReduceShape(x, layout.reduced, true), {}, x);
    if (!plan.ok()) return plan.status();
    absl::StatusOr<Tensor*> dx = ctx.AllocateOutput(0, DataTypeOf<T>::value, x);
    if (!dx.ok()) return dx.status();
    const T factor = static_cast<T>(layout.factor);
    BroadcastBinary(*plan, dy.data<T>(), &factor, (*dx)->data<T>(), [](T a, T b) { return a * b; });
    return absl::OkStatus();
  }

 private:
  BroadcastLikeKernel(std::vector<int64_t> axis, bool keepdim, bool mean)
      : axis_(std::move(axis)), keepdim_(keepdim), mean_(mean) {}
  std::vector<int64_t> axis_;
  bool keepdim_, mean_;
};

STRATA_REGISTER_KERNEL("reduce_sum", DEVICE_CPU, F32, (ReduceKernel<float, false>::Create));
STRATA_REGISTER_KERNEL("reduce_sum", DEVICE_CPU, F64, (ReduceKernel<double, false>::Create));
STRATA_REGISTER_KERNEL("reduce_sum", DEVICE_CPU, I64, (ReduceKernel<int64_t, false>::Create));
STRATA_REGISTER_KERNEL("reduce_mean", DEVICE_CPU, F32, (ReduceKernel<float, true>::Create));
STRATA_REGISTER_KERNEL("reduce_mean", DEVICE_CPU, F64, (ReduceKernel<double, true>::Create));
STRATA_REGISTER_KERNEL("sum_to_like", DEVICE_CPU, F32, (MakeFactory<SumToLikeKernel<float>>()));
STRATA_REGISTER_KERNEL("sum_to_like", DEVICE_CPU, F64, (MakeFactory<SumToLikeKernel<double>>()));
STRATA_REGISTER_KERNEL("sum_to_like", DEVICE_CPU, I64, (MakeFactory<SumToLikeKernel<int64_t>>()));
STRATA_REGISTER_KERNEL("broadcast_like", DEVICE_CPU, F32, (BroadcastLikeKernel<float>::Create));
STRATA_REGISTER_KERNEL("broadcast_like", DEVICE_CPU, F64, (BroadcastLikeKernel<double>::Create));

}  // namespace
}  // namespace strata
