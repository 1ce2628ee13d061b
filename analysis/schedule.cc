#include "analysis/schedule.h"

#include <algorithm>

namespace strata {
namespace {
void Add(Schedule* s, Action::Kind kind, int mb) {
  Action* a = s->add_action();
  a->set_kind(kind);
  a->set_micro_batch(mb);
}
}  // namespace

Schedule BuildSchedule(ScheduleKind kind, int num_stages, int stage, int micro_batches) {
  Schedule s;
  s.set_kind(kind);
  s.set_micro_batches(micro_batches);
  if (kind == F_THEN_B) {
    for (int mb = 0; mb < micro_batches; ++mb) Add(&s, Action::FORWARD, mb);
    for (int mb = 0; mb < micro_batches; ++mb) Add(&s, Action::BACKWARD, mb);
  } else {
    const int warmup = std::min(num_stages - stage - 1, micro_batches);
    int next_forward = 0, next_backward = 0;
    for (; next_forward < warmup; ++next_forward) Add(&s, Action::FORWARD, next_forward);  // warm-up
    while (next_forward < micro_batches) {                                                   // steady 1F1B
      Add(&s, Action::FORWARD, next_forward++);
      Add(&s, Action::BACKWARD, next_backward++);
    }
    while (next_backward < micro_batches) Add(&s, Action::BACKWARD, next_backward++);  // cool-down
  }
  Add(&s, Action::OPTIMIZE, 0);
  return s;
}

double IdealBubbleFraction(int num_stages, int micro_batches) {
  return static_cast<double>(num_stages - 1) / (micro_batches + num_stages - 1);
}

}  // namespace strata
