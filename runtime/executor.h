#ifndef STRATA_RUNTIME_EXECUTOR_H_
#define STRATA_RUNTIME_EXECUTOR_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/optimizer_math.h"
#include "proto/plan.pb.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/device.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"
#include "runtime/trace.h"

namespace strata {

struct ExecutorOptions {
  uint64_t seed = 0;
  // Where the rank's parameters, state and activations live and its kernels
  // run; its allocator's counters are the rank's measured memory.
  Device* device = GetCpuDevice();
  // The rank's communicators (pipeline transfers, collectives); null on a single device.
  const CommunicatorSet* comms = nullptr;
  double comm_timeout_s = 300;
  // Records every action, op and transfer when set. On a GPU each op's event
  // waits for its kernels, so it shows device time, and the step runs slower.
  Tracer* tracer = nullptr;
  // Capture the steady-state training step as a device graph and replay it
  // (runtime/step_graph.h says when and why not); eager steps otherwise.
  bool cuda_graph = false;
};

struct StepResult {
  bool has_loss = false;  // false on pipeline ranks that do not hold the loss
  double loss = 0;        // mean over the step's micro-batches: the global mean
  std::map<std::string, double> fetches;  // the program's fetch vars, likewise averaged
  // The optimizer update this step ended with (1-based; every step's, but
  // every k-th step's under gradient merge); 0 when it ran none.
  int64_t optimizer_step = 0;
  // With dynamic loss scaling (Program.loss_scale): the scale this step's
  // loss gradient was multiplied by, and whether its update was skipped
  // because a gradient held an inf or nan. has_loss_scale false without.
  bool has_loss_scale = false;
  double loss_scale = 0;
  bool skipped_update = false;
  // The learning rate of the step's optimizer update (the program's
  // lr_schedule at the updates made before it, in double, before the
  // rounding to a parameter's dtype); has_lr false on the steps between
  // updates and without an optimizer.
  bool has_lr = false;
  double lr = 0;
  // With clip_global_norm (Program.grad_sumsq): the L2 norm of every trained
  // gradient of the job this step's update clipped by (before clipping, as
  // torch's clip_grad_norm_ returns it); has_grad_norm false on the steps
  // between updates and without clipping.
  bool has_grad_norm = false;
  double grad_norm = 0;
};

// Whether a step reports fetch `name` as the sum of its parts' values (a sum
// over samples, RankPlan.summed_fetch) rather than their mean.
bool IsSummedFetch(const RankPlan& plan, const std::string& name);

// Runs one rank's plan. Prepare (Create) resolves every op to its kernel and
// every var to a slot, so the per-op loop does no lookups; activations are
// freed at their last use as the memory plan says.
class Executor {
 public:
  static absl::StatusOr<std::unique_ptr<Executor>> Create(const RankPlan& plan, const ExecutorOptions& options);

  // Parameters from (seed, name) alone; optimizer state zero; step 0. The
  // checkpointed vars named in `to_load` are left unset (no draws, no
  // bytes): LoadPersistentState gives them their values next.
  absl::Status InitializeState(const std::set<std::string>& to_load = {});

