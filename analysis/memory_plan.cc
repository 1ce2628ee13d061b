#include "analysis/memory_plan.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "proto/roles.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {

namespace {

// Var v's bytes with the batch dimension (-1) taken as `batch`.
int64_t BytesOf(const Graph& graph, int v, int64_t batch) {
  int64_t n = 1;
  for (int64_t d : graph.shape(v)) n *= d == -1 ? batch : d;
  return n * static_cast<int64_t>(DataTypeSize(graph.dtype(v)));
}

// keep[v]: the var is never freed, as the loss and the fetches are reported
// (from their host copies where the host-transfers pass made them).
std::vector<char> KeptVars(const Graph& graph) {
  std::vector<char> keep(graph.num_vars(), 0);
  const auto& host_copy = graph.program_fields().host_copy();
  auto kept = [&](const std::string& name) {
    auto copy = host_copy.find(name);
    if (int v = graph.FindVar(copy != host_copy.end() ? copy->second : name); v >= 0) keep[v] = 1;
  };
  kept(graph.loss());
  for (const auto& f : graph.program_fields().fetch()) kept(f);
  if (!graph.program_fields().grad_sumsq().empty()) kept(graph.program_fields().grad_sumsq());
  return keep;
}

// Per op (by program position): the ids of its outputs and of its first
// input, whether output 0 aliases input 0, whether it is a send or a recv
// (and its channel), and its role.
struct OpInfo {
  int first_output = 0;  // into output_ids
  int num_outputs = 0;
  int input0 = -1;
  bool aliases = false;
  bool eval_aliases = false;  // in an evaluation: dropout passes its input on too
  bool send = false;
  bool recv = false;
  int64_t channel = -1;
  OpRole role = ROLE_UNSPECIFIED;
  int64_t workspace = 0;  // scratch bytes while it runs
};

// What the simulation needs of the graph's ops, found once.
struct OpTable {
  std::vector<OpInfo> info;
  std::vector<int> recv_ops;  // in program order
  std::vector<int> output_ids;
  // Last use of each var, by program position; -1 when no op uses it.
  std::vector<int> last_use;
  // Whether some op reads the var.
  std::vector<char> read;
};

// The scratch bytes op `id` (at program position i) draws while its kernel
// runs, sized for its inputs at `micro_batch_size` samples and `threads`
// threads.
absl::StatusOr<int64_t> WorkspaceBytes(const WorkspaceFn& workspace, const Graph& graph, int id, int i,
                                       int64_t micro_batch_size, int threads) {
  KernelDef def;
  def.op = &graph.AsOp(id);
  for (int v : graph.inputs(id)) {
    TensorType t = graph.type(v);
    for (int64_t& d : t.shape) d = d == -1 ? micro_batch_size : d;
    def.input_types.push_back(std::move(t));
  }
  // Outputs too: a widened kernel's float32 copies of its outputs are scratch.
  for (int v : graph.outputs(id)) {
    TensorType t = graph.type(v);
    for (int64_t& d : t.shape) d = d == -1 ? micro_batch_size : d;
    def.output_types.push_back(std::move(t));
  }
  auto bytes = workspace(def, threads);
  if (!bytes.ok()) {
    return absl::InternalError(absl::StrCat("memory plan: scratch of op #", i, " '", graph.schema(id).type, "': ",
                                            bytes.status().message()));
  }
  return *bytes;
}

// Whether op `id`'s output 0 shares input 0's buffer in the kernels at
// `micro_batch_size` samples: the views (reshape and the like, by schema),
// and two ops that are views only where they change nothing: a sum_to_like
// that sums over no broadcast (every summed dim 1, as a bias gradient at
// one sample; the same element count) and a cast to its own dtype.
bool SharesInputBuffer(const Graph& graph, int id, int64_t micro_batch_size) {
  const OpSchema& schema = graph.schema(id);
  if (graph.inputs(id).empty() || graph.outputs(id).empty()) return false;
  if (schema.output_aliases_input) return true;
  const int x = graph.inputs(id)[0];
  const int y = graph.outputs(id)[0];
  if (schema.type == "sum_to_like") return BytesOf(graph, x, micro_batch_size) == BytesOf(graph, y, micro_batch_size);
  if (schema.type == "cast") return graph.dtype(x) == graph.dtype(y);
  return false;
}

absl::StatusOr<OpTable> DescribeOps(const Graph& graph, int64_t micro_batch_size, int threads,
                                    DeviceKind device_kind) {
  const std::vector<int>& order = graph.ops();
  const int n = static_cast<int>(order.size());
  OpTable table;
  table.info.resize(n);
  table.last_use.assign(graph.num_vars(), -1);
  table.read.assign(graph.num_vars(), 0);
  for (int i = 0; i < n; ++i) {
    const int id = order[i];
    const OpSchema& schema = graph.schema(id);
    OpInfo& o = table.info[i];
    const absl::Span<const int> ins = graph.inputs(id);
    for (int v : ins) {
      table.last_use[v] = i;
      table.read[v] = 1;
    }
    const absl::Span<const int> outs = graph.outputs(id);
    o.first_output = static_cast<int>(table.output_ids.size());
    o.num_outputs = static_cast<int>(outs.size());
    for (int v : outs) {
      table.output_ids.push_back(v);
      if (table.last_use[v] < 0) table.last_use[v] = i;  // produced, maybe never read
    }
    if (!ins.empty()) o.input0 = ins[0];
    // An op told to write output 0 over input 0 (its last reader:
    // softmax_cross_entropy_grad's in_place, passes/in_place_loss_grad).
    const auto in_place = graph.attrs(id).find("in_place");
    o.aliases = SharesInputBuffer(graph, id, micro_batch_size) ||
                (in_place != graph.attrs(id).end() && in_place->second.b());
    // Off training, dropout is the identity and hands on x's buffer (its kernels').
    o.eval_aliases = o.aliases || schema.type == "dropout";
    o.send = schema.type == "send";
    o.recv = schema.type == "recv";
    if (const Channel* c = graph.channel(id)) o.channel = c->id();
    o.role = graph.role(id);
    if (o.recv) table.recv_ops.push_back(i);
    if (const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace(schema.type, device_kind)) {
      auto bytes = WorkspaceBytes(*ws, graph, id, i, micro_batch_size, threads);
      if (!bytes.ok()) return bytes.status();
      o.workspace = *bytes;
    }
  }
  // An op told to write over its input 0 (in_place) must be the last reader
  // of that buffer: of the var and of every view of it (reshape and the
  // other ops whose output 0 shares input 0's buffer, followed from view to
  // view). Checked on the final program, so a pass after
  // in-place-loss-gradient that added a reader after it is caught here.
  std::vector<int> root(graph.num_vars());
  for (int v = 0; v < graph.num_vars(); ++v) root[v] = v;
  std::vector<int> last_read(graph.num_vars(), -1);  // by root: the last op reading the buffer
  for (int i = 0; i < n; ++i) {
    const int id = order[i];
    for (int v : graph.inputs(id)) last_read[root[v]] = i;
    if (SharesInputBuffer(graph, id, micro_batch_size)) root[graph.outputs(id)[0]] = root[graph.inputs(id)[0]];
  }
  for (int i = 0; i < n; ++i) {
    const OpInfo& o = table.info[i];
    if (!o.aliases || SharesInputBuffer(graph, order[i], micro_batch_size)) continue;
    const int buffer = root[o.input0];
    if (const int last = last_read[buffer]; last != i) {
      int reader = -1;  // the var the later op reads: the input itself or a view of it
      for (int v : graph.inputs(order[last])) {
        if (root[v] == buffer) reader = v;
      }
      return absl::InternalError(absl::StrCat(
          "memory plan: op #", i, " '", graph.schema(order[i]).type, "' writes over '", graph.var_name(o.input0),
          "' (in_place), but op #", last, " '", graph.schema(order[last]).type, "' reads ",
          reader == o.input0 ? "it" : absl::StrCat("'", graph.var_name(reader), "', a view of it,"), " after"));
    }
  }
  return table;
}

// frees[i]: the vars freed after the op at position i, their last use,
// sorted by name.
std::vector<std::vector<int>> FreesAfterOps(const Graph& graph, int n, const std::vector<int>& last_use,
                                            const std::vector<char>& keep) {
  std::vector<std::vector<int>> frees(n);
  for (int v = 0; v < graph.num_vars(); ++v) {
    if (last_use[v] < 0) continue;
    if (IsPersistent(graph.kind(v)) || keep[v]) continue;
    frees[last_use[v]].push_back(v);
  }
  for (auto& vars : frees) {
    std::sort(vars.begin(), vars.end(), [&](int a, int b) { return graph.var_name(a) < graph.var_name(b); });
  }
  return frees;
}

// Last use of each var among the ops an evaluation runs (the forward and
// loss ops), by program position; -1 when none of them touches it.
std::vector<int> EvalLastUse(const Graph& graph, const OpTable& ops) {
  std::vector<int> last_use(graph.num_vars(), -1);
  const std::vector<int>& order = graph.ops();
  for (size_t i = 0; i < order.size(); ++i) {
    if (!ActionRuns(Action::FORWARD, ops.info[i].role)) continue;
    for (int v : graph.inputs(order[i])) last_use[v] = static_cast<int>(i);
    for (int v : graph.outputs(order[i])) {
      if (last_use[v] < 0) last_use[v] = static_cast<int>(i);  // produced, maybe never read
    }
  }
  return last_use;
}

void RecordFrees(const Graph& graph, const std::vector<std::vector<int>>& frees,
                 google::protobuf::RepeatedPtrField<MemoryPlan::Frees>* out) {
  out->Reserve(static_cast<int>(frees.size()));
  for (const auto& vars : frees) {
    auto* names = out->Add()->mutable_var();
    names->Reserve(static_cast<int>(vars.size()));
    for (int v : vars) {
      const absl::string_view name = graph.var_name(v);
      names->Add()->assign(name.data(), name.size());
    }
  }
}

// The feeds some op reads in device memory: every forward action allocates
// them (a host feed's copy is its copy_to_device's output).
std::vector<int> ReadFeeds(const Graph& graph, const OpTable& ops) {
  std::vector<int> feeds;
  for (int v = 0; v < graph.num_vars(); ++v) {
    if (graph.kind(v) == FEED && ops.read[v] && !graph.host_memory(v)) feeds.push_back(v);
  }
  return feeds;
}

// Simulates a schedule's activations: buffers per micro-batch, aliases share
// a buffer that lives until its last name dies, and the peak of their bytes.
//
// A sent buffer lives until its receiver takes it: the send holds it (one
// more name on its buffer) until the end of the action send_release names,
// where the executor waits for the send and drops it (a send the map lacks:
// the end of the step); without a map, until the end of the next action.
class ScheduleSimulator {
 public:
  ScheduleSimulator(const Graph& graph, const OpTable& ops, const std::vector<std::vector<int>>& frees,
                    const std::vector<int>& feeds, int64_t micro_batch_size, const SendRelease* send_release,
                    int last_action, MemoryPlan* plan)
      : graph_(graph),
        ops_(ops),
        frees_(frees),
        feeds_(feeds),
        micro_batch_size_(micro_batch_size),
        send_release_(send_release),
        last_action_(last_action),
        plan_(*plan) {}

