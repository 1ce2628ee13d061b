#ifndef STRATA_TESTS_PARITY_UTIL_H_
#define STRATA_TESTS_PARITY_UTIL_H_

// Parity harness: trains a program on one device and under a parallel
// strategy (ranks as threads over an in-memory store and Gloo on loopback),
// and compares per-step losses and final weights.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/plan.pb.h"
#include "proto/program.pb.h"
#include "proto/strategy.pb.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/device.h"
#include "runtime/trainer.h"
#include "tools/model_gen.h"

namespace strata {

struct ParityRun {
  std::vector<double> losses;                              // per step
  std::vector<std::map<std::string, double>> fetches;      // per step, as the step reports them
  std::map<std::string, std::vector<double>> weights;      // parameters after the run
  std::map<std::string, std::vector<double>> initial_weights;  // single device only: before the run
  double eval_loss = 0;                                    // after the run, when options.eval_data is set
  double eval_accuracy = -1;                               // likewise, where the program fetches an accuracy
  std::vector<EvalMetrics> evals;                          // every evaluation, in order (the last is eval_loss's)
  std::map<int, int64_t> measured_peak_bytes;              // per rank
  std::map<int, int64_t> predicted_peak_bytes;             // per rank
  // With dynamic loss scaling: the scale each step used and whether its
  // update was skipped, as the rank with the loss reports them; and each
  // rank's own skip record (every rank must skip the same steps).
  std::vector<double> loss_scales;
  // The learning rate each step's update used, as the rank with the loss
  // reports it (-1 on a step without an update).
  std::vector<double> lrs;
  // Each step's grad_norm as that rank reports it (-1 on a step without an
  // update, or without clipping).
  std::vector<double> grad_norms;
  // Each step's StepResult.optimizer_step as that rank reports it (0 on a
  // step without an update).
  std::vector<int64_t> optimizer_steps;
  std::vector<bool> skipped_updates;
  std::map<int, std::vector<bool>> skipped_updates_by_rank;
};

struct ParityOptions {
  std::string data = "synthetic:classes=10,size=2048";
  int64_t steps = 20;
  uint64_t seed = 1;
  std::string eval_data;  // evaluated at the end of the run (every rank takes part)
  int64_t eval_every = 0;  // and after every N-th step
  bool eval_only = false;  // evaluate once (what load_dir holds, else the initial weights), train nothing
  std::string save_dir;   // checkpoint at the end (and every save_every steps)
  int64_t save_every = 0;
  int keep_checkpoints = 2;
  std::string load_dir;   // resume from a checkpoint
  int64_t batch_size = 0;  // TrainParallel without a pipeline: the global batch (0: the default)
  std::string trace_dir;  // each rank's Chrome trace as TRACE_DIR/rank-R.json
  // Without make_device: the device the plans are compiled for (its passes:
  // DEVICE_CUDA fuses epilogues); they run on the CPU's kernels either way.
  DeviceKind compile_for = DEVICE_CPU;
  // Optional passes to leave out (CompileOptions.disabled_passes).
  std::vector<std::string> disabled_passes;
  // TrainParallel: CompileOptions::mixed_precision_fold_losses (false: the
  // loss reads F32 logits cast up from the LM head's 16-bit output).
  bool mixed_precision_fold_losses = true;
  // TrainParallel on another device: the plans compiled for `device_kind`,
  // rank r training on make_device(r), its communicators staging device
  // tensors through host memory. Unset: each rank on a CpuDevice.
  DeviceKind device_kind = DEVICE_CPU;
  std::function<absl::StatusOr<std::unique_ptr<Device>>(int rank)> make_device;
  // With make_device: the plans (compiled for device_kind) run the CPU's
  // kernels on those devices, whose memory must then be the host's (a
  // FakeAccelerator's), to test the runtime around the kernels.
  bool cpu_kernels = false;
  // Called on each rank's thread with its connected communicators and its
  // device before it trains (device transports over a fake NCCL, in tests).
  std::function<absl::Status(int rank, const RankPlan& plan, Device* device, CommunicatorSet* comms)> connect_device;
};

// The tiny GPT the parity tests train (`strata gen gpt`: 2 blocks, d_model
// 64, 4 heads, 32 tokens, vocab 256 for the license corpus, lr 2e-3).
GenOptions TinyGpt(const std::string& dtype, int stages = 1);

// A generated model's program (strata gen MODEL), parsed.
absl::StatusOr<Program> GenerateModel(const std::string& model, const GenOptions& gen);

// One device, one batch of `batch_size` per step (no strategy).
absl::StatusOr<ParityRun> TrainSingleDevice(const Program& program, int64_t batch_size, const ParityOptions& options);
// Every rank of `strategy` on its own thread.
absl::StatusOr<ParityRun> TrainParallel(const Program& program, const Strategy& strategy, const ParityOptions& options);

// The largest relative difference of per-step losses, and of weights (per
// parameter: max |a - b| / max |b|).
double MaxLossDifference(const ParityRun& a, const ParityRun& b);
double MaxWeightDifference(const std::map<std::string, std::vector<double>>& a,
                           const std::map<std::string, std::vector<double>>& b, std::string* worst = nullptr);
inline double MaxWeightDifference(const ParityRun& a, const ParityRun& b, std::string* worst = nullptr) {
  return MaxWeightDifference(a.weights, b.weights, worst);
}

}  // namespace strata

#endif  // STRATA_TESTS_PARITY_UTIL_H_
