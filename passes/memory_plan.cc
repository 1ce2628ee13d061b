#include "passes/memory_plan.h"

#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/graph_index.h"
#include "proto/roles.h"
#include "compiler/op_registry.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {


namespace {
int64_t BytesOf(const Var& v, int64_t batch) {
  int64_t n = 1;
  for (int64_t d : v.shape()) n *= d == -1 ? batch : d;
  return n * static_cast<int64_t>(DataTypeSize(v.dtype()));
}
}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const Program& program, const Schedule& schedule, int64_t micro_batch_size,
                                      const SendRelease* send_release, int threads, DeviceKind device_kind) {
  if (threads <= 0) threads = IntraOpThreads();
  MemoryPlan plan;
  // Vars are handled by their dense GraphIndex ids: names are hashed once
  // here, not again for every action of the schedule.
  const GraphIndex index(program);
  const int n = program.op_size();
  const int num_ids = index.num_ids();
  std::vector<char> keep(num_ids, 0);
  if (int id = index.id(program.loss()); id >= 0) keep[id] = 1;
  for (const auto& f : program.fetch()) {
    if (int id = index.id(f); id >= 0) keep[id] = 1;
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
  std::vector<OpInfo> info(n);
  std::vector<int> recv_ops;  // in program order
  std::vector<int> output_ids;
  // Last use of each non-persistent var, in program order.
  std::vector<int> last_use(num_ids, -1);
  for (int i = 0; i < n; ++i) {
    const Op& op = program.op(i);
    OpInfo& o = info[i];
    const absl::Span<const int> ins = index.input_ids(i);
    for (int id : ins) last_use[id] = i;
    o.first_output = static_cast<int>(output_ids.size());
    o.num_outputs = op.output_size();
    for (int id : index.output_ids(i)) {
      output_ids.push_back(id);
      if (last_use[id] < 0) last_use[id] = i;  // produced, maybe never read
    }
    if (!ins.empty()) o.input0 = ins[0];
    const OpSchema* schema = OpRegistry::Global().Find(op.type());
    o.aliases = schema != nullptr && schema->output_aliases_input;
    o.send = op.type() == "send";
    o.recv = op.type() == "recv";
    if (o.recv) recv_ops.push_back(i);
    if (const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace(op.type(), device_kind)) {
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
      auto bytes = (*ws)(def, threads);
      if (!bytes.ok()) {
        return absl::InternalError(absl::StrCat("memory plan: scratch of op #", i, " '", op.type(), "': ",
                                                bytes.status().message()));
      }
      o.workspace = *bytes;
    }
  }
  // frees[i]: the ids freed after op i, sorted by name.
  std::vector<std::vector<int>> frees(n);
  for (int id = 0; id < num_ids; ++id) {
    if (last_use[id] < 0) continue;
    if (!index.declared(id) || IsPersistent(index.kind(id)) || keep[id]) continue;
    frees[last_use[id]].push_back(id);
  }
  plan.mutable_frees_after_op()->Reserve(n);
  for (int i = 0; i < n; ++i) {
    auto& ids = frees[i];
    std::sort(ids.begin(), ids.end(), [&](int a, int b) { return index.name(a) < index.name(b); });
    auto* names = plan.add_frees_after_op()->mutable_var();
    names->Reserve(static_cast<int>(ids.size()));
    for (int id : ids) {
      const absl::string_view name = index.name(id);
      names->Add()->assign(name.data(), name.size());
    }
  }

  int64_t param_bytes = 0, state_bytes = 0;
  std::vector<std::pair<int, const Var*>> feeds;  // read feeds, allocated by every forward action
  for (const Var& v : program.var()) {
    if (v.kind() == PARAM) param_bytes += BytesOf(v, 0);
    if (v.kind() == STATE || v.kind() == SCRATCH) state_bytes += BytesOf(v, 0);
    if (v.kind() == FEED && !index.consumers(v.name()).empty()) feeds.push_back({index.id(v.name()), &v});
  }

  // Simulate the schedule: buffers per micro-batch, aliases share a buffer
  // that lives until its last name dies.
  struct Buffer { int64_t bytes; int names; };
  std::map<int, std::vector<int>> buffer_of;  // mb -> var id -> buffer id, or -1 (node-stable)
  auto slots = [&](int mb) -> std::vector<int>& {
    auto& s = buffer_of[mb];
    if (s.empty()) s.assign(num_ids, -1);
    return s;
  };
  std::vector<Buffer> buffers;
  int64_t live = 0, peak = 0;
  auto release = [&](int mb, int var) {
    int& slot = slots(mb)[var];
    if (slot < 0) return;
    Buffer& b = buffers[slot];
    if (--b.names == 0) live -= b.bytes;
    slot = -1;
  };
  auto allocate = [&](int mb, int var, int64_t bytes) {
    buffers.push_back({bytes, 1});
    slots(mb)[var] = static_cast<int>(buffers.size()) - 1;
    live += bytes;
    peak = std::max(peak, live);
  };
  // A sent buffer lives until its receiver takes it: the send holds it (one
  // more name on its buffer) until the end of the action send_release names,
  // where the executor waits for the send and drops it (a send the map lacks:
  // the end of the step); without a map, until the end of the next action.
  std::map<int, std::vector<int>> release_at;  // action index -> buffer ids
  const int last_action = schedule.action_size() - 1;
  for (int ai = 0; ai < schedule.action_size(); ++ai) {
    const Action& action = schedule.action(ai);
    const int mb = action.kind() == Action::OPTIMIZE ? 0 : action.micro_batch();
    if (action.kind() == Action::FORWARD) {
      for (const auto& [id, v] : feeds) allocate(mb, id, BytesOf(*v, micro_batch_size));
    }
    std::vector<int>& mine = slots(mb);
    // An action posts all its receives when it starts (RecvKernel::Prefetch),
    // so their buffers exist from then, not from where each recv op sits.
    for (int i : recv_ops) {
      if (!ActionRuns(action.kind(), program.op(i).role())) continue;
      for (int k = 0; k < info[i].num_outputs; ++k) {
        const int id = output_ids[info[i].first_output + k];
        const Var* v = index.var(id);
        if (v != nullptr && !IsPersistent(*v) && mine[id] < 0) allocate(mb, id, BytesOf(*v, micro_batch_size));
      }
    }
    for (int i = 0; i < n; ++i) {
      const Op& op = program.op(i);
      const bool runs = ActionRuns(action.kind(), op.role());
      if (!runs) continue;
      const OpInfo& o = info[i];
      for (int k = 0; k < o.num_outputs; ++k) {
        const int id = output_ids[o.first_output + k];
        const Var* v = index.var(id);
        if (v == nullptr || IsPersistent(*v)) continue;
        if (o.recv && mine[id] >= 0) continue;  // allocated when the action started
        if (k == 0 && o.aliases && o.input0 >= 0) {
          const int src = mine[o.input0];
          if (src >= 0) {
            buffers[src].names++;
            mine[id] = src;
            continue;
          }
        }
        allocate(mb, id, BytesOf(*v, micro_batch_size));
      }
      // Scratch lives while the kernel runs, on top of its inputs and outputs.
      peak = std::max(peak, live + o.workspace);
      if (o.send) {
        int release_action = ai + 1;
        if (send_release != nullptr) {
          auto it = send_release->find({op.channel().id(), mb});
          release_action = it != send_release->end() ? std::max(ai, it->second) : last_action;
          MemoryPlan::SendWait* wait = plan.add_send_waits();
          wait->set_channel(op.channel().id());
          wait->set_micro_batch(mb);
          wait->set_action(release_action);
        }
        if (o.input0 >= 0 && mine[o.input0] >= 0) {
          buffers[mine[o.input0]].names++;
          release_at[release_action].push_back(mine[o.input0]);
        }
      }
      for (int var : frees[i]) release(mb, var);
    }
    auto due = release_at.find(ai);
    if (due != release_at.end()) {
      for (int buffer : due->second) {
        if (--buffers[buffer].names == 0) live -= buffers[buffer].bytes;
      }
      release_at.erase(due);
    }
  }
  plan.set_param_bytes(param_bytes);
  plan.set_state_bytes(state_bytes);
  plan.set_activation_peak_bytes(peak);
  plan.set_peak_bytes(param_bytes + state_bytes + peak);
  plan.set_planned_batch_size(micro_batch_size * std::max(1, schedule.micro_batches()));
  return plan;
}

}  // namespace strata
