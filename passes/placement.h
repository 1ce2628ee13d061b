#ifndef STRATA_PASSES_PLACEMENT_H_
#define STRATA_PASSES_PLACEMENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// Resolves each op's `device` (Paddle's device_guard: "gpu:N" or "cpu:N")
// to its pipeline stage N. An unplaced op takes the stage of the producer of
// its first produced input; in a program that places no op every op is on
// stage 0. Data must flow to the same or later stages, and the stages must be
// 0..K-1 without gaps. Runs first, on the validated forward program; its
// errors name the op (file:line: op #i 'type').
class PlacementPass : public Pass {
 public:
  std::string name() const override { return "placement"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

// The stage a device string names: "gpu:N" or "cpu:N" (N in 0..4096), or
// "gpu"/"cpu" for stage 0; InvalidArgument saying what is malformed.
absl::StatusOr<int> ParseDeviceStage(const std::string& device);

// The stages of a placed graph: the largest op stage + 1 (1 without ops).
int NumStages(const Graph& graph);

}  // namespace strata

#endif  // STRATA_PASSES_PLACEMENT_H_