  // Action `ai`'s allocations and frees, in the order the executor makes them.
  void RunAction(int ai, const Action& action) {
    const int mb = action.kind() == Action::OPTIMIZE ? 0 : action.micro_batch();
    if (action.kind() == Action::FORWARD) {
      for (int v : feeds_) Allocate(mb, v, BytesOf(graph_, v, micro_batch_size_));
    }
    std::vector<int>& mine = Slots(mb);
    PostReceives(action, mb, mine);
    for (size_t i = 0; i < ops_.info.size(); ++i) {
      const OpInfo& o = ops_.info[i];
      if (!ActionRuns(action.kind(), o.role)) continue;
      AllocateOutputs(o, mb, mine);
      // Scratch lives while the kernel runs, on top of its inputs and outputs.
      peak_ = std::max(peak_, live_ + o.workspace);
      if (o.send) HoldSentBuffer(ai, o, mb, mine);
      for (int var : frees_[i]) Release(mb, var);
    }
    ReleaseSentBuffers(ai);
  }

  // Evaluation forward `j` (Executor::Evaluate's): the forward action's
  // allocations and frees (the simulator's frees: the evaluation's), then
  // the rest dropped (the executor clears the scope), its sends held until
  // the end of forward j + sends_in_flight, and the loss and fetches it
  // reports kept (scalars; `keep`, KeptVars).
  void RunEvalForward(int j, int sends_in_flight, const std::vector<char>& keep) {
    Action forward;
    forward.set_kind(Action::FORWARD);
    forward.set_micro_batch(j);
    eval_sends_in_flight_ = sends_in_flight;
    RunAction(j, forward);
    for (int v = 0; v < graph_.num_vars(); ++v) {
      if (!keep[v]) Release(j, v);
    }
  }

