#ifndef STRATA_RUNTIME_EXECUTOR_H_
#define STRATA_RUNTIME_EXECUTOR_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/plan.pb.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {

struct ExecutorOptions {
  std::string device = "cpu";
  uint64_t seed = 0;
  Allocator* allocator = GetCpuAllocator();
};

struct StepResult {
  double loss = 0;
  std::map<std::string, double> fetches;  // the program's fetch vars
};

// Runs one rank's plan. Prepare (Create) resolves every op to its kernel and
// every var to a slot, so the per-op loop does no lookups; activations are
// freed at their last use as the memory plan says.
class Executor {
 public:
  static absl::StatusOr<std::unique_ptr<Executor>> Create(const RankPlan& plan, const ExecutorOptions& options);

  // Parameters from (seed, name) alone; optimizer state zero; step 0.
  absl::Status InitializeState();

  // One training step over a whole batch (one tensor per FEED var the program
  // reads). sample_offset is the global index of the batch's first sample.
  absl::StatusOr<StepResult> TrainStep(const std::map<std::string, Tensor>& feeds, int64_t sample_offset);
  // Forward only, dropout off; nothing is updated.
  absl::StatusOr<StepResult> Evaluate(const std::map<std::string, Tensor>& feeds, int64_t sample_offset);

  // FEED vars read by the program, with their declared types.
  const std::vector<const Var*>& feeds() const { return feeds_; }
  // Parameters and optimizer state by var name (shared buffers, not copies).
  std::map<std::string, Tensor> PersistentState() const;
  // Replaces parameters/state from a checkpoint; every persistent var must be present with its type.
  absl::Status LoadPersistentState(const std::map<std::string, Tensor>& state);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  void set_total_steps(int64_t total) { total_steps_ = total; }
  Allocator* allocator() const { return options_.allocator; }
  const RankPlan& plan() const { return plan_; }

 private:
  struct PreparedOp {
    std::unique_ptr<OpKernel> kernel;
    std::vector<const Tensor*> inputs;  // point into slots_
    std::vector<int> output_slots;
    std::vector<Tensor> outputs;        // scratch, reused every call
    std::vector<int> frees;             // slots whose last use this op is
    int op_index = 0;
  };
  enum class Section { kForward, kBackward, kOptimize };

  Executor(const RankPlan& plan, const ExecutorOptions& options) : plan_(plan), options_(options) {}
  absl::Status Prepare();
  absl::Status BindFeeds(const std::map<std::string, Tensor>& feeds);
  absl::Status RunSection(Section section, const RunContext& run);
  absl::StatusOr<StepResult> Collect();
  void ClearActivations();

  RankPlan plan_;
  ExecutorOptions options_;
  std::vector<Tensor> slots_;               // one per var
  std::vector<bool> persistent_;            // by slot
  std::map<std::string, int> slot_of_;      // prepare time only
  std::vector<const Var*> feeds_;
  std::vector<PreparedOp> forward_, backward_, optimize_;
  int loss_slot_ = -1;
  std::vector<std::pair<std::string, int>> fetch_slots_;
  int64_t step_ = 0;
  int64_t total_steps_ = 0;
};

// A scalar tensor's value as a double.
double ScalarValue(const Tensor& t);

}  // namespace strata

#endif  // STRATA_RUNTIME_EXECUTOR_H_
