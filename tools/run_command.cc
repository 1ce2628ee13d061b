// strata run PROGRAM: checks the run flags and outputs, then trains in this
// process, launches --nproc workers of this same command, or is one of them
// (tools/run_worker.cc).

#include <signal.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "compiler/program_text.h"
#include "proto/roles.h"
#include "runtime/checkpoint.h"
#include "runtime/comm/health.h"
#include "runtime/comm/store.h"
#include "runtime/device.h"
#include "runtime/kernel.h"
#include "runtime/launcher.h"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"
#include "runtime/trainer.h"
#include "runtime/worker_env.h"
#include "tools/cli_common.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"
#include "tools/run_worker.h"
#include "tools/training_process.h"

namespace strata {
namespace cli {
namespace {

// The per-step losses a metrics file holds.
absl::StatusOr<std::vector<double>> LossesFromMetrics(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  std::vector<double> losses;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    if (!absl::StartsWith(line, "{\"step\": ")) continue;
    size_t at = line.find("\"loss\": ");
    if (at == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(at + 8);
    double v;
    if (!absl::SimpleAtod(rest.substr(0, rest.find(',')), &v)) return absl::DataLossError(absl::StrCat(path, ": bad loss in '", line, "'"));
    losses.push_back(v);
  }
  return losses;
}

// A fresh temporary file for the metrics --compare_single reads when the run
// writes none; empty if none could be made (then the comparison fails
// naming the empty path).
std::string TemporaryMetricsFile() {
  char tmpl[] = "/tmp/strata-metrics-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return "";
  close(fd);
  return tmpl;
}

// --compare_single: the same program on one device, same data and global
// batch, printed beside the parallel run's losses. The reference keeps the
// strategy's gradient_merge, so its step N merges the same samples as the
// parallel run's (without it, it would update on every step).
int CompareWithSingleDevice(const std::string& path, int64_t global_batch, const std::string& parallel_metrics) {
  auto program = ReadProgramFile(UserPath(path));
  if (!program.ok()) {
    std::cerr << "error: " << program.status().message() << "\n";
    return kExitError;
  }
  auto parallel_strategy = StrategyFromFlags();
  if (!parallel_strategy.ok()) {
    std::cerr << "error: " << parallel_strategy.status().message() << "\n";
    return kExitError;
  }
  Strategy reference;
  if (parallel_strategy->has_gradient_merge()) {
    *reference.mutable_gradient_merge() = parallel_strategy->gradient_merge();
  }
  // The same arithmetic: mixed precision (with its loss scaling) and TF32.
  if (parallel_strategy->has_mixed_precision()) {
    *reference.mutable_mixed_precision() = parallel_strategy->mixed_precision();
  }
  reference.set_allow_tf32(parallel_strategy->allow_tf32());
  CompileOptions options;
  options.batch_size = global_batch;
  auto single = Compile(*program, reference, options);
  if (!single.ok()) {
    std::cerr << "error: single-device reference: " << single.status().message() << "\n";
    return kExitError;
  }
  TrainOptions t = TrainOptionsFromFlags(static_cast<uint64_t>(program->seed()));
  t.metrics_path.clear();
  t.trace_path.clear();
  t.save_dir.clear();
  // A resumed run's reference resumes from the same checkpoint (one device
  // loads any layout's), so both columns hold the same steps; where --load
  // names a folder with nothing in it yet (a first start), both start at 0.
  if (!t.load_dir.empty() && !ResolveCheckpoint(t.load_dir).ok()) t.load_dir.clear();
  t.eval_data.clear();
  t.progress = false;
  auto report = Train(single->plans[0], t);
  if (!report.ok()) {
    std::cerr << "error: single-device reference: " << report.status().message() << "\n";
    return kExitError;
  }
  auto parallel = LossesFromMetrics(parallel_metrics);
  if (!parallel.ok()) {
    std::cerr << "error: " << parallel.status().message() << "\n";
    return kExitError;
  }
  std::cout << absl::StrFormat("%6s  %14s  %14s  %10s\n", "step", "single_loss", "parallel_loss", "rel_diff");
  double worst = 0;
  for (size_t i = 0; i < report->steps.size() && i < parallel->size(); ++i) {
    const double a = report->steps[i].loss, b = (*parallel)[i];
    const double rel = std::abs(a - b) / std::max(std::abs(a), 1e-30);
    worst = std::max(worst, rel);
    std::cout << absl::StrFormat("%6d  %14.9f  %14.9f  %10.2e\n", report->steps[i].step, a, b, rel);
  }
  std::cout << absl::StrFormat("max relative difference %.2e over %d steps\n", worst,
                               std::min(report->steps.size(), parallel->size()));
  return 0;
}

// Outputs that cannot be written, and a --load the run cannot resume from,
// are found before the first step (or any worker starts), not after training.
// `schedule_spans_run`: the program's learning rate decays over the run's
// steps (a cosine without decay_steps).
int CheckRunOutputs(int64_t nproc, int64_t global_batch, uint64_t seed, bool schedule_spans_run) {
  const std::string save = UserPath(absl::GetFlag(FLAGS_save));
  const std::string load = UserPath(absl::GetFlag(FLAGS_load));
  if (absl::GetFlag(FLAGS_save_every) < 0) {
    std::cerr << "error: --save_every must be >= 0 (0: only at the end and on SIGTERM), got "
              << absl::GetFlag(FLAGS_save_every) << "\n";
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_keep_checkpoints) < 0 || absl::GetFlag(FLAGS_keep_checkpoints) > (1 << 20)) {
    std::cerr << "error: --keep_checkpoints must be in [0, 2^20] (0: keep all), got "
              << absl::GetFlag(FLAGS_keep_checkpoints) << "\n";
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_save_every) > 0 && save.empty()) {
    std::cerr << "error: --save_every needs --save DIR\n";
    return kExitUsage;
  }
  absl::Status s = save.empty() ? absl::OkStatus() : CheckSaveTarget(save, LoadsFromSaveFolder(load, save));
  for (const auto& [flag, path] : {std::pair<std::string, std::string>{"--trace", absl::GetFlag(FLAGS_trace)},
                                   {"--metrics", absl::GetFlag(FLAGS_metrics)}}) {
    if (s.ok() && !path.empty()) s = CheckWritableFile(UserPath(path), flag);
  }
  // Under --nproc the workers' logs go to ./log unless --log_dir says where.
  const bool log_dir_given = !absl::GetFlag(FLAGS_log_dir).empty();
  const std::string log_dir = !log_dir_given && nproc > 1 ? "log" : absl::GetFlag(FLAGS_log_dir);
  if (s.ok() && !log_dir.empty()) {
    const std::string what =
        log_dir_given ? absl::StrCat("--log_dir ", log_dir)
                      : absl::StrCat("the workers' logs go to ", UserPath(log_dir), " (give --log_dir DIR elsewhere)");
    std::error_code ec;
    std::filesystem::create_directories(UserPath(log_dir), ec);
    if (ec) {
      s = absl::FailedPreconditionError(absl::StrCat(what, ": cannot create the folder: ", ec.message()));
    } else if (access(UserPath(log_dir).c_str(), W_OK) != 0) {
      s = absl::FailedPreconditionError(absl::StrCat(what, ": cannot write there: ", std::strerror(errno)));
    }
  }
  if (!s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitError;
  }
  if (!load.empty() && absl::GetFlag(FLAGS_eval_only)) {
    // Any checkpoint's weights evaluate, whatever batch, seed or steps saved them.
    if (auto metadata = ReadCheckpointMetadata(load); !metadata.ok()) {
      std::cerr << "error: --load " << load << ": " << metadata.status().message() << "\n";
      return kExitError;
    }
  } else if (!load.empty()) {
    // --steps is known here; an --epochs run's length needs the data, so Train checks it.
    auto metadata = ReadCheckpointMetadata(load);
    if (!metadata.ok()) {
      // --load DIR --save DIR with nothing in DIR yet is a first start (Train
      // notes it); anything else unreadable is said once here, before the
      // workers would each say it.
      if (absl::IsNotFound(metadata.status()) && SameFolder(load, save)) return 0;
      std::cerr << "error: --load " << load << ": " << metadata.status().message() << "\n";
      return kExitError;
    }
    const bool given = absl::GetFlag(FLAGS_steps) > 0;
    const int64_t steps = given ? absl::GetFlag(FLAGS_steps) : INT64_MAX;
    absl::Status bad = CheckResumable(*metadata, global_batch, seed, steps, given && schedule_spans_run).status();
    if (!bad.ok()) {
      std::cerr << "error: --load " << load << ": " << bad.message() << "\n";
      return kExitUsage;
    }
  }
  return 0;
}

// A --load checkpoint holds no weight or state of the user's that the
// program lacks: a larger model's checkpoint would otherwise load, its extra
// tensors ignored (PyTorch's load_state_dict is strict by default). Names
// with '@' are the compiler's (optimizer moments, merge buffers, the loss
// scale), which another strategy or optimizer may have saved and this run
// may not use. A checkpoint that cannot be read is left to the load to say.
// The program's own vars count as well as the plans': a pipeline's plans
// leave out a declared parameter no op reads, which one device keeps and
// saves.
int CheckCheckpointFitsProgram(const std::string& path, const std::vector<RankPlan>& plans) {
  const std::string load = UserPath(absl::GetFlag(FLAGS_load));
  if (load.empty()) return 0;
  absl::StatusOr<std::set<std::string>> names = CheckCheckpointFiles(load);
  if (!names.ok()) return 0;
  std::set<std::string> vars;
  auto declare = [&vars](const Program& program) {
    for (const Var& v : program.var()) {
      if (v.kind() == PARAM || v.kind() == STATE) vars.insert(v.name());
    }
  };
  for (const RankPlan& plan : plans) declare(plan.program());
  if (absl::StatusOr<Program> program = ReadProgramFile(UserPath(path)); program.ok()) declare(*program);
  std::vector<std::string> extra;
  for (const std::string& name : *names) {
    if (!absl::StrContains(name, '@') && !vars.count(name)) extra.push_back(name);
  }
  if (extra.empty()) return 0;
  std::cerr << "error: --load " << absl::GetFlag(FLAGS_load) << ": holds '" << extra[0] << "'"
            << (extra.size() > 1 ? absl::StrCat(" and ", extra.size() - 1, " more") : "")
            << ", which the program has no parameter or state var for: a checkpoint of another program?\n";
  return kExitError;
}

// STRATA_PREEMPTION_GRACE_S: the seconds the workers have, after a SIGTERM
// to the launcher, to finish their step and save (a cluster's notice before
// it kills the job: 30 s by default, as GCP's spot VMs and Kubernetes give).
absl::StatusOr<absl::Duration> PreemptionGraceFromEnv(absl::Duration fallback) {
  const char* text = std::getenv("STRATA_PREEMPTION_GRACE_S");
  if (text == nullptr || *text == '\0') return fallback;
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !(seconds > 0) || seconds > 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat("STRATA_PREEMPTION_GRACE_S='", text, "': expected seconds in (0, 86400]"));
  }
  return absl::Seconds(seconds);
}

