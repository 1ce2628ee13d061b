#include "passes/memory_plan.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "compiler/graph_index.h"
#include "compiler/op_registry.h"
#include "proto/roles.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {


namespace {
int64_t BytesOf(const Var& v, int64_t batch) {
  int64_t n = 1;
  for (int64_t d : v.shape()) n *= d == -1 ? batch : d;
  return n * static_cast<int64_t>(DataTypeSize(v.dtype()));
}

// keep[id]: the var is never freed, as the loss and the fetches are reported.
std::vector<char> KeptVars(const Program& program, const GraphIndex& index) {
  std::vector<char> keep(index.num_ids(), 0);
  if (int id = index.id(program.loss()); id >= 0) keep[id] = 1;
  for (const auto& f : program.fetch()) {
    if (int id = index.id(f); id >= 0) keep[id] = 1;
  }
  return keep;
}

// Per op: the ids of its outputs and of its first input, whether output 0
// aliases input 0, and whether it is a send.
struct OpInfo {
  int first_output = 0;  // into output_ids
  int num_outputs = 0;
  int input0 = -1;
  bool aliases = false;
  bool send = false;
  bool recv = false;
  int64_t workspace = 0;  // scratch bytes while it runs
};

// What the simulation needs of the program's ops, found once.
struct OpTable {
  std::vector<OpInfo> info;
  std::vector<int> recv_ops;  // in program order
  std::vector<int> output_ids;
  // Last use of each non-persistent var, in program order.
  std::vector<int> last_use;
};

// The scratch bytes op #i's kernel draws while it runs, sized for its inputs
// at `micro_batch_size` samples and `threads` threads.
absl::StatusOr<int64_t> WorkspaceBytes(const WorkspaceFn& workspace, const Op& op, int i, const GraphIndex& index,
                                       int64_t micro_batch_size, int threads) {
  const absl::Span<const int> ins = index.input_ids(i);
  KernelDef def;
  def.op = &op;
  for (int k = 0; k < op.input_size(); ++k) {
    const Var* v = index.var(ins[k]);
    if (v == nullptr) {
      return absl::InternalError(absl::StrCat("memory plan: op #", i, " reads undeclared '", op.input(k), "'"));
    }
    TensorType t = TypeOf(*v);
    for (int64_t& d : t.shape) d = d == -1 ? micro_batch_size : d;
    def.input_types.push_back(std::move(t));
  }
  auto bytes = workspace(def, threads);
  if (!bytes.ok()) {
    return absl::InternalError(absl::StrCat("memory plan: scratch of op #", i, " '", op.type(), "': ",
                                            bytes.status().message()));
  }
  return *bytes;
}

absl::StatusOr<OpTable> DescribeOps(const Program& program, const GraphIndex& index, int64_t micro_batch_size,
                                    int threads, DeviceKind device_kind) {
  const int n = program.op_size();
  OpTable table;
  table.info.resize(n);
  table.last_use.assign(index.num_ids(), -1);
  for (int i = 0; i < n; ++i) {
    const Op& op = program.op(i);
    OpInfo& o = table.info[i];
    const absl::Span<const int> ins = index.input_ids(i);
    for (int id : ins) table.last_use[id] = i;
    o.first_output = static_cast<int>(table.output_ids.size());
    o.num_outputs = op.output_size();
    for (int id : index.output_ids(i)) {
      table.output_ids.push_back(id);
      if (table.last_use[id] < 0) table.last_use[id] = i;  // produced, maybe never read
    }
    if (!ins.empty()) o.input0 = ins[0];
    const OpSchema* schema = OpRegistry::Global().Find(op.type());
    o.aliases = schema != nullptr && schema->output_aliases_input;
    o.send = op.type() == "send";
    o.recv = op.type() == "recv";
    if (o.recv) table.recv_ops.push_back(i);
    if (const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace(op.type(), device_kind)) {
      auto bytes = WorkspaceBytes(*ws, op, i, index, micro_batch_size, threads);
      if (!bytes.ok()) return bytes.status();
      o.workspace = *bytes;
    }
  }
  return table;
}

// frees[i]: the ids freed after op i, their last use, sorted by name.
std::vector<std::vector<int>> FreesAfterOps(const GraphIndex& index, int n, const std::vector<int>& last_use,
                                            const std::vector<char>& keep) {
  std::vector<std::vector<int>> frees(n);
  for (int id = 0; id < index.num_ids(); ++id) {
    if (last_use[id] < 0) continue;
    if (!index.declared(id) || IsPersistent(index.kind(id)) || keep[id]) continue;
    frees[last_use[id]].push_back(id);
  }
  for (auto& ids : frees) {
    std::sort(ids.begin(), ids.end(), [&](int a, int b) { return index.name(a) < index.name(b); });
  }
  return frees;
}

void RecordFrees(const GraphIndex& index, const std::vector<std::vector<int>>& frees, MemoryPlan* plan) {
  plan->mutable_frees_after_op()->Reserve(static_cast<int>(frees.size()));
  for (const auto& ids : frees) {
    auto* names = plan->add_frees_after_op()->mutable_var();
    names->Reserve(static_cast<int>(ids.size()));
    for (int id : ids) {
      const absl::string_view name = index.name(id);
      names->Add()->assign(name.data(), name.size());
    }
  }
}

// The feeds some op reads, with their ids: every forward action allocates them.
std::vector<std::pair<int, const Var*>> ReadFeeds(const Program& program, const GraphIndex& index) {
  std::vector<std::pair<int, const Var*>> feeds;
  for (const Var& v : program.var()) {
    if (v.kind() == FEED && !index.consumers(v.name()).empty()) feeds.push_back({index.id(v.name()), &v});
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
  ScheduleSimulator(const Program& program, const GraphIndex& index, const OpTable& ops,
                    const std::vector<std::vector<int>>& frees, const std::vector<std::pair<int, const Var*>>& feeds,
                    int64_t micro_batch_size, const SendRelease* send_release, int last_action, MemoryPlan* plan)
      : program_(program),
        index_(index),
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
      for (const auto& [id, v] : feeds_) Allocate(mb, id, BytesOf(*v, micro_batch_size_));
    }
    std::vector<int>& mine = Slots(mb);
    PostReceives(action, mb, mine);
    for (int i = 0; i < program_.op_size(); ++i) {
      const Op& op = program_.op(i);
      const bool runs = ActionRuns(action.kind(), op.role());
      if (!runs) continue;
      const OpInfo& o = ops_.info[i];
      AllocateOutputs(o, mb, mine);
      // Scratch lives while the kernel runs, on top of its inputs and outputs.
      peak_ = std::max(peak_, live_ + o.workspace);
      if (o.send) HoldSentBuffer(ai, op, o, mb, mine);
      for (int var : frees_[i]) Release(mb, var);
    }
    ReleaseSentBuffers(ai);
  }