  // One training step: walks the schedule's actions over this rank's share of
  // the global batch (one tensor per FEED var the program reads, micro-batches
  // of consecutive rows). sample_offset is the global index of its first sample.
  absl::StatusOr<StepResult> TrainStep(const std::map<std::string, Tensor>& feeds, int64_t sample_offset);
  // The same, loading each micro-batch's rows [first_row, first_row + rows)
  // of the step's global batch only when its forward starts, so a schedule
  // holds just the micro-batches in flight. Data-parallel rank d of D reads
  // the d-th slice of every micro-batch: micro-batch m's rows start at
  // (m * D + d) * rows (SampleRow).
  using FeedFn = std::function<absl::StatusOr<std::map<std::string, Tensor>>(int64_t first_row, int64_t rows)>;
  absl::StatusOr<StepResult> TrainStep(const FeedFn& feeds, int64_t sample_offset);
  // With `rows` per micro-batch (the whole-batch overload's split).
  absl::StatusOr<StepResult> TrainStep(const FeedFn& feeds, int64_t sample_offset, int64_t rows);
  // The row of the step's global batch where this rank's micro-batch
  // `micro_batch` of `rows` samples starts.
  int64_t SampleRow(int micro_batch, int64_t rows) const;
  // Whether the optimizer runs at the end of the coming step (every k-th
  // under gradient merge).
  bool UpdateStep() const { return (step_ + 1) % merge_steps_ == 0; }
  // Forward only over one batch of any size, dropout off; nothing is updated.
  // On a pipeline every rank calls it with the same batch.
  // `rows` is the batch's size (a pipeline stage that reads no feed needs it
  // for the shapes it receives); -1 takes it from the feeds.
  absl::StatusOr<StepResult> Evaluate(const std::map<std::string, Tensor>& feeds, int64_t sample_offset,
                                      int64_t rows = -1);
  // Forward only over a run of micro-batches of any sizes, dropout off,
  // nothing updated: micro-batch m has rows[m] rows from global sample
  // first_sample[m], its feeds loaded by load(m) when its forward starts. On
  // a pipeline every rank of a replica calls it with the same micro-batches,
  // and the stages overlap as a schedule's forwards do: a stage goes on to
  // the next micro-batch once the next stage has posted the receive of its
  // sends, holding the sends of no more micro-batches than its training step
  // holds when a forward starts (so it stays inside the plan). One result
  // per micro-batch, with a loss or fetch where this rank computes it.
  struct EvalMicroBatch {
    int64_t first_sample = 0;
    int64_t rows = 0;
  };
  using EvalFeedFn = std::function<absl::StatusOr<std::map<std::string, Tensor>>(int micro_batch)>;
  absl::StatusOr<std::vector<StepResult>> Evaluate(const std::vector<EvalMicroBatch>& micro_batches,
                                                   const EvalFeedFn& load);

  // FEED vars read by the program, with their declared types.
  const std::vector<const Var*>& feeds() const { return feeds_; }
  // Parameters and optimizer state by var name (shared buffers, not copies);
  // never scratch such as micro-batch gradient accumulators.
  std::map<std::string, Tensor> PersistentState() const;
  // The same where the host can read them: the shared buffers on a host
  // device, copies in host memory otherwise (checkpoints, reports).
  absl::StatusOr<std::map<std::string, Tensor>> HostState() const;
  // Replaces parameters/state from a checkpoint; every persistent var must be present with its type.
  // `weights_only` (an evaluation): a var of the compiler's own state (a
  // name with '@': optimizer moments, the loss scale) the checkpoint lacks
  // keeps its initial value, as another optimizer or strategy saved it.
  absl::Status LoadPersistentState(const std::map<std::string, Tensor>& state, bool weights_only = false);
  // The same, taking the tensors no other handle shares on this rank's
  // device as they are (a checkpoint just read: no second copy of the
  // model while it loads); the others are copied.
  absl::Status LoadPersistentState(std::map<std::string, Tensor>&& state, bool weights_only = false);

  // On a pipeline: seconds spent computing, and waiting on transfers (receives
  // not yet arrived, sends not yet taken), since the executor was made.
  double busy_seconds() const { return busy_seconds_; }
  double wait_seconds() const { return wait_seconds_; }

  // Steps taken (under gradient merge, k per optimizer update).
  int64_t step() const { return step_; }
  int merge_steps() const { return merge_steps_; }
  void set_step(int64_t step) { step_ = step; }
  // After a load: the updates the checkpoint's run made up to the step its
  // last update ended (`at_step`), so StepResult.optimizer_step goes on from
  // them under this run's merge k, which may be another (a run resumed at an
  // update's start).
  void set_updates_before(int64_t updates, int64_t at_step) {
    update_base_ = updates;
    update_base_step_ = at_step;
  }
  void set_total_steps(int64_t total) { total_steps_ = total; }
  // Whether this rank's plan holds the optimizer's update count (the
  // lr_schedule op's input); one without it (the loss's stage training no
  // parameter) is told the loaded count, so the rate it reports
  // (StepResult.lr) goes on from the checkpoint's updates. After a load.
  bool counts_updates() const { return update_count_slot_ >= 0; }
  void set_updates_made(int64_t updates) { updates_made_ = updates; }
  Device* device() const { return options_.device; }
  Allocator* allocator() const { return options_.device->allocator(); }
  const RankPlan& plan() const { return plan_; }

