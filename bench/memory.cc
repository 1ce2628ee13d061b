// bench/memory: the executor's measured peak bytes for one training step
// against the memory plan's prediction (plan.memory().peak_bytes(): params +
// optimizer state + the largest set of live activations, feeds included).
// Measured = the CPU allocator's peak over one TrainStep, reset just before it
// (so it starts from what lives between steps: params, state and the feeds).
// Goal for the MLP at batch 256: within 10%. The convnet is shown for
// information (no goal).
//
//   bazel run //bench:memory -- [--steps=3]

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"

namespace strata {
namespace bench {
namespace {

double MiB(int64_t b) { return b / 1048576.0; }

absl::StatusOr<double> Measure(const std::string& model, int64_t batch, int steps) {
  auto plan = CompileGenerated(model, GenOptions(), batch);
  if (!plan.ok()) return plan.status();
  Allocator* allocator = GetCpuAllocator();
  const int64_t live_before = allocator->live_bytes();
  auto executor = Executor::Create(*plan, ExecutorOptions());
  if (!executor.ok()) return executor.status();
  Executor& e = **executor;
  if (auto s = e.InitializeState(); !s.ok()) return s;
  auto feeds = SyntheticFeeds(e, batch, 10, 1);
  if (!feeds.ok()) return feeds.status();
  // The first step's allocations are no different from later ones, but keep
  // it out of the figure anyway (lazily built kernel caches and the like).
  if (auto r = e.TrainStep(*feeds, 0); !r.ok() || !std::isfinite(r->loss)) {
    return r.ok() ? absl::InternalError("validation: non-finite loss") : r.status();
  }
  int64_t measured = 0;
  for (int i = 0; i < steps; ++i) {
    allocator->ResetPeak();
    auto r = e.TrainStep(*feeds, 0);
    if (!r.ok()) return r.status();
    measured = std::max(measured, allocator->peak_bytes() - live_before);
  }
  const MemoryPlan& m = plan->memory();
  const double ratio = static_cast<double>(measured) / m.peak_bytes();
  std::printf("%-7s batch %3lld: predicted %8.3f MiB (params %.3f, state %.3f, activations %.3f)  measured %8.3f MiB  "
              "measured/predicted %.3f\n",
              model.c_str(), static_cast<long long>(batch), MiB(m.peak_bytes()), MiB(m.param_bytes()), MiB(m.state_bytes()),
              MiB(m.activation_peak_bytes()), MiB(measured), ratio);
  std::printf("RESULT model=%s batch=%lld predicted_bytes=%lld measured_bytes=%lld ratio=%.4f\n", model.c_str(),
              static_cast<long long>(batch), static_cast<long long>(m.peak_bytes()), static_cast<long long>(measured), ratio);
  return ratio;
}

}  // namespace
}  // namespace bench
}  // namespace strata

int main(int argc, char** argv) {
  using strata::bench::IntFlag;
  using strata::bench::Measure;
  const int64_t steps = IntFlag(argc, argv, "steps", 3);
  if (steps < 1) {
    std::fprintf(stderr, "memory: --steps must be >= 1\n");
    return 2;
  }
  auto mlp = Measure("mlp", 256, static_cast<int>(steps));
  if (!mlp.ok()) {
    std::fprintf(stderr, "memory: mlp: %s\n", std::string(mlp.status().message()).c_str());
    return 1;
  }
  std::printf("  mlp within 10%% of the plan: %s\n", std::fabs(*mlp - 1.0) <= 0.10 ? "PASS" : "MISS");
  auto conv = Measure("convnet", 64, static_cast<int>(steps));
  if (!conv.ok()) {
    std::fprintf(stderr, "memory: convnet: %s\n", std::string(conv.status().message()).c_str());
    return 1;
  }
  std::printf("  convnet (no goal): %+.1f%% against the plan\n", (*conv - 1.0) * 100);
  return 0;
}
