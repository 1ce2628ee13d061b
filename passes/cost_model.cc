#include "passes/cost_model.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "compiler/graph_index.h"
#include "compiler/op_registry.h"
#include "proto/roles.h"
#include "proto/types.h"

namespace strata {
namespace {

// The var's type with the batch dimension (-1) taken as `batch`.
TensorType ResolvedType(const Var& v, int64_t batch) {
  TensorType t = TypeOf(v);
  for (int64_t& d : t.shape) {
    if (d == -1) d = batch;
  }
  return t;
}

}  // namespace

double EstimateOpCost(const Op& op, const VarLookup& var, int64_t batch) {
  std::vector<TensorType> ins, outs;
  bool all_found = true;
  double bytes = 0;
  auto add = [&](const std::string& name, std::vector<TensorType>& types) {
    const Var* v = var(name);
    if (v == nullptr) {
      all_found = false;
      return;
    }
    types.push_back(ResolvedType(*v, batch));
    bytes += ElementCount(types.back()) * DataTypeSize(v->dtype());
  };
  for (const auto& name : op.input()) add(name, ins);
  for (const auto& name : op.output()) add(name, outs);
  double flops = 0;
  // A cost function may read every input and output its schema names.
  const OpSchema* schema = OpRegistry::Global().Find(op.type());
  if (schema != nullptr && schema->cost_fn && all_found && CheckArity(*schema, op).ok()) {
    flops = schema->cost_fn(CostContext(op, std::move(ins), std::move(outs)));
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