  int64_t peak() const { return peak_; }

 private:
  struct Buffer { int64_t bytes; int names; };

  // Micro-batch mb's buffer of every var id, or -1.
  std::vector<int>& Slots(int mb) {
    auto& s = buffer_of_[mb];
    if (s.empty()) s.assign(graph_.num_vars(), -1);
    return s;
  }

  void Release(int mb, int var) {
    int& slot = Slots(mb)[var];
    if (slot < 0) return;
    Buffer& b = buffers_[slot];
    if (--b.names == 0) live_ -= b.bytes;
    slot = -1;
  }

  void Allocate(int mb, int var, int64_t bytes) {
    buffers_.push_back({bytes, 1});
    Slots(mb)[var] = static_cast<int>(buffers_.size()) - 1;
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }

  // An action posts all its receives when it starts (RecvKernel::Prefetch),
  // so their buffers exist from then, not from where each recv op sits.
  void PostReceives(const Action& action, int mb, const std::vector<int>& mine) {
    for (int i : ops_.recv_ops) {
      if (!ActionRuns(action.kind(), ops_.info[i].role)) continue;
      for (int k = 0; k < ops_.info[i].num_outputs; ++k) {
        const int v = ops_.output_ids[ops_.info[i].first_output + k];
        if (!IsPersistent(graph_.kind(v)) && mine[v] < 0) Allocate(mb, v, BytesOf(graph_, v, micro_batch_size_));
      }
    }
  }

