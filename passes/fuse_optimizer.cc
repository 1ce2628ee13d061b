#include "passes/fuse_optimizer.h"

#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "passes/pass_helpers.h"

namespace strata {
namespace {

// A fusable update op type: its multi op, how many states it keeps
// (inputs 2.. and outputs 1..) and how many scalars follow them.
struct UpdateKind {
  const char* multi;
  int states;
  int scalars;
};

const UpdateKind* KindOf(const std::string& type) {
  static const std::map<std::string, UpdateKind>* kinds = new std::map<std::string, UpdateKind>{
      {"sgd_update", {"sgd_update_multi", 0, 1}},
      {"momentum_update", {"momentum_update_multi", 1, 1}},
      {"adam_update", {"adam_update_multi", 2, 2}},
  };
  auto it = kinds->find(type);
  return it == kinds->end() ? nullptr : &it->second;
}

// What the members of a group agree on: the type, the attrs, the scalar
// inputs (lr, step, grad_scale, found_inf) by var, the param dtype, the place.
std::string GroupKey(const Graph& graph, int op, const UpdateKind& kind) {
  std::string key = graph.schema(op).type;
  std::map<std::string, std::string> attrs;  // sorted: the map's order is not
  for (const auto& [name, value] : graph.attrs(op)) attrs[name] = value.SerializeAsString();
  for (const auto& [name, value] : attrs) absl::StrAppend(&key, "|", name, "=", value);
  const absl::Span<const int> in = graph.inputs(op);
  for (size_t k = 2 + kind.states; k < in.size(); ++k) absl::StrAppend(&key, "|in", in[k]);
  // The param's, the grad's and every state's dtype: one kernel, picked by one dtype, runs the group.
  for (int k = 0; k < 2 + kind.states; ++k) absl::StrAppend(&key, "|dtype", graph.dtype(in[k]));
  absl::StrAppend(&key, "|stage", graph.stage(op), "|role", graph.role(op), "|", graph.device(op));
  return key;
}

// The shape every update op of the optimizer pass has: param, grad, the
// states, the scalars (with attr grad_scale, clipping's coefficient too),
// maybe found_inf; param and states written back to themselves, then with
// attr copy_dtype the copy.
bool WellFormed(const Graph& graph, int op, const UpdateKind& kind) {
  const absl::Span<const int> in = graph.inputs(op), out = graph.outputs(op);
  auto scaled = graph.attrs(op).find("grad_scale");
  const size_t fixed = 2 + kind.states + kind.scalars + (scaled != graph.attrs(op).end() && scaled->second.b() ? 1 : 0);
  const size_t outputs = 1 + kind.states + (WritesParamCopy(graph, op) ? 1 : 0);
  if ((in.size() != fixed && in.size() != fixed + 1) || out.size() != outputs) return false;
  if (out[0] != in[0]) return false;
  for (int k = 0; k < kind.states; ++k) {
    if (out[1 + k] != in[2 + k]) return false;
  }
  return true;
}

struct Group {
  const UpdateKind* kind = nullptr;
  std::vector<int> members;
  absl::flat_hash_set<int> read, written;
};

bool ReadsAny(const Graph& graph, int op, const absl::flat_hash_set<int>& vars) {
  for (int v : graph.inputs(op)) {
    if (vars.contains(v)) return true;
  }
  return false;
}

bool WritesAny(const Graph& graph, int op, const absl::flat_hash_set<int>& vars) {
  for (int v : graph.outputs(op)) {
    if (vars.contains(v)) return true;
  }
  return false;
}

// Whether op `op` must see the group's members before it run, and so must
// not run between them and their fused op (which runs at the last member).
bool Conflicts(const Graph& graph, int op, const Group& g) {
  return ReadsAny(graph, op, g.written) || WritesAny(graph, op, g.written) || WritesAny(graph, op, g.read);
}

void Add(const Graph& graph, int op, Group& g) {
  g.members.push_back(op);
  for (int v : graph.inputs(op)) g.read.insert(v);
  for (int v : graph.outputs(op)) g.written.insert(v);
}

// The multi op of a group, placed like its last member.
absl::StatusOr<Op> MultiOp(const Graph& graph, const Group& g) {
  const int last = g.members.back();
  const int n = static_cast<int>(g.members.size());
  const UpdateKind& kind = *g.kind;
  Op multi = OpPlacedLike(graph, last, kind.multi, graph.role(last));
  for (int k = 0; k < 2 + kind.states; ++k) {
    for (int m : g.members) multi.add_input(std::string(graph.var_name(graph.inputs(m)[k])));
  }
  const absl::Span<const int> in = graph.inputs(last);
  for (size_t k = 2 + kind.states; k < in.size(); ++k) multi.add_input(std::string(graph.var_name(in[k])));
  // param[n], each state [n], and (the members agree on attr copy_dtype) the copies [n].
  const int outputs = 1 + kind.states + (WritesParamCopy(graph, last) ? 1 : 0);
  for (int k = 0; k < outputs; ++k) {
    for (int m : g.members) multi.add_output(std::string(graph.var_name(graph.outputs(m)[k])));
  }
  for (const auto& [name, value] : graph.attrs(last)) (*multi.mutable_attr())[name] = value;
  (*multi.mutable_attr())["n"] = IntAttr(n);
  if (auto s = CanonicalizeOp(*OpRegistry::Global().Find(kind.multi), &multi); !s.ok()) {
    return absl::InternalError(absl::StrCat("fuse-optimizer: ", kind.multi, ": ", s.message()));
  }
  return multi;
}

}  // namespace

absl::StatusOr<bool> FuseOptimizerPass::Run(Graph& graph, const CompileContext&) {
  std::vector<Group> done;
  std::map<std::string, Group> open;
  const auto close = [&](std::map<std::string, Group>::iterator it) {
    if (it->second.members.size() > 1) done.push_back(std::move(it->second));
    return open.erase(it);
  };
  const std::vector<int> order = graph.ops();
  for (int op : order) {
    const UpdateKind* kind = KindOf(graph.schema(op).type);
    std::string key;
    if (kind != nullptr && WellFormed(graph, op, *kind)) key = GroupKey(graph, op, *kind);
    // Another group's members must stay before this op if it would see them.
    for (auto it = open.begin(); it != open.end();) {
      it = it->first != key && Conflicts(graph, op, it->second) ? close(it) : std::next(it);
    }
    if (key.empty()) continue;
    auto it = open.find(key);
    if (it != open.end() && (Conflicts(graph, op, it->second) ||
                             (max_group_size_ > 0 && static_cast<int>(it->second.members.size()) >= max_group_size_))) {
      close(it);
      it = open.end();
    }
    if (it == open.end()) {
      it = open.emplace(key, Group()).first;
      it->second.kind = kind;
    }
    Add(graph, op, it->second);
  }
  for (auto it = open.begin(); it != open.end();) it = close(it);
  if (done.empty()) return false;
  for (const Group& g : done) {
    absl::StatusOr<Op> multi = MultiOp(graph, g);
    if (!multi.ok()) return multi.status();
    const int last = g.members.back();
    if (auto s = graph.ReplaceOp(last, *multi); !s.ok()) {
      return absl::InternalError(absl::StrCat("fuse-optimizer: ", graph.OpLocation(last), ": ", s.message()));
    }
    for (size_t k = 0; k + 1 < g.members.size(); ++k) graph.EraseOp(g.members[k]);
  }
  return true;
}

}  // namespace strata
