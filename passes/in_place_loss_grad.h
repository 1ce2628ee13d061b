#ifndef STRATA_PASSES_IN_PLACE_LOSS_GRAD_H_
#define STRATA_PASSES_IN_PLACE_LOSS_GRAD_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// Writes the loss gradient over the logits where nothing reads them after
// it: softmax_cross_entropy_grad's `in_place`. An LM head's logits and
// their gradient are the largest activations of a GPT step (GPT-2 at batch
// 8 x 1024: 823 MB each in bf16) and were both alive at the peak; now one
// buffer holds the logits, then their gradient, and the memory plan counts
// it once (an op with in_place aliases output 0 to input 0, as reshape
// does). Runs after autodiff (and recompute), on CPU and GPU plans. Marks
// an op only when its logits are an unreported activation written once by
// an op whose kernel always writes a buffer of its own (matmul,
// matmul_bias, add: not a view, not a same-dtype cast or an identity
// dropout, which pass their input's buffer on), and every other reader
// comes before it and keeps no alias (the loss, accuracy). Programs may not
// set in_place themselves (validate refuses it). The kernels read each
// value before they write it, so the numbers are unchanged
// (InPlaceLossGradTest, MixedPrecisionTrainTest).
class InPlaceLossGradPass : public Pass {
 public:
  std::string name() const override { return "in-place-loss-gradient"; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_IN_PLACE_LOSS_GRAD_H_
