#ifndef STRATA_KERNELS_LR_SCHEDULE_OF_H_
#define STRATA_KERNELS_LR_SCHEDULE_OF_H_

#include "kernels/optimizer_math.h"
#include "proto/program.pb.h"

namespace strata {

// The learning-rate schedule of a program's optimizer section: the one
// source of the lr_schedule op's attrs (passes/optimizer.cc) and of the rate
// a training step reports (Executor, StepResult.lr). No optimizer: base_lr 0.
kernel_math::LrSchedule LrScheduleOf(const Optimizer& optimizer);

}  // namespace strata

#endif  // STRATA_KERNELS_LR_SCHEDULE_OF_H_
