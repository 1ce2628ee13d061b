#ifndef STRATA_ANALYSIS_VERIFY_SCHEDULE_H_
#define STRATA_ANALYSIS_VERIFY_SCHEDULE_H_

#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/plan.pb.h"

namespace strata {

// Runs every rank's action list together, as the executor will: within an
// action a rank runs its transfers in program order; a send is posted and the
// rank moves on (sends are asynchronous), a recv blocks until the matching
// send (same channel and micro-batch) has been posted. Fails if a recv's
// shape or dtype differs from its send's, if a channel has no partner, if a
// send is never received, or if some ranks would wait forever, printing the
// cycle of waits (rank, action, channel).
absl::Status VerifySchedules(const std::vector<RankPlan>& plans);

// When each rank's actions run if a forward costs `forward_cost`, a backward
// `backward_cost` and an optimize nothing, each action starting once its rank
// is free and what it receives before its work has been sent. Sends are
// posted when the sender's work is done; an action that receives after a send
// of its own (a tied weight's gradient parts, summed by the owner and sent
// back) ends only once that has come. Gives the predicted bubble (idle over
// the pipeline's makespan) and the diagram `strata check` prints. Call after
// VerifySchedules succeeded.
struct Timeline {
  struct Slot {
    Action action;
    double start = 0, end = 0;
    double work_end = 0;  // start + the action's cost; before end while it waits to receive
  };
  std::vector<std::vector<Slot>> ranks;
  double makespan = 0;
  std::vector<double> bubble;  // per rank
  // One row per rank, one column per time unit: the digit N is the forward of
  // micro-batch N, the letter a+N its backward, '.' idle.
  std::string Diagram() const;
};
Timeline SimulateTimeline(const std::vector<RankPlan>& plans, double forward_cost = 1, double backward_cost = 2);
// The same with each rank's own costs (costs[r] = {forward, backward}, e.g.
// from EstimateActionCosts): a stage that does more work holds the others up.
Timeline SimulateTimeline(const std::vector<RankPlan>& plans, const std::vector<std::pair<double, double>>& costs);

// For each send of `rank` (channel id, micro-batch): the index of the rank's
// own action that is running when the receiver starts the action that takes
// it, on the timeline (when the sent buffer can be freed).
std::map<std::pair<int64_t, int>, int> SendReleaseActions(const std::vector<RankPlan>& plans, const Timeline& timeline,
                                                          int rank);

// The executor waits, at the end of the action a send's release names, for
// its receiver to have taken it (so the memory plan is a bound, not a guess
// about how fast the ranks run). Such a wait must not close a cycle: runs
// every rank's transfers as the executor does (an action posts all its
// receives when it starts, then sends and receives in program order, then
// waits for the sends released at its end) and, whenever the ranks would wait
// on one another forever, moves the wait of the first rank stuck on one to the
// end of its next action. Such cycles come from ties on the timeline (two
// equal stages each waiting at the end of an action for the other to start
// its next). `releases[r]` is rank r's map as from SendReleaseActions, and
// gets an entry for every send (one it lacked: the rank's last action, the
// end of the step). Call after VerifySchedules succeeded.
absl::Status DeferDeadlockingSendWaits(const std::vector<RankPlan>& plans,
                                       std::vector<std::map<std::pair<int64_t, int>, int>>* releases);

}  // namespace strata

#endif  // STRATA_ANALYSIS_VERIFY_SCHEDULE_H_
