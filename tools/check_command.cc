// strata check PROGRAM: compiles the program and prints what the plan holds
// per stage and rank, with the predicted memory and the schedule's timeline.

#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/verify_schedule.h"
#include "runtime/device.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace strata {
namespace cli {

int CheckCommand(const std::string& path) {
  if (auto kind = DeviceKindFromFlags(); !kind.ok()) {
    std::cerr << "error: " << kind.status().message() << "\n";
    return kExitUsage;
  }
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
  if (const DeviceKind kind = result->plans[0].device_kind(); kind != DEVICE_CPU) {
    // Plans and memory predicted for a GPU; what stands between it and a run.
    // Only a binary with the device's kernels (strata_gpu) knows their
    // scratch and which ops have one.
    std::cout << "  device: " << DeviceKindLabel(kind);
    if (FindDeviceFactory(kind) == nullptr) {
      std::cout << " (this strata links no " << DeviceKindLabel(kind)
                << " kernels: the memory plan leaves out their scratch; strata_gpu check plans it and names any op "
                   "without one)\n";
    } else {
      const std::string missing = FirstOpWithoutKernel(result->plans, kind);
      std::cout << " (memory planned with its kernels' scratch"
                << (missing.empty() ? "; every op has a kernel"
                                    : absl::StrCat("; no ", DeviceKindLabel(kind), " kernel yet for ", missing,
                                                   ", so run --device gpu refuses it"))
                << ")\n";
    }
  }
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

}  // namespace cli
}  // namespace strata