  // An op's activations: output 0 of an op that aliases its input 0 shares
  // that buffer; a receive's was allocated when the action started.
  void AllocateOutputs(const OpInfo& o, int mb, std::vector<int>& mine) {
    for (int k = 0; k < o.num_outputs; ++k) {
      const int v = ops_.output_ids[o.first_output + k];
      if (IsPersistent(graph_.kind(v)) || graph_.host_memory(v)) continue;  // host memory is not the device's
      if (o.recv && mine[v] >= 0) continue;  // allocated when the action started
      const bool aliases = eval_sends_in_flight_ >= 0 ? o.eval_aliases : o.aliases;
      if (k == 0 && aliases && o.input0 >= 0) {
        const int src = mine[o.input0];
        if (src >= 0) {
          buffers_[src].names++;
          mine[v] = src;
          continue;
        }
      }
      Allocate(mb, v, BytesOf(graph_, v, micro_batch_size_));
    }
  }

  // Holds the buffer a send (in action ai) reads until its release action,
  // and lists that wait in the plan when there is a send_release map.
  void HoldSentBuffer(int ai, const OpInfo& o, int mb, const std::vector<int>& mine) {
    int release_action = ai + 1;
    if (eval_sends_in_flight_ >= 0) {
      release_action = ai + eval_sends_in_flight_;  // an evaluation's forward ai
    } else if (send_release_ != nullptr) {
      auto it = send_release_->find({o.channel, mb});
      release_action = it != send_release_->end() ? std::max(ai, it->second) : last_action_;
      MemoryPlan::SendWait* wait = plan_.add_send_waits();
      wait->set_channel(o.channel);
      wait->set_micro_batch(mb);
      wait->set_action(release_action);
    }
    if (o.input0 >= 0 && mine[o.input0] >= 0) {
      buffers_[mine[o.input0]].names++;
      release_at_[release_action].push_back(mine[o.input0]);
    }
  }

