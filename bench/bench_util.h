#ifndef STRATA_BENCH_BENCH_UTIL_H_
#define STRATA_BENCH_BENCH_UTIL_H_

// Helpers shared by the benchmarks: compile a generated model for one batch
// size, make synthetic feeds outside the timed loop, summarize timings.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/plan.pb.h"
#include "runtime/executor.h"
#include "runtime/tensor.h"
#include "tools/model_gen.h"

namespace strata {
namespace bench {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// `strata gen <model>` with `options`, parsed and compiled for one device at `batch_size`.
absl::StatusOr<RankPlan> CompileGenerated(const std::string& model, const GenOptions& options, int64_t batch_size,
                                          DeviceKind device_kind = DEVICE_CPU);

// Parses and compiles program text for one device at `batch_size`.
absl::StatusOr<RankPlan> CompileText(const std::string& text, int64_t batch_size,
                                     DeviceKind device_kind = DEVICE_CPU);

// One tensor per feed the executor reads: floats uniform in [0, 1), integer
// labels uniform in [0, num_classes). Deterministic in `seed`.
absl::StatusOr<std::map<std::string, Tensor>> SyntheticFeeds(const Executor& executor, int64_t batch_size,
                                                             int64_t num_classes, uint64_t seed);

double Median(std::vector<double> values);

// The loss of the first and last step and each timed step's milliseconds.
struct StepTimes {
  double first_loss = 0;
  double last_loss = 0;
  std::vector<double> ms;
};
// Runs max(warmup, 5) training steps on `feeds`, which must give finite
// losses and lower the loss on the fixed batch (Adam does), then times
// `steps` more, each until its loss is on the host.
absl::StatusOr<StepTimes> TimeTrainSteps(Executor& executor, const std::map<std::string, Tensor>& feeds,
                                         int64_t warmup, int64_t steps);

// The value of `--name=V` or `--name V` in argv, else `fallback`.
std::string FlagValue(int argc, char** argv, const std::string& name, const std::string& fallback);
int64_t IntFlag(int argc, char** argv, const std::string& name, int64_t fallback);

}  // namespace bench
}  // namespace strata

#endif  // STRATA_BENCH_BENCH_UTIL_H_
