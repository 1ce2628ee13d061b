#ifndef STRATA_PASSES_PIPELINE_BUILDER_H_
#define STRATA_PASSES_PIPELINE_BUILDER_H_

#include <memory>
#include <string>
#include <vector>

#include "compiler/pass.h"
#include "proto/plan.pb.h"
#include "proto/strategy.pb.h"

namespace strata {

// The compiler's passes for a strategy, in DESIGN.md's order, built in this
// one place. The program-level pipeline runs once on the validated program;
// the per-rank pipeline runs for each rank, on a copy of its result. A pass
// that has nothing to do for the job (the pipeline split on one stage)
// returns unchanged; passes the strategy does not ask for are not added.
// Plans for a GPU also fuse epilogues (matmul then a bias add) after
// recompute, and end each rank with the per-parameter optimizer updates
// grouped into multi-tensor ones (fuse-optimizer) and then the host
// transfers (feeds copied in, the loss and fetches copied out, as ops).
// fold_losses false: the mixed-precision pass keeps the cast back before
// softmax_cross_entropy (CompileOptions::mixed_precision_fold_losses; tests).
std::unique_ptr<PassPipeline> BuildProgramPipeline(const Strategy& strategy, DeviceKind device = DEVICE_CPU,
                                                   bool fold_losses = true);
std::unique_ptr<PassPipeline> BuildRankPipeline(const Strategy& strategy, DeviceKind device = DEVICE_CPU);

// Every pass a compile with `strategy` runs, "validate" first: what
// --dump_after accepts, known before compiling.
std::vector<std::string> CompilePassNames(const Strategy& strategy, DeviceKind device = DEVICE_CPU);
// The optional ones among them (fusions), which CompileOptions.disabled_passes may name.
std::vector<std::string> OptionalPassNames(const Strategy& strategy, DeviceKind device = DEVICE_CPU);

// Where a pass that `strategy` on `device` does not run would run: the
// fewest settings it lacks, as a user writes them ("--device gpu",
// "gradient_merge { k_steps: 2 or more }", joined by " and "); empty for a
// name no compile runs. Each is tried on top of what the strategy has.
std::string WherePassRuns(const std::string& name, const Strategy& strategy, DeviceKind device = DEVICE_CPU);

}  // namespace strata

#endif  // STRATA_PASSES_PIPELINE_BUILDER_H_
