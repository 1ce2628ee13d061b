#include "passes/pipeline_builder.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_join.h"

#include "compiler/autodiff.h"
#include "kernels/attention_budget.h"
#include "passes/attention_layout.h"
#include "passes/cast_bias.h"
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
  // On the 16-bit stores fold-casts made: the fused GEMMs' biases in 16 bits.
  if (device == DEVICE_CUDA && strategy.has_mixed_precision()) pipeline->AddPass<CastBiasPass>();
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

std::string WherePassRuns(const std::string& name, const Strategy& strategy, DeviceKind device) {
  struct Setting {
    std::string said;
    std::function<bool(Strategy&, DeviceKind&)> apply;  // false where it is there already
  };
  const std::vector<Setting> settings = {
      {"--device gpu",
       [](Strategy&, DeviceKind& d) {
         const bool changes = d != DEVICE_CUDA;
         d = DEVICE_CUDA;
         return changes;
       }},
      {"mixed_precision in the strategy",
       [](Strategy& s, DeviceKind&) {
         const bool changes = !s.has_mixed_precision();
         if (changes) s.mutable_mixed_precision()->set_dtype(BF16);
         return changes;
       }},
      {"mixed_precision { dtype: F16 } (or loss_scaling {}) in the strategy",
       [](Strategy& s, DeviceKind&) {
         const bool changes = !s.has_mixed_precision() || s.mixed_precision().dtype() != F16;
         s.mutable_mixed_precision()->set_dtype(F16);
         return changes;
       }},
      {"recompute { checkpoints: ... } in the strategy",
       [](Strategy& s, DeviceKind&) {
         const bool changes = s.recompute().checkpoints_size() == 0;
         if (changes) s.mutable_recompute()->add_checkpoints("x");
         return changes;
       }},
      {"gradient_merge { k_steps: 2 or more } in the strategy",
       [](Strategy& s, DeviceKind&) {
         const bool changes = s.gradient_merge().k_steps() < 2;
         if (changes) s.mutable_gradient_merge()->set_k_steps(2);
         return changes;
       }},
      {"data_parallel { degree: 2 or more } in the strategy",
       [](Strategy& s, DeviceKind&) {
         const bool changes = s.data_parallel().degree() < 2;
         if (changes) s.mutable_data_parallel()->set_degree(2);
         return changes;
       }},
      {"allow_tf32: true in the strategy",
       [](Strategy& s, DeviceKind&) {
         const bool changes = !s.allow_tf32();
         s.set_allow_tf32(true);
         return changes;
       }},
  };
  auto runs = [&](const std::vector<int>& chosen) {
    Strategy s = strategy;
    DeviceKind d = device;
    for (int i : chosen) {
      if (!settings[i].apply(s, d)) return false;  // not lacking: a smaller set says it
    }
    return absl::c_linear_search(CompilePassNames(s, d), name);
  };
  auto said = [&](const std::vector<int>& chosen) {
    std::vector<std::string> parts;
    for (int i : chosen) parts.push_back(settings[i].said);
    return absl::StrJoin(parts, " and ");
  };
  const int n = static_cast<int>(settings.size());
  for (int i = 0; i < n; ++i) {
    if (runs({i})) return said({i});
  }
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (runs({i, j})) return said({i, j});
    }
  }
  return "";
}

}  // namespace strata
