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
// times every op; a step that communicates over a transport that runs on the
// host (Gloo, staged through host memory where ranks share a GPU:
// Communicator::GraphBlocker). A step that communicates over NCCL (a GPU
// each) is captured with its transfers and collectives: their Works only
// order the compute stream under the capture, and the host watches each
// replay (the transports' health, --comm_timeout_s) in place of the Works
// (Executor). Refused at run time, after
// which the step runs eagerly for good, with the reason logged: an op that
// writes a persistent var into a new buffer rather than in place (a replay
// would write the captured buffer and read the stale one; the executor
// checks every eager step, on the CPU too), and a capture the device
// refused (an op that synchronises, or any CUDA error under capture).
//
// On several ranks the choice is the world's, never one rank's: NCCL holds
// whether a launch is graph-captured to be a collective property of the
// operation, uniform over the ranks in it, so one rank's eager allreduce
// against its peers' replayed one is undefined (a hang). The ranks vote
// (AgreeOnStepGraphs) after the eager warm-up of each step shape and again
// after each capture, before its first launch; one rank that cannot turns
// graphs off on all of them, at the same step.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "proto/plan.pb.h"

namespace strata {

class Communicator;
class CommunicatorSet;

struct StepGraphConditions {
  bool requested = false;          // --cuda_graph
  std::string device_unsupported;  // Device::GraphUnsupported()
  bool tracing = false;            // --trace
  // The rank's communicators, which serve the plan's transfers and
  // collectives; null where the plan has none.
  const CommunicatorSet* comms = nullptr;
};

// "" when the executor may try to capture `plan`'s training step, else why
// not, as a clause for "note: --cuda_graph: not used: <reason>".
std::string StepGraphBlocker(const RankPlan& plan, const StepGraphConditions& conditions);

// Whether `op` talks to other ranks (a pipeline transfer or a collective).
bool IsCommunicationOp(const Op& op);

// The communicators `plan`'s communication ops go through (the transfer
// transport for transfers, each group's Get for collectives), once each,
// in the order of the ops; an error names an op whose group `comms` lacks.
absl::StatusOr<std::vector<Communicator*>> StepCommunicators(const RankPlan& plan, const CommunicatorSet* comms);

// The world's verdict on using step graphs: the lowest rank that cannot
// and its reason, or rank -1 when every rank can.
struct StepGraphVote {
  int rank = -1;
  std::string reason;
};

// Every rank of `world` calls it at the same point of the same step with
// why it cannot capture (or keep) its step graph, "" when it can, and all
// get the same verdict (AllGatherStrings of the reasons; each allgather
// waits at most `timeout`, and an error says the vote failed).
absl::StatusOr<StepGraphVote> AgreeOnStepGraphs(Communicator& world, const std::string& why_not,
                                                absl::Duration timeout);

}  // namespace strata

#endif  // STRATA_RUNTIME_STEP_GRAPH_H_
