#ifndef STRATA_ANALYSIS_SCHEDULE_H_
#define STRATA_ANALYSIS_SCHEDULE_H_

#include "proto/plan.pb.h"

namespace strata {

// A rank's action list: FORWARD(mb), BACKWARD(mb) and a final OPTIMIZE.
// F_THEN_B runs all forwards, then all backwards (GPipe). ONE_F_ONE_B runs
// (stages - stage - 1) warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards (PipeDream-flush / Megatron).
Schedule BuildSchedule(ScheduleKind kind, int num_stages, int stage, int micro_batches);

// The bubble fraction of a pipeline with equal-cost stages: (K-1)/(M+K-1).
double IdealBubbleFraction(int num_stages, int micro_batches);

}  // namespace strata

#endif  // STRATA_ANALYSIS_SCHEDULE_H_
