#ifndef STRATA_RUNTIME_STEP_GRAPH_H_
#define STRATA_RUNTIME_STEP_GRAPH_H_

// Whether the executor captures a rank's steady-state training step as a
// device graph (a CUDA graph) and replays it, and why not where it does not.
//
// The executor (runtime/executor.h) runs the step's first instance of each
// shape eagerly (caches warm: cuBLASLt plans, allocator segments, page-locked
// blocks), captures the second, and replays it from then on; a step of
// another shape (gradient merge's k-th step, which runs the optimizer) gets
// its own graph, sharing the first one's memory. What a graph must not
// freeze lives in device memory: the step counter, learning rate, Adam's
// step and the loss scale are device state already, dropout reads the
// executor's counters (RunContext::random_counters), and the feeds are
// copied into fixed buffers before each replay.
//
// Refused before the first step (this decision, testable anywhere):
// --cuda_graph=false; a device without graphs (the host); --trace, which
// times every op; a step that communicates: over Gloo staged through host
// memory (on the host, outside any stream) where ranks share a GPU, over
// NCCL with a GPU each, whose Works the executor polls on the host (an
// event query, illegal under capture). Refused at run time, after
// which the step runs eagerly for good, with the reason logged: an op that
// writes a persistent var into a new buffer rather than in place (a replay
// would write the captured buffer and read the stale one; the executor
// checks every eager step, on the CPU too), and a capture the device
// refused (an op that synchronises, or any CUDA error under capture).

#include <string>

#include "proto/plan.pb.h"

namespace strata {

struct StepGraphConditions {
  bool requested = false;          // --cuda_graph
  std::string device_unsupported;  // Device::GraphUnsupported()
  bool tracing = false;            // --trace
};

// "" when the executor may try to capture `plan`'s training step, else why
// not, as a clause for "note: --cuda_graph: not used: <reason>".
std::string StepGraphBlocker(const RankPlan& plan, const StepGraphConditions& conditions);

// Whether `op` talks to other ranks (a pipeline transfer or a collective).
bool IsCommunicationOp(const Op& op);

}  // namespace strata

#endif  // STRATA_RUNTIME_STEP_GRAPH_H_
