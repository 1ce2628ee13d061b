// Strata's side of bench/train_step_gpu: median time of one training step
// (forward, backward, Adam, the loss and accuracy read back to the host) of
// a generated model on one GPU, on a fixed synthetic batch that lives on the
// GPU. Prints one "RESULT key=value ..." line for the driver
// (train_step_gpu.py), which runs PyTorch eager on the same GPU beside it.
//
//   train_step_gpu --model=mlp --batch=256 --warmup=10 --steps=200

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "runtime/cuda/cuda_device.h"

namespace strata {
namespace bench {
namespace {

absl::Status Run(const std::string& model, int64_t batch, int64_t warmup, int64_t steps) {
  auto device = CudaDevice::Create(0);
  if (!device.ok()) return device.status();
  GenOptions gen;  // adam, the model's default widths
  auto plan = CompileGenerated(model, gen, batch, DEVICE_CUDA);
  if (!plan.ok()) return plan.status();
  ExecutorOptions options;
  options.device = device->get();
  auto executor = Executor::Create(*plan, options);
  if (!executor.ok()) return executor.status();
  Executor& e = **executor;
  if (auto s = e.InitializeState(); !s.ok()) return s;
  auto host_feeds = SyntheticFeeds(e, batch, /*num_classes=*/10, /*seed=*/1);
  if (!host_feeds.ok()) return host_feeds.status();
  std::map<std::string, Tensor> feeds;  // on the GPU once, as the torch side's
  for (const auto& [name, t] : *host_feeds) {
    auto on_gpu = t.CopyTo(device->get());
    if (!on_gpu.ok()) return on_gpu.status();
    feeds[name] = *on_gpu;
  }

  auto times = TimeTrainSteps(e, feeds, warmup, steps);
  if (!times.ok()) return times.status();
  const std::vector<double>& ms = times->ms;
  const double first_loss = times->first_loss, last_loss = times->last_loss;
  const CachingAllocator::Stats stats = (*device)->caching_allocator()->stats();
  std::printf(
      "RESULT side=strata model=%s batch=%lld ops=%d median_ms=%.4f min_ms=%.4f loss_first=%.5f loss_last=%.5f "
      "segments=%lld cache_hits=%lld\n",
      model.c_str(), static_cast<long long>(batch), plan->program().op_size(), Median(ms),
      *std::min_element(ms.begin(), ms.end()), first_loss, last_loss,
      static_cast<long long>(stats.segment_allocations), static_cast<long long>(stats.cache_hits));
  return absl::OkStatus();
}

}  // namespace
}  // namespace bench
}  // namespace strata

int main(int argc, char** argv) {
  using strata::bench::FlagValue;
  using strata::bench::IntFlag;
  const std::string model = FlagValue(argc, argv, "model", "mlp");
  const int64_t batch = IntFlag(argc, argv, "batch", 256);
  const int64_t warmup = IntFlag(argc, argv, "warmup", 10);
  const int64_t steps = IntFlag(argc, argv, "steps", 200);
  if (batch < 1 || steps < 1 || warmup < 0) {
    std::fprintf(stderr, "error: train_step_gpu: --batch and --steps must be >= 1, --warmup >= 0\n");
    return 2;
  }
  absl::Status s = strata::bench::Run(model, batch, warmup, steps);
  if (!s.ok()) {
    std::fprintf(stderr, "error: train_step_gpu: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
