#ifndef STRATA_RUNTIME_TRAINER_H_
#define STRATA_RUNTIME_TRAINER_H_

#include <functional>
#include <map>
#include <utility>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/plan.pb.h"
#include "runtime/allocator.h"
#include "runtime/device.h"

namespace strata {

class Communicator;
class CommunicatorSet;

struct TrainOptions {
  std::string data = "synthetic";  // --data
  std::string eval_data;           // --eval_data; empty: no evaluation
  int64_t steps = 0;               // total optimizer steps of the run (--steps); 0: use epochs
  int64_t epochs = 0;              // total epochs (--epochs); 0 with steps 0: one epoch
  uint64_t seed = 0;
  std::string metrics_path;        // --metrics JSONL
  std::string save_dir;            // --save: DIR/step-N folders and DIR/latest (runtime/checkpoint.h)
  int64_t save_every = 0;          // --save_every: also save every N steps (0: only at the end)
  // --eval_every: also evaluate --eval_data after every N-th step (0: after
  // each epoch, or after a --steps run's last step, as without it).
  int64_t eval_every = 0;
  // --eval_only: evaluate eval_data once, after loading load_dir if given,
  // and train nothing (the checkpoint's batch, seed and steps need not be
  // this run's: its weights are what is evaluated).
  bool eval_only = false;
  // Copy every persistent var into TrainReport::final_state (as doubles) at
  // the end, for tests that compare runs' weights. A whole model's state
  // three times over in doubles: GPT-2 124M's weights and Adam moments are
  // 3 GB, so the command line leaves it off.
  bool record_final_state = true;
  int keep_checkpoints = 2;        // --keep_checkpoints: committed step folders kept (0: all)
  std::string load_dir;            // --load: DIR (its latest), DIR/step-N, or a flat format-1 folder
  // Polled at step boundaries: the signal a handler caught (SIGTERM), or 0.
  // When any rank has one, every rank stops after the same step, saves (with
  // save_dir) and returns with TrainReport::stop_signal set to it.
  std::function<int()> stop_signal;
  bool progress = true;            // a progress line on stderr about once a second
  // Said on stderr as "note: ..." lines just before the first step (so an
  // error before it, a bad --eval_data among them, is the run's only line):
  // that the data is the synthetic default, not the user's.
  std::vector<std::string> notes;
  // Rows an evaluation call takes across the data-parallel group; 0: the
  // plan's micro-batch on each replica, the rows its memory plan counts.
  int64_t eval_batch_size = 0;
  // This rank's communicators on several ranks (null on one device), and how
  // long a transfer may wait before the step fails naming its channel.
  const CommunicatorSet* comms = nullptr;
  double comm_timeout_s = 300;
  // Where this rank's step runs. Every byte of it (batches, activations,
  // state) is counted by the device's allocator; ranks run as threads of one
  // process each get their own.
  Device* device = GetCpuDevice();
  std::string trace_path;  // a Chrome trace of this rank's steps (--trace)
  // --cuda_graph: on a device with graphs, capture the steady-state step
  // once and replay it (runtime/step_graph.h); ignored on the host.
  bool cuda_graph = false;
};

struct StepMetrics {
  int64_t step = 0;  // 1-based
  int64_t epoch = 0;
  double loss = 0;
  std::map<std::string, double> fetches;
  double step_ms = 0;
  double samples_per_sec = 0;
  // Under gradient merge: the optimizer update the step ended with (1-based),
  // 0 on the steps between updates; written as "optimizer_step" when > 0.
  int64_t optimizer_step = 0;
  // With dynamic loss scaling: the step's loss scale (written as
  // "loss_scale", exactly) and whether its update was skipped on an inf or
  // nan gradient (written as "skipped_update": true only then).
  bool has_loss_scale = false;
  double loss_scale = 0;
  bool skipped_update = false;
  // The learning rate of the step's optimizer update (written as "lr");
  // has_lr false on the steps between updates.
  bool has_lr = false;
  double lr = 0;
  // The update's gradient norm before clipping (StepResult.grad_norm), with
  // clip_global_norm; has_grad_norm false between updates and without.
  bool has_grad_norm = false;
  double grad_norm = 0;
};

struct EvalMetrics {
  std::string name;  // e.g. "test"
  int64_t step = 0;  // the steps trained before it (the metrics line's "step")
  int64_t epoch = 0;
  double loss = 0;
  double accuracy = -1;  // -1: the program has no accuracy fetch
};

struct TrainReport {
  bool reports_loss = false;  // this rank holds the loss (it wrote the metrics)
  std::vector<StepMetrics> steps;
  std::vector<EvalMetrics> evals;
  int64_t batch_size = 0;
  int64_t steps_per_epoch = 0;
  int64_t measured_peak_bytes = 0;
  int64_t predicted_peak_bytes = 0;
  // The device's reserved bytes at their most (Device::peak_reserved_bytes),
  // reported beside the allocated ones; -1 on the CPU.
  int64_t peak_reserved_bytes = -1;
  double seconds = 0;
  // Persistent vars after training, as doubles (TrainOptions::record_final_state).
  std::map<std::string, std::vector<double>> final_state;
  int stop_signal = 0;            // the signal (on any rank) that ended the run early; 0: it ran to the end
  std::string loaded_from;        // the checkpoint resumed from, e.g. "ckpt/step-20 (latest)"
  std::string last_saved;         // the last step folder saved
  // --cuda_graph: graphs in use at the end, and the executor's last note
  // (why not, or which step was captured); "" when not asked.
  int cuda_graphs = 0;
  std::string cuda_graph_note;
  // The device's kernel fallbacks noted so far (Device::KernelFallbacks).
  std::vector<std::string> kernel_fallbacks;
};

// Whether the program's learning rate decays over the run's steps (a
// cosine without decay_steps), so that a resumed run must have the saving
// run's length.
bool ScheduleSpansRun(const Program& program);

// The step of a checkpoint (its metadata) if a run of `total_steps` steps
// with this global batch and seed may resume from it: the same batch and
// seed (they decide the data order and dropout masks), and steps left to
// run (OutOfRange otherwise). With `schedule_spans_run` (a cosine learning
// rate whose decay_steps is 0: it decays over the run's steps), also the
// same run length as the saving run's, where the checkpoint says it.
absl::StatusOr<int64_t> CheckResumable(const std::map<std::string, std::string>& metadata, int64_t batch,
                                       uint64_t seed, int64_t total_steps, bool schedule_spans_run = false);

// Whether `path` can be written (created if missing, then removed again), so
// that an output (--trace, --metrics) that cannot be written fails before the
// first step; `flag` names it in the error.
absl::Status CheckWritableFile(const std::string& path, const std::string& flag);

// The --metrics lines (DESIGN.md), one JSON object each:
// {"step": 3, "epoch": 1, "loss": 2.1034, <fetches>, "lr": 0.001, "samples_per_sec": 5120.4, "step_ms": 12.5}
// and {"eval": "test", "step": 3, "epoch": 1, "loss": ..., "accuracy": ...}. Numbers carry 10
// significant digits; NaN and the infinities are written as null.
std::string StepMetricsJson(const StepMetrics& m);
std::string EvalMetricsJson(const EvalMetrics& m, int64_t step);

// Every rank sends its (name, value) settings to every other; all refuse,
// FailedPrecondition naming the first setting and rank that differ from
// rank 0's, when any does. Ranks started by hand can be given different
// settings, and training on them would hang or train the wrong model.
absl::Status AgreeOnSettings(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& settings,
                             double timeout_s);

// The data checks every rank of the job makes before its first step (--data
// and --eval_data open, their labels and token ids within the program's
// bounds, one batch at least), made once by a launcher before it starts its
// workers: bad data is then one error, not one per rank.
absl::Status CheckJobData(const std::vector<RankPlan>& plans, const TrainOptions& options);

// Trains one rank's plan on one device: data in (seed, epoch) order, one
// global mini-batch per step, metrics and progress as DESIGN.md says,
// evaluation after each epoch (or at the end of a --steps run), checkpoints.
absl::StatusOr<TrainReport> Train(const RankPlan& plan, const TrainOptions& options);

}  // namespace strata

#endif  // STRATA_RUNTIME_TRAINER_H_
