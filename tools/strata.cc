// The strata command-line tool: check, compile, run, gen (DESIGN.md, "The command line").
// Exit codes: 0 success, 1 a bad program/strategy/data or a failed run, 2 a usage error.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "passes/compile.h"
#include "compiler/graph_index.h"
#include "compiler/program_text.h"
#include "passes/verify_schedule.h"
#include "runtime/comm/health.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/checkpoint.h"
#include "runtime/launcher.h"
#include "runtime/thread_pool.h"
#include "runtime/comm/store.h"
#include "runtime/trace.h"
#include "runtime/worker_env.h"
#include "runtime/trainer.h"
#include "tools/model_gen.h"

ABSL_FLAG(std::string, strategy, "", "strategy file (protobuf text)");
ABSL_FLAG(std::string, out, "", "compile: output folder for rank_<r>.pbtxt plans");
ABSL_FLAG(std::string, dump_after, "", "compile: also write the program after this pass");
ABSL_FLAG(int64_t, nproc, 1, "run: number of worker processes");
ABSL_FLAG(int64_t, steps, 0, "run: total optimizer steps (give --steps or --epochs, not both)");
ABSL_FLAG(int64_t, epochs, 0, "run: total epochs (1 when neither is given; give --epochs or --steps, not both)");
ABSL_FLAG(int64_t, batch_size, 0, "global mini-batch size (default 64, or the pipeline's)");
ABSL_FLAG(std::string, data, "synthetic",
          "run: NAME[:OPTION,...], the options after one ':': fashion_mnist[:train|test,path=DIR] (e.g. "
          "fashion_mnist:test,path=DIR) | mnist:path=DIR[,test] | synthetic[:classes=K,size=N] (random data, for a "
          "smoke test)");
ABSL_FLAG(std::string, eval_data, "", "run: evaluation data, e.g. fashion_mnist:test");
ABSL_FLAG(int64_t, seed, -1, "run: seed for weights, data order and dropout (default: the program's seed, else 0)");
ABSL_FLAG(std::string, device, "cpu", "run: cpu or gpu");
ABSL_FLAG(std::string, metrics, "", "run: write per-step metrics as JSON lines to this file");
ABSL_FLAG(std::string, trace, "", "run: write a Chrome trace to this file");
ABSL_FLAG(std::string, log_dir, "", "run: folder for workerlog.R files");
ABSL_FLAG(std::string, save, "",
          "run: save checkpoints into this folder (DIR/step-N, DIR/latest) at the end, every --save_every steps and "
          "on SIGTERM");
ABSL_FLAG(int64_t, save_every, 0, "run: also save every N steps (0: only at the end and on SIGTERM)");
ABSL_FLAG(int64_t, keep_checkpoints, 2, "run: complete step folders kept in --save DIR (0: all)");
ABSL_FLAG(std::string, load, "",
          "run: resume from DIR's latest checkpoint, or from DIR/step-N (with --save DIR too: start fresh when DIR "
          "has none yet)");
ABSL_FLAG(bool, quiet, false, "run: no progress lines");
ABSL_FLAG(double, comm_timeout_s, 300, "run: seconds a transfer may wait before the job fails naming its channel");
ABSL_FLAG(std::string, store, "", "run: where ranks meet: redis://HOST:PORT (default: a fresh temporary FileStore)");
ABSL_FLAG(std::string, socket_ifname, "",
          "run: network interface the ranks' connections listen on (else STRATA_SOCKET_IFNAME or GLOO_SOCKET_IFNAME; "
          "default: the one whose route reaches the store's host, loopback for one machine)");
ABSL_FLAG(double, heartbeat_timeout_s, 30,
          "run: a rank whose heartbeat stops this long (stalled, its machine gone) is named and the job ends");
ABSL_FLAG(std::string, job_id, "",
          "run: the job's id, scoping its keys in a shared store (default: the launcher's, else TORCHELASTIC_RUN_ID or "
          "SLURM_JOB_ID, else \"default\")");
ABSL_FLAG(bool, compare_single, false, "run: also train the single-device reference and print both loss columns");
ABSL_FLAG(bool, bind_cores, false,
          "run --nproc: pin each worker to its share of the cores (DeepSpeed's --bind_cores_to_rank)");
ABSL_FLAG(std::string, layers, "784,256,128,100,10", "gen mlp/resmlp: layer widths, input first");
ABSL_FLAG(int64_t, stages, 1, "gen: number of pipeline stages to place the model on");
ABSL_FLAG(int64_t, blocks, 4, "gen resmlp: residual blocks");
ABSL_FLAG(std::string, optimizer, "adam", "gen: sgd | momentum | adam | adamw");
ABSL_FLAG(double, lr, 0, "gen: learning rate (0: the optimizer's default)");
ABSL_FLAG(bool, cosine, true, "gen: cosine learning-rate decay over the run");
ABSL_FLAG(double, dropout, 0, "gen: dropout probability after hidden layers");
ABSL_FLAG(std::string, dtype, "F32", "gen: F32 or F64");

