#include "kernels/lr_schedule_of.h"

namespace strata {

kernel_math::LrSchedule LrScheduleOf(const Optimizer& optimizer) {
  kernel_math::LrSchedule s;
  switch (optimizer.kind_case()) {
    case Optimizer::kSgd: s.base_lr = optimizer.sgd().learning_rate(); break;
    case Optimizer::kMomentum: s.base_lr = optimizer.momentum().learning_rate(); break;
    case Optimizer::kAdam: s.base_lr = optimizer.adam().learning_rate(); break;
    case Optimizer::kAdamw: s.base_lr = optimizer.adamw().learning_rate(); break;
    default: break;
  }
  const Optimizer::LrSchedule& schedule = optimizer.lr_schedule();
  s.warmup_steps = schedule.warmup_steps();
  if (schedule.has_cosine()) {
    s.kind = kernel_math::LrScheduleKind::kCosine;
    s.decay_steps = schedule.cosine().decay_steps();
    s.alpha = schedule.cosine().alpha();
  } else if (schedule.has_step_decay()) {
    s.kind = kernel_math::LrScheduleKind::kStep;
    s.step_size = schedule.step_decay().step_size();
    s.gamma = schedule.step_decay().gamma();
  }
  return s;
}

}  // namespace strata
