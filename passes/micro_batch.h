#ifndef STRATA_PASSES_MICRO_BATCH_H_
#define STRATA_PASSES_MICRO_BATCH_H_

#include "compiler/pass.h"

namespace strata {

// Splits a step into ctx.micro_batches micro-batches with the result of one
// big batch: the loss gradient is seeded with 1/M (each micro-batch's loss is
// its own mean), and every gradient the optimizer reads is summed over the
// micro-batches into a persistent buffer (`accumulate`), which is zeroed
// after the update (`fill_zero`). A weight gradient that a 2-D matmul writes
// and only the optimizer block reads is added into its buffer by the GEMM
// itself (`matmul_accumulate`, beta = 1), with no gradient tensor. Nothing
// changes for M = 1 without gradient merge. Under gradient merge
// (ctx.merge_steps = k > 1) the buffers sum over the k steps of an update
// too (the OPTIMIZE action that reads and zeroes them runs every k-th step),
// so they are state rather than scratch.
class MicroBatchPass : public Pass {
 public:
  std::string name() const override { return "micro-batch"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_MICRO_BATCH_H_
