// bench/compile_time: ParseProgramText + Compile (every pass, the schedule
// and the memory plan) of a generated residual MLP with 1000 and 2000 blocks.
// Goals: 1000 blocks under 1 s; 2000 blocks under 2.2x the 1000-block time
// (near-linear scaling). The program text is generated outside the timer.
// Compiling is single-threaded, so the goals are judged on the thread's CPU
// time, which is what the wall time is on an idle machine; the wall time is
// printed beside it (on a shared machine it includes waiting for a core).
//
//   bazel run //bench:compile_time -- [--repetitions=5] [--blocks=1000]
//   compile_time --profile_blocks=2000   (only compiles, for perf/callgrind)

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "passes/compile.h"
#include "compiler/graph.h"
#include "compiler/program_text.h"
#include "compiler/validate.h"

namespace strata {
namespace bench {
namespace {

constexpr int64_t kBatch = 64;

GenOptions ResMlpOptions(int blocks) {
  GenOptions o;
  o.blocks = blocks;
  return o;
}

struct OpCounts {
  int forward = 0;  // FORWARD and LOSS roles
  int total = 0;
};

absl::StatusOr<OpCounts> CountOps(int blocks) {
  auto plan = CompileGenerated("resmlp", ResMlpOptions(blocks), kBatch);
  if (!plan.ok()) return plan.status();
  OpCounts c;
  for (const Op& op : plan->program().op()) {
    c.total++;
    c.forward += op.role() == FORWARD || op.role() == LOSS;
  }
  return c;
}

// Validates the compiled plan before anything is timed: the forward program
// has 7 ops per block (layer_norm, matmul, add, gelu, matmul, add, residual
// add) plus 6 (embedding matmul+add, head matmul+add, loss, accuracy), and the
// whole plan grows by the same number of ops for every block.
absl::Status Validate(int blocks) {
  auto one = CountOps(1), two = CountOps(2), n = CountOps(blocks);
  if (!one.ok()) return one.status();
  if (!two.ok()) return two.status();
  if (!n.ok()) return n.status();
  const int per_block = two->total - one->total;
  const int want_total = one->total + (blocks - 1) * per_block;
  const int want_forward = 7 * blocks + 6;
  if (n->forward != want_forward || n->total != want_total) {
    return absl::InternalError(absl::StrCat("validation: ", blocks, " blocks compiled to ", n->forward, " forward / ",
                                            n->total, " ops, want ", want_forward, " / ", want_total));
  }
  std::printf("validated %d blocks: %d forward ops, %d ops in the plan (%d per block)\n", blocks, n->forward, n->total,
              per_block);
  return absl::OkStatus();
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct Seconds {
  double cpu = 0;
  double wall = 0;
  double parse_cpu = 0;  // the ParseProgramText share of cpu
  PhaseTimes phases;     // of the median repetition (by CPU time)
};

// One parse and compile of `text`.
absl::StatusOr<Seconds> CompileOnce(const std::string& text) {
  auto t0 = Clock::now();
  const double c0 = ThreadCpuSeconds();
  auto program = ParseProgramText(text, "resmlp.pbtxt");
  if (!program.ok()) return program.status();
  Seconds s;
  s.parse_cpu = ThreadCpuSeconds() - c0;
  CompileOptions options;
  options.batch_size = kBatch;
  auto result = Compile(*program, Strategy(), options);
  if (!result.ok()) return result.status();
  s.cpu = ThreadCpuSeconds() - c0;
  s.wall = SecondsSince(t0);
  s.phases = result->times;
  return s;
}

// Medians over the samples; the phases of the sample nearest the median.
Seconds MedianOf(const std::vector<Seconds>& samples) {
  std::vector<double> cpu, wall, parse_cpu;
  for (const Seconds& s : samples) {
    cpu.push_back(s.cpu);
    wall.push_back(s.wall);
    parse_cpu.push_back(s.parse_cpu);
  }
  const double median = Median(cpu);
  size_t at = 0;
  for (size_t r = 0; r < cpu.size(); ++r) {
    if (std::abs(cpu[r] - median) < std::abs(cpu[at] - median)) at = r;
  }
  return Seconds{median, Median(wall), Median(parse_cpu), samples[at].phases};
}

absl::StatusOr<Seconds> MedianCompileSeconds(int blocks, int repetitions) {
  auto text = GenerateProgram("resmlp", ResMlpOptions(blocks));
  if (!text.ok()) return text.status();
  std::vector<Seconds> samples;
  for (int r = 0; r < repetitions; ++r) {
    auto s = CompileOnce(*text);
    if (!s.ok()) return s.status();
    samples.push_back(*s);
  }
  return MedianOf(samples);
}

// No goal: the same checks over the compiled plan by the verifier that ran
// between passes on the protobuf Program and by the one that now runs
// between passes on the Graph IR (docs/design-notes.md), at both sizes in
// alternating pairs. Building the Graph is outside the timer.
absl::Status CompareVerifiers(int blocks, int repetitions) {
  Program programs[2];
  std::unique_ptr<Graph> graphs[2];
  for (int s = 0; s < 2; ++s) {
    auto plan = CompileGenerated("resmlp", ResMlpOptions(blocks << s), kBatch);
    if (!plan.ok()) return plan.status();
    programs[s] = plan->program();
    auto graph = Graph::FromProgram(programs[s]);
    if (!graph.ok()) return graph.status();
    graphs[s] = *std::move(graph);
    // Validated before timing: both verifiers accept the plan.
    if (auto v = VerifyAndIndexProgram(programs[s]); !v.ok()) return v.status();
    if (auto v = VerifyGraph(*graphs[s]); !v.ok()) return v;
  }
  std::vector<double> seconds[2][2], ratios[2];  // [verifier][size]
  for (int r = 0; r < repetitions; ++r) {
    double t[2][2];
    for (int s = 0; s < 2; ++s) {
      double c0 = ThreadCpuSeconds();
      auto index = VerifyAndIndexProgram(programs[s]);
      t[0][s] = ThreadCpuSeconds() - c0;
      c0 = ThreadCpuSeconds();
      absl::Status ok = VerifyGraph(*graphs[s]);
      t[1][s] = ThreadCpuSeconds() - c0;
      if (!index.ok() || !ok.ok()) return absl::InternalError("a verifier changed its mind");
    }
    for (int v = 0; v < 2; ++v) {
      for (int s = 0; s < 2; ++s) seconds[v][s].push_back(t[v][s]);
      ratios[v].push_back(t[v][1] / t[v][0]);
    }
  }
  const char* names[2] = {"protobuf Program", "Graph IR"};
  std::printf("  verifier alone over the plan (no goal):\n");
  for (int v = 0; v < 2; ++v) {
    std::printf("    %-16s %7.1f ms %7.1f ms  ratio %.2f\n", names[v], Median(seconds[v][0]) * 1e3,
                Median(seconds[v][1]) * 1e3, Median(ratios[v]));
  }
  return absl::OkStatus();
}

absl::Status Run(int blocks, int repetitions) {
  if (auto s = Validate(blocks); !s.ok()) return s;
  if (auto s = Validate(2 * blocks); !s.ok()) return s;
  // The two sizes alternate, so a change in the machine's load between the
  // first and the last repetition falls on both; the ratio is the median of
  // each pair's ratio.
  auto small_text = GenerateProgram("resmlp", ResMlpOptions(blocks));
  if (!small_text.ok()) return small_text.status();
  auto big_text = GenerateProgram("resmlp", ResMlpOptions(2 * blocks));
  if (!big_text.ok()) return big_text.status();
  std::vector<Seconds> smalls, bigs;
  std::vector<double> ratios, wall_ratios;
  for (int r = 0; r < repetitions; ++r) {
    auto a = CompileOnce(*small_text);
    if (!a.ok()) return a.status();
    auto b = CompileOnce(*big_text);
    if (!b.ok()) return b.status();
    smalls.push_back(*a);
    bigs.push_back(*b);
    ratios.push_back(b->cpu / a->cpu);
    wall_ratios.push_back(b->wall / a->wall);
  }
  const Seconds small_median = MedianOf(smalls), big_median = MedianOf(bigs);
  const Seconds* small = &small_median;
  const Seconds* big = &big_median;
  const double ratio = Median(ratios);
  std::printf(
      "compile_time (parse + all passes, median of %d): %d blocks %.3f s CPU (%.3f s wall), "
      "%d blocks %.3f s CPU (%.3f s wall)\n",
      repetitions, blocks, small->cpu, small->wall, 2 * blocks, big->cpu, big->wall);
  std::printf("  of which parsing: %.3f s and %.3f s CPU\n", small->parse_cpu, big->parse_cpu);
  std::printf("  %-16s %9s %9s %6s\n", "phase (wall)", "1x", "2x", "ratio");
  for (const auto& [name, secs] : small->phases.entries()) {
    double secs2 = 0;
    for (const auto& [name2, s2] : big->phases.entries()) {
      if (name2 == name) secs2 = s2;
    }
    std::printf("  %-16s %8.4fs %8.4fs %6.2f\n", name.c_str(), secs, secs2, secs > 0 ? secs2 / secs : 0.0);
  }
  std::printf("  %d blocks under 1 s: %s\n", blocks, small->cpu < 1.0 ? "PASS" : "MISS");
  std::printf("  ratio %d/%d = %.2f CPU (%.2f wall; median of %d alternating pairs), goal < 2.2: %s\n", 2 * blocks,
              blocks, ratio, Median(wall_ratios), repetitions, ratio < 2.2 ? "PASS" : "MISS");
  // The spread of the pairs, so a verdict near the line reads as such: the
  // machine's state moves the ratio more than most code changes do.
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  std::printf("  pair ratios: min %.2f, median %.2f, max %.2f; %d of %d pairs under 2.2\n", sorted.front(), ratio,
              sorted.back(),
              static_cast<int>(std::count_if(sorted.begin(), sorted.end(), [](double r) { return r < 2.2; })),
              repetitions);
  std::printf(
      "RESULT blocks=%d cpu_seconds=%.4f wall_seconds=%.4f blocks2=%d cpu_seconds2=%.4f wall_seconds2=%.4f "
      "ratio=%.3f\n",
      blocks, small->cpu, small->wall, 2 * blocks, big->cpu, big->wall, ratio);
  return CompareVerifiers(blocks, repetitions);
}

}  // namespace
}  // namespace bench
}  // namespace strata

int main(int argc, char** argv) {
  using strata::bench::IntFlag;
  const int64_t repetitions = IntFlag(argc, argv, "repetitions", 5);
  const int64_t blocks = IntFlag(argc, argv, "blocks", 1000);
  if (const int64_t profile_blocks = IntFlag(argc, argv, "profile_blocks", 0); profile_blocks > 0) {
    auto secs = strata::bench::MedianCompileSeconds(static_cast<int>(profile_blocks), static_cast<int>(repetitions));
    if (!secs.ok()) {
      std::fprintf(stderr, "compile_time: %s\n", std::string(secs.status().message()).c_str());
      return 1;
    }
    auto plan = strata::bench::CompileGenerated(
        "resmlp", strata::bench::ResMlpOptions(static_cast<int>(profile_blocks)), strata::bench::kBatch);
    if (plan.ok()) {
      size_t op_bytes = 0, attr_bytes = 0, var_bytes = 0;
      for (const auto& op : plan->program().op()) {
        op_bytes += op.SpaceUsedLong();
        for (const auto& [k, v] : op.attr()) attr_bytes += k.capacity() + v.SpaceUsedLong();
      }
      for (const auto& v : plan->program().var()) var_bytes += v.SpaceUsedLong();
      std::printf("program in memory: %d ops %.1f MB (attrs >= %.1f MB), %d vars %.1f MB, plan %.1f MB\n",
                  plan->program().op_size(), op_bytes / 1e6, attr_bytes / 1e6, plan->program().var_size(),
                  var_bytes / 1e6, plan->SpaceUsedLong() / 1e6);
    }
    std::printf("%lld blocks: %.3f s CPU (parsing %.3f s), %.3f s wall (median of %lld)\n",
                static_cast<long long>(profile_blocks), secs->cpu, secs->parse_cpu, secs->wall,
                static_cast<long long>(repetitions));
    return 0;
  }
  if (repetitions < 1 || blocks < 1 || blocks > 50000) {
    std::fprintf(stderr, "compile_time: --repetitions must be >= 1, --blocks in 1..50000\n");
    return 2;
  }
  absl::Status s = strata::bench::Run(static_cast<int>(blocks), static_cast<int>(repetitions));
  if (!s.ok()) {
    std::fprintf(stderr, "compile_time: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
