// CPU kernels of dynamic loss scaling (compiler/ops/optimizer_ops.cc):
// check_finite_and_unscale and update_loss_scaling. The math is
// kernels/loss_scaling_math.h, which a CUDA kernel shares.
//
// check_finite_and_unscale splits each gradient over the intra-op pool in
// contiguous element ranges; every range that meets an inf or nan sets one
// shared flag (the result does not depend on the split).

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/kernel_checks.h"
#include "kernels/loss_scaling_math.h"
#include "proto/status_macros.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

constexpr int64_t kElementwiseChunk = 1 << 14;

using kernel_checks::ExpectScalar;
using kernel_checks::MutableData;

// y = x * inv_scale over N elements; true when some x is inf or nan.
template <typename T>
bool UnscaleAndCheck(const T* x, int64_t N, T inv_scale, T* y) {
  std::atomic<bool> found{false};
  ParallelFor(N, kElementwiseChunk, [&](int64_t begin, int64_t end) {
    bool local = false;
    for (int64_t i = begin; i < end; ++i) y[i] = kernel_math::UnscaleElement(x[i], inv_scale, &local);
    if (local) found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}

// check_finite_and_unscale(scale, x...) -> (found_inf, y...). Keyed by F32
// (the scale, its first floating input); the gradients are F32 or F64.
class CheckFiniteAndUnscaleKernel : public OpKernel {
 public:
  absl::Status Init(const Op&) { return absl::OkStatus(); }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "check_finite_and_unscale", 0, "scale", F32));
    const float inv_scale = kernel_math::InverseLossScale(ctx.input(0).data<float>()[0]);
    bool found = false;
    for (int i = 1; i < ctx.num_inputs(); ++i) {
      const Tensor& x = ctx.input(i);
      STRATA_ASSIGN_OR_RETURN(Tensor* y, ctx.AllocateOutput(i, x.dtype(), x.shape()));
      if (x.dtype() == F32) {
        found |= UnscaleAndCheck(x.data<float>(), x.num_elements(), inv_scale, y->data<float>());
      } else if (x.dtype() == F64) {
        found |= UnscaleAndCheck(x.data<double>(), x.num_elements(), static_cast<double>(inv_scale),
                                 y->data<double>());
      } else {
        return absl::InvalidArgumentError(absl::StrCat("check_finite_and_unscale: input 'x' #", i - 1,
                                                       " must be F32 or F64, got ", DataTypeName(x.dtype())));
      }
    }
    STRATA_ASSIGN_OR_RETURN(Tensor* found_inf, ctx.AllocateOutput(0, F32, {}));
    found_inf->data<float>()[0] = found ? 1.0f : 0.0f;
    return absl::OkStatus();
  }
};

// update_loss_scaling(found_inf, loss_scale, good_steps, skipped_updates) ->
// (loss_scale, good_steps, skipped_updates), in place.
class UpdateLossScalingKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(attrs_.growth_factor, AttrFloat(op, "growth_factor"));
    STRATA_ASSIGN_OR_RETURN(attrs_.backoff_factor, AttrFloat(op, "backoff_factor"));
    STRATA_ASSIGN_OR_RETURN(attrs_.growth_interval, AttrInt(op, "growth_interval"));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "update_loss_scaling", 0, "found_inf", F32));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "update_loss_scaling", 1, "loss_scale", F32));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "update_loss_scaling", 2, "good_steps", I64));
    STRATA_RETURN_IF_ERROR(ExpectScalar(ctx, "update_loss_scaling", 3, "skipped_updates", I64));
    const bool found_inf = kernel_math::SkipsUpdate(ctx.input(0).data<float>()[0]);
    kernel_math::UpdateLossScale(attrs_, found_inf, MutableData<float>(ctx.input(1)),
                                 MutableData<int64_t>(ctx.input(2)), MutableData<int64_t>(ctx.input(3)));
    for (int k = 0; k < 3; ++k) ctx.SetOutput(k, ctx.input(k + 1));
    return absl::OkStatus();
  }

 private:
  kernel_math::LossScalingAttrs attrs_;
};

#undef STRATA_ASSIGN_OR_RETURN
#undef STRATA_RETURN_IF_ERROR

STRATA_REGISTER_KERNEL("check_finite_and_unscale", DEVICE_CPU, F32, InitFactory<CheckFiniteAndUnscaleKernel>());
STRATA_REGISTER_KERNEL("update_loss_scaling", DEVICE_CPU, F32, InitFactory<UpdateLossScalingKernel>());

}  // namespace
}  // namespace strata