  // Drops the sends' holds due at the end of action ai.
  void ReleaseSentBuffers(int ai) {
    auto due = release_at_.find(ai);
    if (due != release_at_.end()) {
      for (int buffer : due->second) {
        if (--buffers_[buffer].names == 0) live_ -= buffers_[buffer].bytes;
      }
      release_at_.erase(due);
    }
  }

  const Graph& graph_;
  const OpTable& ops_;
  const std::vector<std::vector<int>>& frees_;
  const std::vector<int>& feeds_;
  const int64_t micro_batch_size_;
  const SendRelease* const send_release_;
  const int last_action_;
  MemoryPlan& plan_;
  std::map<int, std::vector<int>> buffer_of_;  // mb -> var id -> buffer id, or -1 (node-stable)
  std::vector<Buffer> buffers_;
  int64_t live_ = 0, peak_ = 0;
  std::map<int, std::vector<int>> release_at_;  // action index -> buffer ids
  int eval_sends_in_flight_ = -1;               // an evaluation's (RunEvalForward), or -1
};

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const Graph& graph, const Schedule& schedule, int64_t micro_batch_size,
                                      const SendRelease* send_release, int threads, DeviceKind device_kind) {
  if (threads <= 0) threads = IntraOpThreadsAsked();
  MemoryPlan plan;
  const std::vector<char> keep = KeptVars(graph);
  absl::StatusOr<OpTable> ops = DescribeOps(graph, micro_batch_size, threads, device_kind);
  if (!ops.ok()) return ops.status();
  const std::vector<std::vector<int>> frees =
      FreesAfterOps(graph, static_cast<int>(ops->info.size()), ops->last_use, keep);
  RecordFrees(graph, frees, plan.mutable_frees_after_op());
  const std::vector<std::vector<int>> eval_frees =
      FreesAfterOps(graph, static_cast<int>(ops->info.size()), EvalLastUse(graph, *ops), keep);
  RecordFrees(graph, eval_frees, plan.mutable_eval_frees_after_op());

  int64_t param_bytes = 0, copy_bytes = 0, state_bytes = 0;
  for (int v = 0; v < graph.num_vars(); ++v) {
    if (graph.kind(v) == PARAM) param_bytes += BytesOf(graph, v, 0);
    if (graph.kind(v) == PARAM_COPY) copy_bytes += BytesOf(graph, v, 0);
    if (graph.kind(v) == STATE || graph.kind(v) == SCRATCH) state_bytes += BytesOf(graph, v, 0);
  }
  const std::vector<int> feeds = ReadFeeds(graph, *ops);

  ScheduleSimulator simulator(graph, *ops, frees, feeds, micro_batch_size, send_release, schedule.action_size() - 1,
                              &plan);
  for (int ai = 0; ai < schedule.action_size(); ++ai) simulator.RunAction(ai, schedule.action(ai));
  plan.set_param_bytes(param_bytes);
  plan.set_param_copy_bytes(copy_bytes);
  plan.set_state_bytes(state_bytes);
  plan.set_activation_peak_bytes(simulator.peak());
  plan.set_peak_bytes(param_bytes + copy_bytes + state_bytes + simulator.peak());

  // An evaluation: forwards one after another, each holding the sends of as
  // many earlier ones as the training step does; past that many the live
  // set repeats, so that many forwards and one more reach its peak.
  std::vector<int64_t> forward_channels;
  for (const OpInfo& o : ops->info) {
    if (o.send && ActionRuns(Action::FORWARD, o.role)) forward_channels.push_back(o.channel);
  }
  const int in_flight = EvalSendsInFlight(schedule, plan.send_waits(), forward_channels);
  ScheduleSimulator eval(graph, *ops, eval_frees, feeds, micro_batch_size, nullptr, in_flight, &plan);
  for (int j = 0; j <= in_flight; ++j) eval.RunEvalForward(j, in_flight, keep);
  plan.set_eval_peak_bytes(param_bytes + copy_bytes + state_bytes + eval.peak());
  plan.set_planned_batch_size(micro_batch_size * std::max(1, schedule.micro_batches()));
  return plan;
}

}  // namespace strata
