#ifndef STRATA_PASSES_PIPELINE_SPLIT_H_
#define STRATA_PASSES_PIPELINE_SPLIT_H_

#include "compiler/pass.h"

namespace strata {

// Keeps the ops of ctx.stage() (forward, backward and optimizer) and joins the
// stages with explicit transfers: every var produced on one stage and read on
// another gets a `send` right after its producer and a `recv` just before its
// first reader on each reading stage, for activations going forward, their
// gradients coming back, and vars that skip stages. Each transfer carries a
// Channel (source rank, destination rank, var, id) and the recv its type,
// both decided here; the id is the same on both sides because every rank
// numbers the transfers of the whole program in the same order. A weight
// tied across stages has its gradient's parts summed once an update, in the
// optimizer action; with micro-batches, a weight read twice on one stage
// (one device included) does too, so every layout sums in one order.
class PipelineSplitPass : public Pass {
 public:
  std::string name() const override { return "pipeline-split"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_PIPELINE_SPLIT_H_
