#ifndef STRATA_ANALYSIS_MEMORY_PLAN_H_
#define STRATA_ANALYSIS_MEMORY_PLAN_H_

#include <map>
#include <utility>

#include "absl/status/statusor.h"
#include "compiler/graph.h"
#include "proto/plan.pb.h"
#include "proto/program.pb.h"

namespace strata {

// Which op is the last use of every activation (so the executor frees it at
// once), and the predicted peak bytes of a rank running `schedule` with
// micro-batches of `micro_batch_size` samples: parameters and optimizer state,
// plus the largest set of activations alive at once over the schedule.
// Loss and fetch vars live to the end of their action (they are reported).
//
// A sent buffer stays alive until its receiver takes it: `send_release` maps
// (channel id, micro-batch) to the index of this rank's action at whose end
// the executor waits for that and drops the buffer (from the timeline of all
// ranks, see DeferDeadlockingSendWaits); a send it lacks is held to the end
// of the step. The plan lists these waits (MemoryPlan.send_waits) for the
// executor. Without a map, a sent buffer is held to the next action's end.
using SendRelease = std::map<std::pair<int64_t, int>, int>;
// Kernels that draw scratch memory (the convolutions) count it while they
// run, as `device_kind`'s kernels register it, sized for `threads` intra-op
// threads (0: this process's count).
absl::StatusOr<MemoryPlan> PlanMemory(const Graph& graph, const Schedule& schedule, int64_t micro_batch_size,
                                      const SendRelease* send_release = nullptr, int threads = 0,
                                      DeviceKind device_kind = DEVICE_CPU);

}  // namespace strata

#endif  // STRATA_ANALYSIS_MEMORY_PLAN_H_
