#ifndef STRATA_PASSES_OPTIMIZER_H_
#define STRATA_PASSES_OPTIMIZER_H_

#include "compiler/pass.h"

namespace strata {

// Appends the optimizer block: the step counter, the learning-rate schedule,
// clipping by global gradient norm, and one update op per trained parameter
// (on the parameter's stage), with its state vars (velocity, moments). A
// clipped update reads the gradient and the clipping coefficient (attr
// grad_scale) and scales each element as it reads it, as apex's fused
// optimizers fold clipping in, where it read a scaled copy of the gradient
// before (2026-11-29): the same bits, one pass over the gradients fewer.
class OptimizerPass : public Pass {
 public:
  std::string name() const override { return "optimizer"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

// Names of the compiler's optimizer vars.
inline constexpr char kStepVar[] = "@step";

}  // namespace strata

#endif  // STRATA_PASSES_OPTIMIZER_H_