  // What --cuda_graph has to say: "" while nothing, else why the step is not
  // captured, or which step was; it changes when the executor decides.
  const std::string& graph_note() const { return graph_note_; }
  // Graphs captured and in use now (one per step shape).
  int graphs() const { return static_cast<int>(graphs_.size()); }
  // The first op of the last training step that wrote a persistent var
  // into a new buffer instead of in place (which a replayed graph could not
  // follow), as a message; "" when none did.
  const std::string& moved_state() const { return moved_state_; }

 private:
  absl::Status LoadState(std::map<std::string, Tensor>& state, bool adopt, bool weights_only);
  struct PreparedOp {
    std::unique_ptr<OpKernel> kernel;
    std::vector<int> input_slots;
    std::vector<const Tensor*> inputs;  // scratch: resolved per call against the micro-batch's scope
    std::vector<int> output_slots;
    std::vector<Tensor> outputs;        // scratch, reused every call
    std::vector<int> frees;             // slots whose last use this op is
    std::vector<int> eval_frees;        // the same in an evaluation (MemoryPlan.eval_frees_after_op)
    int op_index = 0;
    std::string trace_name;             // for the tracer
    const char* trace_category = "op";
    bool is_transfer = false;
  };
  struct Section {
    std::vector<PreparedOp> ops;
    std::vector<int> prefetching;  // indices into ops of kernels that post work early
    std::vector<int64_t> send_channels;  // the channel of each send, in the order they post
  };

  // A captured step: its graph, and the host copies of the loss and fetches
  // it writes (HoldMetrics' tensors as the capture made them).
  struct StepGraph {
    std::unique_ptr<DeviceGraph> graph;
    std::vector<std::pair<int, Tensor>> metrics;
  };
  // Micro-batch m's feeds, checked against the program and the rows.
  using MicroBatchFeeds = std::function<absl::StatusOr<std::map<std::string, Tensor>>(int micro_batch)>;