// The run flags checked before anything is compiled. 0, or the exit code once
// it printed what is wrong.
int CheckRunFlags() {
  // The environment's thread count, checked as a flag would be: another
  // value was ignored, or past the thread limit aborted the process.
  if (NumThreadsFromEnv() < 0) {
    std::cerr << "error: STRATA_NUM_THREADS='" << std::getenv("STRATA_NUM_THREADS")
              << "': expected a thread count from 1 to " << kMaxIntraOpThreads << "\n";
    return kExitUsage;
  }
  if (SpinMicrosFromEnv() == -2) {
    std::cerr << "error: STRATA_SPIN_US='" << std::getenv("STRATA_SPIN_US") << "': expected microseconds from 0 to "
              << kMaxSpinMicros << "\n";
    return kExitUsage;
  }
  // Read by the launcher only, but wrong on any run (a script's one-process
  // test of a cluster command).
  if (absl::StatusOr<absl::Duration> grace = PreemptionGraceFromEnv(absl::Seconds(30)); !grace.ok()) {
    std::cerr << "error: " << grace.status().message() << "\n";
    return kExitUsage;
  }
  const int64_t nproc = absl::GetFlag(FLAGS_nproc);
  if (nproc < 1 || nproc > 1024) {
    std::cerr << "error: --nproc must be in 1..1024, got " << nproc << "\n";
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_steps) < 0 || absl::GetFlag(FLAGS_epochs) < 0) {
    std::cerr << "error: --steps and --epochs must be >= 0\n";
    return kExitUsage;
  }
  if (const int64_t every = absl::GetFlag(FLAGS_eval_every); every < 0) {
    std::cerr << "error: --eval_every must be >= 0, got " << every << "\n";
    return kExitUsage;
  } else if (every > 0 && absl::GetFlag(FLAGS_eval_data).empty()) {
    std::cerr << "error: --eval_every needs --eval_data (the set to evaluate)\n";
    return kExitUsage;
  }
  // Below a second the ranks' own start (comparing their settings, the
  // first step's warm-up) outlasts it, and every job fails (0.001 and 0.1
  // did); past 1e6 s a timeout is no longer one.
  const double comm_timeout = absl::GetFlag(FLAGS_comm_timeout_s);
  if (!(comm_timeout >= 1 && comm_timeout <= 1e6)) {
    std::cerr << "error: --comm_timeout_s must be in [1, 1e6], got " << comm_timeout << "\n";
    return kExitUsage;
  }
  // Below a second a loaded machine's scheduling alone would look like a stall.
  if (!(absl::GetFlag(FLAGS_heartbeat_timeout_s) >= 1) || absl::GetFlag(FLAGS_heartbeat_timeout_s) > 1e6) {
    std::cerr << "error: --heartbeat_timeout_s must be in [1, 1e6]\n";
    return kExitUsage;
  }
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "gpu") {
    std::cerr << "error: --device '" << device << "': expected cpu or gpu\n";
    return kExitUsage;
  }
  const std::string store = absl::GetFlag(FLAGS_store);
  // memory:// stores live in one process: only tests, which run ranks as threads, use them.
  const absl::Status why = store.empty() ? absl::OkStatus() : CheckStoreSpec(store);
  if (!why.ok() || absl::StartsWith(store, "memory://")) {
    std::cerr << "error: --store '" << store
              << "': expected redis://HOST:PORT, tcp://HOST:PORT (served by rank 0) or file:///DIR (a folder all ranks see)"
              << (why.ok() ? "" : absl::StrCat(" (", why.message(), ")")) << "\n";
    return kExitUsage;
  }
  if (absl::Status s = CheckPassFlags(); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitUsage;
  }
  return 0;
}

