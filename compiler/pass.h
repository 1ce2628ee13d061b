#ifndef STRATA_COMPILER_PASS_H_
#define STRATA_COMPILER_PASS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/graph.h"
#include "proto/plan.pb.h"
#include "proto/program.pb.h"
#include "proto/mesh.h"
#include "proto/strategy.pb.h"

namespace strata {

// What every pass may read: the strategy and the job's shape.
struct CompileContext {
  Strategy strategy;
  // The layout (axes "dp", "pp"): every rank and stage number comes from it.
  Mesh mesh;
  int64_t batch_size = 0;  // global mini-batch; 0 when not known
  int micro_batches = 1;   // per step, per data-parallel rank
  int merge_steps = 1;     // gradient merge: steps per optimizer update
  // The loss is a sum over the batch's samples (analysis/sample_forms.h): a
  // split batch's parts add their gradients up, where a mean's are averaged
  // (the loss's seed is not scaled by 1/parts).
  bool summed_loss = false;
  // The dtype the global gradient norm is summed in on every rank: the
  // trainable parameters' dtype, F64 when they mix. DT_INVALID: the pass
  // decides from the parameters it sees (a pass run on its own).
  DataType global_norm_dtype = DT_INVALID;
  // Whether the program trains any parameter on some stage (false: every
  // one frozen). A stage training nothing still joins clipping's norm
  // allreduce, but reports the norm only where some stage trains.
  bool trains = true;
  // The rank a per-rank pass is producing.
  int rank = 0;

  int num_stages() const { return mesh.AxisSize("pp"); }
  int dp_degree() const { return mesh.AxisSize("dp"); }
  int stage() const { return mesh.Coordinate(rank, "pp"); }
  int dp_rank() const { return mesh.Coordinate(rank, "dp"); }
  // The id of this rank's communication group along `axis` (Mesh::GroupsOf);
  // 0, the world, where the axis has size 1.
  int GroupAlong(absl::string_view axis) const;
};

// Seconds spent per phase of a compilation ("autodiff", "verify", ...),
// summed over ranks, in first-seen order (bench/compile_time prints it).
class PhaseTimes {
 public:
  void Add(absl::string_view phase, double seconds);
  const std::vector<std::pair<std::string, double>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, double>> entries_;
};

// Adds the wall time from construction to destruction to one phase.
class ScopedPhase {
 public:
  ScopedPhase(PhaseTimes* times, absl::string_view phase);
  ~ScopedPhase();
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimes* times_;
  std::string phase_;
  int64_t start_ns_;
};

// A rewrite of the Graph IR, XLA's HloPassInterface: Run returns whether it
// changed the graph. One signature; tests and tools that hold a Program use
// RunOnProgram.
class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;  // kebab case: "pipeline-split"
  // An optimization the plans are correct without (a fusion): one that
  // CompileOptions.disabled_passes may leave out, as XLA's
  // --xla_disable_hlo_passes does, so a test can compare with and without.
  virtual bool optional() const { return false; }
  virtual absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) = 0;
};

// Runs `pass` on `program` through a Graph, writing the program back when the
// pass changed it.
absl::StatusOr<bool> RunOnProgram(Pass& pass, Program& program, const CompileContext& ctx);
inline absl::StatusOr<bool> RunOnProgram(Pass&& pass, Program& program, const CompileContext& ctx) {
  return RunOnProgram(pass, program, ctx);
}

// Runs passes in order with VerifyGraph after each that changed the graph
// (the invariant checker, XLA's AddInvariantChecker), and can keep a copy of
// the program after a named pass (--dump_after). Itself a pass.
class PassPipeline : public Pass {
 public:
  explicit PassPipeline(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }

  template <typename T, typename... Args>
  T& AddPass(Args&&... args) {
    auto pass = std::make_unique<T>(std::forward<Args>(args)...);
    T& added = *pass;
    passes_.push_back(std::move(pass));
    return added;
  }
  void set_dump_after(std::string pass_name) { dump_after_ = std::move(pass_name); }
  // Optional passes (Pass::optional) with these names are skipped.
  void set_disabled(std::vector<std::string> names) { disabled_ = std::move(names); }
  // Each pass's and the verifier's time is added here.
  void set_times(PhaseTimes* times) { times_ = times; }
  // The program after the dump_after pass, if it ran (in this pipeline or
  // one nested in it).
  const Program* dumped() const;
  // The passes' names, those of nested pipelines in their place; with
  // optional_only, just the optional passes' (Pass::optional).
  std::vector<std::string> PassNames(bool optional_only = false) const;

  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;

 private:
  std::string name_;
  std::vector<std::unique_ptr<Pass>> passes_;
  std::string dump_after_;
  std::vector<std::string> disabled_;
  PhaseTimes* times_ = nullptr;
  Program dumped_;
  bool dumped_valid_ = false;
};

}  // namespace strata

#endif  // STRATA_COMPILER_PASS_H_