  Executor(const RankPlan& plan, const ExecutorOptions& options) : plan_(plan), options_(options) {}
  absl::Status Prepare();
  // Checks the feeds against the program; returns their batch rows.
  absl::StatusOr<int64_t> CheckFeeds(const std::map<std::string, Tensor>& feeds) const;
  // Puts each feed into `scope`, copied onto the device where it is not there.
  absl::Status PlaceFeeds(const std::map<std::string, Tensor>& feeds, std::vector<Tensor>& scope);
  // The sends `section` posted in action `action` wait for the end of the
  // action the memory plan releases them at; those due now are waited for.
  absl::Status HoldSends(const Section& section, int action, int micro_batch);
  absl::Status WaitSends(std::vector<std::unique_ptr<Work>>& sends, absl::Status status);
  // "; cuda:0 held N bytes in tensors (peak P this step), the plan predicted
  // a peak of Q bytes for rank R": appended to an op's out-of-memory error.
  // What the device held and what the plan predicted (a step's peak, or
  // with `training` false an evaluation's), for an out-of-memory error.
  std::string OutOfMemoryDetail(bool training) const;
  absl::Status RunSection(Section& section, int micro_batch, const RunContext& run);
  // A training step's work on the device, eager or as a graph (captured or
  // replayed); FinishStep ends it.
  absl::Status RunStep(const MicroBatchFeeds& load, int64_t sample_offset, int64_t rows, bool update);
  // The schedule's actions, each kernel called.
  absl::Status RunActions(const MicroBatchFeeds& load, int64_t sample_offset, int64_t rows, bool update);
  // Captures the step (falling back to RunActions, for good, when that fails) and launches it.
  absl::Status CaptureStep(const MicroBatchFeeds& load, int64_t sample_offset, int64_t rows, bool update);
  absl::Status ReplayStep(StepGraph& graph, const MicroBatchFeeds& load, int64_t sample_offset, int64_t rows);
  // Copies micro-batch `micro_batch`'s feeds into the fixed buffers the
  // graphs read (allocated the first time: page-locked for host feeds).
  absl::Status FillGraphFeeds(int micro_batch, const std::map<std::string, Tensor>& feeds);
  // Every micro-batch's, as `load` gives them.
  absl::Status FillGraphFeeds(const MicroBatchFeeds& load);
  // No graphs from now on, and why; no more votes either.
  void DisableGraphs(const std::string& reason);
  // Where the world must agree (graph_vote_), every rank's verdict given
  // this rank's `why_not` ("" when it can use its graph): "" when every
  // rank can, else this rank's own reason or "rank r cannot capture its
  // step: ...". Alone, `why_not` itself.
  absl::StatusOr<std::string> AgreeOnGraphs(const std::string& why_not);
  // Drops the captured graphs (their buffers' state was replaced); the next
  // step captures again.
  void DropGraphs();
  // Holds micro-batch `micro_batch`'s loss and fetch tensors (host copies
  // on a GPU plan, whose bytes arrive with the step's end synchronisation)
  // until SumMetrics adds them into the result, after that synchronisation.
  void HoldMetrics(int micro_batch);
  void SumMetrics(StepResult* result);
  // Where a feed's tensor goes: the host for a host_memory feed, else the device.
  Device* FeedDevice(const Var& feed) const;
  absl::Status FinishStep(absl::Status status);
  // The end of a replayed step that communicates: no Work watches the
  // graph's transfers and collectives, so instead of blocking in
  // Synchronize the host polls the device, checks the step's transports,
  // and aborts them when one failed or the replay ran out of time, which
  // ends NCCL kernels waiting for a dead or stalled peer.
  absl::Status WaitForReplay();
  // Aborts the step's communicators after a replay failed or ran out of
  // time, and drops the graphs (NCCL's abort returns only once they are
  // gone), each wait bounded; from then on the steps run eagerly.
  void AbortReplay(const absl::Status& why);
  RunContext MakeRunContext(int64_t sample_offset, bool training, int micro_batches, int64_t micro_batch_size);
  // Runs refresh_ where param_copies_stale_ says so (eagerly, outside any
  // captured graph), and queues nothing otherwise.
  absl::Status RefreshParamCopies();
  // Writes each micro-batch's {step, sample_offset} of the coming step (the
  // RunContext's random_counters) on the host; EnqueueRandomCounters copies
  // them to the device (a replayed graph does that copy itself).
  absl::Status WriteRandomCounters(int64_t sample_offset, int64_t rows);
  absl::Status EnqueueRandomCounters();
  // Micro-batch `micro_batch`'s counters on the device.
  const int64_t* RandomCounters(int micro_batch) const;
  // Persistent scalars' values, read to the host (one device sync for all
  // of them where the state is not host-accessible).
  absl::StatusOr<std::vector<double>> ReadStateScalars(const std::vector<int>& slots) const;
  // The loss scale and the skipped-update count as the last step (or the
  // first read) left them, so a step reads them once, at its end, and the
  // next step starts from them without another sync. Cleared wherever the
  // state changes outside TrainStep (initialize, load, a failed step).
  absl::StatusOr<std::pair<double, double>> LossScaleState();

