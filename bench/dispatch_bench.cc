// Strata's side of bench/dispatch: per-op overhead of the executor on a chain
// of tiny elementwise ops (scale, y = x + 0.001, on a [1, 8] tensor) run
// forward-only through Executor::Evaluate, plus a reduce_mean as the loss.
// Time per op = Evaluate's wall time / ops run (feed binding and the loss
// read-out included, so the figure is an upper bound on pure dispatch).
// Built as dispatch_bench_gpu (STRATA_DISPATCH_GPU), the same chain runs on
// GPU 0 from a feed already there: each op a kernel launch, the loss's read
// back the one synchronisation per chain. There, BM_StrataTrainStepDispatch
// also runs the chain as a training step (forward, backward, update), eager
// and as one CUDA graph replayed.
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

#ifdef STRATA_DISPATCH_GPU
// The same chain as a training step (a bias parameter b added first, SGD
// with learning rate 1e-30, which validation accepts where it refuses 0, and
// under which 1 + b rounds to 1, so every step computes the same loss): the step's
// forward, backward and update ops, eager (graph 0) or captured once as a
// CUDA graph and replayed (graph 1). Per op = step wall time / the plan's ops.
void BM_StrataTrainStepDispatch(benchmark::State& state) {
  const int chain_length = static_cast<int>(state.range(0));
  const bool graph = state.range(1) != 0;
  auto device = CudaDevice::Create(0);
  if (!device.ok()) return state.SkipWithError(std::string(device.status().message()).c_str());
  std::string text = ChainProgram(chain_length);
  text.replace(text.find("var {"), 0,
               "var { name: \"b\" dtype: F32 shape: [8] kind: PARAM init { constant { value: 0 } } }\n");
  text.replace(text.find("input: [\"x\"]"), 12, "input: [\"xb\"]");
  text.replace(text.find("op {"), 0, "op { type: \"add\" input: [\"x\", \"b\"] output: [\"xb\"] }\n");
  absl::StrAppend(&text, "optimizer { sgd { learning_rate: 1e-30 } }\n");
  auto plan = CompileText(text, /*batch_size=*/1, DEVICE_CUDA);
  if (!plan.ok()) return state.SkipWithError(std::string(plan.status().message()).c_str());
  ExecutorOptions options;
  options.device = device->get();
  options.cuda_graph = graph;
  auto executor = Executor::Create(*plan, options);
  if (!executor.ok()) return state.SkipWithError(std::string(executor.status().message()).c_str());
  Executor& e = **executor;
  if (!e.InitializeState().ok()) return state.SkipWithError("InitializeState failed");
  Tensor x = Tensor::Empty(F32, {1, 8});
  x.Fill(1.0);
  std::map<std::string, Tensor> feeds = {{"x", x}};
  const double want = 1.0 + chain_length * kBias;
  // Validate before timing, past the eager warm-up and the capture.
  for (int i = 0; i < 3; ++i) {
    auto r = e.TrainStep(feeds, 0);
    if (!r.ok() || std::fabs(r->loss - want) > 1e-4 * want) {
      return state.SkipWithError(
          absl::StrCat("validation: ", r.ok() ? absl::StrCat("loss ", r->loss, ", want ", want)
                                              : std::string(r.status().message())).c_str());
    }
  }
  if (graph && e.graphs() != 1) return state.SkipWithError(absl::StrCat("not captured: ", e.graph_note()).c_str());
  for (auto _ : state) {
    auto result = e.TrainStep(feeds, 0);
    benchmark::DoNotOptimize(result);
  }
  const int ops = plan->program().op_size();
  state.counters["ops"] = ops;
  state.counters["per_op"] = benchmark::Counter(static_cast<double>(ops) * state.iterations(),
                                                benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_StrataTrainStepDispatch)
    ->Args({1000, 0})
    ->Args({1000, 1})
    ->ArgNames({"chain", "graph"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
#endif

}  // namespace
}  // namespace bench
}  // namespace strata

BENCHMARK_MAIN();
