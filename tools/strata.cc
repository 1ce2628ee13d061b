// The strata command-line tool: check, compile, run, gen (DESIGN.md, "The command line").
// Exit codes: 0 success, 1 a bad program/strategy/data or a failed run, 2 a usage error.

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "compiler/compile.h"
#include "compiler/graph_index.h"
#include "compiler/program_text.h"
#include "passes/verify_schedule.h"
#include "runtime/thread_pool.h"
#include "runtime/trainer.h"
#include "tools/model_gen.h"

ABSL_FLAG(std::string, strategy, "", "strategy file (protobuf text)");
ABSL_FLAG(std::string, out, "", "compile: output folder for rank_<r>.pbtxt plans");
ABSL_FLAG(std::string, dump_after, "", "compile: also write the program after this pass");
ABSL_FLAG(int64_t, nproc, 1, "run: number of worker processes");
ABSL_FLAG(int64_t, steps, 0, "run: total optimizer steps (overrides --epochs)");
ABSL_FLAG(int64_t, epochs, 0, "run: total epochs (default 1)");
ABSL_FLAG(int64_t, batch_size, 0, "global mini-batch size (default 64, or the pipeline's)");
ABSL_FLAG(std::string, data, "synthetic", "run: fashion_mnist[:train|test][,path=DIR] | mnist:path=DIR | synthetic[:classes=K,size=N]");
ABSL_FLAG(std::string, eval_data, "", "run: evaluation data, e.g. fashion_mnist:test");
ABSL_FLAG(int64_t, seed, -1, "run: seed for weights, data order and dropout (default: the program's seed, else 0)");
ABSL_FLAG(std::string, device, "cpu", "run: cpu or gpu");
ABSL_FLAG(std::string, metrics, "", "run: write per-step metrics as JSON lines to this file");
ABSL_FLAG(std::string, trace, "", "run: write a Chrome trace to this file");
ABSL_FLAG(std::string, log_dir, "", "run: folder for workerlog.R files");
ABSL_FLAG(std::string, save, "", "run: save a checkpoint to this folder at the end");
ABSL_FLAG(std::string, load, "", "run: resume from the checkpoint in this folder");
ABSL_FLAG(bool, quiet, false, "run: no progress lines");
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

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

const char kUsage[] =
    "usage:\n"
    "  strata check   PROGRAM [--strategy S] [--batch_size B]\n"
    "  strata compile PROGRAM [--strategy S] --out DIR [--dump_after PASS]\n"
    "  strata run     PROGRAM [--strategy S] [--nproc N] [--steps N | --epochs E] [--batch_size B]\n"
    "                 [--data fashion_mnist|synthetic[:classes=K]] [--eval_data fashion_mnist:test]\n"
    "                 [--seed N] [--device cpu|gpu] [--metrics FILE.jsonl] [--trace FILE.json]\n"
    "                 [--log_dir DIR] [--save DIR] [--load DIR] [--quiet]\n"
    "  strata gen     mlp|resmlp|convnet|alexnet [--layers 784,256,10] [--stages K] [--optimizer adam] ...\n";

const std::map<std::string, std::set<std::string>>& CommandFlags() {
  static const auto* flags = new std::map<std::string, std::set<std::string>>{
      {"check", {"strategy", "batch_size"}},
      {"compile", {"strategy", "batch_size", "out", "dump_after"}},
      {"run", {"strategy", "batch_size", "nproc", "steps", "epochs", "data", "eval_data", "seed", "device", "metrics",
               "trace", "log_dir", "save", "load", "quiet"}},
      {"gen", {"layers", "stages", "blocks", "optimizer", "lr", "cosine", "dropout", "dtype"}},
  };
  return *flags;
}

struct UsageError {
  std::string message;
};

// Parses "--name=value", "--name value" and "--flag"/"--noflag" for the
// command's own flags; returns the positional arguments.
absl::StatusOr<std::vector<std::string>> ParseFlags(const std::string& command, int argc, char** argv, int first) {
  std::vector<std::string> positional;
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
  }
  return positional;
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
  if (options.batch_size < 0) return absl::InvalidArgumentError(absl::StrCat("--batch_size must be > 0, got ", options.batch_size));
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
  }
  std::cout << "program " << first.name() << " (" << first.source_file() << "): ok\n";
  std::cout << absl::StrFormat("  parameters: %d (%s)\n", params, Bytes(param_bytes));
  std::cout << "  passes: " << absl::StrJoin(result->pass_names, ", ") << "\n";
  const Schedule& schedule = result->plans[0].schedule();
  std::cout << absl::StrFormat("  global batch %d = %d micro-batch(es) of %d, %s schedule, %d rank(s)\n",
                               result->batch_size, schedule.micro_batches(), schedule.micro_batch_size(),
                               ScheduleKind_Name(schedule.kind()), result->plans.size());
  for (const auto& [stage, n] : stage_ops) {
    std::cout << absl::StrFormat(
        "  stage %d: %d ops (%d forward), %d transfers, %d parameters (%s), predicted activations %s\n", stage, n,
        stage_forward_ops[stage], stage_transfers[stage], stage_params[stage], Bytes(stage_param_bytes[stage]),
        Bytes(stage_activation_bytes[stage]));
  }
  for (const RankPlan& plan : result->plans) {
    const MemoryPlan& m = plan.memory();
    std::cout << absl::StrFormat(
        "  rank %d: predicted peak %s (parameters %s, optimizer state %s, activations %s), bubble %.1f%%\n",
        plan.rank(), Bytes(m.peak_bytes()), Bytes(m.param_bytes()), Bytes(m.state_bytes()),
        Bytes(m.activation_peak_bytes()), 100 * m.bubble_fraction());
  }
  std::cout << "  schedule (forward 1 unit, backward 2; digit N = forward of micro-batch N, letter = its backward, a = 0):\n";
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
  std::string dump_after = absl::GetFlag(FLAGS_dump_after);
  if (!dump_after.empty()) {
    bool known = false;
    for (const auto& n : result->pass_names) known |= n == dump_after;
    if (!known) {
      std::cerr << "error: --dump_after '" << dump_after << "': no such pass (passes: "
                << absl::StrJoin(result->pass_names, ", ") << ")\n";
      return kExitUsage;
    }
    if (auto s = WriteFileAtomically(absl::StrCat(out, "/after_", dump_after, ".pbtxt"), ProgramToText(result->dumped)); !s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitError;
    }
  }
  std::cout << "wrote " << result->plans.size() << " plan(s) and schedule.txt to " << out << "\n";
  return 0;
}