namespace strata {
namespace {

volatile sig_atomic_t g_stop_signal = 0;  // the SIGTERM a training process got

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int64_t kMaxBatchSize = int64_t{1} << 24;

const char kUsage[] =
    "usage:\n"
    "  strata check   PROGRAM [--strategy S] [--batch_size B]\n"
    "  strata compile PROGRAM [--strategy S] --out DIR [--dump_after PASS]\n"
    "  strata run     PROGRAM [--strategy S] [--nproc N] [--steps N | --epochs E] [--batch_size B]\n"
    "                 [--data fashion_mnist|synthetic[:classes=K]] [--eval_data fashion_mnist:test]\n"
    "                 [--seed N] [--device cpu|gpu] [--metrics FILE.jsonl] [--trace FILE.json]\n"
    "                 [--log_dir DIR] [--save DIR [--save_every N] [--keep_checkpoints K]] [--load DIR]\n"
    "                 [--quiet] [--comm_timeout_s S] [--heartbeat_timeout_s S] [--job_id ID]\n"
    "                 [--store redis://HOST:PORT|tcp://HOST:PORT] [--socket_ifname IF] [--compare_single] [--bind_cores]\n"
    "  strata gen     mlp|resmlp|convnet|alexnet [--layers 784,256,10] [--stages K] [--optimizer adam] ...\n"
    "strata COMMAND --help lists the command's flags.\n";

const std::map<std::string, std::set<std::string>>& CommandFlags() {
  static const auto* flags = new std::map<std::string, std::set<std::string>>{
      {"check", {"strategy", "batch_size"}},
      {"compile", {"strategy", "batch_size", "out", "dump_after"}},
      {"run", {"strategy", "batch_size", "nproc", "steps", "epochs", "data", "eval_data", "seed", "device", "metrics",
               "trace", "log_dir", "save", "save_every", "keep_checkpoints", "load", "quiet", "comm_timeout_s",
               "heartbeat_timeout_s", "job_id", "store", "socket_ifname", "compare_single",
               "bind_cores"}},
      {"gen", {"layers", "stages", "blocks", "optimizer", "lr", "cosine", "dropout", "dtype"}},
  };
  return *flags;
}

// What ParseFlags found: the positional arguments and the flags given on the
// command line (by name), so that a default can be told from an explicit value.
struct ParsedArgs {
  std::vector<std::string> positional;
  std::set<std::string> given;
};

// `strata COMMAND --help` or `-h` anywhere before "--".
bool WantsHelp(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--help" || arg == "-help" || arg == "-h") return true;
  }
  return false;
}

// The command's lines of kUsage, then each of its flags with its default.
std::string CommandHelp(const std::string& command) {
  std::string text = "usage:\n";
  bool mine = false;
  for (absl::string_view line : absl::StrSplit(kUsage, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "  strata ")) {
      std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
      mine = words.size() > 1 && words[1] == command;
    } else if (!absl::StartsWith(line, " ")) {
      mine = false;
    }
    if (mine) absl::StrAppend(&text, line, "\n");
  }
  const std::set<std::string>& names = CommandFlags().at(command);
  size_t width = 0;
  for (const std::string& name : names) width = std::max(width, name.size());
  absl::StrAppend(&text, "flags:\n");
  for (const std::string& name : names) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    const std::string help = flag->Help();
    std::string default_value = flag->DefaultValue();
    if (flag->IsOfType<std::string>()) default_value = absl::StrCat("\"", default_value, "\"");
    absl::StrAppend(&text, absl::StrFormat("  --%-*s  %s [default: %s]\n", static_cast<int>(width), name,
                                           absl::StripPrefix(help, absl::StrCat(command, ": ")), default_value));
  }
  return text;
}

// Parses "--name=value", "--name value" and "--flag"/"--noflag" for the
// command's own flags.
absl::StatusOr<ParsedArgs> ParseFlags(const std::string& command, int argc, char** argv, int first) {
  ParsedArgs parsed;
  std::vector<std::string>& positional = parsed.positional;
  const auto& allowed = CommandFlags().at(command);
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) positional.push_back(argv[i]);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      positional.push_back(arg);
      continue;
    }
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    std::string name = body, value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    absl::CommandLineFlag* flag = allowed.count(name) ? absl::FindCommandLineFlag(name) : nullptr;
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no") && allowed.count(name.substr(2))) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>() && !has_value;
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) {
      std::string hint;
      for (const auto& a : allowed) {
        if (a.find(name) != std::string::npos || name.find(a) != std::string::npos) hint = a;
      }
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", arg, "' for 'strata ", command, "'",
                                                     hint.empty() ? "" : absl::StrCat("; did you mean --", hint, "?"),
                                                     " (flags: --", absl::StrJoin(allowed, ", --"), ")"));
    }
    if (negated) {
      value = "false";
    } else if (!has_value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else {
        if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
        value = argv[++i];
      }
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("bad value '", value, "' for --", name, ": ", error));
    }
    parsed.given.insert(std::string(flag->Name()));
  }
  return parsed;
}

