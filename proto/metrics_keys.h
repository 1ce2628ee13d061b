#ifndef STRATA_PROTO_METRICS_KEYS_H_
#define STRATA_PROTO_METRICS_KEYS_H_

#include <array>

#include "absl/strings/string_view.h"

namespace strata {

// The keys `strata run --metrics` writes of its own in a step's line
// (runtime/trainer.cc StepMetricsJson), and those that tell an evaluation's
// and the summary's lines apart. A fetch is written under its name beside
// them, so validation refuses a fetch so named: the line's value would hide
// it, or it would be read as the line's (a fetched "summary" made every step
// line a summary to tools/compare_metrics.py).
inline constexpr std::array<absl::string_view, 12> kMetricsLineKeys = {
    "step",           "epoch",           "loss",    "optimizer_step", "lr",     "grad_norm", "loss_scale",
    "skipped_update", "samples_per_sec", "step_ms", "eval",           "summary"};

inline bool IsMetricsLineKey(absl::string_view name) {
  for (absl::string_view k : kMetricsLineKeys) {
    if (k == name) return true;
  }
  return false;
}

}  // namespace strata

#endif  // STRATA_PROTO_METRICS_KEYS_H_
