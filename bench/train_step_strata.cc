// Strata's side of bench/train_step: median time of one training step
// (forward, backward, Adam) of a generated model on a fixed synthetic batch.
// Prints one "RESULT key=value ..." line for the driver (train_step.py).
//
//   train_step_strata --model=mlp --batch=256 --warmup=10 --steps=50

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace bench {
namespace {

absl::Status Run(const std::string& model, int64_t batch, int64_t warmup, int64_t steps) {
  GenOptions gen;  // adam, the model's default widths
  auto plan = CompileGenerated(model, gen, batch);
  if (!plan.ok()) return plan.status();
  auto executor = Executor::Create(*plan, ExecutorOptions());
  if (!executor.ok()) return executor.status();
  Executor& e = **executor;
  if (auto s = e.InitializeState(); !s.ok()) return s;
  auto feeds = SyntheticFeeds(e, batch, /*num_classes=*/10, /*seed=*/1);
  if (!feeds.ok()) return feeds.status();

  // Validate before timing: finite losses, and Adam on one fixed batch must
  // lower the loss over the warm-up steps.
  auto times = TimeTrainSteps(e, *feeds, warmup, steps);
  if (!times.ok()) return times.status();
  const std::vector<double>& ms = times->ms;
  const double first_loss = times->first_loss, last_loss = times->last_loss;
  std::printf("RESULT side=strata model=%s batch=%lld threads=%d ops=%d median_ms=%.4f min_ms=%.4f loss_first=%.5f loss_last=%.5f\n",
              model.c_str(), static_cast<long long>(batch), IntraOpThreads(), plan->program().op_size(), Median(ms),
              *std::min_element(ms.begin(), ms.end()), first_loss, last_loss);
  return absl::OkStatus();
}

}  // namespace
}  // namespace bench
}  // namespace strata

int main(int argc, char** argv) {
  using strata::bench::FlagValue;
  using strata::bench::IntFlag;
  const std::string model = FlagValue(argc, argv, "model", "mlp");
  const int64_t batch = IntFlag(argc, argv, "batch", model == "convnet" ? 64 : 256);
  const int64_t warmup = IntFlag(argc, argv, "warmup", 10);
  const int64_t steps = IntFlag(argc, argv, "steps", 50);
  if (batch < 1 || steps < 1 || warmup < 0) {
    std::fprintf(stderr, "train_step_strata: --batch and --steps must be >= 1, --warmup >= 0\n");
    return 2;
  }
  absl::Status s = strata::bench::Run(model, batch, warmup, steps);
  if (!s.ok()) {
    std::fprintf(stderr, "train_step_strata: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