// `bazel run` starts us in the runfiles tree; user paths are relative to where they typed the command.
std::string UserPath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const char* wd = std::getenv("BUILD_WORKING_DIRECTORY");
  return wd ? absl::StrCat(wd, "/", path) : path;
}

std::string Bytes(int64_t b) {
  if (b >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / 1073741824.0);
  if (b >= (int64_t{1} << 20)) return absl::StrFormat("%.2f MiB", b / 1048576.0);
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

absl::StatusOr<CompileResult> CompileFromFlags(const std::string& program_path) {
  auto program = ReadProgramFile(UserPath(program_path));
  if (!program.ok()) return program.status();
  Strategy strategy;
  std::string strategy_path = absl::GetFlag(FLAGS_strategy);
  if (!strategy_path.empty()) {
    auto s = ReadStrategyFile(UserPath(strategy_path));
    if (!s.ok()) return s.status();
    strategy = *s;
  }
  CompileOptions options;
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.dump_after = absl::GetFlag(FLAGS_dump_after);
  return Compile(*program, strategy, options, strategy_path.empty() ? "strategy" : strategy_path);
}

std::string ScheduleDiagram(const RankPlan& plan) {
  std::string s = absl::StrCat("rank ", plan.rank(), " |");
  for (const Action& a : plan.schedule().action()) {
    if (a.kind() == Action::FORWARD) absl::StrAppend(&s, " F", a.micro_batch());
    if (a.kind() == Action::BACKWARD) absl::StrAppend(&s, " B", a.micro_batch());
    if (a.kind() == Action::OPTIMIZE) absl::StrAppend(&s, " OPT");
  }
  return s + "\n";
}

int Check(const std::string& path) {
  auto result = CompileFromFlags(path);
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    return kExitError;
  }
  const Program& first = result->plans[0].program();
  int64_t params = 0, param_bytes = 0;
  std::map<int, int64_t> stage_params, stage_param_bytes, stage_activation_bytes;
  std::map<int, double> stage_work;  // estimated forward + backward per micro-batch
  std::map<int, int> stage_ops, stage_forward_ops, stage_transfers;
  for (const RankPlan& plan : result->plans) {
    if (plan.topology().dp_rank() != 0) continue;
    const int stage = plan.topology().stage();
    for (const Var& v : plan.program().var()) {
      if (v.kind() != PARAM) continue;
      int64_t n = NumElements(std::vector<int64_t>(v.shape().begin(), v.shape().end()));
      stage_params[stage] += n;
      stage_param_bytes[stage] += n * DataTypeSize(v.dtype());
      params += n;
      param_bytes += n * DataTypeSize(v.dtype());
    }
    for (const Op& op : plan.program().op()) {
      if (op.type() == "send" || op.type() == "recv") {
        stage_transfers[stage]++;
        continue;
      }
      stage_ops[stage]++;
      stage_forward_ops[stage] += op.role() == FORWARD || op.role() == LOSS;
    }
    stage_activation_bytes[stage] = plan.memory().activation_peak_bytes();
    stage_work[stage] = plan.memory().forward_cost() + plan.memory().backward_cost();
  }
  double total_work = 0;
  for (const auto& [stage, w] : stage_work) total_work += w;
  std::cout << "program " << first.name() << " (" << path << "): ok\n";
  std::cout << absl::StrFormat("  parameters: %d (%s)\n", params, Bytes(param_bytes));
  std::cout << "  passes: " << absl::StrJoin(result->pass_names, ", ") << "\n";
  const Schedule& schedule = result->plans[0].schedule();
  std::cout << absl::StrFormat("  global batch %d = %d micro-batch(es) of %d, %s schedule, %d rank(s)\n",
                               result->batch_size, schedule.micro_batches(), schedule.micro_batch_size(),
                               ScheduleKind_Name(schedule.kind()), result->plans.size());
  for (const auto& [stage, n] : stage_ops) {
    // On a pipeline: the cost model's share of the work, to balance stages by.
    const std::string work =
        stage_ops.size() > 1 && total_work > 0
            ? absl::StrFormat(", %.0f%% of the work (%.3g GFLOP-eq per micro-batch)",
                              100 * stage_work[stage] / total_work, stage_work[stage] * 1e-9)
            : "";
    std::cout << absl::StrFormat(
        "  stage %d: %d ops (%d forward), %d transfers, %d parameters (%s), predicted activations %s%s\n", stage, n,
        stage_forward_ops[stage], stage_transfers[stage], stage_params[stage], Bytes(stage_param_bytes[stage]),
        Bytes(stage_activation_bytes[stage]), work);
  }
  for (const RankPlan& plan : result->plans) {
    const MemoryPlan& m = plan.memory();
    std::cout << absl::StrFormat(
        "  rank %d: predicted peak %s (parameters %s, optimizer state %s, activations %s), bubble %.1f%%\n",
        plan.rank(), Bytes(m.peak_bytes()), Bytes(m.param_bytes()), Bytes(m.state_bytes()),
        Bytes(m.activation_peak_bytes()), 100 * m.bubble_fraction());
  }
  std::cout << "  schedule (as if every stage's forward took 1 unit and backward 2; the bubbles above weigh each stage's\n"
               "  estimated work; digit N = forward of micro-batch N, letter = its backward, a = 0):\n";
  Timeline timeline = SimulateTimeline(result->plans);
  for (absl::string_view line : absl::StrSplit(timeline.Diagram(), '\n', absl::SkipEmpty())) {
    std::cout << "    " << line << "\n";
  }
  return 0;
}

