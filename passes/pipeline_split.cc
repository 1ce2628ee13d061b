#include "passes/pipeline_split.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "passes/pass_helpers.h"
#include "proto/roles.h"

namespace strata {
namespace {

struct Transfer {
  int var;
  int src_stage, dst_stage;
  int64_t id;  // unique in the job: each data-parallel replica's pipeline numbers its own
};

Op MakeTransferOp(const Graph& graph, const std::string& type, const Transfer& t, const CompileContext& ctx,
                  OpRole role) {
  Op op;
  op.set_type(type);
  const std::string var(graph.var_name(t.var));
  // The ranks of those stages in this rank's pipeline.
  Channel* c = op.mutable_channel();
  c->set_src_rank(ctx.mesh.WithCoordinate(ctx.rank, "pp", t.src_stage));
  c->set_dst_rank(ctx.mesh.WithCoordinate(ctx.rank, "pp", t.dst_stage));
  c->set_var(var);
  c->set_id(t.id);
  if (type == "send") {
    op.add_input(var);
    op.set_stage(t.src_stage);
  } else {
    op.add_output(var);
    op.set_stage(t.dst_stage);
    const absl::Span<const int64_t> shape = graph.shape(t.var);
    (*op.mutable_attr())["shape"] = IntsAttr(std::vector<int64_t>(shape.begin(), shape.end()));
    (*op.mutable_attr())["dtype"] = StringAttr(DataType_Name(graph.dtype(t.var)));
  }
  op.set_role(role == LOSS ? FORWARD : role);
  op.set_device(absl::StrCat("gpu:", op.stage()));
  op.set_uid(-1);
  op.set_name(absl::StrCat(type, " ", var, " ", t.src_stage, "->", t.dst_stage));
  return op;
}

// A weight read on several stages whose gradient flows through one reader
// (read elsewhere only where no gradient flows, as a fetched mean) has no
// sum of parts: its gradient op writes the whole gradient. That op writes a
// part instead, and a sum of that one part (add_n, a copy) makes the whole,
// so that it crosses the stages as the other tied gradients do: once an
// update, from a tensor of the optimizer action's own. Sent from the buffer
// the micro-batches sum the gradient into, the send could still be reading
// it when the buffer is zeroed for the next step; sent in every backward, a
// gradient going the way the activations go met the home's next forward's
// activation on the same pair of ranks, which NCCL (matching a pair's
// messages by issue order) cannot take.
absl::Status GiveOnePathTiedGradientsASum(Graph& graph) {
  const std::vector<int> producer = graph.FirstWriters();
  const std::vector<std::vector<int>> readers = graph.Readers();
  const VarWriters writers = CountWriters(graph);
  absl::flat_hash_set<int> summed;  // gradients given a sum here (two tied weights may share one)
  for (int v = 0; v < graph.num_vars(); ++v) {
    if (graph.kind(v) != PARAM) continue;
    auto g = graph.program_fields().param_grad().find(std::string(graph.var_name(v)));
    if (g == graph.program_fields().param_grad().end()) continue;
    std::set<int> stages;
    for (int c : readers[v]) stages.insert(graph.stage(c));
    const int grad = graph.FindVar(g->second);
    if (stages.size() < 2 || grad < 0 || producer[grad] < 0 || writers.count[grad] != 1) continue;
    if (!summed.insert(grad).second) continue;
    const int op = producer[grad];
    if (graph.role(op) != BACKWARD || graph.schema(op).type == "add_n") continue;
    bool moves = true;
    for (int r : readers[grad]) moves = moves && graph.role(r) != BACKWARD && graph.role(r) != FORWARD;
    for (int64_t d : graph.shape(grad)) moves = moves && d >= 0;
    if (!moves) continue;
    const std::string part = FreshVarName(graph, graph.var_name(grad), "@part");
    graph.AddVar(part, graph.dtype(grad), graph.shape(grad), ACTIVATION);
    Op rewritten = graph.AsOp(op);
    for (std::string& out : *rewritten.mutable_output()) {
      if (out == graph.var_name(grad)) out = part;
    }
    if (auto s = graph.ReplaceOp(op, rewritten); !s.ok()) return s;
    Op sum;
    sum.set_type("add_n");
    sum.add_input(part);
    sum.add_output(std::string(graph.var_name(grad)));
    sum.set_role(BACKWARD);  // moved to the update below, as autodiff's sums are
    sum.set_stage(graph.stage(op));
    sum.set_device(std::string(graph.device(op)));
    sum.set_uid(-1);
    sum.set_name(absl::StrCat("sum of ", graph.var_name(grad)));
    if (auto s = graph.InsertOpAfter(op, sum); !s.ok()) return s.status();
  }
  return absl::OkStatus();
}

// Whether autodiff's sum of gradient `grad` (its producer) may run once an
// update, in the optimizer action: an add_n writing `grad` alone, which no
// forward or backward op reads, of parts made by backward ops, each without
// a batch dim (a per-update value, summed over the micro-batches in a buffer
// of its own by the micro-batch pass).
bool SummableAtUpdate(const Graph& graph, const std::vector<int>& producer,
                      const std::vector<std::vector<int>>& readers, int grad) {
  const int sum = producer[grad];
  if (sum < 0 || graph.role(sum) != BACKWARD || graph.schema(sum).type != "add_n" || graph.outputs(sum).size() != 1) {
    return false;
  }
  for (int r : readers[grad]) {
    if (graph.role(r) == BACKWARD || graph.role(r) == FORWARD) return false;
  }
  for (int in : graph.inputs(sum)) {
    if (producer[in] < 0 || graph.role(producer[in]) != BACKWARD) return false;
    for (int64_t d : graph.shape(in)) {
      if (d < 0) return false;
    }
  }
  return true;
}

// With micro-batches (and no gradient merge), a weight read twice on one
// stage (a tied weight on one device; the LM head and the token embedding
// of `strata gen gpt`) has autodiff's sum of its gradient's two parts moved
// to the optimizer action too: each part is summed over the micro-batches,
// then the two once. That is the order a pipeline must sum a weight tied
// across its stages in (each stage's part over the micro-batches, then the
// parts, below), so one device and the pipeline add the same floats in the
// same order and train the same bits. A part a matmul makes is summed by
// the GEMM itself (matmul_accumulate), and the traffic is that of one sum
// and one accumulate a micro-batch as before; the cost is one buffer of
// the weight's size held through the step. A weight read three times or
// more keeps its sum in the backward (a buffer a part would be a shared
// layer's whole gradient again per use), as under gradient merge, whose
// checkpoints hold the whole gradient's buffer on one device. Whether a
// sum moved.
bool SumPartsAtUpdate(Graph& graph, const CompileContext& ctx, const std::vector<int>& producer,
                      const std::vector<std::vector<int>>& readers) {
  if (ctx.micro_batches <= 1 || ctx.merge_steps > 1) return false;
  const VarWriters writers = CountWriters(graph);
  bool moved = false;
  for (const auto& [param_name, grad_name] : graph.program_fields().param_grad()) {
    const int param = graph.FindVar(param_name);
    const int grad = graph.FindVar(grad_name);
    if (param < 0 || grad < 0 || writers.count[grad] != 1 || !SummableAtUpdate(graph, producer, readers, grad)) continue;
    const int sum = producer[grad];
    if (graph.inputs(sum).size() != 2) continue;
    bool one_stage = true;  // a weight tied across stages is the pipeline split's (below)
    for (int r : readers[param]) one_stage = one_stage && graph.stage(r) == graph.stage(sum);
    for (int in : graph.inputs(sum)) {
      one_stage = one_stage && writers.count[in] == 1 && graph.stage(producer[in]) == graph.stage(sum);
    }
    if (!one_stage) continue;
    graph.set_role(sum, OPTIMIZE);
    moved = true;
  }
  return moved;
}

}  // namespace

absl::StatusOr<bool> PipelineSplitPass::Run(Graph& graph, const CompileContext& ctx) {
  if (ctx.num_stages() <= 1) return SumPartsAtUpdate(graph, ctx, graph.FirstWriters(), graph.Readers());
  if (auto s = GiveOnePathTiedGradientsASum(graph); !s.ok()) return s;
  const int stage = ctx.stage();
  const std::vector<int> order = graph.ops();  // the whole program, in order
  const std::vector<int> producer = graph.FirstWriters();
  const std::vector<std::vector<int>> readers = graph.Readers();
  Program& fields = graph.mutable_program_fields();

  // Tied weights: a parameter read on several stages lives on each of them.
  // Autodiff sums its gradient on one stage (the gradient's producer); that
  // sum is sent to the other stages, so every replica takes the same update.
  struct Tied {
    int param;
    int grad;
    int home;                // stage producing the summed gradient
    std::set<int> replicas;  // the other stages reading the parameter
  };
  std::vector<Tied> tied;  // in declaration order of the parameters
  for (int v = 0; v < graph.num_vars(); ++v) {
    if (graph.kind(v) != PARAM) continue;
    auto g = fields.param_grad().find(std::string(graph.var_name(v)));
    if (g == fields.param_grad().end()) continue;
    std::set<int> stages;
    for (int c : readers[v]) stages.insert(graph.stage(c));
    if (stages.size() < 2) continue;
    const int grad = graph.FindVar(g->second);
    if (grad < 0 || producer[grad] < 0) {
      return absl::InternalError(absl::StrCat("pipeline-split: gradient of '", graph.var_name(v), "' has no producer"));
    }
    Tied t{v, grad, graph.stage(producer[grad]), {}};
    for (int s : stages) {
      if (s != t.home) t.replicas.insert(s);
    }
    tied.push_back(t);
  }
  // By parameter name: the order replicas' receives are appended in (an
  // action posts its receives in channel order whatever their places).
  std::sort(tied.begin(), tied.end(),
            [&](const Tied& a, const Tied& b) { return graph.var_name(a.param) < graph.var_name(b.param); });

  // The tied gradients cross stages once an update, in the optimizer
  // action, as Megatron-LM sums the embedding's gradient between the first
  // and last stage after the last micro-batch: each stage's part is summed
  // over the micro-batches (and under gradient merge over the k steps of an
  // update) on its own stage, in the micro-batch pass's buffers; the
  // replicas' parts go to the home stage, whose sum of the parts (an OPTIMIZE
  // op now) goes back to them. Exchanged in every backward instead, the
  // home's backward of micro-batch i would wait for the replica's, and the
  // replica's next forward for the home's sum: a 1F1B pipeline of a tied GPT
  // ran its stages one after the other.
  absl::flat_hash_set<int> at_update;  // vars whose transfers run in the optimizer action
  // Under gradient merge, this stage's parts: (part var, whole gradient var,
  // whether the part is its sum's first input).
  std::vector<std::tuple<int, int, bool>> merge_parts;
  for (const Tied& t : tied) {
    // Autodiff's add_n of the parts (a weight whose gradient flows through
    // one reader has no sum: its gradient op keeps its place), read by no
    // forward or backward op.
    const int sum = producer[t.grad];
    bool moves = SummableAtUpdate(graph, producer, readers, t.grad);
    // Each part from another stage read by the sum alone off its own stage,
    // on a replica (which takes the sum back: its part's buffer is zeroed
    // after that receive, so after the home has taken the part).
    std::vector<int> parts;
    for (int in : graph.inputs(sum)) {
      if (!moves) break;
      const int from = graph.stage(producer[in]);
      if (from == t.home) continue;
      moves = moves && t.replicas.count(from) > 0;
      for (int r : readers[in]) moves = moves && (r == sum || graph.stage(r) == from);
      parts.push_back(in);
    }
    if (!moves) continue;
    graph.set_role(sum, OPTIMIZE);
    at_update.insert(t.grad);
    at_update.insert(parts.begin(), parts.end());
    if (ctx.merge_steps > 1) {
      for (int in : graph.inputs(sum)) {
        if (graph.stage(producer[in]) == stage) merge_parts.push_back({in, t.grad, in == graph.inputs(sum)[0]});
      }
    }
  }
  SumPartsAtUpdate(graph, ctx, producer, readers);  // the other weights' sums, as one device sums them
  auto transfer_role = [&](int var, OpRole role) { return at_update.contains(var) ? OPTIMIZE : role; };

  // Every cross-stage transfer of the whole program, numbered in program order.
  std::vector<Transfer> transfers;
  std::map<std::pair<int, int>, int64_t> transfer_to;  // (var, dst stage) -> id
  std::map<int, std::vector<int64_t>> transfers_of;    // var -> ids
  for (int op : order) {
    for (int out : graph.outputs(op)) {
      if (producer[out] != op || IsPersistent(graph.kind(out))) continue;  // parameters and state stay on their stage
      std::set<int> dst;
      for (int c : readers[out]) {
        if (graph.stage(c) != graph.stage(op)) dst.insert(graph.stage(c));
      }
      for (const Tied& t : tied) {
        if (t.grad == out) dst.insert(t.replicas.begin(), t.replicas.end());
      }
      for (int d : dst) {
        const int64_t id = static_cast<int64_t>(transfers.size());
        transfer_to[{out, d}] = id;
        transfers_of[out].push_back(id);
        transfers.push_back({out, graph.stage(op), d, id});
      }
    }
  }

  // Each data-parallel replica's pipeline has its own channels, so that a
  // channel names one pair of ranks in the whole job.
  const int64_t replica_offset = static_cast<int64_t>(ctx.dp_rank()) * static_cast<int64_t>(transfers.size());
  for (Transfer& t : transfers) t.id += replica_offset;

  // This stage's ops stay, each with a recv before it for what it reads from
  // other stages and a send after it for what other stages read of it.
  absl::flat_hash_set<int> received;
  int last_kept = -1;
  for (int op : order) {
    if (graph.stage(op) != stage) {
      graph.EraseOp(op);
      continue;
    }
    const std::vector<int> ins(graph.inputs(op).begin(), graph.inputs(op).end());
    for (int in : ins) {
      const int p = producer[in];
      if (p < 0 || graph.stage(p) == stage || received.count(in)) continue;
      auto t = transfer_to.find({in, stage});
      if (t == transfer_to.end()) {
        return absl::InternalError(absl::StrCat("pipeline-split: no transfer of '", graph.var_name(in), "'"));
      }
      if (auto s = graph.InsertOpBefore(
              op, MakeTransferOp(graph, "recv", transfers[t->second], ctx, transfer_role(in, graph.role(op))));
          !s.ok()) {
        return s.status();
      }
      received.insert(in);
    }
    last_kept = op;
    const std::vector<int> outs(graph.outputs(op).begin(), graph.outputs(op).end());
    for (int out : outs) {
      if (producer[out] != op) continue;
      auto ids = transfers_of.find(out);
      if (ids == transfers_of.end()) continue;
      for (int64_t id : ids->second) {
        absl::StatusOr<int> send =
            graph.InsertOpAfter(last_kept, MakeTransferOp(graph, "send", transfers[id], ctx, transfer_role(out, graph.role(op))));
        if (!send.ok()) return send.status();
        last_kept = *send;
      }
    }
  }

  // A replica's summed gradient arrives after this stage's own backward ops
  // (in the optimizer action where the sum moved there).
  std::vector<std::string> replicas;
  absl::flat_hash_set<int> summed_here;  // one receive of a gradient two tied weights share
  for (const Tied& t : tied) {
    if (!t.replicas.count(stage)) continue;
    replicas.emplace_back(graph.var_name(t.param));
    if (!summed_here.insert(t.grad).second) continue;
    auto it = transfer_to.find({t.grad, stage});
    if (it == transfer_to.end()) {
      return absl::InternalError(absl::StrCat("pipeline-split: no transfer of '", graph.var_name(t.grad), "'"));
    }
    if (auto s = graph.AddOp(MakeTransferOp(graph, "recv", transfers[it->second], ctx, transfer_role(t.grad, BACKWARD)));
        !s.ok()) {
      return s;
    }
  }

  // Only the vars this stage touches; feeds stay declared on every stage:
  // each rank reads the same data stream.
  std::vector<bool> touched(graph.num_vars(), false);
  for (int op : graph.ops()) {
    for (int v : graph.inputs(op)) touched[v] = true;
    for (int v : graph.outputs(op)) touched[v] = true;
  }
  auto used = [&](const std::string& name) {
    const int v = graph.FindVar(name);
    return v >= 0 && touched[v];
  };
  std::vector<std::pair<std::string, std::string>> grads;
  for (const auto& [param, grad] : fields.param_grad()) {
    if (used(param)) grads.push_back({param, grad});
  }
  fields.clear_param_grad();
  for (auto& [p, g] : grads) (*fields.mutable_param_grad())[p] = g;
  for (const auto& r : replicas) fields.add_tied_replica(r);
  // The first part of each sum takes the whole gradient of a checkpoint
  // saved under another layout (the sum's inputs are in one order on every
  // rank); the micro-batch pass names the buffers.
  for (const auto& [part, whole, primary] : merge_parts) {
    Program::MergePart* m = fields.add_merge_part();
    m->set_buffer(std::string(graph.var_name(part)));
    m->set_whole(std::string(graph.var_name(whole)));
    m->set_primary(primary);
  }
  // The loss belongs to the stage that makes it: a later stage that
  // receives it (an op there reads it) neither seeds its gradient nor
  // reports it (two reporters wrote one metrics file).
  auto made_here = [&](const std::string& name) {
    const int v = graph.FindVar(name);
    const int writer = v >= 0 ? graph.FirstWriters()[v] : -1;
    return writer >= 0 && graph.channel(writer) == nullptr;  // not a recv
  };
  if (!used(fields.loss()) || !made_here(fields.loss())) fields.clear_loss();
  if (!used(fields.loss_grad())) fields.clear_loss_grad();
  std::vector<std::string> fetch;
  for (const auto& f : fields.fetch()) {
    if (used(f)) fetch.push_back(f);
  }
  fields.clear_fetch();
  for (const auto& f : fetch) fields.add_fetch(f);
  std::vector<bool> keep(graph.num_vars());
  for (int v = 0; v < graph.num_vars(); ++v) keep[v] = touched[v] || graph.kind(v) == FEED;
  if (auto s = graph.RetainVars(keep); !s.ok()) return s;
  return true;
}

}  // namespace strata
