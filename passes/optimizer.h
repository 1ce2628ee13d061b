#ifndef STRATA_PASSES_OPTIMIZER_H_
#define STRATA_PASSES_OPTIMIZER_H_

#include "compiler/pass.h"

namespace strata {

// Appends the optimizer block: the step counter, the learning-rate schedule,
// clipping by global gradient norm, and one update op per trained parameter
// (on the parameter's stage), with its state vars (velocity, moments).
class OptimizerPass : public Pass {
 public:
  std::string name() const override { return "optimizer"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

// Names of the compiler's optimizer vars.
inline constexpr char kStepVar[] = "@step";

}  // namespace strata

#endif  // STRATA_PASSES_OPTIMIZER_H_