int CompileCommand(const std::string& path) {
  std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cerr << "error: strata compile needs --out DIR\n" << kUsage;
    return kExitUsage;
  }
  auto result = CompileFromFlags(path);
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    return kExitError;
  }
  // Flags are checked before anything is written: a usage error leaves --out as it was.
  const std::string dump_after = absl::GetFlag(FLAGS_dump_after);
  if (!dump_after.empty() && !absl::c_linear_search(result->pass_names, dump_after)) {
    std::cerr << "error: --dump_after '" << dump_after << "': no such pass (passes: "
              << absl::StrJoin(result->pass_names, ", ") << ")\n";
    return kExitUsage;
  }
  out = UserPath(out);
  if (mkdir(out.c_str(), 0755) != 0 && errno != EEXIST) {
    std::cerr << "error: --out " << out << ": cannot create folder\n";
    return kExitError;
  }
  std::string diagram;
  for (const RankPlan& plan : result->plans) {
    std::string file = absl::StrCat(out, "/rank_", plan.rank(), ".pbtxt");
    if (auto s = WriteFileAtomically(file, ProgramToText(plan)); !s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitError;
    }
    diagram += ScheduleDiagram(plan);
  }
  if (auto s = WriteFileAtomically(absl::StrCat(out, "/schedule.txt"), diagram); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitError;
  }
  if (!dump_after.empty()) {
    if (auto s = WriteFileAtomically(absl::StrCat(out, "/after_", dump_after, ".pbtxt"), ProgramToText(result->dumped)); !s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitError;
    }
  }
  std::cout << "wrote " << result->plans.size() << " plan(s) and schedule.txt to " << out << "\n";
  return 0;
}

TrainOptions TrainOptionsFromFlags(uint64_t program_seed) {
  TrainOptions options;
  options.data = absl::GetFlag(FLAGS_data);
  options.eval_data = absl::GetFlag(FLAGS_eval_data);
  options.steps = absl::GetFlag(FLAGS_steps);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  int64_t seed = absl::GetFlag(FLAGS_seed);
  options.seed = seed >= 0 ? static_cast<uint64_t>(seed) : program_seed;
  options.device = absl::GetFlag(FLAGS_device);
  options.metrics_path = UserPath(absl::GetFlag(FLAGS_metrics));
  options.save_dir = UserPath(absl::GetFlag(FLAGS_save));
  options.load_dir = UserPath(absl::GetFlag(FLAGS_load));
  options.save_every = absl::GetFlag(FLAGS_save_every);
  options.keep_checkpoints = static_cast<int>(absl::GetFlag(FLAGS_keep_checkpoints));
  options.stop_signal = [] { return static_cast<int>(g_stop_signal); };
  options.progress = !absl::GetFlag(FLAGS_quiet);
  options.comm_timeout_s = absl::GetFlag(FLAGS_comm_timeout_s);
  options.trace_path = UserPath(absl::GetFlag(FLAGS_trace));
  return options;
}

