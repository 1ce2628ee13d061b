#include "passes/micro_batch.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "compiler/graph_index.h"
#include "compiler/op_registry.h"

namespace strata {

absl::StatusOr<bool> MicroBatchPass::Run(Program& program, const CompileContext& ctx) {
  const int m = ctx.micro_batches;
  if (m <= 1) return false;

  // The seed of dL/dloss (on the loss's stage): each micro-batch's loss is the
  // mean over its own samples, so 1/M makes the summed gradient that of the
  // global mean.
  for (Op& op : *program.mutable_op()) {
    if (op.role() == BACKWARD && op.type() == "fill_like" && op.input_size() == 1 && op.input(0) == program.loss()) {
      (*op.mutable_attr())["value"] = FloatAttr(1.0 / m);
    }
  }

  // Gradients produced in backward and read by the optimizer block.
  GraphIndex index(program);
  std::vector<std::string> grads;
  std::set<std::string> seen;
  for (const Op& op : program.op()) {
    if (op.role() != OPTIMIZE && op.role() != LR_SCHEDULE) continue;
    for (const auto& in : op.input()) {
      int p = index.producer(in);
      if (p >= 0 && program.op(p).role() == BACKWARD && seen.insert(in).second) grads.push_back(in);
    }
  }
  std::map<std::string, std::string> acc_of;
  for (const auto& g : grads) {
    const Var* v = index.var(g);
    if (v == nullptr) return absl::InternalError(absl::StrCat("micro-batch: gradient '", g, "' has no var"));
    for (int64_t d : v->shape()) {
      if (d < 0) return absl::InternalError(absl::StrCat("micro-batch: gradient '", g, "' read by the optimizer has a batch dim"));
    }
    acc_of[g] = absl::StrCat(g, "@acc");
  }

  // A gradient that a 2-D matmul writes and only the optimizer block reads is
  // summed by the GEMM itself: matmul_accumulate adds op(a) @ op(b) into the
  // buffer, and the gradient var goes away.
  std::set<std::string> fused;
  for (const auto& g : grads) {
    const int producer = index.producer(g);
    const Op& op = program.op(producer);
    if (op.type() != "matmul" || op.output_size() != 1 || op.input_size() != 2) continue;
    const Var* a = index.var(op.input(0));
    const Var* b = index.var(op.input(1));
    if (a == nullptr || b == nullptr || a->shape_size() != 2 || b->shape_size() != 2) continue;
    bool only_optimizer = true;
    for (int c : index.consumers(g)) {
      only_optimizer &= program.op(c).role() == OPTIMIZE || program.op(c).role() == LR_SCHEDULE;
    }
    if (only_optimizer) fused.insert(g);
  }

  // Rebuild the op list: accumulate right after each producer, the optimizer
  // reads the buffers, and the buffers are zeroed after the optimizer block.
  std::vector<Op> ops(program.op().begin(), program.op().end());
  program.clear_op();
  std::vector<Op> zeros;
  for (Op& op : ops) {
    if (op.role() == OPTIMIZE || op.role() == LR_SCHEDULE) {
      for (auto& in : *op.mutable_input()) {
        auto it = acc_of.find(in);
        if (it != acc_of.end()) in = it->second;
      }
    }
    const bool fuse = op.role() == BACKWARD && op.output_size() == 1 && fused.count(op.output(0)) > 0;
    if (fuse) {
      op.set_type("matmul_accumulate");
      op.add_input(acc_of[op.output(0)]);
      op.set_output(0, acc_of[op.output(0)]);
    }
    *program.add_op() = op;
    if (op.role() != BACKWARD) continue;
    for (const auto& out : op.output()) {
      auto it = acc_of.find(out);
      if (it == acc_of.end() && !fuse) continue;
      const std::string& buffer = fuse ? out : it->second;
      if (!fuse) {
        Op* acc = program.add_op();
        acc->set_type("accumulate");
        acc->add_input(buffer);
        acc->add_input(out);
        acc->add_output(buffer);
        acc->set_role(BACKWARD);
        acc->set_stage(op.stage());
        acc->set_device(op.device());
        acc->set_uid(op.uid());
      }
      Op zero;
      zero.set_type("fill_zero");
      zero.add_input(buffer);
      zero.add_output(buffer);
      zero.set_role(OPTIMIZE);
      zero.set_stage(op.stage());
      zero.set_device(op.device());
      zero.set_uid(op.uid());
      zeros.push_back(std::move(zero));
    }
  }
  for (auto& z : zeros) *program.add_op() = std::move(z);
  for (const auto& g : grads) {
    const Var* v = index.var(g);
    Var* acc = program.add_var();
    acc->set_name(acc_of[g]);
    acc->set_dtype(v->dtype());
    *acc->mutable_shape() = v->shape();
    acc->set_kind(SCRATCH);  // zero at every step boundary: not checkpointed
  }
  for (auto& [param, grad] : *program.mutable_param_grad()) {
    auto it = acc_of.find(grad);
    if (it != acc_of.end()) grad = it->second;
  }
  if (!fused.empty()) {
    // The fused gradients are written nowhere now: drop their vars (last, as
    // the index points into them).
    auto* vars = program.mutable_var();
    int kept = 0;
    for (int i = 0; i < vars->size(); ++i) {
      if (fused.count(vars->Get(i).name())) continue;
      if (kept != i) vars->SwapElements(kept, i);
      ++kept;
    }
    vars->DeleteSubrange(kept, vars->size() - kept);
  }
  return true;
}

}  // namespace strata
