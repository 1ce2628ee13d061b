#include "tools/cli_common.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "compiler/program_text.h"
#include "passes/pipeline_builder.h"
#include "runtime/kernel.h"
#include "tools/cli_flags.h"

namespace strata {
namespace cli {

const char kUsage[] =
    "usage:\n"
    "  strata check   PROGRAM [--strategy S] [--batch_size B] [--device cpu|gpu] [--device_memory_gib G]\n"
    "                 [--disable_passes P,...]\n"
    "  strata compile PROGRAM [--strategy S] --out DIR [--dump_after PASS] [--device cpu|gpu] [--disable_passes P,...]\n"
    "  strata run     PROGRAM [--strategy S] [--nproc N] [--steps N | --epochs E] [--batch_size B]\n"
    "                 [--data fashion_mnist[:test,path=DIR,size=N]|mnist:path=DIR[,size=N]|synthetic[:classes=K,vocab=V,size=N]|\n"
    "                         tokens:path=FILE[,size=N]]\n"
    "                 [--eval_data fashion_mnist:test [--eval_every N | --eval_only]] [--seed N] [--device cpu|gpu]\n"
    "                 [--metrics FILE.jsonl] [--trace FILE.json] [--log_dir DIR]\n"
    "                 [--save DIR [--save_every N] [--keep_checkpoints K]]\n"
    "                 [--load DIR | --load DIR/step-N]\n"
    "                 [--quiet] [--comm_timeout_s S] [--heartbeat_timeout_s S] [--job_id ID]\n"
    "                 [--store redis://HOST:PORT|tcp://HOST:PORT|file:///DIR] [--socket_ifname IF] [--compare_single] [--bind_cores]\n"
    "                 [--cuda_graph=false] [--nccl=false] [--disable_passes P,...]\n"
    "  strata gen     mlp|resmlp|convnet|alexnet|gpt [--layers 784,256,10] [--stages K] [--optimizer adam] ...\n"
    "strata COMMAND --help lists the command's flags.\n";

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

absl::StatusOr<DeviceKind> DeviceKindFromFlags() {
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cpu") return DEVICE_CPU;
  if (device == "gpu") return DEVICE_CUDA;
  return absl::InvalidArgumentError(absl::StrCat("--device '", device, "': expected cpu or gpu"));
}

std::string FirstOpWithoutKernel(const std::vector<RankPlan>& plans, DeviceKind kind) {
  for (const RankPlan& plan : plans) {
    const Program& p = plan.program();
    std::map<std::string, const Var*> vars;
    for (const Var& v : p.var()) vars[v.name()] = &v;
    for (int i = 0; i < p.op_size(); ++i) {
      // The dtype the executor picks the kernel by (KernelDtype), from the
      // plan's declared vars.
      KernelDef def;
      def.op = &p.op(i);
      for (const std::string& in : p.op(i).input()) {
        if (auto it = vars.find(in); it != vars.end()) def.input_types.push_back(TensorType{it->second->dtype(), {}});
      }
      for (const std::string& out : p.op(i).output()) {
        if (auto it = vars.find(out); it != vars.end()) def.output_types.push_back(TensorType{it->second->dtype(), {}});
      }
      const DataType dtype = KernelDtype(def);
      if (KernelRegistry::Global().Find(p.op(i).type(), kind, dtype) == nullptr) {
        return absl::StrCat("op #", i, " '", p.op(i).type(), "'",
                            p.op(i).name().empty() ? "" : absl::StrCat(" (", p.op(i).name(), ")"), " in ",
                            DataTypeName(dtype), " on rank ", plan.rank());
      }
    }
  }
  return "";
}

absl::StatusOr<Strategy> StrategyFromFlags() {
  const std::string path = absl::GetFlag(FLAGS_strategy);
  if (path.empty()) return Strategy();
  return ReadStrategyFile(UserPath(path));
}

namespace {

// --disable_passes, each name without the spaces around it ("a, b").
std::vector<std::string> DisabledPassesFromFlags() {
  std::vector<std::string> names = absl::GetFlag(FLAGS_disable_passes);
  for (std::string& n : names) absl::StripAsciiWhitespace(&n);
  return names;
}

}  // namespace

absl::Status CheckPassFlags() {
  auto strategy = StrategyFromFlags();
  auto device = DeviceKindFromFlags();
  // A strategy that cannot be read is the compile's error to report.
  if (!strategy.ok() || !device.ok()) return absl::OkStatus();
  const std::string dump_after = absl::GetFlag(FLAGS_dump_after);
  if (!dump_after.empty()) {
    const std::vector<std::string> passes = CompilePassNames(*strategy, *device);
    if (!absl::c_linear_search(passes, dump_after)) {
      const std::string where = WherePassRuns(dump_after, *strategy, *device);
      return absl::InvalidArgumentError(
          absl::StrCat("--dump_after '", dump_after, "': ",
                       where.empty() ? "no such pass" : absl::StrCat("that pass runs only with ", where),
                       " (this compile's passes: ", absl::StrJoin(passes, ", "), ")"));
    }
  }
  const std::vector<std::string> disabled = DisabledPassesFromFlags();
  if (absl::Status s = CheckDisabledPasses(*strategy, *device, disabled); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--disable_passes: ", s.message()));
  }
  if (!dump_after.empty() && absl::c_linear_search(disabled, dump_after)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dump_after '", dump_after, "': --disable_passes leaves that pass out, so nothing runs to dump"));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<CompileResult> CompileFromFlags(const std::string& program_path, bool clear_recompute) {
  auto program = ReadProgramFile(UserPath(program_path));
  if (!program.ok()) return program.status();
  auto strategy = StrategyFromFlags();
  if (!strategy.ok()) return strategy.status();
  if (clear_recompute) strategy->clear_recompute();
  const std::string strategy_path = absl::GetFlag(FLAGS_strategy);
  auto device_kind = DeviceKindFromFlags();
  if (!device_kind.ok()) return device_kind.status();
  CompileOptions options;
  options.device_kind = *device_kind;
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.dump_after = absl::GetFlag(FLAGS_dump_after);
  options.disabled_passes = DisabledPassesFromFlags();
  return Compile(*program, *strategy, options, strategy_path.empty() ? "strategy" : strategy_path);
}

}  // namespace

absl::StatusOr<CompileResult> CompileFromFlags(const std::string& program_path) {
  return CompileFromFlags(program_path, /*clear_recompute=*/false);
}

absl::StatusOr<CompileResult> CompileFromFlagsWithoutRecompute(const std::string& program_path) {
  return CompileFromFlags(program_path, /*clear_recompute=*/true);
}

}  // namespace cli
}  // namespace strata