  RankPlan plan_;
  ExecutorOptions options_;
  std::vector<bool> persistent_;                 // by slot: lives outside the micro-batch scopes
  std::vector<bool> checkpointed_;               // by slot: saved and loaded (PARAM, STATE)
  std::vector<Tensor> state_;                    // persistent vars, by slot
  std::vector<std::vector<Tensor>> scopes_;      // activations: one scope per micro-batch, by slot
  std::map<std::string, int> slot_of_;           // prepare time only
  std::vector<const Var*> feeds_;
  std::vector<int> feed_slots_;
  Section forward_, backward_, optimize_;
  // The ops that write PARAM_COPY vars (the optimizer action's casts of the
  // updated weights, passes/hoist_param_casts.h), again, and the REFRESH
  // ops (the casts of the copies the updates write): run before a step
  // or an evaluation whenever the params changed outside the optimizer
  // (initialised, loaded, a failed step) and the copies may be stale.
  Section refresh_;
  bool param_copies_stale_ = true;
  std::vector<bool> in_place_output_;  // by slot: a PARAM_COPY, rewritten in its buffer
  int loss_slot_ = -1;
  int grad_sumsq_slot_ = -1;       // Program.grad_sumsq's (or its host copy's); -1: none
  int loss_scale_slot_ = -1;       // Program.loss_scale's slot, or -1
  int skipped_updates_slot_ = -1;  // Program.skipped_updates's slot, or -1
  // The optimizer's update count (the lr_schedule op's input: "@step"), or
  // -1 where this rank has none; and its value before the coming update,
  // read once after a load and counted since (StepResult.lr).
  int update_count_slot_ = -1;
  // The program's learning-rate schedule (none without an optimizer), for
  // the rate a step reports.
  std::optional<kernel_math::LrSchedule> lr_schedule_;
  std::optional<int64_t> updates_made_;
  std::optional<std::pair<double, double>> loss_scale_state_;  // (scale, skipped updates); see LossScaleState
  std::vector<std::pair<std::string, int>> fetch_slots_;
  // This step's metric tensors: (-1 for the loss, kGradSumsqMetric for the
  // update's Program.grad_sumsq, else an index into fetch_slots_, tensor).
  static constexpr int kGradSumsqMetric = -2;
  std::vector<std::pair<int, Tensor>> held_metrics_;
  // Micro-batches whose sends an evaluation holds when it starts a forward:
  // as many as a training step holds at the start of any of its forwards
  // (often 0: the plan waits a send before the next forward).
  int eval_sends_in_flight_ = 0;
  std::vector<std::unique_ptr<Work>> pending_sends_;  // posted by send kernels during an action
  std::map<int64_t, PendingCollective> pending_buckets_;  // gradient buckets being summed, by id
  int dp_degree_ = 1;
  int dp_rank_ = 0;
  int merge_steps_ = 1;  // gradient merge: steps per optimizer update
  // Posted sends by the action at whose end they are waited for and dropped
  // (their buffers freed), as the plan's send_waits say; the rest at the step's end.
  std::map<int, std::vector<std::unique_ptr<Work>>> held_sends_;
  std::map<std::pair<int64_t, int>, int> send_wait_action_;  // (channel id, micro-batch) -> action
  // RandomCounters' storage: on the host, counters_on_host_ (outside the
  // rank's counted allocator, so its bytes stay the plan's); on a GPU,
  // written into page-locked counters_host_ and copied to counters_device_.
  std::vector<int64_t> counters_on_host_;
  Tensor counters_host_;
  Tensor counters_device_;
  int64_t step_ = 0;
  int64_t total_steps_ = 0;
  int64_t update_base_ = 0, update_base_step_ = 0;  // set_updates_before
  // CUDA graphs (runtime/step_graph.h). Declared after the state they
  // write, so they are destroyed (after their replays end) first.
  std::string graph_blocker_;  // "" while graphs may be used
  // The ranks vote on graphs (runtime/step_graph.h): --cuda_graph on a
  // world of several ranks, until graphs are off on every rank. A rank
  // with graph_blocker_ set from Prepare still votes once, at its first step.
  bool graph_vote_ = false;
  std::string graph_note_;
  std::vector<std::map<std::string, Tensor>> graph_feeds_;  // by micro-batch: the buffers graphs read feeds from
  std::map<bool, StepGraph> graphs_;  // by whether the step runs the optimizer
  std::set<bool> warmed_;             // step shapes run eagerly once
  int64_t graph_rows_ = -1;           // rows per micro-batch the graphs are for
  // The transports the step's communication ops go through; a replay is
  // watched through them (WaitForReplay).
  std::vector<Communicator*> graph_comms_;
  bool launched_graph_ = false;     // this step's work is a graph's launch
  double eager_step_seconds_ = 0;   // the longest eager warm-up step, added to a replay's time limit
  std::string moved_state_;
  double busy_seconds_ = 0;
  double wait_seconds_ = 0;
};

// A scalar tensor's value as a double.
double ScalarValue(const Tensor& t);

}  // namespace strata

#endif  // STRATA_RUNTIME_EXECUTOR_H_