void PrintSummary(const TrainReport& report) {
  if (!report.reports_loss) {
    // A pipeline rank without the loss: its own memory, so every rank's shows.
    std::cerr << absl::StrFormat("done in %.1f s, measured peak %s, predicted %s\n", report.seconds,
                                 Bytes(report.measured_peak_bytes), Bytes(report.predicted_peak_bytes));
    return;
  }
  std::cerr << absl::StrFormat("done: %d steps in %.1f s (batch %d, %d threads), measured peak %s, predicted %s\n",
                               report.steps.empty() ? 0 : report.steps.back().step, report.seconds,
                               report.batch_size, IntraOpThreads(), Bytes(report.measured_peak_bytes),
                               Bytes(report.predicted_peak_bytes));
  if (!report.evals.empty()) {
    const EvalMetrics& e = report.evals.back();
    std::cout << absl::StrFormat("final %s loss %.4f", e.name, e.loss);
    if (e.accuracy >= 0) std::cout << absl::StrFormat(" accuracy %.4f", e.accuracy);
    std::cout << "\n";
  } else if (!report.steps.empty()) {
    std::cout << absl::StrFormat("final train loss %.4f\n", report.steps.back().loss);
  }
}

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

// --compare_single: the same program on one device, same data and global
// batch, printed beside the parallel run's losses.
int CompareWithSingleDevice(const std::string& path, int64_t global_batch, const std::string& parallel_metrics) {
  auto program = ReadProgramFile(UserPath(path));
  if (!program.ok()) {
    std::cerr << "error: " << program.status().message() << "\n";
    return kExitError;
  }
  CompileOptions options;
  options.batch_size = global_batch;
  auto single = Compile(*program, Strategy(), options);
  if (!single.ok()) {
    std::cerr << "error: single-device reference: " << single.status().message() << "\n";
    return kExitError;
  }
  TrainOptions t = TrainOptionsFromFlags(static_cast<uint64_t>(program->seed()));
  t.metrics_path.clear();
  t.trace_path.clear();
  t.save_dir.clear();
  t.load_dir.clear();
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
    std::cout << absl::StrFormat("%6d  %14.9f  %14.9f  %10.2e\n", i + 1, a, b, rel);
  }
  std::cout << absl::StrFormat("max relative difference %.2e over %d steps\n", worst,
                               std::min(report->steps.size(), parallel->size()));
  return 0;
}

// Synthetic data is the default so that `strata run PROGRAM` is a smoke test;
// say so, lest a user take its loss for their dataset's.
void NoteSyntheticData(const std::set<std::string>& given) {
  if (given.count("data") || absl::GetFlag(FLAGS_quiet)) return;
  std::cerr << "note: no --data given; training on synthetic data (use --data fashion_mnist for Fashion-MNIST)\n";
}

// A training process (one device, or a worker) stops at the next step
// boundary on SIGTERM, every rank after the same step, and saves with --save:
// a cluster's preemption (the launcher forwards it to the workers).
void OnStopSignal(int signo) { g_stop_signal = signo; }
void InstallStopHandler() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  action.sa_flags = SA_RESTART;  // other threads' system calls must not fail with EINTR
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
}

// How a run that a stop request ended reports it: the step, what it saved,
// and 128 + the signal as the exit code, as a process killed by it would.
int ReportStopped(const TrainReport& report) {
  const int64_t step = report.steps.empty() ? 0 : report.steps.back().step;
  const char* name = sigabbrev_np(report.stop_signal);
  std::cerr << "stopped by " << (name != nullptr ? absl::StrCat("SIG", name) : absl::StrCat("signal ", report.stop_signal))
            << (g_stop_signal == 0 ? " (on another rank)" : "") << " after step " << step
            << (report.last_saved.empty() ? "; no --save, nothing saved" : absl::StrCat("; saved ", report.last_saved))
            << "\n";
  return 128 + report.stop_signal;
}