  int64_t peak() const { return peak_; }

 private:
  struct Buffer { int64_t bytes; int names; };

  // Micro-batch mb's buffer of every var id, or -1.
  std::vector<int>& Slots(int mb) {
    auto& s = buffer_of_[mb];
    if (s.empty()) s.assign(index_.num_ids(), -1);
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
      if (!ActionRuns(action.kind(), program_.op(i).role())) continue;
      for (int k = 0; k < ops_.info[i].num_outputs; ++k) {
        const int id = ops_.output_ids[ops_.info[i].first_output + k];
        const Var* v = index_.var(id);
        if (v != nullptr && !IsPersistent(*v) && mine[id] < 0) Allocate(mb, id, BytesOf(*v, micro_batch_size_));
      }
    }
  }

  // An op's activations: output 0 of an op that aliases its input 0 shares
  // that buffer; a receive's was allocated when the action started.
  void AllocateOutputs(const OpInfo& o, int mb, std::vector<int>& mine) {
    for (int k = 0; k < o.num_outputs; ++k) {
      const int id = ops_.output_ids[o.first_output + k];
      const Var* v = index_.var(id);
      if (v == nullptr || IsPersistent(*v)) continue;
      if (o.recv && mine[id] >= 0) continue;  // allocated when the action started
      if (k == 0 && o.aliases && o.input0 >= 0) {
        const int src = mine[o.input0];
        if (src >= 0) {
          buffers_[src].names++;
          mine[id] = src;
          continue;
        }
      }
      Allocate(mb, id, BytesOf(*v, micro_batch_size_));
    }
  }

  // Holds the buffer a send (in action ai) reads until its release action,
  // and lists that wait in the plan when there is a send_release map.
  void HoldSentBuffer(int ai, const Op& op, const OpInfo& o, int mb, const std::vector<int>& mine) {
    int release_action = ai + 1;
    if (send_release_ != nullptr) {
      auto it = send_release_->find({op.channel().id(), mb});
      release_action = it != send_release_->end() ? std::max(ai, it->second) : last_action_;
      MemoryPlan::SendWait* wait = plan_.add_send_waits();
      wait->set_channel(op.channel().id());
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

  const Program& program_;
  const GraphIndex& index_;
  const OpTable& ops_;
  const std::vector<std::vector<int>>& frees_;
  const std::vector<std::pair<int, const Var*>>& feeds_;
  const int64_t micro_batch_size_;
  const SendRelease* const send_release_;
  const int last_action_;
  MemoryPlan& plan_;
  std::map<int, std::vector<int>> buffer_of_;  // mb -> var id -> buffer id, or -1 (node-stable)
  std::vector<Buffer> buffers_;
  int64_t live_ = 0, peak_ = 0;
  std::map<int, std::vector<int>> release_at_;  // action index -> buffer ids
};

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const Program& program, const Schedule& schedule, int64_t micro_batch_size,
                                      const SendRelease* send_release, int threads, DeviceKind device_kind) {
  if (threads <= 0) threads = IntraOpThreads();
  MemoryPlan plan;
  // Vars are handled by their dense GraphIndex ids: names are hashed once
  // here, not again for every action of the schedule.
  const GraphIndex index(program);
  const std::vector<char> keep = KeptVars(program, index);
  absl::StatusOr<OpTable> ops = DescribeOps(program, index, micro_batch_size, threads, device_kind);
  if (!ops.ok()) return ops.status();
  const std::vector<std::vector<int>> frees = FreesAfterOps(index, program.op_size(), ops->last_use, keep);
  RecordFrees(index, frees, &plan);

  int64_t param_bytes = 0, state_bytes = 0;
  for (const Var& v : program.var()) {
    if (v.kind() == PARAM) param_bytes += BytesOf(v, 0);
    if (v.kind() == STATE || v.kind() == SCRATCH) state_bytes += BytesOf(v, 0);
  }
  const std::vector<std::pair<int, const Var*>> feeds = ReadFeeds(program, index);

  ScheduleSimulator simulator(program, index, *ops, frees, feeds, micro_batch_size, send_release,
                              schedule.action_size() - 1, &plan);
  for (int ai = 0; ai < schedule.action_size(); ++ai) simulator.RunAction(ai, schedule.action(ai));
  plan.set_param_bytes(param_bytes);
  plan.set_state_bytes(state_bytes);
  plan.set_activation_peak_bytes(simulator.peak());
  plan.set_peak_bytes(param_bytes + state_bytes + simulator.peak());
  plan.set_planned_batch_size(micro_batch_size * std::max(1, schedule.micro_batches()));
  return plan;
}

}  // namespace strata
