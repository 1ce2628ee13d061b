#ifndef STRATA_PASSES_RECOMPUTE_H_
#define STRATA_PASSES_RECOMPUTE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "compiler/pass.h"

namespace strata {

// Activation recomputation (PaddlePaddle's RecomputeOptimizer, Megatron's
// activation checkpointing), after autodiff: the forward ops are cut into
// segments at the strategy's checkpoint vars and at every change of
// pipeline stage. A forward activation of a segment that backward reads is
// not kept from the forward: the segment's ops that make it are re-emitted
// (role BACKWARD, the same uid, so dropout draws the same mask) just before
// the first backward op that reads one of them, writing `<var>@recompute`,
// which the backward ops read instead. Kept as they are: the checkpoints,
// feeds and persistent vars, vars another stage reads (a stage cut acts as
// a checkpoint), and the last segment, the one holding the loss (its
// backward follows at once). A re-emitted op that reads a var of another
// segment reads it under its own name, so that var lives until then (and
// is re-made as well where its own segment's backward needs it).
class RecomputePass : public Pass {
 public:
  std::string name() const override { return "recompute"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

// Checks the strategy's checkpoints against a validated program: each names a
// var an op makes on the way to the loss, and cuts the graph (every path
// from the feeds it depends on to the loss goes through it). The error names
// the checkpoint and, for one that does not cut, a var on the way around it.
absl::Status CheckRecomputeCheckpoints(const Program& program, const std::vector<std::string>& checkpoints);

}  // namespace strata

#endif  // STRATA_PASSES_RECOMPUTE_H_
