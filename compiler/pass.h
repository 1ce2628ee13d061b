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
  // The dtype the global gradient norm is summed in on every rank: the
  // trainable parameters' dtype, F64 when they mix. DT_INVALID: the pass
  // decides from the parameters it sees (a pass run on its own).
  DataType global_norm_dtype = DT_INVALID;
  // The rank a per-rank pass is producing.
  int rank = 0;

  int num_stages() const { return mesh.AxisSize("pp"); }
  int dp_degree() const { return mesh.AxisSize("dp"); }
  int stage() const { return mesh.Coordinate(rank, "pp"); }
  int dp_rank() const { return mesh.Coordinate(rank, "dp"); }
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

// A program-to-program rewrite. Run returns whether it changed the program.
// The pipeline runs passes on the Graph IR; a pass is written against one
// representation (GraphPass or ProgramPass) and the other Run converts, so
// tests and tools can run any pass on a Program (docs/design-notes.md: the
// passes move onto the Graph one by one).
class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;  // kebab case: "pipeline-split"
  virtual absl::StatusOr<bool> Run(Program& program, const CompileContext& ctx) = 0;
  virtual absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) = 0;
};

// A pass written against the Graph.
class GraphPass : public Pass {
 public:
  using Pass::Run;
  absl::StatusOr<bool> Run(Program& program, const CompileContext& ctx) final;
};

// A pass still written against the Program: on a Graph it converts out and
// back, unless Applies says the pass has nothing to do for this job.
class ProgramPass : public Pass {
 public:
  using Pass::Run;
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) final;
  virtual bool Applies(const CompileContext& ctx) const { return true; }
};

// Runs passes in order with the program verifier after each, and can keep a
// copy of the program after a named pass (--dump_after).
class PassPipeline {
 public:
  template <typename T, typename... Args>
  void AddPass(Args&&... args) {
    passes_.push_back(std::make_unique<T>(std::forward<Args>(args)...));
  }
  void set_dump_after(std::string pass_name) { dump_after_ = std::move(pass_name); }
  const Program* dumped() const { return dumped_valid_ ? &dumped_ : nullptr; }
  std::vector<std::string> PassNames() const;

  // Runs every pass, VerifyGraph after each that changed the graph; with
  // `times`, adds each pass's and the verifier's time.
  absl::Status Run(Graph& graph, const CompileContext& ctx, PhaseTimes* times = nullptr);

 private:
  std::vector<std::unique_ptr<Pass>> passes_;
  std::string dump_after_;
  Program dumped_;
  bool dumped_valid_ = false;
};

}  // namespace strata

#endif  // STRATA_COMPILER_PASS_H_
