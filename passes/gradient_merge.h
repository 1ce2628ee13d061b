#ifndef STRATA_PASSES_GRADIENT_MERGE_H_
#define STRATA_PASSES_GRADIENT_MERGE_H_

#include "compiler/pass.h"

namespace strata {

// Gradient merge (PaddlePaddle's gradient_merge, DeepSpeed's
// gradient_accumulation_steps): the optimizer runs every k-th step on the
// gradients summed over the k steps, so k steps of batch b train as one step
// of batch k*b. The micro-batch pass before it already sums the gradients
// into persistent buffers; the schedule's merge_steps makes the executor run
// the update (which reads and zeroes them) on every k-th step only. This pass
// records those buffers (Program.merge_buffer: state the checkpoints keep,
// summed over the data-parallel group) and, with `average`, scales the loss
// gradient's seed by 1/k so the update sees the mean over the merged batch.
class GradientMergePass : public Pass {
 public:
  std::string name() const override { return "gradient-merge"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_GRADIENT_MERGE_H_