// The ranks this machine runs must fit in its memory and swap: past them
// the kernel's OOM killer ends the run with SIGKILL mid-step, nothing said.
// `plans` are this machine's: a worker's own, else every rank (the launcher
// starts them all here). CPU plans only: a GPU's allocator fails with an
// error naming the op. `eval_only`: the run only evaluates, so its
// evaluation's peak counts (a plan without one: the step's).
int CheckPlansFitTheMachine(const std::vector<const RankPlan*>& plans, bool eval_only) {
  if (plans.empty() || plans[0]->device_kind() != DEVICE_CPU) return 0;
  int64_t need = 0;
  for (const RankPlan* plan : plans) need += PredictedPeak(plan->memory(), eval_only);
  struct sysinfo info = {};
  const int64_t swap = sysinfo(&info) == 0 ? static_cast<int64_t>(info.totalswap) * info.mem_unit : 0;
  const int64_t memory = GetCpuDevice()->capacity_bytes();
  if (memory <= 0 || need <= memory + swap) return 0;
  const std::string what =
      plans.size() == 1 ? absl::StrCat("rank ", plans[0]->rank(), "'s plan predicts a peak of ", Bytes(need))
                        : absl::StrCat("the ", plans.size(), " ranks' plans predict peaks adding up to ", Bytes(need));
  std::cerr << "error: " << what << ", more than this machine's " << Bytes(memory) << " of memory"
            << (swap > 0 ? absl::StrCat(" and ", Bytes(swap), " of swap") : "")
            << ": the system would kill the run; use a smaller batch, more pipeline stages or recompute "
               "(strata check shows each rank's peak)\n";
  return kExitError;
}