int Run(const std::string& path) {
  if (absl::GetFlag(FLAGS_nproc) < 1) {
    std::cerr << "error: --nproc must be >= 1, got " << absl::GetFlag(FLAGS_nproc) << "\n";
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_nproc) > 1) {
    std::cerr << "error: --nproc " << absl::GetFlag(FLAGS_nproc)
              << ": multi-process runs need the pipeline and data-parallel passes, not built yet in this version\n";
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_steps) < 0 || absl::GetFlag(FLAGS_epochs) < 0) {
    std::cerr << "error: --steps and --epochs must be >= 0\n";
    return kExitUsage;
  }
  std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "gpu") {
    std::cerr << "error: --device '" << device << "': expected cpu or gpu\n";
    return kExitUsage;
  }
  if (device == "gpu") {
    std::cerr << "error: --device gpu: the GPU executor is not built yet in this version; use --device cpu\n";
    return kExitUsage;
  }
  if (!absl::GetFlag(FLAGS_trace).empty() || !absl::GetFlag(FLAGS_log_dir).empty()) {
    std::cerr << "error: --trace and --log_dir come with multi-process runs, not built yet in this version\n";
    return kExitUsage;
  }
  auto result = CompileFromFlags(path);
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    return kExitError;
  }
  TrainOptions options;
  options.data = absl::GetFlag(FLAGS_data);
  options.eval_data = absl::GetFlag(FLAGS_eval_data);
  options.steps = absl::GetFlag(FLAGS_steps);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  int64_t seed = absl::GetFlag(FLAGS_seed);
  options.seed = seed >= 0 ? static_cast<uint64_t>(seed) : static_cast<uint64_t>(result->plans[0].program().seed());
  options.device = device;
  options.metrics_path = UserPath(absl::GetFlag(FLAGS_metrics));
  options.save_dir = UserPath(absl::GetFlag(FLAGS_save));
  options.load_dir = UserPath(absl::GetFlag(FLAGS_load));
  options.progress = !absl::GetFlag(FLAGS_quiet);
  auto report = Train(result->plans[0], options);
  if (!report.ok()) {
    std::cerr << "error: " << report.status().message() << "\n";
    return kExitError;
  }
  std::cerr << absl::StrFormat("done: %d steps in %.1f s (batch %d, %d threads), measured peak %s, predicted %s\n",
                               report->steps.empty() ? 0 : report->steps.back().step, report->seconds,
                               report->batch_size, IntraOpThreads(), Bytes(report->measured_peak_bytes),
                               Bytes(report->predicted_peak_bytes));
  if (!report->evals.empty()) {
    const EvalMetrics& e = report->evals.back();
    std::cout << absl::StrFormat("final %s loss %.4f", e.name, e.loss);
    if (e.accuracy >= 0) std::cout << absl::StrFormat(" accuracy %.4f", e.accuracy);
    std::cout << "\n";
  } else if (!report->steps.empty()) {
    std::cout << absl::StrFormat("final train loss %.4f\n", report->steps.back().loss);
  }
  return 0;
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
  if (o.learning_rate < 0) {
    std::cerr << "error: --lr must be > 0\n";
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
  auto positional = ParseFlags(command, argc, argv, 2);
  if (!positional.ok()) {
    std::cerr << "error: " << positional.status().message() << "\n";
    return kExitUsage;
  }
  if (command == "gen") return Gen(*positional);
  if (positional->size() != 1) {
    std::cerr << "error: strata " << command << " needs exactly one PROGRAM file, got " << positional->size() << "\n" << kUsage;
    return kExitUsage;
  }
  const std::string& program = (*positional)[0];
  if (command == "check") return Check(program);
  if (command == "compile") return CompileCommand(program);
  return Run(program);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::Main(argc, argv); }
