#include "passes/pipeline_split.h"

#include <map>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/graph_index.h"
#include "compiler/op_registry.h"

namespace strata {
namespace {

struct Transfer {
  std::string var;
  int src_stage, dst_stage;
  int64_t id;
};

Op MakeTransferOp(const std::string& type, const Transfer& t, const CompileContext& ctx, OpRole role,
                  const Var& var) {
  Op op;
  op.set_type(type);
  // The ranks of those stages in this rank's pipeline.
  Channel* c = op.mutable_channel();
  c->set_src_rank(ctx.mesh.WithCoordinate(ctx.rank, "pp", t.src_stage));
  c->set_dst_rank(ctx.mesh.WithCoordinate(ctx.rank, "pp", t.dst_stage));
  c->set_var(t.var);
  c->set_id(t.id);
  if (type == "send") {
    op.add_input(t.var);
    op.set_stage(t.src_stage);
  } else {
    op.add_output(t.var);
    op.set_stage(t.dst_stage);
    (*op.mutable_attr())["shape"] = IntsAttr(std::vector<int64_t>(var.shape().begin(), var.shape().end()));
    (*op.mutable_attr())["dtype"] = StringAttr(DataType_Name(var.dtype()));
  }
  op.set_role(role == LOSS ? FORWARD : role);
  op.set_device(absl::StrCat("gpu:", op.stage()));
  op.set_uid(-1);
  op.set_name(absl::StrCat(type, " ", t.var, " ", t.src_stage, "->", t.dst_stage));
  return op;
}

}  // namespace

absl::StatusOr<bool> PipelineSplitPass::Run(Program& program, const CompileContext& ctx) {
  if (ctx.num_stages() <= 1) return false;
  const int stage = ctx.stage();
  GraphIndex index(program);

  // Tied weights: a parameter read on several stages lives on each of them.
  // Autodiff sums its gradient on one stage (the gradient's producer); that
  // sum is sent to the other stages, so every replica takes the same update.
  struct Tied {
    std::string grad;
    int home;                // stage producing the summed gradient
    std::set<int> replicas;  // the other stages reading the parameter
  };
  std::map<std::string, Tied> tied;
  for (const Var& v : program.var()) {
    if (v.kind() != PARAM) continue;
    auto g = program.param_grad().find(v.name());
    if (g == program.param_grad().end()) continue;
    std::set<int> stages;
    for (int c : index.consumers(v.name())) stages.insert(program.op(c).stage());
    if (stages.size() < 2) continue;
    int producer = index.producer(g->second);
    if (producer < 0) return absl::InternalError(absl::StrCat("pipeline-split: gradient of '", v.name(), "' has no producer"));
    Tied t{g->second, program.op(producer).stage(), {}};
    for (int s : stages) {
      if (s != t.home) t.replicas.insert(s);
    }
    tied[v.name()] = t;
  }

  // Every cross-stage transfer of the whole program, numbered in program order.
  std::vector<Transfer> transfers;
  std::map<std::pair<std::string, int>, int64_t> transfer_to;  // (var, dst stage) -> id
  std::map<std::string, std::vector<int64_t>> transfers_of;    // var -> ids
  for (int i = 0; i < program.op_size(); ++i) {
    const Op& op = program.op(i);
    for (const auto& out : op.output()) {
      if (index.producer(out) != i) continue;
      const Var* v = index.var(out);
      if (v == nullptr || IsPersistent(*v)) continue;  // parameters and state stay on their stage
      std::set<int> dst;
      for (int c : index.consumers(out)) {
        if (program.op(c).stage() != op.stage()) dst.insert(program.op(c).stage());
      }
      for (const auto& [param, t] : tied) {
        if (t.grad == out) dst.insert(t.replicas.begin(), t.replicas.end());
      }
      for (int d : dst) {
        transfer_to[{out, d}] = static_cast<int64_t>(transfers.size());
        transfers_of[out].push_back(static_cast<int64_t>(transfers.size()));
        transfers.push_back({out, op.stage(), d, static_cast<int64_t>(transfers.size())});
      }
    }
  }

  std::vector<Op> kept;
  absl::flat_hash_set<std::string> received;
  for (int i = 0; i < program.op_size(); ++i) {
    const Op& op = program.op(i);
    if (op.stage() != stage) continue;
    for (const auto& in : op.input()) {
      int p = index.producer(in);
      if (p < 0 || program.op(p).stage() == stage || received.count(in)) continue;
      auto t = transfer_to.find({in, stage});
      if (t == transfer_to.end()) return absl::InternalError(absl::StrCat("pipeline-split: no transfer of '", in, "'"));
      kept.push_back(MakeTransferOp("recv", transfers[t->second], ctx, op.role(), *index.var(in)));
      received.insert(in);
    }
    kept.push_back(op);
    for (const auto& out : op.output()) {
      if (index.producer(out) != i) continue;
      auto ids = transfers_of.find(out);
      if (ids == transfers_of.end()) continue;
      for (int64_t id : ids->second) kept.push_back(MakeTransferOp("send", transfers[id], ctx, op.role(), *index.var(out)));
    }
  }

  // A replica's summed gradient arrives after this stage's own backward ops.
  std::vector<std::string> replicas;
  for (const auto& [param, t] : tied) {
    if (!t.replicas.count(stage)) continue;
    auto it = transfer_to.find({t.grad, stage});
    if (it == transfer_to.end()) return absl::InternalError(absl::StrCat("pipeline-split: no transfer of '", t.grad, "'"));
    kept.push_back(MakeTransferOp("recv", transfers[it->second], ctx, BACKWARD, *index.var(t.grad)));
    replicas.push_back(param);
  }

  // Only the vars this stage touches.
  absl::flat_hash_set<std::string> used;
  for (const Op& op : kept) {
    for (const auto& in : op.input()) used.insert(in);
    for (const auto& out : op.output()) used.insert(out);
  }
  std::vector<Var> vars;
  for (const Var& v : program.var()) {
    // Feeds stay declared on every stage: each rank reads the same data stream.
    if (used.count(v.name()) || v.kind() == FEED) vars.push_back(v);
  }
  std::vector<std::pair<std::string, std::string>> grads;
  for (const auto& [param, grad] : program.param_grad()) {
    if (used.count(param)) grads.push_back({param, grad});
  }
  program.clear_op();
  for (auto& op : kept) *program.add_op() = std::move(op);
  program.clear_var();
  for (auto& v : vars) *program.add_var() = std::move(v);
  program.clear_param_grad();
  for (auto& [p, g] : grads) (*program.mutable_param_grad())[p] = g;
  for (const auto& r : replicas) program.add_tied_replica(r);
  if (!used.count(program.loss())) program.clear_loss();
  std::vector<std::string> fetch;
  for (const auto& f : program.fetch()) {
    if (used.count(f)) fetch.push_back(f);
  }
  program.clear_fetch();
  for (const auto& f : fetch) program.add_fetch(f);
  return true;
}

}  // namespace strata
