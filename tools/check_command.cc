// strata check PROGRAM: compiles the program and prints what the plan holds
// per stage and rank, with the predicted memory (with recompute: against the
// same program compiled without it) and the schedule's timeline.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/verify_schedule.h"
#include "runtime/device.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"
#include "tools/cli_common.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"

namespace strata {
namespace cli {
namespace {

// Up to this many buckets are listed one by one; more are summarised.
constexpr int kBucketsListed = 6;
// Up to this many ranks of a group are listed; more are elided.
constexpr int kRanksListed = 8;

const CommGroup* FindGroup(const Topology& topology, int id) {
  for (const CommGroup& g : topology.group()) {
    if (g.id() == id) return &g;
  }
  return nullptr;
}

// "0, 4, 8" or, past kRanksListed, "0, 4, 8, ..., 28".
std::string RanksText(const std::vector<int>& ranks) {
  if (ranks.size() <= kRanksListed) return absl::StrJoin(ranks, ", ");
  return absl::StrFormat("%d, %d, %d, ..., %d", ranks[0], ranks[1], ranks[2], ranks.back());
}

std::string RankList(const CommGroup& g) {
  const std::string listed = RanksText({g.rank().begin(), g.rank().end()});
  return g.rank_size() <= kRanksListed ? listed : absl::StrFormat("%s (%d ranks)", listed, g.rank_size());
}

// Ranks whose lines read the same: a stage's data-parallel replicas, whose
// plans differ in their peers only. In the order of their first rank.
struct RankGroup {
  int stage = 0;
  std::string lines;  // what follows "rank N: "
  std::vector<int> ranks;
};

std::vector<RankGroup> GroupAlikeRanks(const std::vector<std::pair<const RankPlan*, std::string>>& rank_lines) {
  std::vector<RankGroup> groups;
  std::map<std::pair<int, std::string>, size_t> index;
  for (const auto& [plan, lines] : rank_lines) {
    const int stage = plan->topology().stage();
    auto [it, added] = index.try_emplace({stage, lines}, groups.size());
    if (added) groups.push_back({stage, lines, {}});
    groups[it->second].ranks.push_back(plan->rank());
  }
  return groups;
}

// "rank 3: " or "ranks 0, 2 (stage 0's 2 data-parallel replicas): ".
std::string GroupHeader(const RankGroup& g, int num_stages) {
  if (g.ranks.size() == 1) return absl::StrFormat("  rank %d: ", g.ranks[0]);
  return absl::StrFormat("  ranks %s (%s%d data-parallel replicas): ", RanksText(g.ranks),
                         num_stages > 1 ? absl::StrFormat("stage %d's ", g.stage) : "", g.ranks.size());
}

// The schedule's rows, "rank N |...|", as one row a stage where its
// replicas' rows are the same ("stage S |...|"), the labels padded to one
// width.
std::vector<std::string> ScheduleRows(const Timeline& timeline, const std::vector<RankPlan>& plans) {
  std::vector<std::pair<std::string, std::string>> rows;  // label, "|...|"
  for (absl::string_view line : absl::StrSplit(timeline.Diagram(), '\n', absl::SkipEmpty())) {
    const size_t bar = line.find(" |");
    rows.emplace_back(line.substr(0, bar), line.substr(bar + 1));
  }
  std::map<int, std::set<std::string>> by_stage;
  for (size_t r = 0; r < rows.size() && r < plans.size(); ++r) {
    by_stage[plans[r].topology().stage()].insert(rows[r].second);
  }
  const bool collapse =
      by_stage.size() < rows.size() &&
      std::all_of(by_stage.begin(), by_stage.end(), [](const auto& s) { return s.second.size() == 1; });
  if (collapse) {
    rows.clear();
    for (const auto& [stage, row] : by_stage) rows.emplace_back(absl::StrCat("stage ", stage), *row.begin());
  }
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  std::vector<std::string> out;
  for (const auto& [label, row] : rows) {
    out.push_back(absl::StrCat(label, std::string(width - label.size(), ' '), " ", row));
  }
  return out;
}

// A data-parallel rank's lines under its entry ("rank N:", or its replicas'): its dp group, the
// buckets its plan posts (bucket_allreduce ops, read from the program, not
// recomputed) and the bytes the ring algorithm sends for them per update.
std::string DataParallelLines(const RankPlan& plan) {
  const Topology& topology = plan.topology();
  const CommGroup* dp = nullptr;
  for (const CommGroup& g : topology.group()) {
    if (g.axis_size() == 1 && g.axis(0) == "dp") dp = &g;
  }
  std::string out = dp == nullptr ? "    dp group: none in the plan's topology\n"
                                  : absl::StrFormat("    dp group %d: ranks %s\n", dp->id(), RankList(*dp));
  std::map<std::string, int64_t> var_bytes;
  for (const Var& v : plan.program().var()) {
    var_bytes[v.name()] =
        NumElements(std::vector<int64_t>(v.shape().begin(), v.shape().end())) * DataTypeSize(v.dtype());
  }
  struct Bucket {
    int grads;
    int64_t bytes;
  };
  std::vector<Bucket> buckets;
  int64_t total_bytes = 0, grads = 0;
  double sent = 0;
  std::vector<int> sizes;  // of the groups the buckets are summed over
  for (const Op& op : plan.program().op()) {
    if (op.type() != "bucket_allreduce" || op.input_size() == 0) continue;
    const auto it = var_bytes.find(op.input(0));
    const int64_t bytes = it == var_bytes.end() ? 0 : it->second;
    buckets.push_back({op.input_size() - 1, bytes});
    total_bytes += bytes;
    grads += op.input_size() - 1;
    const CommGroup* g = FindGroup(topology, op.has_group() ? op.group() : 0);
    const int d = g == nullptr ? 1 : g->rank_size();
    sent += 2.0 * (d - 1) / d * bytes;
    if (std::find(sizes.begin(), sizes.end(), d) == sizes.end()) sizes.push_back(d);
  }
  if (buckets.empty()) {
    return out + "    no buckets (this stage trains no parameters): the gradient allreduce sends nothing\n";
  }
  if (buckets.size() <= kBucketsListed) {
    std::vector<std::string> each;
    for (const Bucket& b : buckets) {
      each.push_back(absl::StrFormat("%d gradient%s (%s)", b.grads, b.grads == 1 ? "" : "s", Bytes(b.bytes)));
    }
    absl::StrAppendFormat(
        &out, "    %s: %s\n",
        buckets.size() == 1 ? "1 bucket" : absl::StrCat(buckets.size(), " buckets, in the order posted"),
        absl::StrJoin(each, ", "));
  } else {
    auto by_grads = [](const Bucket& a, const Bucket& b) { return a.grads < b.grads; };
    auto by_bytes = [](const Bucket& a, const Bucket& b) { return a.bytes < b.bytes; };
    const auto [few, many] = std::minmax_element(buckets.begin(), buckets.end(), by_grads);
    const auto [small, large] = std::minmax_element(buckets.begin(), buckets.end(), by_bytes);
    const std::string counts = few->grads == many->grads
                                   ? absl::StrFormat("%d gradient%s", few->grads, few->grads == 1 ? "" : "s")
                                   : absl::StrFormat("%d-%d gradients", few->grads, many->grads);
    const std::string sizes_range = small->bytes == large->bytes
                                        ? Bytes(small->bytes)
                                        : absl::StrCat(Bytes(small->bytes), "-", Bytes(large->bytes));
    absl::StrAppendFormat(&out, "    %d buckets of %s, %s; %d gradients (%s) in all\n", buckets.size(), counts,
                          sizes_range, grads, Bytes(total_bytes));
  }
  absl::StrAppendFormat(&out,
                        "    gradient allreduce: sends %s per optimizer step (the ring algorithm's 2*(D-1)/D of the "
                        "buckets' %s, D = %s ranks)\n",
                        Bytes(std::llround(sent)), Bytes(total_bytes), absl::StrJoin(sizes, " or "));
  return out;
}

// What the loss-scaling pass inserted, read from the plan: the scale's
// start and its update's factors.
std::string LossScalingLine(const Program& program) {
  double init = 0, growth = 0, backoff = 0;
  int64_t interval = 0;
  for (const Var& v : program.var()) {
    if (v.name() == program.loss_scale()) init = v.init().constant().value();
  }
  for (const Op& op : program.op()) {
    if (op.type() != "update_loss_scaling") continue;
    growth = op.attr().at("growth_factor").f();
    backoff = op.attr().at("backoff_factor").f();
    interval = op.attr().at("growth_interval").i();
  }
  return absl::StrFormat(
      "  loss scaling: the loss gradient times %s (from %g); before the optimizer every gradient is unscaled and "
      "checked (check_finite_and_unscale), an inf or nan on any rank skips the update and scales by %g, %d good "
      "updates in a row by %g (update_loss_scaling)\n",
      program.loss_scale(), init, backoff, interval, growth);
}

// The line under a rank's entry when the strategy asks for
// recompute: its activation peak with and without it.
std::string RecomputeLine(int64_t with, const std::map<int, int64_t>& without, int rank,
                          const std::string& without_error) {
  const auto it = without.find(rank);
  if (it == without.end()) {
    return absl::StrFormat("    activations %s with recompute; without it the program does not compile: %s\n",
                           Bytes(with), without_error.empty() ? "no plan for this rank" : without_error);
  }
  const std::string share = it->second > 0 ? absl::StrFormat(" (%.0f%%)", 100.0 * with / it->second) : "";
  return absl::StrFormat("    activations %s with recompute, %s without%s\n", Bytes(with), Bytes(it->second), share);
}

// Each rank's predicted peak held against the memory it will run in: on
// GPUs the one `run` places it on (rank r on GPU r % count, as PlaceOnGpu;
// ranks that share a GPU add up), each the size of the first (or
// --device_memory_gib, one GPU per rank unless this strata can count them;
// one machine assumed, as `run` assumes for its local ranks, so ranks spread
// over several hosts are held against fewer GPUs than they have: an
// over-warning, never an under-warning);
// on the CPU the machine's memory, which all its ranks share. Returns the
// lines to print; a peak that does not fit also goes to stderr as a warning.
std::string DeviceMemoryLines(const std::vector<RankPlan>& plans, DeviceKind kind) {
  const double gib = absl::GetFlag(FLAGS_device_memory_gib);
  int64_t capacity = 0;
  std::string holder;
  const int ranks = static_cast<int>(plans.size());
  // GPUs the ranks spread over (one each unless fewer are here).
  int gpus = ranks;
  if (kind != DEVICE_CPU) {
    if (absl::StatusOr<int> count = CountDevices(kind); count.ok() && *count > 0) gpus = std::min(ranks, *count);
  }
  if (gib > 0) {
    capacity = static_cast<int64_t>(std::llround(gib * (int64_t{1} << 30)));
    holder = absl::StrCat(kind == DEVICE_CPU ? "the machine" : "each GPU", " (--device_memory_gib ", gib, ")");
  } else if (kind == DEVICE_CPU) {
    capacity = GetCpuDevice()->capacity_bytes();
    holder = "this machine";
  } else if (const DeviceFactory* factory = FindDeviceFactory(kind); factory != nullptr) {
    absl::StatusOr<std::unique_ptr<Device>> device = (*factory)(0);
    if (!device.ok()) {
      return absl::StrCat("  device memory: unknown (", device.status().message(),
                          "; --device_memory_gib G holds each rank against G GiB)\n");
    }
    capacity = (*device)->capacity_bytes();
    holder = absl::StrCat("each GPU (", (*device)->name(), "'s size)");
  }
  if (capacity <= 0) {
    return absl::StrCat("  device memory: unknown (this strata cannot open a ", DeviceKindLabel(kind),
                        "; --device_memory_gib G holds each rank against G GiB)\n");
  }
  // On the CPU the ranks share the machine: their peaks add up; so do
  // those of ranks that share a GPU.
  const bool shared = kind == DEVICE_CPU;
  const int devices = shared ? 1 : gpus;
  std::vector<int64_t> held(devices, 0);
  std::vector<std::vector<int>> on(devices);
  for (const RankPlan& plan : plans) {
    const int d = plan.rank() % devices;
    held[d] += plan.memory().peak_bytes();
    on[d].push_back(plan.rank());
  }
  const int fullest = static_cast<int>(std::max_element(held.begin(), held.end()) - held.begin());
  const int64_t need = held[fullest];
  std::string what;
  if (shared && ranks > 1) {
    what = absl::StrFormat("the %d ranks' predicted peaks add up to %s", ranks, Bytes(need));
  } else if (on[fullest].size() > 1) {
    what = absl::StrFormat("ranks %s share GPU %d (%d GPUs for %d ranks); their predicted peaks add up to %s",
                           absl::StrJoin(on[fullest], ", "), fullest, devices, ranks, Bytes(need));
  } else {
    what = absl::StrFormat("rank %d's predicted peak%s is %s", on[fullest][0], ranks > 1 ? ", the largest," : "",
                           Bytes(need));
  }
  std::string out = absl::StrFormat("  device memory: %s holds %s; %s (%.1f%%)\n", holder, Bytes(capacity), what,
                                    100.0 * need / capacity);
  if (need <= capacity) return out;
  std::string warning;
  if (shared) {
    warning = absl::StrFormat("warning: %s, more than the %s %s holds; the run would run out of memory\n", what,
                              Bytes(capacity), holder);
  } else {
    std::vector<std::string> over;
    // Ranks alone on their GPU: a stage's replicas with the same peak as one entry.
    std::vector<std::pair<std::pair<int, int64_t>, std::vector<int>>> alone;
    for (int d = 0; d < devices; ++d) {
      if (held[d] <= capacity) continue;
      if (on[d].size() > 1) {
        over.push_back(absl::StrFormat("GPU %d (ranks %s) %s", d, absl::StrJoin(on[d], ", "), Bytes(held[d])));
        continue;
      }
      const std::pair<int, int64_t> key = {plans[on[d][0]].topology().stage(), held[d]};
      auto it = std::find_if(alone.begin(), alone.end(), [&](const auto& a) { return a.first == key; });
      if (it == alone.end()) it = alone.insert(alone.end(), {key, {}});
      it->second.push_back(on[d][0]);
    }
    for (const auto& [key, ranks] : alone) {
      over.push_back(
          absl::StrFormat("rank%s %s %s", ranks.size() == 1 ? "" : "s", RanksText(ranks), Bytes(key.second)));
    }
    warning = absl::StrFormat("warning: predicted peak above the %s %s holds: %s; the run would run out of memory\n",
                              Bytes(capacity), holder, absl::StrJoin(over, ", "));
  }
  std::cerr << warning;
  return absl::StrCat(out, "  ", warning);
}

}  // namespace

int CheckCommand(const std::string& path) {
  if (auto kind = DeviceKindFromFlags(); !kind.ok()) {
    std::cerr << "error: " << kind.status().message() << "\n";
    return kExitUsage;
  }
  if (const double gib = absl::GetFlag(FLAGS_device_memory_gib); !(gib >= 0 && gib < 1e9)) {
    std::cerr << "error: --device_memory_gib " << gib << ": expected a size in GiB, 0 for the device's own\n";
    return kExitUsage;
  }
  if (absl::Status s = CheckPassFlags(); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
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
  // Transfers in the optimizer action (tied weights' gradients, once an
  // update), and the bytes this stage sends there.
  std::map<int, int> stage_update_transfers;
  std::map<int, int64_t> stage_update_send_bytes;
  std::set<std::string> counted;  // parameter names
  for (const RankPlan& plan : result->plans) {
    if (plan.topology().dp_rank() != 0) continue;
    const int stage = plan.topology().stage();
    for (const Var& v : plan.program().var()) {
      if (v.kind() != PARAM) continue;
      int64_t n = NumElements(std::vector<int64_t>(v.shape().begin(), v.shape().end()));
      stage_params[stage] += n;
      stage_param_bytes[stage] += n * DataTypeSize(v.dtype());
      if (!counted.insert(v.name()).second) continue;  // a tied weight on several stages counts once
      params += n;
      param_bytes += n * DataTypeSize(v.dtype());
    }
    std::map<std::string, const Var*> var_of;
    for (const Var& v : plan.program().var()) var_of[v.name()] = &v;
    for (const Op& op : plan.program().op()) {
      if (op.type() == "send" || op.type() == "recv") {
        stage_transfers[stage]++;
        if (op.role() != OPTIMIZE) continue;
        stage_update_transfers[stage]++;
        auto v = op.type() == "send" && op.input_size() == 1 ? var_of.find(op.input(0)) : var_of.end();
        if (v != var_of.end()) {
          stage_update_send_bytes[stage] +=
              NumElements(std::vector<int64_t>(v->second->shape().begin(), v->second->shape().end())) *
              DataTypeSize(v->second->dtype());
        }
        continue;
      }
      if (op.role() == REFRESH) continue;  // run before the first step and after a load, not in a step
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
  std::cout << DeviceMemoryLines(result->plans, result->plans[0].device_kind());
  const Schedule& schedule = result->plans[0].schedule();
  const int dp = std::max(1, result->plans[0].topology().dp_degree());
  const int merge = std::max(1, schedule.merge_steps());
  std::cout << absl::StrFormat("  global batch %d = %d micro-batch(es) of %d%s, %s schedule, %d rank(s)\n",
                               result->batch_size, schedule.micro_batches(), schedule.micro_batch_size(),
                               dp > 1 ? absl::StrFormat(" x %d data-parallel replicas", dp) : "",
                               ScheduleKind_Name(schedule.kind()), result->plans.size());
  if (!result->plans[0].relayed_fetch().empty()) {
    int loss_stage = 0;
    for (const RankPlan& p : result->plans) {
      if (!p.program().loss().empty()) loss_stage = p.topology().stage();
    }
    for (const RankPlan::RelayedFetch& r : result->plans[0].relayed_fetch()) {
      std::cout << "  fetch '" << r.name() << "': made on stage " << r.stage() << ", sent to the loss's stage ("
                << loss_stage << ") each step, which reports it\n";
    }
  }
  if (schedule.micro_batches() > 1 || dp > 1) {
    // Compile refuses a split batch unless the loss is a mean or a sum (analysis/sample_forms.h).
    std::cout << (result->plans[0].summed_loss()
                      ? "  loss: a sum over samples (proved from its ops), so the parts added up train as one "
                        "device's batch, and a step reports their total\n"
                      : "  loss: a mean over samples (proved from its ops), so the averaged parts train as one "
                        "device's batch\n");
    for (const std::string& f : result->plans[0].summed_fetch()) {
      std::cout << "  fetch '" << f << "': a sum over samples, reported as the parts' total\n";
    }
  }
  if (merge > 1) {
    // Summed without `average` (Paddle's avg=False): one device's step of a
    // sum loss, k times a mean's.
    const bool averaged = result->plans[0].strategy().gradient_merge().average();
    std::cout << absl::StrFormat(
        "  gradient merge: the optimizer runs once every %d steps, on %d samples, their gradients %s\n", merge,
        result->batch_size * merge,
        averaged ? "averaged"
                 : (result->plans[0].summed_loss() ? "summed (the loss is a sum over samples: one device's step)"
                                                   : "summed (average: false), not averaged"));
  }
  if (!first.loss_scale().empty()) std::cout << LossScalingLine(first);
  for (const auto& [stage, n] : stage_ops) {
    // On a pipeline: the cost model's share of the work, to balance stages by.
    const std::string work =
        stage_ops.size() > 1 && total_work > 0
            ? absl::StrFormat(", %.0f%% of the work (%.3g GFLOP-eq per micro-batch)",
                              100 * stage_work[stage] / total_work, stage_work[stage] * 1e-9)
            : "";
    const std::string at_update =
        stage_update_transfers[stage] > 0
            ? absl::StrFormat(" (%d once an update, sending %s)", stage_update_transfers[stage],
                              Bytes(stage_update_send_bytes[stage]))
            : "";
    std::cout << absl::StrFormat(
        "  stage %d: %d ops (%d forward), %d transfers%s, %d parameters (%s), predicted activations %s%s\n", stage, n,
        stage_forward_ops[stage], stage_transfers[stage], at_update, stage_params[stage],
        Bytes(stage_param_bytes[stage]), Bytes(stage_activation_bytes[stage]), work);
  }
  // With recompute: the same program compiled without it, so each rank can
  // show what recompute saves (activation peaks of the two memory plans).
  const bool recompute = absl::c_linear_search(result->pass_names, "recompute");
  std::map<int, int64_t> activations_without;
  std::string without_error;
  if (recompute) {
    auto without = CompileFromFlagsWithoutRecompute(path);
    if (without.ok()) {
      for (const RankPlan& plan : without->plans) {
        activations_without[plan.rank()] = plan.memory().activation_peak_bytes();
      }
    } else {
      without_error = std::string(without.status().message());
    }
  }
  std::vector<std::pair<const RankPlan*, std::string>> rank_lines;
  for (const RankPlan& plan : result->plans) {
    const MemoryPlan& m = plan.memory();
    // Mixed precision's 16-bit weight copies (hoist-param-casts) beside the float32 parameters.
    const std::string copies =
        m.param_copy_bytes() > 0 ? absl::StrCat(", 16-bit weight copies ", Bytes(m.param_copy_bytes())) : "";
    // And an evaluation's (--eval_only, --eval_data): the forward alone.
    std::string lines = absl::StrFormat(
        "predicted peak %s (parameters %s%s, optimizer state %s, activations %s), an evaluation %s, bubble %.1f%%\n",
        Bytes(m.peak_bytes()), Bytes(m.param_bytes()), copies, Bytes(m.state_bytes()), Bytes(m.activation_peak_bytes()),
        Bytes(m.eval_peak_bytes()), 100 * m.bubble_fraction());
    if (recompute) lines += RecomputeLine(m.activation_peak_bytes(), activations_without, plan.rank(), without_error);
    if (plan.topology().dp_degree() > 1) lines += DataParallelLines(plan);
    rank_lines.emplace_back(&plan, std::move(lines));
  }
  const int num_stages = result->plans[0].topology().num_stages();
  for (const RankGroup& g : GroupAlikeRanks(rank_lines)) std::cout << GroupHeader(g, num_stages) << g.lines;
  std::cout << "  schedule (as if every stage's forward took 1 unit and backward 2; the bubbles above weigh each stage's\n"
               "  estimated work; digit N = forward of micro-batch N, letter = its backward, a = 0):\n";
  for (const std::string& row : ScheduleRows(SimulateTimeline(result->plans), result->plans)) {
    std::cout << "    " << row << "\n";
  }
  return 0;
}

}  // namespace cli
}  // namespace strata
