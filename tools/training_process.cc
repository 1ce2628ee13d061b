#include "tools/training_process.h"

#include <signal.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <set>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/thread_pool.h"
#include "tools/cli_common.h"
#include "tools/cli_flags.h"

namespace strata {
namespace cli {
namespace {

volatile sig_atomic_t g_stop_signal = 0;  // the SIGTERM a training process got

void OnStopSignal(int signo) { g_stop_signal = signo; }

}  // namespace

TrainOptions TrainOptionsFromFlags(uint64_t program_seed) {
  TrainOptions options;
  options.data = absl::GetFlag(FLAGS_data);
  options.eval_data = absl::GetFlag(FLAGS_eval_data);
  options.steps = absl::GetFlag(FLAGS_steps);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  int64_t seed = absl::GetFlag(FLAGS_seed);
  options.seed = seed >= 0 ? static_cast<uint64_t>(seed) : program_seed;
  options.metrics_path = UserPath(absl::GetFlag(FLAGS_metrics));
  options.save_dir = UserPath(absl::GetFlag(FLAGS_save));
  options.load_dir = UserPath(absl::GetFlag(FLAGS_load));
  options.save_every = absl::GetFlag(FLAGS_save_every);
  options.eval_every = absl::GetFlag(FLAGS_eval_every);
  options.eval_only = absl::GetFlag(FLAGS_eval_only);
  // Nothing the command prints reads it, and it would copy the whole state.
  options.record_final_state = false;
  options.keep_checkpoints = static_cast<int>(absl::GetFlag(FLAGS_keep_checkpoints));
  options.stop_signal = [] { return static_cast<int>(g_stop_signal); };
  options.progress = !absl::GetFlag(FLAGS_quiet);
  options.comm_timeout_s = absl::GetFlag(FLAGS_comm_timeout_s);
  options.trace_path = UserPath(absl::GetFlag(FLAGS_trace));
  // Only GPU runs capture (the host has no graphs): a CPU run says nothing
  // about a flag that is on by default.
  options.cuda_graph = absl::GetFlag(FLAGS_cuda_graph) && absl::GetFlag(FLAGS_device) == "gpu";
  return options;
}

namespace {

// A GPU's reserved bytes beside its allocated ones (DESIGN's memory rule
// measures the allocated); nothing on the CPU.
std::string ReservedBeside(const TrainReport& report) {
  if (report.peak_reserved_bytes < 0) return "";
  return absl::StrCat(" (reserved ", Bytes(report.peak_reserved_bytes), ")");
}

}  // namespace

void PrintSummary(const TrainReport& report) {
  if (!report.reports_loss) {
    // A pipeline rank without the loss: its own memory, so every rank's shows.
    std::cerr << absl::StrFormat("done in %.1f s, measured peak %s, predicted %s%s\n", report.seconds,
                                 Bytes(report.measured_peak_bytes), Bytes(report.predicted_peak_bytes),
                                 ReservedBeside(report));
    return;
  }
  // --eval_only trains no step: what it did is one evaluation.
  const std::string did = report.steps.empty() && !report.evals.empty()
                              ? absl::StrFormat("evaluated step %d", report.evals.back().step)
                              : absl::StrFormat("%d steps", report.steps.empty() ? 0 : report.steps.back().step);
  // Under --eval_only the prediction is the evaluation's (MemoryPlan.eval_peak_bytes).
  std::cerr << absl::StrFormat("done: %s in %.1f s (batch %d, %d threads), measured peak %s, predicted %s%s\n", did,
                               report.seconds, report.batch_size, IntraOpThreads(), Bytes(report.measured_peak_bytes),
                               Bytes(report.predicted_peak_bytes), ReservedBeside(report));
  // Every update skipped by loss scaling (inf or nan gradients at every
  // scale it tried): the run "succeeded" with its initial weights; say so.
  int64_t updates = 0, skipped = 0;
  for (const StepMetrics& m : report.steps) {
    updates += m.has_lr;
    skipped += m.skipped_update;
  }
  if (updates > 0 && skipped == updates) {
    std::cerr << absl::StrFormat(
        "note: loss scaling skipped every one of the run's %d updates (inf or nan gradients; the last scale tried "
        "%g): the weights are where they started\n",
        updates, report.steps.back().loss_scale);
  }
  // The run's last evaluation is its final one only where it followed the
  // last step (a stop signal, or --eval_every, can leave an earlier one).
  if (!report.evals.empty() && (report.steps.empty() || report.evals.back().step == report.steps.back().step)) {
    const EvalMetrics& e = report.evals.back();
    std::cout << absl::StrFormat("final %s loss %.4f", e.name, e.loss);
    if (e.accuracy >= 0) std::cout << absl::StrFormat(" accuracy %.4f", e.accuracy);
    std::cout << "\n";
  } else if (!report.steps.empty()) {
    std::cout << absl::StrFormat("final train loss %.4f\n", report.steps.back().loss);
  }
}

std::string SyntheticDataNote(const std::set<std::string>& given) {
  if (given.count("data") || absl::GetFlag(FLAGS_quiet) || absl::GetFlag(FLAGS_eval_only)) return "";
  return "no --data given; training on synthetic data (use --data fashion_mnist for Fashion-MNIST)";
}

std::vector<std::string> RunNotes(const std::set<std::string>& given) {
  std::vector<std::string> notes;
  if (std::string note = SyntheticDataNote(given); !note.empty()) notes.push_back(std::move(note));
  return notes;
}

void InstallStopHandler() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  action.sa_flags = SA_RESTART;  // other threads' system calls must not fail with EINTR
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
}

int ReportStopped(const TrainReport& report) {
  const int64_t step = report.steps.empty() ? 0 : report.steps.back().step;
  const char* name = sigabbrev_np(report.stop_signal);
  std::cerr << "stopped by " << (name != nullptr ? absl::StrCat("SIG", name) : absl::StrCat("signal ", report.stop_signal))
            << (g_stop_signal == 0 ? " (on another rank)" : "") << " after step " << step
            << (report.last_saved.empty() ? "; no --save, nothing saved" : absl::StrCat("; saved ", report.last_saved))
            << "\n";
  return 128 + report.stop_signal;
}

}  // namespace cli
}  // namespace strata
