#include "passes/recompute.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/graph_index.h"
#include "proto/roles.h"

namespace strata {
namespace {

bool IsForward(OpRole role) { return role == FORWARD || role == LOSS; }

}  // namespace

absl::Status CheckRecomputeCheckpoints(const Program& program, const std::vector<std::string>& checkpoints) {
  GraphIndex index(program);
  // Readers of every var, by name.
  absl::flat_hash_map<std::string, std::vector<int>> readers;
  for (int i = 0; i < program.op_size(); ++i) {
    for (const auto& in : program.op(i).input()) readers[in].push_back(i);
  }
  // Vars that the loss depends on.
  absl::flat_hash_set<std::string> to_loss;
  std::vector<std::string> stack = {program.loss()};
  while (!stack.empty()) {
    std::string v = std::move(stack.back());
    stack.pop_back();
    if (!to_loss.insert(v).second) continue;
    const int p = index.producer(v);
    if (p >= 0) {
      for (const auto& in : program.op(p).input()) stack.push_back(in);
    }
  }
  for (const std::string& c : checkpoints) {
    if (!to_loss.contains(c)) {
      return absl::InvalidArgumentError(absl::StrCat("var '", c, "' is not on the way to the loss '", program.loss(),
                                                     "': it cuts nothing"));
    }
    if (c == program.loss()) return absl::InvalidArgumentError(absl::StrCat("var '", c, "' is the loss itself"));
    // The feeds it depends on...
    std::vector<std::string> feeds;
    absl::flat_hash_set<std::string> seen;
    stack = {c};
    while (!stack.empty()) {
      std::string v = std::move(stack.back());
      stack.pop_back();
      if (!seen.insert(v).second) continue;
      const Var* var = index.var(v);
      if (var != nullptr && var->kind() == FEED) feeds.push_back(v);
      const int p = index.producer(v);
      if (p >= 0) {
        for (const auto& in : program.op(p).input()) stack.push_back(in);
      }
    }
    // ...reach the loss only through it.
    absl::flat_hash_set<std::string> reached(feeds.begin(), feeds.end());
    std::map<std::string, std::string> via;  // var -> the var it was reached from
    stack = feeds;
    while (!stack.empty()) {
      std::string v = std::move(stack.back());
      stack.pop_back();
      for (int op : readers[v]) {
        for (const auto& out : program.op(op).output()) {
          if (out == c || reached.contains(out)) continue;
          reached.insert(out);
          via[out] = v;
          stack.push_back(out);
        }
      }
    }
    if (reached.contains(program.loss())) {
      // The last var on the way around before it rejoins the loss's path.
      std::string around = program.loss();
      while (via.count(around) && !absl::c_linear_search(feeds, via[around]) && to_loss.contains(via[around])) {
        around = via[around];
        if (index.producer(around) >= 0 && to_loss.contains(around)) {
          bool from_checkpoint_side = false;
          for (const auto& in : program.op(index.producer(around)).input()) from_checkpoint_side |= in == c;
          if (from_checkpoint_side) break;
        }
      }
      return absl::InvalidArgumentError(absl::StrCat("var '", c, "' does not cut the graph: the loss '",
                                                     program.loss(), "' is reached from feed '", feeds.front(),
                                                     "' without it (through '", around, "')"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RecomputePass::Run(Graph& graph, const CompileContext& ctx) {
  const auto& names = ctx.strategy.recompute().checkpoints();
  if (names.empty()) return false;
  absl::flat_hash_set<int> checkpoint;
  for (const std::string& n : names) {
    const int v = graph.FindVar(n);
    if (v < 0) return absl::InternalError(absl::StrCat("recompute: checkpoint '", n, "' has no var"));
    checkpoint.insert(v);
  }
  // Found: the passes after this one may fold them as any other var.
  graph.ClearPins();
  const std::vector<int> order = graph.ops();
  const std::vector<int> producer = graph.FirstWriters();
  const std::vector<std::vector<int>> readers = graph.Readers();

  // Segments of the forward ops: a new one after an op that makes a
  // checkpoint and wherever the stage changes.
  std::vector<int> segment_of(graph.op_id_bound(), -1);
  std::vector<std::vector<int>> segments;
  int last_stage = -1;
  bool close = true;
  for (int op : order) {
    if (!IsForward(graph.role(op))) continue;
    if (close || graph.stage(op) != last_stage) segments.emplace_back();
    close = false;
    last_stage = graph.stage(op);
    segments.back().push_back(op);
    segment_of[op] = static_cast<int>(segments.size()) - 1;
    for (int out : graph.outputs(op)) close |= checkpoint.contains(out);
  }

  // A var is kept (never recomputed) when it is not an activation a forward
  // op makes, is a checkpoint, or is read on another stage.
  auto kept = [&](int v) {
    if (graph.kind(v) != ACTIVATION || checkpoint.contains(v)) return true;
    const int p = producer[v];
    if (p < 0 || segment_of[p] < 0) return true;
    for (int r : readers[v]) {
      if (graph.stage(r) != graph.stage(p)) return true;
    }
    return false;
  };

  bool changed = false;
  for (size_t s = 0; s < segments.size(); ++s) {
    const std::vector<int>& ops = segments[s];
    bool holds_loss = false;
    for (int op : ops) holds_loss |= graph.role(op) == LOSS;
    if (holds_loss) continue;  // its backward follows at once
    // What backward reads of this segment, and the first backward op to.
    std::set<int> needed;
    int first_reader = -1;
    for (int op : ops) {
      for (int out : graph.outputs(op)) {
        if (producer[out] != op || kept(out)) continue;
        for (int r : readers[out]) {
          if (graph.role(r) != BACKWARD) continue;
          needed.insert(out);
          if (first_reader < 0 || graph.Precedes(r, first_reader)) first_reader = r;
        }
      }
    }
    if (needed.empty()) continue;
    // The segment's ops that make them, found backwards through the segment.
    std::set<int> want = needed;
    std::vector<int> recompute;
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      bool makes = false;
      for (int out : graph.outputs(*it)) makes |= want.count(out) > 0;
      if (!makes) continue;
      recompute.push_back(*it);
      for (int in : graph.inputs(*it)) {
        const int p = producer[in];
        if (p >= 0 && segment_of[p] == static_cast<int>(s) && !kept(in)) want.insert(in);
      }
    }
    std::reverse(recompute.begin(), recompute.end());
    // Re-emitted before the first backward reader, writing renamed vars.
    absl::flat_hash_map<int, int> renamed;
    for (int op : recompute) {
      for (int out : graph.outputs(op)) {
        if (renamed.contains(out)) continue;
        const std::string name = absl::StrCat(graph.var_name(out), "@recompute");
        const int copy = graph.AddVar(name, graph.dtype(out), graph.shape(out), ACTIVATION);
        if (copy < 0) return absl::InternalError(absl::StrCat("recompute: var '", name, "' exists already"));
        renamed[out] = copy;
      }
    }
    for (int op : recompute) {
      Op clone = graph.AsOp(op);
      clone.set_role(BACKWARD);
      for (int k = 0; k < clone.input_size(); ++k) {
        auto it = renamed.find(graph.inputs(op)[k]);
        if (it != renamed.end()) clone.set_input(k, std::string(graph.var_name(it->second)));
      }
      for (int k = 0; k < clone.output_size(); ++k) {
        clone.set_output(k, std::string(graph.var_name(renamed.at(graph.outputs(op)[k]))));
      }
      if (auto added = graph.InsertOpBefore(first_reader, clone); !added.ok()) return added.status();
    }
    // The backward ops from the first reader on read the recomputed vars.
    // (Ops of later segments re-emitted earlier keep reading the original.)
    for (int v : needed) {
      auto replaced = graph.ReplaceAllUsesWith(v, renamed.at(v), [&](int op) {
        return graph.role(op) == BACKWARD && !graph.Precedes(op, first_reader);
      });
      if (!replaced.ok()) return replaced.status();
    }
    changed = true;
  }
  return changed;
}

}  // namespace strata
