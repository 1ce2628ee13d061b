#include "tests/parity_util.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "compiler/program_text.h"
#include "passes/compile.h"
#include "runtime/allocator.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

namespace strata {
namespace {

bool IsParam(const Program& program, const std::string& name) {
  for (const Var& v : program.var()) {
    if (v.name() == name) return v.kind() == PARAM;
  }
  return false;
}

TrainOptions BaseOptions(const ParityOptions& options) {
  TrainOptions t;
  t.data = options.data;
  t.steps = options.steps;
  t.seed = options.seed;
  t.progress = false;
  t.comm_timeout_s = 60;
  t.eval_data = options.eval_data;
  t.eval_every = options.eval_every;
  t.eval_only = options.eval_only;
  t.save_dir = options.save_dir;
  t.save_every = options.save_every;
  t.keep_checkpoints = options.keep_checkpoints;
  t.load_dir = options.load_dir;
  return t;
}

}  // namespace

GenOptions TinyGpt(const std::string& dtype, int stages) {
  GenOptions gen;
  gen.blocks = 2;
  gen.d_model = 64;
  gen.heads = 4;
  gen.seq = 32;
  gen.vocab = 256;
  gen.stages = stages;
  gen.dtype = dtype;
  gen.learning_rate = 2e-3;
  return gen;
}

absl::StatusOr<Program> GenerateModel(const std::string& model, const GenOptions& gen) {
  absl::StatusOr<std::string> text = GenerateProgram(model, gen);
  if (!text.ok()) return text.status();
  return ParseProgramText(*text, model + ".pbtxt");
}

absl::StatusOr<ParityRun> TrainSingleDevice(const Program& program, int64_t batch_size, const ParityOptions& options) {
  CompileOptions copts;
  copts.batch_size = batch_size;
  copts.device_kind = options.compile_for;
  copts.disabled_passes = options.disabled_passes;
  auto compiled = Compile(program, Strategy(), copts);
  if (!compiled.ok()) return compiled.status();
  for (RankPlan& plan : compiled->plans) plan.set_device_kind(DEVICE_CPU);
  ParityRun run;
  {
    ExecutorOptions eopts;
    eopts.seed = options.seed;
    auto e = Executor::Create(compiled->plans[0], eopts);
    if (!e.ok()) return e.status();
    if (auto s = (*e)->InitializeState(); !s.ok()) return s;
    for (const auto& [name, t] : (*e)->PersistentState()) {
      if (!IsParam(compiled->plans[0].program(), name)) continue;
      std::vector<double>& out = run.initial_weights[name];
      for (int64_t i = 0; i < t.num_elements(); ++i) out.push_back(t.ValueAt(i));
    }
  }
  auto report = Train(compiled->plans[0], BaseOptions(options));
  if (!report.ok()) return report.status();
  for (const auto& s : report->steps) {
    run.losses.push_back(s.loss);
    run.fetches.push_back(s.fetches);
    run.lrs.push_back(s.has_lr ? s.lr : -1);
    run.grad_norms.push_back(s.has_grad_norm ? s.grad_norm : -1);
    run.optimizer_steps.push_back(s.optimizer_step);
    if (s.has_loss_scale) run.loss_scales.push_back(s.loss_scale);
    if (s.has_loss_scale) run.skipped_updates.push_back(s.skipped_update);
  }
  run.evals = report->evals;
  if (!report->evals.empty()) {
    run.eval_loss = report->evals.back().loss;
    run.eval_accuracy = report->evals.back().accuracy;
  }
  for (const auto& [name, values] : report->final_state) {
    if (IsParam(compiled->plans[0].program(), name)) run.weights[name] = values;
  }
  run.measured_peak_bytes[0] = report->measured_peak_bytes;
  run.predicted_peak_bytes[0] = report->predicted_peak_bytes;
  return run;
}

absl::StatusOr<ParityRun> TrainParallel(const Program& program, const Strategy& strategy,
                                        const ParityOptions& options) {
  CompileOptions copts;
  copts.batch_size = options.batch_size;
  // On make_device's devices the plans are theirs; else compiled for
  // compile_for and run on the CPU's kernels.
  copts.device_kind = options.make_device ? options.device_kind : options.compile_for;
  copts.disabled_passes = options.disabled_passes;
  copts.mixed_precision_fold_losses = options.mixed_precision_fold_losses;
  auto compiled = Compile(program, strategy, copts);
  if (!compiled.ok()) return compiled.status();
  if (!options.make_device || options.cpu_kernels) {
    for (RankPlan& plan : compiled->plans) plan.set_device_kind(DEVICE_CPU);
  }

  absl::Mutex mu;
  ParityRun run;
  absl::Status status;  // replicas that differ
  std::vector<absl::Status> results = testing::RunConnectedPlans(compiled->plans, [&](int rank, CommunicatorSet* comms) {
    const RankPlan& plan = compiled->plans[rank];
    TrainOptions topts = BaseOptions(options);
    topts.comms = comms;
    if (!options.trace_dir.empty()) topts.trace_path = absl::StrCat(options.trace_dir, "/rank-", rank, ".json");
    CpuAllocator allocator;  // per rank: its own byte counters
    CpuDevice cpu(&allocator);
    std::unique_ptr<Device> other;
    if (options.make_device) {
      absl::StatusOr<std::unique_ptr<Device>> made = options.make_device(rank);
      if (!made.ok()) return made.status();
      other = *std::move(made);
    }
    topts.device = other != nullptr ? other.get() : &cpu;
    if (options.connect_device) {
      if (absl::Status s = options.connect_device(rank, plan, topts.device, comms); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("rank ", rank, ": ", s.message()));
      }
    }
    auto report = Train(plan, topts);
    if (!report.ok()) {
      return absl::Status(report.status().code(), absl::StrCat("rank ", rank, ": ", report.status().message()));
    }
    absl::MutexLock lock(&mu);
    if (report->reports_loss) {
      for (const auto& s : report->steps) {
        run.losses.push_back(s.loss);
        run.fetches.push_back(s.fetches);
        run.lrs.push_back(s.has_lr ? s.lr : -1);
        run.grad_norms.push_back(s.has_grad_norm ? s.grad_norm : -1);
        run.optimizer_steps.push_back(s.optimizer_step);
        if (s.has_loss_scale) run.loss_scales.push_back(s.loss_scale);
        if (s.has_loss_scale) run.skipped_updates.push_back(s.skipped_update);
      }
      if (!report->evals.empty()) {
        run.evals = report->evals;
        run.eval_loss = report->evals.back().loss;
        run.eval_accuracy = report->evals.back().accuracy;
      }
    }
    for (const auto& s : report->steps) {
      if (s.has_loss_scale) run.skipped_updates_by_rank[rank].push_back(s.skipped_update);
    }
    for (const auto& [name, values] : report->final_state) {
      if (!IsParam(plan.program(), name)) continue;
      auto it = run.weights.find(name);
      if (it != run.weights.end() && it->second != values && status.ok()) {
        // A tied weight lives on several stages; its replicas must stay
        // identical.
        size_t i = 0;
        while (i < values.size() && i < it->second.size() && values[i] == it->second[i]) ++i;
        status = absl::InternalError(absl::StrCat(
            "replicas of '", name, "' differ between ranks: element ", i, " is ",
            i < it->second.size() ? absl::StrCat(it->second[i]) : "missing", " on one and ",
            i < values.size() ? absl::StrCat(values[i]) : "missing", " on rank ", rank));
      }
      run.weights[name] = values;
    }
    run.measured_peak_bytes[rank] = report->measured_peak_bytes;
    run.predicted_peak_bytes[rank] = report->predicted_peak_bytes;
    return absl::OkStatus();
  }, absl::Seconds(60), /*stage_device_tensors=*/options.make_device != nullptr);
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  if (!status.ok()) return status;
  return run;
}

double MaxLossDifference(const ParityRun& a, const ParityRun& b) {
  if (a.losses.size() != b.losses.size() || a.losses.empty()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]) / std::max(std::abs(b.losses[i]), 1e-30));
  }
  return worst;
}

double MaxWeightDifference(const std::map<std::string, std::vector<double>>& a,
                           const std::map<std::string, std::vector<double>>& b, std::string* worst_name) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double worst = 0;
  for (const auto& [name, wb] : b) {
    auto it = a.find(name);
    if (it == a.end() || it->second.size() != wb.size()) return INFINITY;
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < wb.size(); ++i) {
      diff = std::max(diff, std::abs(it->second[i] - wb[i]));
      scale = std::max(scale, std::abs(wb[i]));
    }
    if (diff / scale > worst) {
      worst = diff / scale;
      if (worst_name) *worst_name = name;
    }
  }
  return worst;
}

}  // namespace strata
