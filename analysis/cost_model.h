#ifndef STRATA_ANALYSIS_COST_MODEL_H_
#define STRATA_ANALYSIS_COST_MODEL_H_

#include <cstdint>

#include "compiler/graph.h"

namespace strata {

// A rough cost model for placing a rank's actions in time: the work of an op
// in FLOP-equivalents is its floating-point operations (its schema's cost
// function, OpDef::Cost: 2 per multiply-add of matmul and conv2d and their
// gradients; 0 for ops without one) plus kBytesWeight per byte it reads and
// writes (what elementwise ops, normalizations and the optimizer cost).
// Good enough to see that one stage does twice another's work; not a
// profiler. The batch dimension (-1) takes `batch`.
inline constexpr double kBytesWeight = 2.0;

double EstimateOpCost(const Graph& graph, int op, int64_t batch);

// The estimated work of one micro-batch's forward action (FORWARD and LOSS
// ops) and backward action (BACKWARD ops) of a rank's graph.
struct ActionCosts {
  double forward = 0;
  double backward = 0;
};
ActionCosts EstimateActionCosts(const Graph& graph, int64_t micro_batch_size);

}  // namespace strata

#endif  // STRATA_ANALYSIS_COST_MODEL_H_