// Started by hand (not as a worker), --nproc must give the strategy's ranks.
int CheckProcessCount(const CompileResult& result) {
  const int world = static_cast<int>(result.plans.size());
  if (absl::GetFlag(FLAGS_nproc) != world) {
    std::cerr << "error: the strategy needs " << world << " rank(s) (" << result.plans[0].topology().num_stages()
              << " stage(s) x data-parallel degree " << result.plans[0].topology().dp_degree() << "); run with --nproc "
              << world << "\n";
    return kExitUsage;
  }
  return 0;
}

// One rank: this process trains, then --compare_single trains the reference.
int RunOneProcess(const std::string& path, const CompileResult& result, uint64_t program_seed,
                  const std::set<std::string>& given, Device* device) {
  InstallStopHandler();
  TrainOptions options = TrainOptionsFromFlags(program_seed);
  options.notes = RunNotes(given);
  if (device != nullptr) options.device = device;
  // --compare_single reads this run's losses from its metrics, a temporary
  // file when the run writes none.
  const bool compare = absl::GetFlag(FLAGS_compare_single);
  std::string temp_metrics;
  if (compare && options.metrics_path.empty()) temp_metrics = options.metrics_path = TemporaryMetricsFile();
  auto report = Train(result.plans[0], options);
  int rc = 0;
  if (!report.ok()) {
    std::cerr << "error: " << report.status().message() << "\n";
    rc = kExitError;
  } else {
    PrintSummary(*report);
    if (report->stop_signal != 0) {
      rc = ReportStopped(*report);
    } else if (compare) {
      rc = CompareWithSingleDevice(path, result.batch_size, options.metrics_path);
    }
  }
  if (!temp_metrics.empty()) std::remove(temp_metrics.c_str());
  return rc;
}

