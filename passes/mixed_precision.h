#ifndef STRATA_PASSES_MIXED_PRECISION_H_
#define STRATA_PASSES_MIXED_PRECISION_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"
#include "proto/plan.pb.h"

namespace strata {

// Mixed precision (the strategy's `mixed_precision { dtype: BF16 }` or F16),
// on the forward program after placement and before autodiff (DESIGN.md's
// order). Every `matmul` and `conv2d` whose inputs are F32, every `gelu`
// whose x is F32 (as torch autocast runs gelu on the bf16 output of a
// linear layer; the kernels widen x and compute in float32, so only the
// stored x and y are 16-bit, and gelu_grad reads the 16-bit x), and every
// `scaled_dot_product_attention` whose q, k, v are F32, reads BF16 (F16:
// `@f16`) copies instead: one `cast` per input var and stage, named
// `<var>@bf16` (`<var>@bf16@stage<k>` for a second stage's copy, so no bf16
// copy crosses stages) and placed before the first such op that reads it, so
// a weight read twice is cast once. The op writes `<y>@bf16` and a `cast`
// back to F32 writes its original output `y` right after it; a later low op
// on the same stage that reads y (a matmul feeding a matmul) reads
// `<y>@bf16` itself, the bits a cast down of y would give, and a cast back
// whose y nothing else reads goes (not a recompute checkpoint's, the loss's
// or a fetch's); attention's
// second output, the logsumexp, is F32 by its schema for BF16/F16 q and is
// left as it is. A low op's output whose only reader is a
// softmax_cross_entropy (its logits, on the op's stage; not fetched, not a
// recompute checkpoint) gets no cast back: the loss reads `<y>@bf16`
// directly and computes in float32 (its loss stays F32 by its schema), the
// F32 `y` is dropped, and autodiff's softmax_cross_entropy_grad writes the
// 16-bit gradient the op's backward reads, so a GPT's float32 logits and
// their gradient never exist; the results are the casts' bit for bit
// (widening is exact, the gradient is rounded once either way). A GPT's MLP
// becomes matmul -> cast up -> bias add -> cast down -> gelu in bf16 -> the
// next matmul reading the gelu's bf16 output: its pre-activation, which the
// backward's gelu_grad reads, is stored in 16 bits, half the bytes, and on
// GPU plans fuse-epilogues makes one GEMM of it with cuBLASLt's
// GELU_AUX_BIAS (D and aux both 16-bit, the one aux type cuBLASLt takes
// beside a 16-bit D). Every other op (softmax, layer_norm, mse_loss, a
// cross-entropy on logits something else reads, the adds, relu) still runs
// in float32, and the parameters stay F32
// master copies the optimizer updates. Autodiff differentiates through the
// casts, so the weight gradients arrive in F32 too; conv2d's gradients
// (conv2d_grad_input, conv2d_grad_filter) run in the low dtype as matmul's
// do, and its bias `add` stays F32 (conv2d has no bias input). On GPU plans attention whose 16-bit scores would not fit the
// GPU kernels' budget (kernels/attention_budget.h: T above 10362) stays in
// float32, where the flash kernels take any length. F16's loss scaling is the loss-scaling pass's
// (passes/loss_scaling.h), after the pipeline split.
class MixedPrecisionPass : public Pass {
 public:
  // fold_losses false keeps every cast back, the loss reading the F32
  // logits (the form before the losses read 16-bit logits): for tests that
  // compare the two.
  explicit MixedPrecisionPass(DeviceKind device = DEVICE_CPU, bool fold_losses = true)
      : device_(device), fold_losses_(fold_losses) {}
  std::string name() const override { return "mixed-precision"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;

 private:
  DeviceKind device_;  // the plans' device
  bool fold_losses_;   // softmax_cross_entropy reads a sole-reader low output directly
};

}  // namespace strata

#endif  // STRATA_PASSES_MIXED_PRECISION_H_
