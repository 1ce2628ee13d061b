#ifndef STRATA_PASSES_LOSS_SCALING_H_
#define STRATA_PASSES_LOSS_SCALING_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"
#include "proto/strategy.pb.h"

namespace strata {

// Dynamic loss scaling (torch.cuda.amp.GradScaler; PaddlePaddle's static AMP
// ops), for F16 mixed precision, on each rank's program after the optimizer
// pass and before the micro-batch pass:
// - state vars `@loss_scale` (F32, starts at init_scale),
//   `@loss_scale.good_steps` and `@loss_scale.skipped_updates` (I64), on
//   every rank under the same names, so checkpoints key them alike under any
//   layout (every rank updates them alike, so its shards agree);
// - on the rank with the loss: the backward seed times `@loss_scale`
//   (`<loss_grad>@scaled`, which the loss's gradient ops read);
// - before the optimizer block: `check_finite_and_unscale` over every
//   gradient the optimizer reads (`<g>@unscaled` = g / S, and `@found_inf`),
//   then, with a pipeline, `@found_inf.all`: an allreduce over the stages,
//   as clipping sums its norm, so every rank skips the same steps (data
//   parallel replicas read the gradients already summed over the group:
//   the data-parallel pass waits for them before this first reader);
// - the found flag as the optional last input of every optimizer op that
//   takes one (the updates, the step counter): a skipped step changes no
//   weight, optimizer state or step count, so the lr schedule and Adam's
//   bias corrections follow the updates made;
// - after the block, `update_loss_scaling`: S *= backoff_factor on a skip,
//   S *= growth_factor after growth_interval good steps in a row.
// With gradient merge the block, and so the check and the update of S, runs
// on every k-th step on the merged gradients; S is constant across the k.
class LossScalingPass : public Pass {
 public:
  std::string name() const override { return "loss-scaling"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

// Whether the strategy scales the loss: F16 mixed precision always, BF16 when
// its `loss_scaling` section is given.
bool UsesLossScaling(const Strategy& strategy);

// The strategy's loss_scaling with GradScaler's defaults (65536, 2, 0.5,
// 2000) for the fields left 0.
LossScaling EffectiveLossScaling(const Strategy& strategy);

inline constexpr char kLossScaleVar[] = "@loss_scale";
inline constexpr char kGoodStepsVar[] = "@loss_scale.good_steps";
inline constexpr char kSkippedUpdatesVar[] = "@loss_scale.skipped_updates";
inline constexpr char kFoundInfVar[] = "@found_inf";

}  // namespace strata

#endif  // STRATA_PASSES_LOSS_SCALING_H_