// The errors the job's ranks recorded in its store, first in time first, for
// the launcher; then the job's keys go.
std::vector<std::pair<int, std::string>> RecordedFailures(const std::string& spec, const std::string& job_id) {
  std::vector<std::pair<int, std::string>> records;
  if (absl::StartsWith(spec, "tcp://")) return records;  // served by rank 0, gone with it
  auto store = OpenStore(spec, false, absl::Seconds(2));
  if (!store.ok()) return records;
  auto failures = ReadFailures(*(*store)->WithPrefix(HealthKeyPrefix(job_id)), absl::Milliseconds(200));
  if (failures.ok()) {
    for (const FailureReport& f : *failures) records.push_back({f.rank, f.message});
  }
  (*store)->WithPrefix(JobKeyPrefix(job_id))->DeleteAll().IgnoreError();
  return records;
}

// The launcher's options: the workers run this same command without the
// flags only the launcher reads, under one job id.
LaunchOptions LauncherOptionsFromFlags(std::vector<std::string> worker_argv) {
  LaunchOptions launch;
  launch.argv = std::move(worker_argv);
  launch.nproc = static_cast<int>(absl::GetFlag(FLAGS_nproc));
  launch.log_dir = UserPath(absl::GetFlag(FLAGS_log_dir).empty() ? "log" : absl::GetFlag(FLAGS_log_dir));
  launch.store_spec = absl::GetFlag(FLAGS_store);
  launch.bind_cores = absl::GetFlag(FLAGS_bind_cores);
  // The job's id scopes its keys (a shared Redis server outlives jobs).
  const std::string job_id = absl::GetFlag(FLAGS_job_id).empty()
                                 ? absl::StrFormat("%08x%08x", static_cast<uint32_t>(getpid()),
                                                   static_cast<uint32_t>(absl::ToUnixMicros(absl::Now())))
                                 : absl::GetFlag(FLAGS_job_id);
  launch.extra_env.push_back({"STRATA_JOB_ID", job_id});
  launch.recorded_failures = [job_id](const std::string& spec) { return RecordedFailures(spec, job_id); };
  // CheckRunFlags refused a bad value.
  launch.preemption_grace = PreemptionGraceFromEnv(launch.preemption_grace).value_or(launch.preemption_grace);
  return launch;
}

