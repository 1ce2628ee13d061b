#include "passes/compile.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/cost_model.h"
#include "analysis/memory_plan.h"
#include "analysis/sample_forms.h"
#include "analysis/schedule.h"
#include "analysis/verify_schedule.h"
#include "compiler/graph_index.h"
#include "compiler/validate.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "passes/pipeline_builder.h"
#include "passes/placement.h"
#include "passes/recompute.h"
#include "proto/fnv1a.h"
#include "proto/status_macros.h"
#include "proto/utf8.h"

namespace strata {
namespace {


// Compile time and memory grow with micro-batches x stages (schedules, their
// verification, the timeline): 4096 on 8 stages checks in about half a second on 2 cores.
constexpr int64_t kMaxAccumulateSteps = 4096;
// Every rank schedules, and the verifier simulates, each of its micro-batches'
// actions: ranks x micro-batches bounds the compiler's time and memory (2^20:
// about 2 s and 0.4 GB for a small program on 2 cores; 2^24 took 30 s and
// 6.9 GB).
constexpr int64_t kMaxRankMicroBatches = int64_t{1} << 20;
// Steps per update under gradient merge: a bound that keeps step counts far
// from overflow, not a limit anyone should meet.
constexpr int64_t kMaxMergeSteps = int64_t{1} << 20;

absl::Status StrategyError(const std::string& file, const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", field, ": ", why));
}

// Each field 0 (GradScaler's default) or a value the scaling can run with.
absl::Status ValidateLossScaling(const LossScaling& ls, const std::string& file) {
  const double init = ls.init_scale(), growth = ls.growth_factor(), backoff = ls.backoff_factor();
  // At least float32's least normal value, whose reciprocal (the gradients'
  // unscaling factor) float32 still holds.
  if (init != 0 && !(init >= std::numeric_limits<float>::min() && init <= std::numeric_limits<float>::max())) {
    return StrategyError(file, "mixed_precision.loss_scaling.init_scale",
                         absl::StrCat("must be a float32 in [2^-126, its largest] (or 0 for the default 65536), "
                                      "whose reciprocal float32 holds, got ", init));
  }
  if (growth != 0 && !(growth > 1 && std::isfinite(growth))) {
    return StrategyError(file, "mixed_precision.loss_scaling.growth_factor",
                         absl::StrCat("must be a finite value > 1 (or 0 for the default 2), got ", growth));
  }
  if (backoff != 0 && !(backoff > 0 && backoff < 1)) {
    return StrategyError(file, "mixed_precision.loss_scaling.backoff_factor",
                         absl::StrCat("must be in (0, 1) (or 0 for the default 0.5), got ", backoff));
  }
  if (ls.growth_interval() < 0) {
    return StrategyError(file, "mixed_precision.loss_scaling.growth_interval",
                         absl::StrCat("must be >= 1 (or 0 for the default 2000), got ", ls.growth_interval()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateStrategy(const Strategy& strategy, const Program& program, int64_t batch_size,
                              const std::string& file) {
  if (strategy.has_pipeline()) {
    const auto& p = strategy.pipeline();
    if (p.micro_batch_size() <= 0) return StrategyError(file, "pipeline.micro_batch_size", absl::StrCat("must be > 0, got ", p.micro_batch_size()));
    if (p.accumulate_steps() <= 0) return StrategyError(file, "pipeline.accumulate_steps", absl::StrCat("must be > 0, got ", p.accumulate_steps()));
    if (!ScheduleKind_IsValid(p.schedule())) {
      return StrategyError(file, "pipeline.schedule", absl::StrCat("unknown schedule ", static_cast<int>(p.schedule()),
                                                                   "; expected ONE_F_ONE_B or F_THEN_B"));
    }
    if (p.micro_batch_size() > (int64_t{1} << 30)) {
      return StrategyError(file, "pipeline.micro_batch_size", absl::StrCat("absurdly large: ", p.micro_batch_size()));
    }
    if (p.accumulate_steps() > kMaxAccumulateSteps) {
      return StrategyError(file, "pipeline.accumulate_steps",
                           absl::StrCat("must be at most ", kMaxAccumulateSteps, ", got ", p.accumulate_steps(),
                                        " (every micro-batch is an action each rank schedules and the compiler "
                                        "verifies; use a larger micro_batch_size)"));
    }
  }
  int64_t dp = 1;
  if (strategy.has_data_parallel()) {
    const auto& d = strategy.data_parallel();
    if (d.degree() <= 0) return StrategyError(file, "data_parallel.degree", absl::StrCat("must be > 0, got ", d.degree()));
    if (d.degree() > 4096) return StrategyError(file, "data_parallel.degree", absl::StrCat("absurdly large: ", d.degree()));
    if (!(d.bucket_mb() >= 0 && d.bucket_mb() <= 1024)) {
      return StrategyError(file, "data_parallel.bucket_mb",
                           absl::StrCat("must be in (0, 1024] (or 0 for the default 25), got ", d.bucket_mb()));
    }
    dp = d.degree();
  }
  if (strategy.has_gradient_merge()) {
    const int64_t k = strategy.gradient_merge().k_steps();
    if (k <= 0) return StrategyError(file, "gradient_merge.k_steps", absl::StrCat("must be > 0, got ", k));
    if (k > kMaxMergeSteps) {
      return StrategyError(file, "gradient_merge.k_steps", absl::StrCat("must be at most ", kMaxMergeSteps, ", got ", k));
    }
  }
  if (strategy.has_recompute()) {
    GraphIndex index(program);
    for (const auto& c : strategy.recompute().checkpoints()) {
      if (HasControlCharacter(c)) {
        return StrategyError(file, "recompute.checkpoints",
                             absl::StrCat("var '", absl::CHexEscape(c), "' contains a control character"));
      }
      if (index.var(c) == nullptr) return StrategyError(file, "recompute.checkpoints", absl::StrCat("var '", c, "' does not exist in ", program.source_file()));
      if (index.producer(c) < 0) return StrategyError(file, "recompute.checkpoints", absl::StrCat("var '", c, "' is not produced by an op"));
    }
    const auto& names = strategy.recompute().checkpoints();
    if (auto s = CheckRecomputeCheckpoints(program, std::vector<std::string>(names.begin(), names.end())); !s.ok()) {
      return StrategyError(file, "recompute.checkpoints", std::string(s.message()));
    }
  }
  if (strategy.has_mixed_precision()) {
    const DataType dtype = strategy.mixed_precision().dtype();
    if (dtype != BF16 && dtype != F16) {
      return StrategyError(file, "mixed_precision.dtype",
                           absl::StrCat(DataType_IsValid(dtype) ? DataType_Name(dtype) : absl::StrCat(static_cast<int>(dtype)),
                                        " is not a mixed-precision dtype; use BF16 or F16"));
    }
    STRATA_RETURN_IF_ERROR(ValidateLossScaling(strategy.mixed_precision().loss_scaling(), file));
  }
  if (strategy.has_pipeline()) {
    int64_t global = strategy.pipeline().micro_batch_size() * strategy.pipeline().accumulate_steps() * dp;
    if (batch_size != 0 && batch_size != global) {
      return StrategyError(file, "pipeline", absl::StrCat("--batch_size ", batch_size, " must equal micro_batch_size ",
                                                          strategy.pipeline().micro_batch_size(), " x accumulate_steps ",
                                                          strategy.pipeline().accumulate_steps(), " x data-parallel degree ", dp,
                                                          " = ", global, " (or be left out)"));
    }
  } else if (batch_size != 0 && batch_size % dp != 0) {
    return StrategyError(file, "data_parallel.degree", absl::StrCat("--batch_size ", batch_size, " is not divisible by the degree ", dp));
  } else if (batch_size == 0 && kDefaultBatchSize % dp != 0) {
    // The default batch is split as an explicit one is: never rounded down
    // (to 0 replicas' worth past 64).
    return StrategyError(file, "data_parallel.degree",
                         absl::StrCat("the default --batch_size ", kDefaultBatchSize, " is not divisible by the degree ", dp,
                                      "; give --batch_size (a multiple of ", dp, ")"));
  }
  // A split batch combines its parts' losses and gradients: averaged for a
  // loss that is a mean over samples, added up for a sum over them; one
  // device's step for no other loss.
  std::string field, parts;
  if (strategy.has_pipeline() && strategy.pipeline().accumulate_steps() > 1) {
    field = "pipeline.accumulate_steps";
    parts = absl::StrCat(strategy.pipeline().accumulate_steps(), " micro-batches combine their losses and gradients");
  } else if (dp > 1) {
    field = "data_parallel.degree";
    parts = absl::StrCat(dp, " replicas combine their losses and gradients");
  } else if (strategy.gradient_merge().k_steps() > 1 && strategy.gradient_merge().average()) {
    // (Without `average` the merged gradients are summed, as Paddle's
    // avg=False: the user's choice, not one device's step.)
    field = "gradient_merge.k_steps";
    parts = absl::StrCat(strategy.gradient_merge().k_steps(), " merged steps average their gradients");
  }
  if (!field.empty()) {
    absl::StatusOr<LossCombine> combine = LossCombination(program);
    if (!combine.ok()) {
      // (Averaged merged steps suit a mean alone: a sum is refused below.)
      return StrategyError(file, field,
                           absl::StrCat(parts, ", which equals one device's step only for a loss that is a mean ",
                                        field == "gradient_merge.k_steps" ? "" : "or a sum ", "over samples; ",
                                        combine.status().message()));
    }
    if (*combine == LossCombine::kSum && strategy.gradient_merge().k_steps() > 1 &&
        strategy.gradient_merge().average()) {
      // k merged steps of a sum are one step of k times the batch when
      // their gradients add up; averaged, they train another step, silently.
      return StrategyError(file, "gradient_merge.average",
                           absl::StrCat(strategy.gradient_merge().k_steps(),
                                        " merged steps average their gradients, but the loss '", program.loss(),
                                        "' is a sum over the batch's samples, whose merged step adds them up: set "
                                        "average: false"));
    }
  }
  // Micro-batches and replicas also combine the fetches each step reports
  // (each merged step reports its own): means and constants averaged, sums
  // added up (SummedFetches, RankPlan.summed_fetch).
  if (field != "gradient_merge.k_steps" && !field.empty()) {
    if (auto s = CheckFetchesCombine(program); !s.ok()) {
      const std::string who = field == "data_parallel.degree"
                                  ? absl::StrCat(dp, " replicas")
                                  : absl::StrCat(strategy.pipeline().accumulate_steps(), " micro-batches");
      return StrategyError(file, field,
                           absl::StrCat(who, " report each fetch as the mean of their values (a sum over samples as "
                                             "their total), the batch's value only for means and sums; ",
                                        s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDisabledPasses(const Strategy& strategy, DeviceKind device,
                                 const std::vector<std::string>& disabled) {
  const std::vector<std::string> optional = OptionalPassNames(strategy, device);
  for (const std::string& name : disabled) {
    if (std::find(optional.begin(), optional.end(), name) == optional.end()) {
      // A pass that runs here is required; one that does not may run elsewhere.
      const std::vector<std::string> here = CompilePassNames(strategy, device);
      const std::string where = std::find(here.begin(), here.end(), name) == here.end()
                                    ? WherePassRuns(name, strategy, device)
                                    : "";
      // Optional where it runs (a fusion), or required there too.
      Strategy everything = strategy;
      everything.mutable_mixed_precision()->set_dtype(BF16);
      everything.set_allow_tf32(true);
      std::vector<std::string> fusions = OptionalPassNames(everything, DEVICE_CUDA);
      for (std::string& n : OptionalPassNames(everything, DEVICE_CPU)) fusions.push_back(std::move(n));
      const bool fusion = std::find(fusions.begin(), fusions.end(), name) != fusions.end();
      std::string why = where.empty() && std::find(here.begin(), here.end(), name) != here.end() ? "it is required; " : "";
      if (!where.empty()) {
        why = fusion ? absl::StrCat("it runs only with ", where, "; ")
                     : absl::StrCat("it is required where it runs (with ", where, "); ");
      }
      return absl::InvalidArgumentError(absl::StrCat("cannot disable pass '", name, "': ", why,
                                                     "the optional passes here are ",
                                                     optional.empty() ? "none" : absl::StrJoin(optional, ", ")));
    }
  }
  return absl::OkStatus();
}

namespace {

// The layout the ranks share, known once the program-level passes have run.
struct Layout {
  CompileContext ctx;             // mesh, micro-batches, batch size; rank unset
  int64_t micro_batch_size = 0;
  ScheduleKind schedule = ONE_F_ONE_B;
};

// Validates the user's program (reports name its lines) and the strategy
// against it; refuses what is not built yet.
absl::Status ValidateInputs(Program& program, const Strategy& strategy, const CompileOptions& options,
                            const std::string& strategy_file, CompileResult& result) {
  {
    ScopedPhase phase(&result.times, "validate");
    STRATA_RETURN_IF_ERROR(ValidateAndInferProgram(&program));
  }
  result.pass_names = {"validate"};
  if (options.dump_after == "validate") result.dumped = program;
  STRATA_RETURN_IF_ERROR(ValidateStrategy(strategy, program, options.batch_size, strategy_file));
  return CheckDisabledPasses(strategy, options.device_kind, options.disabled_passes);
}

// The validated program as a Graph, through the program-level pipeline
// (placement, autodiff).
absl::StatusOr<std::unique_ptr<Graph>> RunProgramPasses(const Program& program, const Strategy& strategy,
                                                       const CompileOptions& options, const CompileContext& ctx,
                                                       CompileResult& result) {
  std::unique_ptr<Graph> graph;
  {
    ScopedPhase phase(&result.times, "to-graph");
    auto g = Graph::FromProgram(program);
    if (!g.ok()) return absl::InternalError(absl::StrCat("validated program is not a graph: ", g.status().message()));
    graph = *std::move(g);
  }
  // The recompute pass finds its checkpoints by name after the
  // mixed-precision and cast passes, which must leave them in place.
  for (const std::string& checkpoint : strategy.recompute().checkpoints()) graph->Pin(checkpoint);
  std::unique_ptr<PassPipeline> pipeline =
      BuildProgramPipeline(strategy, options.device_kind, options.mixed_precision_fold_losses);
  if (!options.dump_after.empty()) pipeline->set_dump_after(options.dump_after);
  pipeline->set_disabled(options.disabled_passes);
  pipeline->set_times(&result.times);
  if (auto s = pipeline->Run(*graph, ctx); !s.ok()) return s.status();
  for (const auto& n : pipeline->PassNames()) result.pass_names.push_back(n);
  if (pipeline->dumped()) result.dumped = *pipeline->dumped();
  return graph;
}

// The mesh, now that placement has said how many stages the program has
// (without a pipeline section a placed program runs all its stages on one
// device), and the batch sizes.
absl::StatusOr<Layout> MakeLayout(const Graph& graph, const Strategy& strategy, const CompileOptions& options,
                                  const std::string& strategy_file, CompileContext ctx) {
  const bool pipelined = strategy.has_pipeline();
  const int dp = strategy.has_data_parallel() ? static_cast<int>(strategy.data_parallel().degree()) : 1;
  auto mesh = Mesh::Create({{"dp", dp}, {"pp", pipelined ? NumStages(graph) : 1}});
  if (!mesh.ok()) return absl::InvalidArgumentError(absl::StrCat(strategy_file, ": ", mesh.status().message()));
  Layout layout;
  layout.ctx = std::move(ctx);
  layout.ctx.mesh = *std::move(mesh);
  layout.ctx.micro_batches = pipelined ? static_cast<int>(strategy.pipeline().accumulate_steps()) : 1;
  const int64_t world = layout.ctx.mesh.world_size();
  if (world * layout.ctx.micro_batches > kMaxRankMicroBatches) {
    const int stages = layout.ctx.mesh.AxisSize("pp");
    return StrategyError(
        strategy_file, layout.ctx.micro_batches > 1 ? "pipeline.accumulate_steps" : "data_parallel.degree",
        absl::StrCat(layout.ctx.micro_batches, " micro-batch(es) on each of ", world, " ranks (", stages,
                     " stage(s) x data_parallel.degree ", dp, ") make ", world * layout.ctx.micro_batches,
                     " micro-batch schedules to build and verify, more than 2^20; use ",
                     layout.ctx.micro_batches > 1 ? "fewer, larger micro-batches or " : "", "fewer ranks"));
  }
  layout.ctx.merge_steps = std::max<int>(1, static_cast<int>(strategy.gradient_merge().k_steps()));
  layout.micro_batch_size = pipelined ? strategy.pipeline().micro_batch_size()
                                      : (options.batch_size != 0 ? options.batch_size : kDefaultBatchSize) / dp;
  layout.ctx.batch_size = layout.micro_batch_size * layout.ctx.micro_batches * dp;
  // A var's elements at this micro-batch stay within what a shape may hold.
  for (int v = 0; v < graph.num_vars(); ++v) {
    int64_t per_sample = 1;
    bool batched = false;
    for (int64_t d : graph.shape(v)) {
      if (d < 0) {
        batched = true;
      } else if (d > 0) {
        per_sample *= d;
      }
    }
    if (batched && layout.micro_batch_size > kMaxTensorElements / per_sample) {
      return absl::InvalidArgumentError(absl::StrCat(
          graph.program_fields().source_file(), ": var '", graph.var_name(v), "' ", ShapeString(graph.shape(v)),
          " would hold more than 2^40 elements at a micro-batch of ", layout.micro_batch_size,
          "; use a smaller --batch_size or micro_batch_size"));
    }
  }
  // Every rank sums its part of the global gradient norm in one dtype, so
  // their allreduce matches, a rank with no parameters of its own included.
  std::set<DataType> dtypes;
  for (const auto& [param, grad] : graph.program_fields().param_grad()) {
    if (const int v = graph.FindVar(param); v >= 0) dtypes.insert(graph.dtype(v));
  }
  layout.ctx.global_norm_dtype = dtypes.size() == 1 ? *dtypes.begin() : F64;
  layout.ctx.trains = !graph.program_fields().param_grad().empty();
  layout.schedule = pipelined ? strategy.pipeline().schedule() : ONE_F_ONE_B;
  return layout;
}

// Rank `rank`'s plan: the per-rank pipeline (pipeline split, optimizer,
// micro-batch) on `graph`, the rank's place in the mesh, its schedule, and a
// first memory plan (sends released at the step's end).
absl::StatusOr<RankPlan> CompileRank(int rank, Graph& graph, const Layout& layout, const Strategy& strategy,
                                     const CompileOptions& options, const std::string& source_file,
                                     CompileResult& result) {
  const CompileContext& ctx = layout.ctx;
  CompileContext rank_ctx = ctx;
  rank_ctx.rank = rank;
  std::unique_ptr<PassPipeline> per_rank = BuildRankPipeline(strategy, options.device_kind);
  if (!options.dump_after.empty()) per_rank->set_dump_after(options.dump_after);
  per_rank->set_disabled(options.disabled_passes);
  per_rank->set_times(&result.times);
  if (auto s = per_rank->Run(graph, rank_ctx); !s.ok()) return s.status();
  if (rank == 0) {
    for (const auto& n : per_rank->PassNames()) result.pass_names.push_back(n);
    if (per_rank->dumped()) result.dumped = *per_rank->dumped();
  }
  if (per_rank->dumped()) {
    result.dumped_ranks.resize(ctx.mesh.world_size());
    result.dumped_ranks[rank] = *per_rank->dumped();
  }
  if (graph.num_ops() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(source_file, ": stage ", rank_ctx.stage(), " has no ops"));
  }
  RankPlan plan;
  plan.set_rank(rank);
  Topology* topo = plan.mutable_topology();
  topo->set_world_size(ctx.mesh.world_size());
  topo->set_num_stages(ctx.num_stages());
  topo->set_dp_degree(ctx.dp_degree());
  topo->set_rank(rank);
  topo->set_stage(rank_ctx.stage());
  topo->set_dp_rank(rank_ctx.dp_rank());
  *topo->mutable_mesh() = ctx.mesh.ToProto();
  for (int c : ctx.mesh.Coordinates(rank)) topo->add_coordinate(c);
  for (CommGroup& g : ctx.mesh.GroupsOf(rank)) *topo->add_group() = std::move(g);
  *plan.mutable_strategy() = strategy;
  plan.set_device_kind(options.device_kind);
  *plan.mutable_schedule() = BuildSchedule(layout.schedule, ctx.num_stages(), rank_ctx.stage(), ctx.micro_batches);
  plan.mutable_schedule()->set_micro_batch_size(layout.micro_batch_size);
  if (ctx.merge_steps > 1) plan.mutable_schedule()->set_merge_steps(ctx.merge_steps);
  {
    ScopedPhase phase(&result.times, "to-program");
    *plan.mutable_program() = graph.ToProgram();
  }
  {
    ScopedPhase phase(&result.times, "memory-plan");
    auto memory = PlanMemory(graph, plan.schedule(), layout.micro_batch_size, nullptr, 0, options.device_kind);
    if (!memory.ok()) return memory.status();
    *plan.mutable_memory() = std::move(*memory);
  }
  return plan;
}

// Every rank's plan through the per-rank pipeline, and each rank's graph (in
// `rank_graphs`) for the analyses after it. The last rank takes the graph
// itself; earlier ones start from a copy of the program after autodiff.
absl::Status CompileRanks(std::unique_ptr<Graph> graph, const Layout& layout, const Strategy& strategy,
                          const CompileOptions& options, const std::string& source_file, CompileResult& result,
                          std::vector<std::unique_ptr<Graph>>& rank_graphs) {
  const int world = layout.ctx.mesh.world_size();
  std::optional<Program> after_autodiff;
  for (int rank = 0; rank < world; ++rank) {
    std::unique_ptr<Graph> own;
    if (rank + 1 < world) {
      ScopedPhase phase(&result.times, "copy-rank");
      if (!after_autodiff.has_value()) after_autodiff = graph->ToProgram();
      auto copy = Graph::FromProgram(*after_autodiff);
      if (!copy.ok()) return copy.status();
      own = *std::move(copy);
    } else {
      own = std::move(graph);
    }
    STRATA_ASSIGN_OR_RETURN(RankPlan plan, CompileRank(rank, *own, layout, strategy, options, source_file, result));
    result.plans.push_back(std::move(plan));
    rank_graphs.push_back(std::move(own));
  }
  return absl::OkStatus();
}

// Only the loss's stage reports a step's metrics (the trainer's reporter):
// a fetch made on another stage is sent to it each step from the first stage
// that has it (RankPlan.relayed_fetch), in the program's order.
void RelayFetchesOffTheLossStage(const Program& program, std::vector<RankPlan>& plans) {
  std::vector<RankPlan::RelayedFetch> relayed;
  for (const std::string& f : program.fetch()) {
    bool with_loss = false;
    int stage = -1;
    for (const RankPlan& p : plans) {
      const auto& fetch = p.program().fetch();
      if (std::find(fetch.begin(), fetch.end(), f) == fetch.end()) continue;
      if (!p.program().loss().empty()) with_loss = true;
      if (stage < 0 || p.topology().stage() < stage) stage = p.topology().stage();
    }
    if (with_loss || stage < 0) continue;
    RankPlan::RelayedFetch& r = relayed.emplace_back();
    r.set_name(f);
    r.set_stage(stage);
  }
  for (RankPlan& p : plans) *p.mutable_relayed_fetch() = {relayed.begin(), relayed.end()};
}

// The fetch an evaluation reports as its accuracy (RankPlan.accuracy_fetch):
// the program's first fetch an `accuracy` op makes; "" for none.
std::string AccuracyFetch(const Program& program) {
  for (const std::string& f : program.fetch()) {
    for (const Op& op : program.op()) {
      if (op.type() == "accuracy" && op.output_size() > 0 && op.output(0) == f) return f;
    }
  }
  return "";
}

// Verifies the schedules, places every rank's actions in time by the cost
// model's estimate of its work (so an unbalanced placement shows in the
// bubble and in when sent buffers go), and plans memory again with sent
// buffers held until their receivers take them: the executor waits for each
// send at the end of the action the timeline says its receiver takes it by,
// or later where waiting there could hang the ranks.
absl::Status PlaceInTime(const Layout& layout, const CompileOptions& options,
                         const std::vector<std::unique_ptr<Graph>>& rank_graphs, CompileResult& result) {
  const int world = static_cast<int>(result.plans.size());
  Timeline timeline;
  std::vector<std::pair<double, double>> costs;  // per rank: forward, backward
  {
    ScopedPhase phase(&result.times, "verify-schedule");
    if (auto s = VerifySchedules(result.plans); !s.ok()) {
      return absl::InternalError(absl::StrCat("compiled schedules fail verification: ", s.message()));
    }
    for (const auto& graph : rank_graphs) {
      const ActionCosts c = world > 1 ? EstimateActionCosts(*graph, layout.micro_batch_size) : ActionCosts{1, 2};
      costs.push_back({c.forward, c.backward});
    }
    timeline = SimulateTimeline(result.plans, costs);
  }
  std::vector<SendRelease> releases;
  if (world > 1) {
    ScopedPhase phase(&result.times, "send-waits");
    for (size_t r = 0; r < result.plans.size(); ++r) {
      releases.push_back(SendReleaseActions(result.plans, timeline, static_cast<int>(r)));
    }
    STRATA_RETURN_IF_ERROR(DeferDeadlockingSendWaits(result.plans, &releases));
  }
  for (size_t r = 0; r < result.plans.size(); ++r) {
    RankPlan& plan = result.plans[r];
    if (world > 1) {
      ScopedPhase phase(&result.times, "memory-plan");
      auto memory = PlanMemory(*rank_graphs[r], plan.schedule(), layout.micro_batch_size, &releases[r], 0,
                               options.device_kind);
      if (!memory.ok()) return memory.status();
      *plan.mutable_memory() = std::move(*memory);
    }
    plan.mutable_memory()->set_bubble_fraction(timeline.bubble[r]);
    if (world > 1) {
      plan.mutable_memory()->set_forward_cost(costs[r].first);
      plan.mutable_memory()->set_backward_cost(costs[r].second);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CompileResult> Compile(const Program& input, const Strategy& strategy, const CompileOptions& options,
                                      const std::string& strategy_file) {
  CompileResult result;
  // The user's program is validated on an arena (compact, freed at once),
  // then the passes run on the Graph IR, which writes each rank's program
  // into its plan at the end.
  google::protobuf::ArenaOptions arena_options;
  arena_options.start_block_size = 1 << 16;
  arena_options.max_block_size = 1 << 20;
  google::protobuf::Arena arena(arena_options);
  Program& program = *google::protobuf::Arena::CreateMessage<Program>(&arena);
  {
    ScopedPhase phase(&result.times, "copy-in");
    program = input;
  }
  STRATA_RETURN_IF_ERROR(ValidateInputs(program, strategy, options, strategy_file, result));
  CompileContext ctx;
  ctx.strategy = strategy;
  {
    // (ValidateStrategy has refused a loss that combines neither way under a split.)
    absl::StatusOr<LossCombine> combine = LossCombination(program);
    ctx.summed_loss = combine.ok() && *combine == LossCombine::kSum;
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Graph> graph, RunProgramPasses(program, strategy, options, ctx, result));
  STRATA_ASSIGN_OR_RETURN(const Layout layout, MakeLayout(*graph, strategy, options, strategy_file, std::move(ctx)));
  std::vector<std::unique_ptr<Graph>> rank_graphs;
  STRATA_RETURN_IF_ERROR(
      CompileRanks(std::move(graph), layout, strategy, options, program.source_file(), result, rank_graphs));
  RelayFetchesOffTheLossStage(program, result.plans);
  STRATA_RETURN_IF_ERROR(PlaceInTime(layout, options, rank_graphs, result));
  rank_graphs.clear();
  result.batch_size = layout.ctx.batch_size;
  {
    const std::vector<std::string> summed = SummedFetches(program);
    const std::string accuracy = AccuracyFetch(program);
    for (auto& p : result.plans) {
      *p.mutable_summed_fetch() = {summed.begin(), summed.end()};
      p.set_summed_loss(layout.ctx.summed_loss);
      p.set_accuracy_fetch(accuracy);
    }
  }
  // Where the program was read from is not part of what runs: ranks that read
  // the same program from different paths (other machines) must agree.
  for (auto& p : result.plans) p.mutable_program()->clear_source_file();
  {
    ScopedPhase phase(&result.times, "fingerprint");
    std::string fp = FingerprintPlans(result.plans);
    for (auto& p : result.plans) p.set_fingerprint(fp);
  }
  return result;
}

namespace {

// FNV-1a over everything written to it, a buffer at a time, so a plan's
// serialization is hashed without being held in memory.
class Fnv1aOutputStream : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  bool Next(void** data, int* size) override {
    Consume();
    *data = buffer_;
    *size = kSize;
    pending_ = kSize;
    return true;
  }
  void BackUp(int count) override { pending_ -= count; }
  int64_t ByteCount() const override { return consumed_ + pending_; }
  // The hash of all bytes written; call after the CodedOutputStream is gone.
  uint64_t Hash() {
    Consume();
    return hash_;
  }

 private:
  static constexpr int kSize = 1 << 16;
  void Consume() {
    hash_ = Fnv1a64Update(hash_, buffer_, pending_);
    consumed_ += pending_;
    pending_ = 0;
  }
  uint64_t hash_ = kFnv1a64Offset;
  int64_t consumed_ = 0;
  int pending_ = 0;
  char buffer_[kSize];
};

}  // namespace

std::string FingerprintPlans(std::vector<RankPlan>& plans) {
  // Lines cleared in place and put back after: copying large plans to hash
  // them would cost as much as a compile pass.
  std::vector<int32_t> lines;
  for (RankPlan& plan : plans) {
    Program* program = plan.mutable_program();
    for (Var& v : *program->mutable_var()) {
      lines.push_back(v.line());
      v.clear_line();
    }
    for (Op& op : *program->mutable_op()) {
      lines.push_back(op.line());
      op.clear_line();
    }
  }
  uint64_t h = kFnv1a64Offset;
  for (const RankPlan& plan : plans) {
    // Hash the plan as it is; only a plan that already carries a fingerprint
    // is copied to clear it (an empty proto3 string is not serialized).
    RankPlan cleared;
    const RankPlan* p = &plan;
    if (!plan.fingerprint().empty()) {
      cleared = plan;
      cleared.clear_fingerprint();
      p = &cleared;
    }
    auto stream = std::make_unique<Fnv1aOutputStream>();
    {
      google::protobuf::io::CodedOutputStream coded(stream.get());
      coded.SetSerializationDeterministic(true);
      p->SerializeToCodedStream(&coded);
    }
    h = MixKey(h, stream->Hash());  // = Fnv1a64 of the serialized bytes
  }
  size_t next = 0;
  for (RankPlan& plan : plans) {
    Program* program = plan.mutable_program();
    for (Var& v : *program->mutable_var()) v.set_line(lines[next++]);
    for (Op& op : *program->mutable_op()) op.set_line(lines[next++]);
  }
  return absl::StrFormat("%016x", h);
}

}  // namespace strata
