#include "passes/micro_batch.h"

#include <map>
#include <set>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "passes/pass_helpers.h"

namespace strata {
namespace {

bool IsUpdate(OpRole role) { return role == OPTIMIZE || role == LR_SCHEDULE; }

// The buffer that sums gradient `grad` over the micro-batches (and the steps
// of an update): one name on every layout, so checkpoints find it.
std::string BufferName(absl::string_view grad) { return absl::StrCat(grad, "@acc"); }

// An op on `buffer` in place, placed like `like`.
Op OpLike(const Graph& graph, int like, const std::string& type, const std::string& buffer, OpRole role) {
  Op op = OpPlacedLike(graph, like, type, role);
  op.add_input(buffer);
  op.add_output(buffer);
  return op;
}

}  // namespace

absl::StatusOr<bool> MicroBatchPass::Run(Graph& graph, const CompileContext& ctx) {
  const int m = ctx.micro_batches;
  if (m <= 1 && ctx.merge_steps <= 1) return false;
  // Under gradient merge the buffers carry the sum across the steps of an
  // update: state, saved in checkpoints.
  const VarKind buffer_kind = ctx.merge_steps > 1 ? STATE : SCRATCH;
  const std::vector<int> order = graph.ops();  // the ops before this pass, in program order

  // Each micro-batch's loss is the mean over its own samples, so 1/M makes
  // the summed gradient that of the global mean.
  const std::vector<int> producer = graph.FirstWriters();
  if (m > 1 && !ctx.summed_loss) {  // (a sum's parts add up as they are)
    if (auto s = ScaleLossSeed(graph, 1.0 / m, "micro-batch"); !s.ok()) return s;
  }

  // Gradients produced in backward and read by the optimizer block, in the
  // order the optimizer reads them.
  std::vector<int> grads;
  absl::flat_hash_set<int> seen;
  for (int op : order) {
    if (!IsUpdate(graph.role(op))) continue;
    for (int in : graph.inputs(op)) {
      if (producer[in] >= 0 && graph.role(producer[in]) == BACKWARD && seen.insert(in).second) grads.push_back(in);
    }
  }
  for (int g : grads) {
    for (int64_t d : graph.shape(g)) {
      if (d < 0) {
        return absl::InternalError(
            absl::StrCat("micro-batch: gradient '", graph.var_name(g), "' read by the optimizer has a batch dim"));
      }
    }
  }

  // A gradient that a 2-D matmul writes and only the optimizer block reads is
  // summed by the GEMM itself: matmul_accumulate adds op(a) @ op(b) into the
  // buffer, and the gradient var goes away.
  const std::vector<std::vector<int>> readers = graph.Readers();
  std::set<int> fused;
  for (int g : grads) {
    const int op = producer[g];
    if (graph.schema(op).type != "matmul" || graph.outputs(op).size() != 1 || graph.inputs(op).size() != 2) continue;
    if (graph.shape(graph.inputs(op)[0]).size() != 2 || graph.shape(graph.inputs(op)[1]).size() != 2) continue;
    // matmul_accumulate's CPU kernels are F32/F64 only: a BF16 gradient (mixed
    // precision casts it to F32 after the matmul anyway) keeps its matmul.
    if (graph.dtype(g) != F32 && graph.dtype(g) != F64) continue;
    bool only_optimizer = true;
    for (int c : readers[g]) only_optimizer &= IsUpdate(graph.role(c));
    if (only_optimizer) fused.insert(g);
  }

  // The buffers, declared after every var there is (in the optimizer's order).
  std::map<int, int> acc_of;  // gradient var -> its buffer
  for (int g : grads) {
    const std::string name = BufferName(graph.var_name(g));
    const int acc = graph.AddVar(name, graph.dtype(g), graph.shape(g), buffer_kind);
    if (acc < 0) return absl::InternalError(absl::StrCat("micro-batch: var '", name, "' exists already"));
    acc_of[g] = acc;
  }

  // Accumulate right after each producer, the optimizer reads the buffers,
  // and the buffers are zeroed after the optimizer block.
  std::vector<Op> zeros;
  for (int op : order) {
    if (IsUpdate(graph.role(op))) {
      const std::vector<int> ins(graph.inputs(op).begin(), graph.inputs(op).end());
      for (size_t k = 0; k < ins.size(); ++k) {
        auto it = acc_of.find(ins[k]);
        if (it == acc_of.end()) continue;
        if (auto s = graph.SetInput(op, static_cast<int>(k), it->second); !s.ok()) return s;
      }
    }
    if (graph.role(op) != BACKWARD) continue;
    const bool fuse = graph.outputs(op).size() == 1 && fused.count(graph.outputs(op)[0]) > 0;
    if (fuse) {
      const int acc = acc_of.at(graph.outputs(op)[0]);
      Op gemm = graph.AsOp(op);
      gemm.set_type("matmul_accumulate");
      gemm.add_input(std::string(graph.var_name(acc)));
      gemm.set_output(0, std::string(graph.var_name(acc)));
      if (auto s = graph.ReplaceOp(op, gemm); !s.ok()) return s;
      zeros.push_back(OpLike(graph, op, "fill_zero", std::string(graph.var_name(acc)), OPTIMIZE));
      continue;
    }
    int last = op;
    const std::vector<int> outs(graph.outputs(op).begin(), graph.outputs(op).end());
    for (int out : outs) {
      auto it = acc_of.find(out);
      if (it == acc_of.end()) continue;
      const std::string buffer(graph.var_name(it->second));
      Op acc = OpLike(graph, op, "accumulate", buffer, BACKWARD);
      acc.add_input(std::string(graph.var_name(out)));
      absl::StatusOr<int> added = graph.InsertOpAfter(last, acc);
      if (!added.ok()) return added.status();
      last = *added;
      zeros.push_back(OpLike(graph, op, "fill_zero", buffer, OPTIMIZE));
    }
  }
  for (const Op& z : zeros) {
    if (auto s = graph.AddOp(z); !s.ok()) return s;
  }
  for (auto& [param, grad] : *graph.mutable_program_fields().mutable_param_grad()) {
    const int g = graph.FindVar(grad);
    auto it = g >= 0 ? acc_of.find(g) : acc_of.end();
    if (it != acc_of.end()) grad = std::string(graph.var_name(it->second));
  }
  // A tied gradient's parts under gradient merge (the pipeline split's
  // merge_part): their buffers, and the buffer one device sums the whole in.
  std::set<int> parts;
  for (Program::MergePart& m : *graph.mutable_program_fields().mutable_merge_part()) {
    const int part = graph.FindVar(m.buffer());
    auto it = part >= 0 ? acc_of.find(part) : acc_of.end();
    if (it == acc_of.end() || !parts.insert(part).second) {
      return absl::InternalError(
          absl::StrCat("micro-batch: the tied gradient's part '", m.buffer(), "' has no buffer of its own"));
    }
    m.set_buffer(std::string(graph.var_name(it->second)));
    m.set_whole(BufferName(m.whole()));
  }
  if (!fused.empty()) {
    // The fused gradients are written nowhere now.
    std::vector<bool> keep(graph.num_vars(), true);
    for (int g : fused) keep[g] = false;
    if (auto s = graph.RetainVars(keep); !s.ok()) return s;
  }
  return true;
}

}  // namespace strata