// The workers' rank_<r> trace files merged into --trace, when given.
absl::Status MergeWorkerTraces(int world) {
  const std::string trace = UserPath(absl::GetFlag(FLAGS_trace));
  if (trace.empty()) return absl::OkStatus();
  std::vector<std::string> parts;
  for (int r = 0; r < world; ++r) parts.push_back(absl::StrCat(trace, ".rank", r));
  return MergeTraceFiles(parts, trace);
}

// After a stop signal: the ranks the launcher had to kill at the end of the
// grace, which neither finished their step nor saved it ("" when none).
std::string KilledAtTheGrace(const LaunchReport& report, absl::Duration grace) {
  std::vector<std::string> killed;
  for (const WorkerOutcome& w : report.workers) {
    if (w.signal == SIGKILL) killed.push_back(absl::StrCat(w.rank));
  }
  if (killed.empty()) return "";
  const bool preempted = report.interrupt_signal == SIGTERM && report.killed_at_signal == 0;
  const std::string save = absl::GetFlag(FLAGS_save);
  std::string why;
  if (report.killed_at_signal != 0) {
    why = absl::StrCat(" at once, at a second ", SignalName(report.killed_at_signal), " while they stopped");
  } else if (preempted) {
    why = absl::StrCat(": not stopped ", absl::FormatDuration(grace), " after SIGTERM");
  } else {
    why = absl::StrCat(": not stopped within the grace after ", SignalName(report.interrupt_signal));
  }
  return absl::StrCat(killed.size() == 1 ? "rank " : "ranks ", absl::StrJoin(killed, ", "),
                      killed.size() == 1 ? " was" : " were", " killed", why,
                      save.empty() ? "" : absl::StrCat(", so no checkpoint of the stop is in ", save),
                      preempted ? " (STRATA_PREEMPTION_GRACE_S sets the time a step and its save may take)" : "");
}