// Outputs that cannot be written, and a --load the run cannot resume from,
// are found before the first step (or any worker starts), not after training.
int CheckRunOutputs(int64_t nproc, int64_t global_batch, uint64_t seed) {
  const std::string save = UserPath(absl::GetFlag(FLAGS_save));
  const std::string load = UserPath(absl::GetFlag(FLAGS_load));
  if (absl::GetFlag(FLAGS_save_every) < 0 || absl::GetFlag(FLAGS_keep_checkpoints) < 0 ||
      absl::GetFlag(FLAGS_keep_checkpoints) > (1 << 20)) {
    std::cerr << "error: --save_every and --keep_checkpoints must be >= 0\n";
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
  const std::string log_dir = absl::GetFlag(FLAGS_log_dir).empty() && nproc > 1 ? "log" : absl::GetFlag(FLAGS_log_dir);
  if (s.ok() && !log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(UserPath(log_dir), ec);
    s = CheckWritableFile(UserPath(log_dir) + "/.strata-write-test", "--log_dir");
  }
  if (!s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitError;
  }
  if (!load.empty()) {
    // --steps is known here; an --epochs run's length needs the data, so Train checks it.
    auto metadata = ReadCheckpointMetadata(load);
    const int64_t steps = absl::GetFlag(FLAGS_steps) > 0 ? absl::GetFlag(FLAGS_steps) : INT64_MAX;
    absl::Status bad = metadata.ok() ? CheckResumable(*metadata, global_batch, seed, steps).status() : absl::OkStatus();
    if (!bad.ok()) {
      std::cerr << "error: --load " << load << ": " << bad.message() << "\n";
      return kExitUsage;
    }
  }
  return 0;
}

// The job's id: --job_id, else what the launcher or torchrun set (their run
// id), else Slurm's job; "default" for ranks started by hand without one.
// A restarted job (torchrun's restarts, a requeued Slurm job) keeps its id
// but counts its restarts: each attempt gets keys of its own.
std::string JobId() {
  if (!absl::GetFlag(FLAGS_job_id).empty()) return absl::GetFlag(FLAGS_job_id);
  const auto env = [](const char* var) -> std::string {
    const char* value = std::getenv(var);
    return value != nullptr ? value : "";
  };
  if (!env("STRATA_JOB_ID").empty()) return env("STRATA_JOB_ID");
  for (const auto& [id, restarts] : {std::pair<const char*, const char*>{"TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"},
                                    {"SLURM_JOB_ID", "SLURM_RESTART_COUNT"}}) {
    if (env(id).empty()) continue;
    return env(restarts).empty() ? env(id) : absl::StrCat(env(id), ".", env(restarts));
  }
  return "default";
}

// A worker: this rank's plan, its communicator, then the same training loop.
// Every error after the store is open is recorded there before the rank
// exits, so the launcher names the first failure in time.
int RunWorker(const CompileResult& result, const WorkerEnv& env, uint64_t program_seed,
              const std::set<std::string>& given) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const int world = static_cast<int>(result.plans.size());
  if (env.world_size != world) {
    std::cerr << "error: rank " << env.rank << ": started with world size " << env.world_size << " but the strategy needs "
              << world << " rank(s)\n";
    return kExitUsage;
  }
  const RankPlan& plan = result.plans[env.rank];
  RendezvousOptions ropts;
  ropts.rank = env.rank;
  ropts.world_size = env.world_size;
  ropts.job_id = JobId();
  ropts.store_spec = !absl::GetFlag(FLAGS_store).empty() ? absl::GetFlag(FLAGS_store) : env.store_spec;
  if (ropts.store_spec.empty() && !env.master_addr.empty() && env.master_port > 0) {
    // torchrun's way: rank 0 serves the store on MASTER_ADDR:MASTER_PORT.
    ropts.store_spec = absl::StrCat("tcp://", env.master_addr, ":", env.master_port);
  }
  if (ropts.store_spec.empty()) {
    std::cerr << "error: rank " << env.rank
              << ": no store to meet the other ranks (set MASTER_ADDR and MASTER_PORT, STRATA_STORE, or --store "
                 "redis://HOST:PORT)\n";
    return kExitUsage;
  }
  ropts.serve_store = absl::StartsWith(ropts.store_spec, "tcp://") && env.rank == 0;
  std::string ifname = absl::GetFlag(FLAGS_socket_ifname);
  std::string ifname_from = "--socket_ifname";
  for (const char* var : {"STRATA_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    if (ifname.empty() && std::getenv(var) != nullptr) {
      ifname = std::getenv(var);
      ifname_from = var;
    }
  }
  auto listen = ChooseListenAddress(ropts.store_spec, ifname);
  if (!listen.ok()) {
    std::cerr << "error: rank " << env.rank << ": choosing the address to listen on"
              << (ifname.empty() ? "" : absl::StrCat(" (", ifname_from, " ", ifname, ")")) << ": "
              << listen.status().message() << "\n";
    return kExitError;
  }
  ropts.hostname = *listen;
  ropts.fingerprint = plan.fingerprint();
  ropts.timeout = absl::Seconds(absl::GetFlag(FLAGS_comm_timeout_s));
  ropts.op_timeout = absl::Seconds(absl::GetFlag(FLAGS_comm_timeout_s));
  auto store = OpenStore(ropts.store_spec, ropts.serve_store, ropts.timeout);
  if (!store.ok()) {
    std::cerr << "error: rank " << env.rank << ": " << store.status().message() << "\n";
    return kExitError;
  }
  std::unique_ptr<Store> health = (*store)->WithPrefix(HealthKeyPrefix(ropts.job_id));
  // Exits at once: a heartbeat thread stuck on a stalled store must not hold
  // the process (joining it could hang), and nothing else is left to do.
  auto fail = [&](const absl::Status& status) {
    const std::string message = absl::StrCat("rank ", env.rank, ": ", status.message());
    ReportFailure(*health, env.rank, message).IgnoreError();
    std::cout.flush();
    std::cerr << "error: " << message << std::endl;
    _exit(kExitError);
    return kExitError;
  };
  auto world_comm = Rendezvous(ropts, **store);
  if (!world_comm.ok()) return fail(world_comm.status());
  CommunicatorSet comms(*std::move(world_comm));
  if (auto s = ConnectGroups(ropts, **store, plan.topology().group(), &comms); !s.ok()) return fail(s);

  // A rank whose heartbeat stops (SIGSTOP, a dead machine) ends the job
  // within --heartbeat_timeout_s, named; the monitor thread ends this process.
  HeartbeatMonitor::Options hopts;
  hopts.store_spec = ropts.store_spec;
  hopts.job_id = ropts.job_id;
  hopts.rank = env.rank;
  hopts.world_size = env.world_size;
  hopts.timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  hopts.interval = std::clamp(hopts.timeout / 6, absl::Milliseconds(100), absl::Seconds(3));
  hopts.store_owner = absl::StartsWith(ropts.store_spec, "tcp://") ? 0 : -1;
  hopts.on_unresponsive = [rank = env.rank](int, const std::string& why) {
    std::cerr << "error: rank " << rank << ": " << why << "\n";
    std::cerr.flush();
    _exit(kExitError);
  };
  auto monitor = HeartbeatMonitor::Start(hopts);
  if (!monitor.ok()) return fail(monitor.status());

  TrainOptions options = TrainOptionsFromFlags(program_seed);
  options.comms = &comms;
  if (!options.trace_path.empty()) options.trace_path = absl::StrCat(options.trace_path, ".rank", env.rank);
  // One note for the job: the launcher relays rank 0's stderr.
  if (env.rank == 0) NoteSyntheticData(given);
  InstallStopHandler();
  auto report = Train(plan, options);
  if (!report.ok()) return fail(report.status());
  (*monitor)->Finish();
  // Every rank is done with the store: the job's keys go, so that the next
  // job with this id can meet in the same Redis server.
  if (comms.world()->Barrier()->Wait(absl::Seconds(absl::GetFlag(FLAGS_comm_timeout_s))).ok() && env.rank == 0) {
    (*store)->WithPrefix(JobKeyPrefix(ropts.job_id))->DeleteAll().IgnoreError();
  }
  PrintSummary(*report);
  if (report->stop_signal != 0) return ReportStopped(*report);
  return 0;
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

int Run(const std::string& path, int argc, char** argv, const std::set<std::string>& given) {
  const int64_t nproc = absl::GetFlag(FLAGS_nproc);
  if (nproc < 1 || nproc > 1024) {
    std::cerr << "error: --nproc must be in 1..1024, got " << nproc << "\n";
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_steps) < 0 || absl::GetFlag(FLAGS_epochs) < 0) {
    std::cerr << "error: --steps and --epochs must be >= 0\n";
    return kExitUsage;
  }
  if (!(absl::GetFlag(FLAGS_comm_timeout_s) > 0)) {
    std::cerr << "error: --comm_timeout_s must be > 0\n";
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
  if (device == "gpu") {
    std::cerr << "error: --device gpu: the GPU executor is not built yet in this version; use --device cpu\n";
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
  const int world = static_cast<int>(result->plans.size());
  const uint64_t program_seed = static_cast<uint64_t>(result->plans[0].program().seed());
  if (const int64_t flag_seed = absl::GetFlag(FLAGS_seed);
      int rc = CheckRunOutputs(nproc, result->batch_size, flag_seed >= 0 ? flag_seed : program_seed)) {
    return rc;
  }

  if (!worker->has_value()) {
    if (nproc != world) {
      std::cerr << "error: the strategy needs " << world << " rank(s) (" << result->plans[0].topology().num_stages()
                << " stage(s) x data-parallel degree " << result->plans[0].topology().dp_degree() << "); run with --nproc "
                << world << "\n";
      return kExitUsage;
    }
    if (world == 1) {
      NoteSyntheticData(given);
      InstallStopHandler();
      auto report = Train(result->plans[0], TrainOptionsFromFlags(program_seed));
      if (!report.ok()) {
        std::cerr << "error: " << report.status().message() << "\n";
        return kExitError;
      }
      PrintSummary(*report);
      if (report->stop_signal != 0) return ReportStopped(*report);
      return absl::GetFlag(FLAGS_compare_single) ? CompareWithSingleDevice(path, result->batch_size, UserPath(absl::GetFlag(FLAGS_metrics))) : 0;
    }
    // The launcher: N workers of this same command.
    LaunchOptions launch;
    std::vector<std::string> args(argv, argv + argc);
    args = ArgvWithoutFlag(ArgvWithoutFlag(ArgvWithoutFlag(args, "nproc"), "log_dir"), "compare_single", false);
    args = ArgvWithoutFlag(args, "bind_cores", false);
    std::string metrics = UserPath(absl::GetFlag(FLAGS_metrics));
    std::string temp_metrics;
    if (absl::GetFlag(FLAGS_compare_single) && metrics.empty()) {
      char tmpl[] = "/tmp/strata-metrics-XXXXXX";
      int fd = mkstemp(tmpl);
      if (fd >= 0) close(fd);
      temp_metrics = metrics = tmpl;
      args.push_back(absl::StrCat("--metrics=", metrics));
    }
    launch.argv = args;
    launch.nproc = static_cast<int>(nproc);
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
    const std::string trace = UserPath(absl::GetFlag(FLAGS_trace));
    if (rc == 0 && !trace.empty()) {
      std::vector<std::string> parts;
      for (int r = 0; r < world; ++r) parts.push_back(absl::StrCat(trace, ".rank", r));
      if (auto s = MergeTraceFiles(parts, trace); !s.ok()) {
        std::cerr << "error: " << s.message() << "\n";
        return kExitError;
      }
    }
    if (rc == 0 && absl::GetFlag(FLAGS_compare_single)) rc = CompareWithSingleDevice(path, result->batch_size, metrics);
    if (!temp_metrics.empty()) std::remove(temp_metrics.c_str());
    return rc;
  }

  return RunWorker(*result, **worker, program_seed, given);
}

int Gen(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::cerr << "error: strata gen needs one model name (mlp, resmlp, convnet, alexnet)\n" << kUsage;
    return kExitUsage;
  }
  GenOptions o;
  o.layers.clear();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_layers), ',')) {
    int64_t w;
    if (!absl::SimpleAtoi(part, &w)) {
      std::cerr << "error: --layers '" << absl::GetFlag(FLAGS_layers) << "': expected comma-separated widths\n";
      return kExitUsage;
    }
    o.layers.push_back(w);
  }
  o.stages = static_cast<int>(std::clamp<int64_t>(absl::GetFlag(FLAGS_stages), -1, 1 << 20));
  o.blocks = static_cast<int>(std::clamp<int64_t>(absl::GetFlag(FLAGS_blocks), -1, 1 << 20));
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.learning_rate = absl::GetFlag(FLAGS_lr);
  o.cosine = absl::GetFlag(FLAGS_cosine);
  o.dropout = absl::GetFlag(FLAGS_dropout);
  o.dtype = absl::GetFlag(FLAGS_dtype);
  if (!(o.learning_rate >= 0) || !std::isfinite(o.learning_rate)) {
    std::cerr << "error: --lr must be > 0 and finite (0: the optimizer's default)\n";
    return kExitUsage;
  }
  auto text = GenerateProgram(args[0], o);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return kExitUsage;
  }
  std::cout << *text;
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help") {
    std::cerr << kUsage;
    return argc < 2 ? kExitUsage : 0;
  }
  std::string command = argv[1];
  if (!CommandFlags().count(command)) {
    std::cerr << "error: unknown command '" << command << "'\n" << kUsage;
    return kExitUsage;
  }
  if (WantsHelp(argc, argv, 2)) {
    std::cout << CommandHelp(command);
    return 0;
  }
  auto parsed = ParseFlags(command, argc, argv, 2);
  if (!parsed.ok()) {
    std::cerr << "error: " << parsed.status().message() << "\n";
    return kExitUsage;
  }
  if (parsed->given.count("steps") && parsed->given.count("epochs")) {
    std::cerr << "error: --steps and --epochs are mutually exclusive; give one\n";
    return kExitUsage;
  }
  // Left out, --steps and --epochs train one epoch; an explicit 0 asks for nothing, which is a mistake.
  const bool zero_steps = parsed->given.count("steps") && absl::GetFlag(FLAGS_steps) == 0;
  if (zero_steps || (parsed->given.count("epochs") && absl::GetFlag(FLAGS_epochs) == 0)) {
    std::cerr << "error: --" << (zero_steps ? "steps" : "epochs")
              << " 0: give at least 1, or leave out --steps and --epochs to train one epoch\n";
    return kExitUsage;
  }
  const std::vector<std::string>& positional = parsed->positional;
  if (command == "gen") return Gen(positional);
  const int64_t batch_size = absl::GetFlag(FLAGS_batch_size);
  if (batch_size < 0 || batch_size > kMaxBatchSize) {
    std::cerr << "error: --batch_size must be in 1.." << kMaxBatchSize << ", got " << batch_size << "\n";
    return kExitUsage;
  }
  if (positional.size() != 1) {
    std::cerr << "error: strata " << command << " needs exactly one PROGRAM file, got " << positional.size() << "\n" << kUsage;
    return kExitUsage;
  }
  const std::string& program = positional[0];
  if (command == "check") return Check(program);
  if (command == "compile") return CompileCommand(program);
  return Run(program, argc, argv, parsed->given);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported as
  // an error, instead of killing the process with SIGXFSZ.
  signal(SIGXFSZ, SIG_IGN);
  return strata::Main(argc, argv);
}
