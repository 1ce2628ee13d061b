#include "compiler/compile.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compiler/autodiff.h"
#include "compiler/graph_index.h"
#include "compiler/pass.h"
#include "compiler/validate.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "passes/memory_plan.h"
#include "passes/optimizer.h"
#include "passes/schedule.h"
#include "runtime/philox.h"

namespace strata {
namespace {

class ValidatePass : public Pass {
 public:
  std::string name() const override { return "validate"; }
  absl::StatusOr<bool> Run(Program& program, const CompileContext&) override {
    if (auto s = ValidateAndInferProgram(&program); !s.ok()) return s;
    return true;
  }
};

class AutodiffPass : public Pass {
 public:
  std::string name() const override { return "autodiff"; }
  absl::StatusOr<bool> Run(Program& program, const CompileContext&) override {
    if (auto s = AppendBackward(&program); !s.ok()) return s;
    return true;
  }
};

absl::Status StrategyError(const std::string& file, const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", field, ": ", why));
}

}  // namespace

absl::Status ValidateStrategy(const Strategy& strategy, const Program& program, int64_t batch_size,
                              const std::string& file) {
  int stages = NumStages(program);
  if (strategy.has_pipeline()) {
    const auto& p = strategy.pipeline();
    if (p.micro_batch_size() <= 0) return StrategyError(file, "pipeline.micro_batch_size", absl::StrCat("must be > 0, got ", p.micro_batch_size()));
    if (p.accumulate_steps() <= 0) return StrategyError(file, "pipeline.accumulate_steps", absl::StrCat("must be > 0, got ", p.accumulate_steps()));
    if (p.micro_batch_size() > (int64_t{1} << 30) || p.accumulate_steps() > (int64_t{1} << 20)) {
      return StrategyError(file, "pipeline", "micro_batch_size or accumulate_steps is absurdly large");
    }
  }
  int64_t dp = 1;
  if (strategy.has_data_parallel()) {
    const auto& d = strategy.data_parallel();
    if (d.degree() <= 0) return StrategyError(file, "data_parallel.degree", absl::StrCat("must be > 0, got ", d.degree()));
    if (d.degree() > 4096) return StrategyError(file, "data_parallel.degree", absl::StrCat("absurdly large: ", d.degree()));
    if (d.bucket_mb() < 0) return StrategyError(file, "data_parallel.bucket_mb", absl::StrCat("must be >= 0, got ", d.bucket_mb()));
    dp = d.degree();
  }
  if (strategy.has_gradient_merge() && strategy.gradient_merge().k_steps() <= 0) {
    return StrategyError(file, "gradient_merge.k_steps", absl::StrCat("must be > 0, got ", strategy.gradient_merge().k_steps()));
  }
  if (strategy.has_recompute()) {
    GraphIndex index(program);
    for (const auto& c : strategy.recompute().checkpoints()) {
      if (index.var(c) == nullptr) return StrategyError(file, "recompute.checkpoints", absl::StrCat("var '", c, "' does not exist in ", program.source_file()));
      if (index.producer(c) < 0) return StrategyError(file, "recompute.checkpoints", absl::StrCat("var '", c, "' is not produced by an op"));
    }
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
  }
  if (stages > 1 && !strategy.has_pipeline()) {
    // A placed program without a pipeline section runs all stages on one device.
  }
  return absl::OkStatus();
}

absl::StatusOr<CompileResult> Compile(const Program& input, const Strategy& strategy, const CompileOptions& options,
                                      const std::string& strategy_file) {
  CompileResult result;
  Program program = input;
  CompileContext ctx;
  ctx.strategy = strategy;

  PassPipeline front;
  front.AddPass<ValidatePass>();
  if (!options.dump_after.empty()) front.set_dump_after(options.dump_after);
  if (auto s = front.Run(program, ctx); !s.ok()) return s;
  if (auto s = ValidateStrategy(strategy, program, options.batch_size, strategy_file); !s.ok()) return s;

  const int stages = NumStages(program);
  const int dp = strategy.has_data_parallel() ? static_cast<int>(strategy.data_parallel().degree()) : 1;
  if (strategy.has_pipeline() || dp > 1 || strategy.has_gradient_merge() || strategy.has_recompute()) {
    return absl::UnimplementedError(absl::StrCat(
        strategy_file, ": pipeline, data_parallel, gradient_merge and recompute are not built yet in this version; "
                       "remove the strategy to train on one device"));
  }
  ctx.num_stages = stages;
  ctx.dp_degree = dp;
  ctx.batch_size = options.batch_size != 0 ? options.batch_size : kDefaultBatchSize;

  PassPipeline pipeline;
  pipeline.AddPass<AutodiffPass>();
  pipeline.AddPass<OptimizerPass>();
  if (!options.dump_after.empty()) pipeline.set_dump_after(options.dump_after);
  if (auto s = pipeline.Run(program, ctx); !s.ok()) return s;
  result.pass_names = front.PassNames();
  for (const auto& n : pipeline.PassNames()) result.pass_names.push_back(n);
  if (front.dumped()) result.dumped = *front.dumped();
  if (pipeline.dumped()) result.dumped = *pipeline.dumped();

  // One rank runs every stage.
  RankPlan plan;
  plan.set_rank(0);
  Topology* topo = plan.mutable_topology();
  topo->set_world_size(1);
  topo->set_num_stages(1);
  topo->set_dp_degree(1);
  *plan.mutable_strategy() = strategy;
  *plan.mutable_schedule() = BuildSchedule(ONE_F_ONE_B, 1, 0, 1);
  plan.mutable_schedule()->set_micro_batch_size(ctx.batch_size);
  auto memory = PlanMemory(program, plan.schedule(), ctx.batch_size);
  if (!memory.ok()) return memory.status();
  memory->set_bubble_fraction(0.0);
  *plan.mutable_memory() = *memory;
  *plan.mutable_program() = std::move(program);
  result.plans.push_back(std::move(plan));
  result.batch_size = ctx.batch_size;
  std::string fp = FingerprintPlans(result.plans);
  for (auto& p : result.plans) p.set_fingerprint(fp);
  return result;
}

std::string FingerprintPlans(const std::vector<RankPlan>& plans) {
  uint64_t h = 1469598103934665603ull;
  for (RankPlan p : plans) {
    p.clear_fingerprint();
    std::string bytes;
    {
      google::protobuf::io::StringOutputStream out(&bytes);
      google::protobuf::io::CodedOutputStream coded(&out);
      coded.SetSerializationDeterministic(true);
      p.SerializeToCodedStream(&coded);
    }
    h = MixKey(h, Fnv1a64(bytes));
  }
  return absl::StrFormat("%016x", h);
}

}  // namespace strata