// The launcher: N workers of this same command, then their traces merged and
// --compare_single's reference. Without --metrics, --compare_single reads the
// workers' losses from a temporary file.
int RunLauncher(const std::string& path, const CompileResult& result, int argc, char** argv) {
  if (const int rc = CheckWorkerSetup(); rc != 0) return rc;
  std::vector<std::string> args(argv, argv + argc);
  args = ArgvWithoutFlag(ArgvWithoutFlag(ArgvWithoutFlag(args, "nproc"), "log_dir"), "compare_single", false);
  args = ArgvWithoutFlag(args, "bind_cores", false);
  std::string metrics = UserPath(absl::GetFlag(FLAGS_metrics));
  std::string temp_metrics;
  if (absl::GetFlag(FLAGS_compare_single) && metrics.empty()) {
    temp_metrics = metrics = TemporaryMetricsFile();
    args.push_back(absl::StrCat("--metrics=", metrics));
  }
  const LaunchOptions launch = LauncherOptionsFromFlags(std::move(args));
  std::cout.flush();
  LaunchReport launch_report;
  auto code = LaunchWorkers(launch, &launch_report);
  if (!code.ok()) {
    std::cerr << "error: " << code.status().message() << "\n";
    for (const std::string& then : launch_report.consequences) std::cerr << "note: then " << then << "\n";
    if (!temp_metrics.empty()) std::remove(temp_metrics.c_str());
    return kExitError;
  }
  int rc = *code;
  if (launch_report.interrupt_signal != 0) {
    if (const std::string killed = KilledAtTheGrace(launch_report, launch.preemption_grace); !killed.empty()) {
      std::cerr << "error: " << killed << "\n";
      if (!temp_metrics.empty()) std::remove(temp_metrics.c_str());
      return rc;
    }
  }
  if (rc == 0) {
    if (auto s = MergeWorkerTraces(static_cast<int>(result.plans.size())); !s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitError;
    }
  } else if (rc == 128 + SIGTERM) {
    // A job stopped by SIGTERM (to the launcher or to one worker), every rank
    // having stopped cleanly, has its trace too: each rank wrote its part as
    // it stopped (SIGINT and SIGHUP end the workers without one).
    if (auto s = MergeWorkerTraces(static_cast<int>(result.plans.size())); !s.ok()) {
      std::cerr << "note: --trace not merged: " << s.message() << "\n";
    }
  }
  if (rc == 0 && absl::GetFlag(FLAGS_compare_single)) {
    if (launch_report.interrupt_signal != 0) {
      // The job finished, but whoever signalled wants it to end now.
      std::cerr << "note: --compare_single skipped: " << SignalName(launch_report.interrupt_signal)
                << " came during the run's last work\n";
    } else {
      rc = CompareWithSingleDevice(path, result.batch_size, metrics);
    }
  }
  if (!temp_metrics.empty()) std::remove(temp_metrics.c_str());
  return rc;
}

}  // namespace

