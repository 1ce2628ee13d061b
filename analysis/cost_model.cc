#include "analysis/cost_model.h"

#include <string>
#include <vector>

#include "compiler/op_registry.h"
#include "proto/roles.h"
#include "proto/types.h"

namespace strata {

double EstimateOpCost(const Graph& graph, int op, int64_t batch) {
  std::vector<TensorType> ins, outs;
  double bytes = 0;
  auto add = [&](absl::Span<const int> vars, std::vector<TensorType>& types) {
    for (int v : vars) {
      TensorType t = graph.type(v);
      for (int64_t& d : t.shape) {
        if (d == -1) d = batch;
      }
      bytes += ElementCount(t) * DataTypeSize(t.dtype);
      types.push_back(std::move(t));
    }
  };
  add(graph.inputs(op), ins);
  add(graph.outputs(op), outs);
  double flops = 0;
  // A cost function may read every input and output its schema names.
  const OpSchema& schema = graph.schema(op);
  if (schema.cost_fn) {
    const Op& message = graph.AsOp(op);
    if (CheckArity(schema, message).ok()) flops = schema.cost_fn(CostContext(message, std::move(ins), std::move(outs)));
  }
  return flops + kBytesWeight * bytes;
}

ActionCosts EstimateActionCosts(const Graph& graph, int64_t micro_batch_size) {
  ActionCosts c;
  for (int op : graph.ops()) {
    const OpRole role = graph.role(op);
    const bool forward = ActionRuns(Action::FORWARD, role), backward = ActionRuns(Action::BACKWARD, role);
    if (!forward && !backward) continue;
    const double cost = EstimateOpCost(graph, op, micro_batch_size);
    if (forward) c.forward += cost;
    if (backward) c.backward += cost;
  }
  return c;
}

}  // namespace strata
