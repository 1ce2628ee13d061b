#include "passes/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "proto/roles.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

double Elements(const Var& v, int64_t batch) {
  double n = 1;
  for (int64_t d : v.shape()) n *= d == -1 ? static_cast<double>(batch) : static_cast<double>(d);
  return n;
}

}  // namespace

double EstimateOpCost(const Op& op, const VarLookup& var, int64_t batch) {
  std::vector<const Var*> ins, outs;
  double bytes = 0;
  for (const auto& name : op.input()) {
    const Var* v = var(name);
    ins.push_back(v);
    if (v != nullptr) bytes += Elements(*v, batch) * DataTypeSize(v->dtype());
  }
  for (const auto& name : op.output()) {
    const Var* v = var(name);
    outs.push_back(v);
    if (v != nullptr) bytes += Elements(*v, batch) * DataTypeSize(v->dtype());
  }
  double flops = 0;
  const std::string& type = op.type();
  if (absl::StartsWith(type, "matmul") && (ins.size() == 2 || type == "matmul_accumulate") && outs.size() == 1 &&
      ins[0] && ins[1] && outs[0]) {
    // Forward, either gradient or a gradient accumulated in place, the three
    // tensors are [M,K], [K,N] and [M,N] (times any batch dims), so
    // M*N*K = sqrt of their sizes' product.
    flops = 2 * std::sqrt(Elements(*ins[0], batch) * Elements(*ins[1], batch) * Elements(*outs[0], batch));
  } else if (absl::StartsWith(type, "conv2d") && ins.size() == 2 && outs.size() == 1 && ins[0] && ins[1] && outs[0]) {
    // Multiply-adds = elements of y (or dy) x the weight's elements per output channel.
    const Var* w = type == "conv2d_grad_filter" ? outs[0] : ins[1];
    const Var* y = type == "conv2d" ? outs[0] : type == "conv2d_grad_input" ? ins[0] : ins[1];
    if (w->shape_size() == 4 && w->shape(0) > 0) {
      flops = 2 * Elements(*y, batch) * (Elements(*w, batch) / static_cast<double>(w->shape(0)));
    }
  }
  return flops + kBytesWeight * bytes;
}

ActionCosts EstimateActionCosts(const Program& program, int64_t micro_batch_size) {
  absl::flat_hash_map<absl::string_view, const Var*> vars;
  vars.reserve(program.var_size());
  for (const Var& v : program.var()) vars.emplace(v.name(), &v);
  VarLookup lookup = [&](const std::string& name) -> const Var* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second;
  };
  ActionCosts c;
  for (const Op& op : program.op()) {
    if (ActionRuns(Action::FORWARD, op.role())) c.forward += EstimateOpCost(op, lookup, micro_batch_size);
    if (ActionRuns(Action::BACKWARD, op.role())) c.backward += EstimateOpCost(op, lookup, micro_batch_size);
  }
  return c;
}

}  // namespace strata
