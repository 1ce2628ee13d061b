// The strata command line's flags (each defined here once), the table of which
// command takes which, and the parser and --help text built from that table.

#include "tools/cli_flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tools/cli_common.h"

ABSL_FLAG(std::string, strategy, "", "strategy file (protobuf text)");
ABSL_FLAG(std::string, out, "", "compile: output folder for rank_<r>.pbtxt plans");
ABSL_FLAG(std::string, dump_after, "", "compile: also write the program after this pass");
ABSL_FLAG(std::vector<std::string>, disable_passes, {},
          "check, compile, run: optional passes (the fusions) to leave out, comma-separated, as XLA's "
          "--xla_disable_hlo_passes; an unknown or required pass is refused naming the optional ones");
ABSL_FLAG(int64_t, nproc, 1, "run: number of worker processes");
ABSL_FLAG(int64_t, steps, 0, "run: total steps, each of one global batch (give --steps or --epochs, not both); under gradient_merge the "
          "optimizer runs every k_steps-th step, so --steps counts steps, not optimizer steps, and must be a multiple "
          "of k_steps");
ABSL_FLAG(int64_t, epochs, 0, "run: total epochs (1 when neither is given; give --epochs or --steps, not both)");
ABSL_FLAG(int64_t, batch_size, 0, "global mini-batch size (default 64, or the pipeline's)");
ABSL_FLAG(std::string, data, "synthetic",
          "run: NAME[:OPTION,...], the options after one ':': fashion_mnist[:train|test,path=DIR,size=N] (e.g. "
          "fashion_mnist:test,path=DIR) | mnist:path=DIR[,test,size=N] | synthetic[:classes=K,vocab=V,size=N] "
          "(random data, for a smoke test) | tokens:path=FILE[,vocab=V,size=N] (little-endian uint16 token ids, in "
          "windows of T+1 for the I64 [-1, T] tokens and targets feeds); size=N keeps the first N samples");
ABSL_FLAG(std::string, eval_data, "", "run: evaluation data, e.g. fashion_mnist:test");
ABSL_FLAG(bool, eval_only, false,
          "run: evaluate --eval_data once, with the weights --load gives (else the initial ones), and train nothing");
ABSL_FLAG(int64_t, eval_every, 0,
          "run: also evaluate --eval_data every N steps (0: after each epoch, or after a --steps run's last step)");
ABSL_FLAG(int64_t, seed, -1, "run: seed for weights, data order and dropout (default: the program's seed, else 0)");
ABSL_FLAG(std::string, device, "cpu", "check, compile, run: cpu or gpu (the device the plans are for)");
ABSL_FLAG(double, device_memory_gib, 0,
          "check: hold each rank's predicted peak against a device of this many GiB (default: the GPU strata_gpu "
          "opens; on the CPU, the machine's memory, which all its ranks share)");
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
ABSL_FLAG(bool, cuda_graph, true,
          "run --device gpu: capture the steady-state training step as a CUDA graph and replay it (falls back to "
          "eager steps, with a note saying why, where it cannot); --cuda_graph=false runs every step eagerly");
ABSL_FLAG(bool, nccl, true,
          "run --nproc N --device gpu with a GPU per rank: tensors between ranks over NCCL (false: over Gloo, "
          "staged through pinned host memory, as for ranks sharing a GPU)");
ABSL_FLAG(double, comm_timeout_s, 300, "run: seconds a transfer may wait before the job fails naming its channel (1 to 1e6)");
ABSL_FLAG(std::string, store, "", "run: where ranks meet: redis://HOST:PORT, tcp://HOST:PORT served by rank 0 (an IPv6 HOST in brackets, [::1]), or file:///DIR (one machine; default: a FileStore in a fresh temporary folder)");
ABSL_FLAG(std::string, socket_ifname, "",
          "run: network interface the ranks' connections listen on (else STRATA_SOCKET_IFNAME or GLOO_SOCKET_IFNAME; "
          "default: the one whose route reaches the store's host, loopback for one machine); with --device gpu "
          "also NCCL's NCCL_SOCKET_IFNAME unless that is set");
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
ABSL_FLAG(int64_t, blocks, 4, "gen resmlp: residual blocks; gen gpt: transformer blocks");
ABSL_FLAG(std::string, optimizer, "", "gen: sgd | momentum | adam | adamw (empty: adam, adamw for gpt)");
ABSL_FLAG(double, lr, 0, "gen: learning rate (0: the optimizer's default)");
ABSL_FLAG(bool, cosine, true, "gen: cosine learning-rate decay over the run");
ABSL_FLAG(double, dropout, 0, "gen: dropout probability after hidden layers");
ABSL_FLAG(std::string, dtype, "F32", "gen: F32 or F64");
ABSL_FLAG(int64_t, d_model, 768, "gen gpt: model width");
ABSL_FLAG(int64_t, heads, 12, "gen gpt: attention heads (they divide --d_model)");
ABSL_FLAG(int64_t, seq, 1024, "gen gpt: tokens per sample (the tokens and targets feeds' length)");
ABSL_FLAG(int64_t, vocab, 50257, "gen gpt: vocabulary size (rows of the tied token embedding)");
ABSL_FLAG(std::string, gelu, "tanh",
          "gen gpt: the MLP's gelu, tanh (GPT-2's; cuBLASLt's GELU epilogue fuses it) or erf (the exact form)");

namespace strata {
namespace cli {

const std::map<std::string, std::set<std::string>>& CommandFlags() {
  static const auto* flags = new std::map<std::string, std::set<std::string>>{
      {"check", {"strategy", "batch_size", "device", "device_memory_gib", "disable_passes"}},
      {"compile", {"strategy", "batch_size", "out", "dump_after", "device", "disable_passes"}},
      {"run", {"strategy", "batch_size", "nproc", "steps", "epochs", "data", "eval_data", "eval_every", "eval_only", "seed", "device", "metrics",
               "trace", "log_dir", "save", "save_every", "keep_checkpoints", "load", "quiet", "comm_timeout_s",
               "heartbeat_timeout_s", "job_id", "store", "socket_ifname", "compare_single",
               "bind_cores", "cuda_graph", "nccl", "disable_passes"}},
      {"gen", {"layers", "stages", "blocks", "optimizer", "lr", "cosine", "dropout", "dtype", "d_model", "heads", "seq",
               "vocab", "gelu"}},
  };
  return *flags;
}

bool WantsHelp(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--help" || arg == "-help" || arg == "-h") return true;
  }
  return false;
}

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
    // absl reads a double past its range as 0 or inf without a word (--lr
    // 1e-400 was the optimizer's default learning rate).
    if (flag->IsOfType<double>()) {
      errno = 0;
      char* end = nullptr;
      const double parsed = std::strtod(value.c_str(), &end);
      // Past the range: 0 or inf (a subnormal, also ERANGE, is a value).
      if (errno == ERANGE && end != value.c_str() && *end == '\0' && (parsed == 0 || std::isinf(parsed))) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad value '", value, "' for --", name, ": out of a double's range"));
      }
    }
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("bad value '", value, "' for --", name, ": ", error));
    }
    parsed.given.insert(std::string(flag->Name()));
  }
  return parsed;
}

}  // namespace cli
}  // namespace strata
