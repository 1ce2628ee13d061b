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
// an op at the end of the program, after every update, and its output a
// PARAM_COPY var: persistent, read by every micro-batch's forward and
// backward, written once an update (on gradient merge's k-th step only, as
// the optimizer runs) and by the executor before the first step and after
// every load (Executor::RefreshParamCopies). Casts of one parameter into
// one dtype share one copy (a recomputed cast reads the forward's).
//
// Where the param's one update op (sgd_update, momentum_update,
// adam_update) can write the copy, it does: attr copy_dtype and one more
// output, the updated param rounded as the cast rounds it, in the same pass
// over the param (apex's and Megatron's fused optimizers write the model
// params so), and fuse-optimizer's multi-tensor op writes them all in its
// one launch. The cast then runs only to refresh the copy (role REFRESH: no
// action runs it, the executor's refresh does). Elsewhere (a 16-bit dtype
// the op does not write, a param updated twice) the cast is an OPTIMIZE op
// after the update. GPT-2's single-GPU step so reads each weight once an
// update instead of twice (about 0.5 GB less memory traffic a step, and
// 72 launches fewer: 73 casts, less the multi-tensor launch more that the
// updates writing copies take as a group of their own).
//
// A plan that runs one micro-batch an update (no pipeline micro-batches, no
// gradient merge) hoists a weight its forward casts once only where its
// update writes the copy: a copy held across steps for a cast the step makes
// anyway would only live longer (a frozen weight keeps its cast). GPT-2's
// single-GPU plan holds its 236 MiB of copies across the step for 160 MiB
// less of activations at its peak (4.97 -> 5.04 GiB predicted). The copy
// holds the bits the per-micro-batch cast computed from the same weights,
// so the numbers are unchanged (tests/hoist_param_casts_parity_test.cc);
// what changes is the work (a pipeline of M micro-batches cast every weight
// M times, 2M with recompute; one micro-batch an update, once, in the
// update) and the memory (the copies once, where a pipeline stage held one
// per micro-batch in flight: MemoryPlan.param_copy_bytes).
class HoistParamCastsPass : public Pass {
 public:
  std::string name() const override { return "hoist-param-casts"; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_HOIST_PARAM_CASTS_H_
