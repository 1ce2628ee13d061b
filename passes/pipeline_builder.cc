#include "passes/pipeline_builder.h"

#include "compiler/autodiff.h"
#include "kernels/attention_budget.h"
#include "passes/attention_layout.h"
#include "passes/commute_casts.h"
#include "passes/data_parallel.h"
#include "passes/fold_casts.h"
#include "passes/fuse_epilogues.h"
#include "passes/fuse_optimizer.h"
#include "passes/gradient_merge.h"
#include "passes/hoist_param_casts.h"
#include "passes/host_transfers.h"
#include "passes/in_place_loss_grad.h"
#include "passes/loss_scaling.h"
#include "passes/micro_batch.h"
#include "passes/mixed_precision.h"
#include "passes/optimizer.h"
#include "passes/pack_qkv.h"
#include "passes/pad_vocab.h"
#include "passes/pipeline_split.h"
#include "passes/placement.h"
#include "passes/recompute.h"
#include "passes/tf32.h"

namespace strata {

std::unique_ptr<PassPipeline> BuildProgramPipeline(const Strategy& strategy, DeviceKind device, bool fold_losses) {
  auto pipeline = std::make_unique<PassPipeline>("program");
  pipeline->AddPass<PlacementPass>();
  if (strategy.has_mixed_precision()) {
    pipeline->AddPass<MixedPrecisionPass>(device, fold_losses);
    pipeline->AddPass<CommuteCastsPass>();
  }
  if (device == DEVICE_CUDA) pipeline->AddPass<PadVocabPass>();
  // On the final forward ops, so autodiff writes no transposes around
  // attention's gradient. GPU plans only where the tensor-core attention
  // (the one GPU path that reads the layout in place) is on.
  if (device != DEVICE_CUDA || TensorCoreAttention().load()) pipeline->AddPass<AttentionLayoutPass>(device);
  // Then the split into q, k, v and its gradients' concat, where the kernels
  // read the projection in place (on GPU plans, the flash kernels).
  if (device != DEVICE_CUDA || TensorCoreAttention().load()) pipeline->AddPass<PackQkvPass>(device);
  pipeline->AddPass<AutodiffPass>();
  if (strategy.recompute().checkpoints_size() > 0) pipeline->AddPass<RecomputePass>();
  pipeline->AddPass<InPlaceLossGradPass>();
  if (device == DEVICE_CUDA) pipeline->AddPass<FuseEpiloguesPass>();
  if (device == DEVICE_CUDA && strategy.has_mixed_precision()) {
    pipeline->AddPass<CommuteCastsPass>("commute-casts-backward");
  }
  if (strategy.has_mixed_precision()) pipeline->AddPass<FoldCastsPass>();
  if (device == DEVICE_CUDA && strategy.allow_tf32()) pipeline->AddPass<Tf32Pass>();
  return pipeline;
}

std::unique_ptr<PassPipeline> BuildRankPipeline(const Strategy& strategy, DeviceKind device) {
  auto pipeline = std::make_unique<PassPipeline>("per-rank");
  pipeline->AddPass<PipelineSplitPass>();
  pipeline->AddPass<OptimizerPass>();
  if (UsesLossScaling(strategy)) pipeline->AddPass<LossScalingPass>();
  pipeline->AddPass<MicroBatchPass>();
  if (strategy.gradient_merge().k_steps() > 1) pipeline->AddPass<GradientMergePass>();
  if (strategy.data_parallel().degree() > 1) pipeline->AddPass<DataParallelPass>();
  // After every pass that adds or moves update ops: the casts go after them.
  if (strategy.has_mixed_precision()) pipeline->AddPass<HoistParamCastsPass>();
  // Last: every pass before it may add, rewire or reorder the update ops.
  if (device == DEVICE_CUDA) pipeline->AddPass<FuseOptimizerPass>();
  if (device == DEVICE_CUDA) pipeline->AddPass<HostTransfersPass>();
  return pipeline;
}

std::vector<std::string> OptionalPassNames(const Strategy& strategy, DeviceKind device) {
  std::vector<std::string> names;
  for (const auto& pipeline : {BuildProgramPipeline(strategy, device), BuildRankPipeline(strategy, device)}) {
    for (std::string& name : pipeline->PassNames(/*optional_only=*/true)) names.push_back(std::move(name));
  }
  return names;
}

std::vector<std::string> CompilePassNames(const Strategy& strategy, DeviceKind device) {
  std::vector<std::string> names = {"validate"};
  for (const auto& pipeline : {BuildProgramPipeline(strategy, device), BuildRankPipeline(strategy, device)}) {
    for (std::string& name : pipeline->PassNames()) names.push_back(std::move(name));
  }
  return names;
}

}  // namespace strata
