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
    *program.add_op() = op;
    if (op.role() != BACKWARD) continue;
    for (const auto& out : op.output()) {
      auto it = acc_of.find(out);
      if (it == acc_of.end()) continue;
      Op* acc = program.add_op();
      acc->set_type("accumulate");
      acc->add_input(it->second);
      acc->add_input(out);
      acc->add_output(it->second);
      acc->set_role(BACKWARD);
      acc->set_stage(op.stage());
      acc->set_device(op.device());
      acc->set_uid(op.uid());
      Op zero;
      zero.set_type("fill_zero");
      zero.add_input(it->second);
      zero.add_output(it->second);
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
    acc->set_kind(STATE);
  }
  for (auto& [param, grad] : *program.mutable_param_grad()) {
    auto it = acc_of.find(grad);
    if (it != acc_of.end()) grad = it->second;
  }
  return true;
}

}  // namespace strata
