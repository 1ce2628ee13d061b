#include "passes/memory_plan.h"

#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/graph_index.h"
#include "proto/roles.h"
#include "compiler/op_registry.h"

namespace strata {


namespace {
int64_t BytesOf(const Var& v, int64_t batch) {
  int64_t n = 1;
  for (int64_t d : v.shape()) n *= d == -1 ? batch : d;
  return n * static_cast<int64_t>(DataTypeSize(v.dtype()));
}
}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const Program& program, const Schedule& schedule, int64_t micro_batch_size,
                                      const SendRelease* send_release) {
  MemoryPlan plan;
  GraphIndex index(program);
  const int n = program.op_size();
  absl::flat_hash_set<std::string> keep = {program.loss()};
  for (const auto& f : program.fetch()) keep.insert(f);

  // Last use of each non-persistent var, in program order.
  absl::flat_hash_map<std::string, int> last_use;
  for (int i = 0; i < n; ++i) {
    const Op& op = program.op(i);
    for (const auto& in : op.input()) last_use[in] = i;
    for (const auto& out : op.output()) {
      if (!last_use.count(out)) last_use[out] = i;  // produced, maybe never read
    }
  }
  plan.mutable_frees_after_op()->Reserve(n);
  for (int i = 0; i < n; ++i) plan.add_frees_after_op();
  for (const auto& [var, op_index] : last_use) {
    const Var* v = index.var(var);
    if (v == nullptr || IsPersistent(*v) || keep.count(var)) continue;
    plan.mutable_frees_after_op(op_index)->add_var(var);
  }
  for (auto& frees : *plan.mutable_frees_after_op()) {
    std::sort(frees.mutable_var()->begin(), frees.mutable_var()->end());
  }

  int64_t param_bytes = 0, state_bytes = 0;
  for (const Var& v : program.var()) {
    if (v.kind() == PARAM) param_bytes += BytesOf(v, 0);
    if (v.kind() == STATE) state_bytes += BytesOf(v, 0);
  }

  // Simulate the schedule: buffers per micro-batch, aliases share a buffer
  // that lives until its last name dies.
  struct Buffer { int64_t bytes; int names; };
  std::map<std::pair<int, std::string>, int> buffer_of;  // (mb, var) -> buffer id
  std::vector<Buffer> buffers;
  int64_t live = 0, peak = 0;
  auto release = [&](int mb, const std::string& var) {
    auto it = buffer_of.find({mb, var});
    if (it == buffer_of.end()) return;
    Buffer& b = buffers[it->second];
    if (--b.names == 0) live -= b.bytes;
    buffer_of.erase(it);
  };
  auto allocate = [&](int mb, const std::string& var, int64_t bytes) {
    buffers.push_back({bytes, 1});
    buffer_of[{mb, var}] = static_cast<int>(buffers.size()) - 1;
    live += bytes;
    peak = std::max(peak, live);
  };
  // A sent buffer lives until its receiver takes it: released at the end of
  // the action send_release names, or of the next one.
  std::map<int, std::vector<std::pair<int, std::string>>> release_at;  // action index -> (mb, var)
  for (int ai = 0; ai < schedule.action_size(); ++ai) {
    const Action& action = schedule.action(ai);
    const int mb = action.kind() == Action::OPTIMIZE ? 0 : action.micro_batch();
    if (action.kind() == Action::FORWARD) {
      for (const Var& v : program.var()) {
        if (v.kind() == FEED && !index.consumers(v.name()).empty()) allocate(mb, v.name(), BytesOf(v, micro_batch_size));
      }
    }
    for (int i = 0; i < n; ++i) {
      const Op& op = program.op(i);
      const bool runs = ActionRuns(action.kind(), op.role());
      if (!runs) continue;
      const OpSchema* schema = OpRegistry::Global().Find(op.type());
      for (int k = 0; k < op.output_size(); ++k) {
        const Var* v = index.var(op.output(k));
        if (v == nullptr || IsPersistent(*v)) continue;
        if (k == 0 && schema != nullptr && schema->output_aliases_input) {
          auto src = buffer_of.find({mb, op.input(0)});
          if (src != buffer_of.end()) {
            buffers[src->second].names++;
            buffer_of[{mb, op.output(0)}] = src->second;
            continue;
          }
        }
        allocate(mb, op.output(k), BytesOf(*v, micro_batch_size));
      }
      int release_action = -1;
      if (op.type() == "send") {
        release_action = ai + 1;
        if (send_release != nullptr) {
          auto it = send_release->find({op.channel().id(), mb});
          if (it != send_release->end()) release_action = std::max(ai, it->second);
        }
      }
      for (const auto& var : plan.frees_after_op(i).var()) {
        if (release_action >= 0) {
          release_at[release_action].push_back({mb, var});
        } else {
          release(mb, var);
        }
      }
    }
    auto due = release_at.find(ai);
    if (due != release_at.end()) {
      for (const auto& [m, var] : due->second) release(m, var);
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
