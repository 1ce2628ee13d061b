// bench/op_profile: where a training step's time goes, op by op. Runs the
// compiled plan's ops in the executor's order (forward, backward, optimize)
// through the same registered kernels, timing each Compute; prints the ops
// and op types by median time. A profiling aid for the train_step figures,
// not a benchmark with a goal.
//
//   bazel run //bench:op_profile -- --model=convnet --batch=64 [--steps=20] [--top=25]

#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "runtime/initializers.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace bench {
namespace {

struct TimedOp {
  int index;
  std::unique_ptr<OpKernel> kernel;
  std::vector<const Tensor*> inputs;
  std::vector<int> output_slots;
  std::vector<Tensor> outputs;
  std::vector<double> ms;
  bool refresh_only = false;  // role REFRESH: run once, before the steps, untimed
};

int Phase(OpRole role) {
  if (role == FORWARD || role == LOSS) return 0;
  if (role == BACKWARD) return 1;
  return 2;
}

absl::Status Run(const std::string& model, int64_t batch, int steps, int top) {
  auto plan = CompileGenerated(model, GenOptions(), batch);
  if (!plan.ok()) return plan.status();
  const Program& program = plan->program();
  std::map<std::string, int> slot_of;
  std::vector<Tensor> slots(program.var_size());
  for (int i = 0; i < program.var_size(); ++i) slot_of[program.var(i).name()] = i;

  // Feeds, parameters and state as the executor would hold them.
  auto executor = Executor::Create(*plan, ExecutorOptions());
  if (!executor.ok()) return executor.status();
  auto feeds = SyntheticFeeds(**executor, batch, 10, 1);
  if (!feeds.ok()) return feeds.status();
  for (int i = 0; i < program.var_size(); ++i) {
    const Var& v = program.var(i);
    if (v.kind() == PARAM) {
      auto t = InitializeParam(v, 0);
      if (!t.ok()) return t.status();
      slots[i] = *t;
    } else if (v.kind() == STATE || v.kind() == SCRATCH) {
      slots[i] = Tensor::Zeros(v.dtype(), Shape(v.shape().begin(), v.shape().end()));
    } else if (v.kind() == FEED && feeds->count(v.name())) {
      slots[i] = feeds->at(v.name());
    }
  }

  // The casts of the weights into their 16-bit copies (PARAM_COPY: the
  // optimizer's, or REFRESH ops where the updates write the copies) run
  // first, as the executor runs them before a first step: every step's
  // forward reads them.
  auto phase_of = [&](const Op& op) {
    if (op.role() == REFRESH) return -1;
    bool casts = op.output_size() > 0;  // every output a copy (an update writes its param too)
    for (const auto& out : op.output()) casts = casts && program.var(slot_of.at(out)).kind() == PARAM_COPY;
    return casts ? -1 : Phase(op.role());
  };
  std::vector<TimedOp> ops;
  for (int phase = -1; phase < 3; ++phase) {
    for (int i = 0; i < program.op_size(); ++i) {
      const Op& op = program.op(i);
      if (phase_of(op) != phase) continue;
      TimedOp t;
      t.index = i;
      KernelDef def;
      def.op = &op;
      for (const auto& in : op.input()) {
        const Var& v = program.var(slot_of.at(in));
        t.inputs.push_back(&slots[slot_of.at(in)]);
        def.input_types.push_back(TensorType{v.dtype(), Shape(v.shape().begin(), v.shape().end())});
      }
      for (const auto& out : op.output()) {
        const Var& v = program.var(slot_of.at(out));
        t.output_slots.push_back(slot_of.at(out));
        def.output_types.push_back(TensorType{v.dtype(), Shape(v.shape().begin(), v.shape().end())});
      }
      t.outputs.resize(op.output_size());
      const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), DEVICE_CPU, KernelDtype(def));
      if (factory == nullptr) return absl::NotFoundError(absl::StrCat("no kernel for ", op.type()));
      auto kernel = (*factory)(def);
      if (!kernel.ok()) return kernel.status();
      t.kernel = std::move(*kernel);
      t.refresh_only = op.role() == REFRESH;
      ops.push_back(std::move(t));
    }
  }

  RunContext run;
  std::vector<double> step_ms;
  for (int s = 0; s < steps + 3; ++s) {
    run.step = s;
    auto step_begin = Clock::now();
    for (TimedOp& t : ops) {
      if (t.refresh_only && s > 0) continue;  // the executor refreshes the copies once, then the updates write them
      KernelContext ctx(&run, t.inputs, absl::MakeSpan(t.outputs));
      auto t0 = Clock::now();
      absl::Status status = t.kernel->Compute(ctx);
      const double ms = SecondsSince(t0) * 1e3;
      if (!status.ok()) return status;
      for (size_t k = 0; k < t.output_slots.size(); ++k) slots[t.output_slots[k]] = std::move(t.outputs[k]);
      if (s >= 3) t.ms.push_back(ms);  // the first steps warm caches and the pool
    }
    if (s >= 3) step_ms.push_back(SecondsSince(step_begin) * 1e3);
  }

  double total = 0;
  std::map<std::string, double> by_type;
  std::vector<std::pair<double, const TimedOp*>> rows;
  for (const TimedOp& t : ops) {
    if (t.refresh_only) continue;
    const double m = Median(t.ms);
    total += m;
    by_type[program.op(t.index).type()] += m;
    rows.push_back({m, &t});
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::printf("op_profile %s batch %lld, %d threads: step %.3f ms (median), sum of op medians %.3f ms, %zu ops\n",
              model.c_str(), static_cast<long long>(batch), IntraOpThreads(), Median(step_ms), total, rows.size());
  std::printf("%8s %6s  %-28s %s\n", "ms", "share", "op", "output");
  for (int r = 0; r < std::min<int>(top, rows.size()); ++r) {
    const Op& op = program.op(rows[r].second->index);
    const Tensor& out = slots[rows[r].second->output_slots.empty() ? 0 : rows[r].second->output_slots[0]];
    std::printf("%8.3f %5.1f%%  #%-3d %-23s %s\n", rows[r].first, 100 * rows[r].first / total, rows[r].second->index,
                op.type().c_str(), ShapeString(out.shape()).c_str());
  }
  std::vector<std::pair<double, std::string>> types;
  for (const auto& [type, ms] : by_type) types.push_back({ms, type});
  std::sort(types.rbegin(), types.rend());
  std::printf("by op type:\n");
  for (const auto& [ms, type] : types) std::printf("%8.3f %5.1f%%  %s\n", ms, 100 * ms / total, type.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace bench
}  // namespace strata

int main(int argc, char** argv) {
  using strata::bench::FlagValue;
  using strata::bench::IntFlag;
  const std::string model = FlagValue(argc, argv, "model", "convnet");
  const int64_t batch = IntFlag(argc, argv, "batch", model == "convnet" ? 64 : 256);
  const int64_t steps = IntFlag(argc, argv, "steps", 20);
  const int64_t top = IntFlag(argc, argv, "top", 25);
  if (batch < 1 || steps < 1 || top < 0) {
    std::fprintf(stderr, "op_profile: --batch and --steps must be >= 1\n");
    return 2;
  }
  absl::Status s = strata::bench::Run(model, batch, static_cast<int>(steps), static_cast<int>(top));
  if (!s.ok()) {
    std::fprintf(stderr, "op_profile: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
