#ifndef STRATA_PASSES_MIXED_PRECISION_H_
#define STRATA_PASSES_MIXED_PRECISION_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"
#include "proto/plan.pb.h"

namespace strata {

// Mixed precision (the strategy's `mixed_precision { dtype: BF16 }` or F16),
// on the forward program after placement and before autodiff (DESIGN.md's
// order). Every `matmul` and `conv2d` whose inputs are F32, and every
// `scaled_dot_product_attention` whose q, k, v are F32, reads BF16 (F16:
// `@f16`) copies instead: one `cast` per input var and stage, named
// `<var>@bf16` (`<var>@bf16@stage<k>` for a second stage's copy, so no bf16
// copy crosses stages) and placed before the first such op that reads it, so
// a weight read twice is cast once. The op writes `<y>@bf16` and a `cast`
// back to F32 writes its original output `y` right after it; attention's
// second output, the logsumexp, is F32 by its schema for BF16/F16 q and is
// left as it is. Every other op (softmax, layer_norm, the losses, the adds)
// still runs in float32, and the parameters stay F32 master copies the
// optimizer updates. Autodiff differentiates through the casts, so the weight
// gradients arrive in F32 too; conv2d's gradients (conv2d_grad_input,
// conv2d_grad_filter) run in the low dtype as matmul's do, and its bias
// `add` stays F32 (conv2d has no bias input). On GPU plans attention whose 16-bit scores would not fit the
// GPU kernels' budget (kernels/attention_budget.h: T above 10362) stays in
// float32, where the flash kernels take any length. F16's loss scaling is the loss-scaling pass's
// (passes/loss_scaling.h), after the pipeline split.
class MixedPrecisionPass : public Pass {
 public:
  explicit MixedPrecisionPass(DeviceKind device = DEVICE_CPU) : device_(device) {}
  std::string name() const override { return "mixed-precision"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;

 private:
  DeviceKind device_;  // the plans' device
};

}  // namespace strata

#endif  // STRATA_PASSES_MIXED_PRECISION_H_
