// Strata's side of bench/dispatch: per-op overhead of the executor on a chain
// of tiny elementwise ops (scale, y = x + 0.001, on a [1, 8] tensor) run
// forward-only through Executor::Evaluate, plus a reduce_mean as the loss.
// Time per op = Evaluate's wall time / ops run (feed binding and the loss
// read-out included, so the figure is an upper bound on pure dispatch).
// Built as dispatch_bench_gpu (STRATA_DISPATCH_GPU), the same chain runs on
// GPU 0 from a feed already there: each op a kernel launch, the loss's read
// back the one synchronisation per chain (no CUDA graphs yet).
//
//   dispatch_bench [--benchmark_format=json] [--benchmark_repetitions=5]

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "bench/bench_util.h"
#ifdef STRATA_DISPATCH_GPU
#include "runtime/cuda/cuda_device.h"
#endif

namespace strata {
namespace bench {
namespace {

constexpr double kBias = 0.001;

// x (all ones) -> chain_length x scale(bias 0.001) -> reduce_mean -> loss.
std::string ChainProgram(int chain_length) {
  std::string text = "name: \"dispatch_chain\"\nvar { name: \"x\" dtype: F32 shape: [-1, 8] kind: FEED }\n";
  std::string prev = "x";
  for (int i = 0; i < chain_length; ++i) {
    std::string out = absl::StrCat("s", i);
    absl::StrAppend(&text, "op { type: \"scale\" input: [\"", prev, "\"] output: [\"", out,
                    "\"] attr { key: \"bias\" value { f: ", kBias, " } } }\n");
    prev = out;
  }
  absl::StrAppend(&text, "op { type: \"reduce_mean\" input: [\"", prev, "\"] output: [\"loss\"] }\nloss: \"loss\"\n");
  return text;
}

void BM_StrataDispatch(benchmark::State& state) {
  const int chain_length = static_cast<int>(state.range(0));
#ifdef STRATA_DISPATCH_GPU
  auto device = CudaDevice::Create(0);
  if (!device.ok()) return state.SkipWithError(std::string(device.status().message()).c_str());
  const DeviceKind kind = DEVICE_CUDA;
#else
  const DeviceKind kind = DEVICE_CPU;
#endif
  auto plan = CompileText(ChainProgram(chain_length), /*batch_size=*/1, kind);
  if (!plan.ok()) return state.SkipWithError(std::string(plan.status().message()).c_str());
  ExecutorOptions options;
#ifdef STRATA_DISPATCH_GPU
  options.device = device->get();
#endif
  auto executor = Executor::Create(*plan, options);
  if (!executor.ok()) return state.SkipWithError(std::string(executor.status().message()).c_str());
  Executor& e = **executor;
  if (!e.InitializeState().ok()) return state.SkipWithError("InitializeState failed");
  Tensor x = Tensor::Empty(F32, {1, 8});
  x.Fill(1.0);
#ifdef STRATA_DISPATCH_GPU
  auto on_gpu = x.CopyTo(device->get());
  if (!on_gpu.ok()) return state.SkipWithError(std::string(on_gpu.status().message()).c_str());
  x = *on_gpu;
#endif
  std::map<std::string, Tensor> feeds = {{"x", x}};

  // Validate before timing: every element is 1 + chain_length * 0.001.
  auto r = e.Evaluate(feeds, 0);
  const double want = 1.0 + chain_length * kBias;
  if (!r.ok() || std::fabs(r->loss - want) > 1e-4 * want) {
    return state.SkipWithError(absl::StrCat("validation: loss ", r.ok() ? r->loss : NAN, ", want ", want).c_str());
  }
  int ops = 0;
  for (const Op& op : plan->program().op()) ops += op.role() == FORWARD || op.role() == LOSS;

  for (auto _ : state) {
    auto result = e.Evaluate(feeds, 0);
    benchmark::DoNotOptimize(result);
  }
  state.counters["ops"] = ops;
  // Seconds per op, shown by the console reporter as e.g. "250n".
  state.counters["per_op"] = benchmark::Counter(static_cast<double>(ops) * state.iterations(),
                                                benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_StrataDispatch)->Arg(1000)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace bench
}  // namespace strata

BENCHMARK_MAIN();
