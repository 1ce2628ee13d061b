#ifndef STRATA_PASSES_HOIST_PARAM_CASTS_H_
#define STRATA_PASSES_HOIST_PARAM_CASTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// Casts each parameter to its compute dtype once per optimizer update
// instead of once per use in every micro-batch: the 16-bit weight copies of
// Megatron-LM's and apex's mixed precision (model params beside float32
// main params, refreshed after each optimizer step), where autocast and the
// mixed-precision pass cast the master weight at every forward.
//
// Per rank, after the optimizer pass and every pass that rewires its
// update ops (loss scaling, micro-batch, gradient merge, data parallel),
// before fuse-optimizer. Each `cast` of a PARAM into another dtype (the
// mixed-precision pass's, their copies in recomputed segments, and
// cast-bias's of the fused GEMMs' biases on GPU plans) becomes
// an OPTIMIZE op at the end of the program, after every update, and its
// output a PARAM_COPY var: persistent, read by every micro-batch's
// forward and backward, written once an update (on gradient merge's k-th
// step only, as the optimizer runs) and by the executor before the first
// step and after every load (Executor::RefreshParamCopies). Casts of one
// parameter into one dtype share one copy (a recomputed cast reads the
// forward's). A plan that runs one micro-batch an update (no pipeline
// micro-batches, no gradient merge) hoists only the weights it casts more
// than once (recompute's second cast): for the others a copy would only live longer (GPT-2's single-GPU
// plan would hold 236 MiB of copies for 160 MiB less of activations at
// its peak). The copy holds the bits the per-micro-batch cast computed
// from the same weights, so the numbers are unchanged
// (tests/hoist_param_casts_parity_test.cc); what changes is the work (a
// pipeline of M micro-batches cast every weight M times, 2M with
// recompute) and the memory (the copies once, where a pipeline stage held
// one per micro-batch in flight: MemoryPlan.param_copy_bytes).
class HoistParamCastsPass : public Pass {
 public:
  std::string name() const override { return "hoist-param-casts"; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_HOIST_PARAM_CASTS_H_