// Checks the flags, compiles, checks the outputs, then trains as one of three:
// a worker (started by a launcher, torchrun or Slurm), a single process, or the
// launcher of --nproc workers.
int RunCommand(const std::string& path, int argc, char** argv, const std::set<std::string>& given) {
  if (int rc = CheckRunFlags(); rc != 0) return rc;
  // A rank writes to its peers' sockets (Gloo, the store). When a peer dies,
  // the write must fail with EPIPE and name the lost connection, not kill
  // this rank with SIGPIPE and hide the peer that failed first (as Python,
  // and so PyTorch, ignores SIGPIPE from the start).
  signal(SIGPIPE, SIG_IGN);
  auto worker = WorkerEnvFromEnvironment();
  if (!worker.ok()) {
    std::cerr << "error: " << worker.status().message() << "\n";
    return kExitUsage;
  }
  auto result = CompileFromFlags(path);
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    return kExitError;
  }
  // A plan for a GPU runs in a binary that links a GPU runtime and a kernel
  // for each of its ops (strata_gpu). One process opens GPU 0; a worker opens
  // GPU local_rank % count and exchanges tensors over Gloo staged through
  // pinned host memory (runtime/comm/staged_communicator.h); the launcher
  // itself opens none.
  std::unique_ptr<Device> gpu;
  GpuPlacement placement;  // a worker's: the GPU it opens, NCCL or Gloo between them
  if (const DeviceKind kind = result->plans[0].device_kind(); kind != DEVICE_CPU) {
    const DeviceFactory* factory = FindDeviceFactory(kind);
    if (factory == nullptr) {
      std::cerr << "error: --device gpu: this strata links no GPU runtime; run the same command with strata_gpu "
                   "(bazel run //tools:strata_gpu -- run ..., built where CUDA is installed)\n";
      return kExitUsage;
    }
    if (const std::string op = FirstOpWithoutKernel(result->plans, kind); !op.empty()) {
      std::cerr << "error: --device gpu: " << op << " has no " << DeviceKindLabel(kind)
                << " kernel in this strata; run it with --device cpu\n";
      return kExitUsage;
    }
    int ordinal = 0;
    std::string who;
    if (worker->has_value()) {
      const WorkerEnv& env = **worker;
      who = absl::StrCat("rank ", env.rank, ": ");
      SetNcclEnvironment();  // before CUDA starts its threads
      absl::StatusOr<int> count = CountDevices(kind);
      if (!count.ok()) {
        std::cerr << "error: " << who << "--device gpu: " << count.status().message() << "\n";
        return kExitError;
      }
      // The machine's ranks: torchrun's LOCAL_WORLD_SIZE, else one machine
      // (its local ranks the world's). A guess from the count: once the
      // ranks meet they compare their GPUs' UUIDs (PlaceOnGpus), so a rank
      // that sees one GPU through its own CUDA_VISIBLE_DEVICES is not taken
      // for one sharing it.
      placement =
          PlaceOnGpu(env.local_rank, env.local_world_size > 0 ? env.local_world_size : env.world_size, *count);
      ordinal = placement.ordinal;
    }
    if (worker->has_value() || result->plans.size() == 1) {
      absl::StatusOr<std::unique_ptr<Device>> opened = (*factory)(ordinal);
      if (!opened.ok()) {
        std::cerr << "error: " << who << "--device gpu: " << opened.status().message() << "\n";
        return kExitError;
      }
      gpu = *std::move(opened);
    }
  }
  if (const int k = result->plans[0].schedule().merge_steps(); k > 1 && absl::GetFlag(FLAGS_steps) % k != 0) {
    const int64_t steps = absl::GetFlag(FLAGS_steps);
    std::cerr << "error: --steps " << steps << " is not a multiple of gradient_merge.k_steps " << k
              << " (--steps counts steps, and the optimizer runs once every " << k << " of them); use --steps "
              << (steps / k + 1) * k << "\n";
    return kExitUsage;
  }
  // Between a merge's steps the weights have not moved: an evaluation there
  // repeats the last one.
  if (const int k = result->plans[0].schedule().merge_steps(); k > 1 && absl::GetFlag(FLAGS_eval_every) % k != 0) {
    const int64_t every = absl::GetFlag(FLAGS_eval_every);
    std::cerr << "error: --eval_every " << every << " is not a multiple of gradient_merge.k_steps " << k
              << " (the weights change once every " << k << " steps); use --eval_every " << (every / k + 1) * k
              << "\n";
    return kExitUsage;
  }
  const uint64_t program_seed = static_cast<uint64_t>(result->plans[0].program().seed());
  // A rank started by hand that stops here tells the others, which would
  // otherwise wait for it until --comm_timeout_s.
  const auto worker_stops = [&](int rc) {
    if (rc != 0 && worker->has_value()) AnnounceWorkerExit(**worker);
    return rc;
  };
  if (const int64_t flag_seed = absl::GetFlag(FLAGS_seed);
      int rc = CheckRunOutputs(absl::GetFlag(FLAGS_nproc), result->batch_size, flag_seed >= 0 ? flag_seed : program_seed,
                               ScheduleSpansRun(result->plans[0].program()))) {
    return worker_stops(rc);
  }
  if (int rc = CheckCheckpointFitsProgram(path, result->plans); rc != 0) return worker_stops(rc);
  std::vector<const RankPlan*> here;
  for (const RankPlan& plan : result->plans) {
    if (!worker->has_value() || plan.rank() == (*worker)->rank) here.push_back(&plan);
  }
  if (!worker->has_value()) {
    if (int rc = CheckProcessCount(*result); rc != 0) return rc;
  }
  if (int rc = CheckPlansFitTheMachine(here, absl::GetFlag(FLAGS_eval_only)); rc != 0) return worker_stops(rc);
  if (worker->has_value()) return RunWorker(*result, **worker, program_seed, given, gpu.get(), placement);
  if (result->plans.size() == 1) return RunOneProcess(path, *result, program_seed, given, gpu.get());
  // Bad data is one error line here, before any worker starts (each would
  // fail on it alike).
  if (absl::Status s = CheckJobData(result->plans, TrainOptionsFromFlags(program_seed)); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitError;
  }
  return RunLauncher(path, *result, argc, argv);
}

}  // namespace cli
}  // namespace strata
