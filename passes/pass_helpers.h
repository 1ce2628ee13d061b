#ifndef STRATA_PASSES_PASS_HELPERS_H_
#define STRATA_PASSES_PASS_HELPERS_H_

#include "absl/status/status.h"
#include <string>

#include "absl/strings/string_view.h"
#include "compiler/graph.h"

namespace strata {

// What several passes do alike.

// An op of a pass's making placed like op `like` (its stage, device and uid,
// so a random op keyed by the uid draws alike): type and role set, no
// inputs, outputs or attrs yet.
Op OpPlacedLike(const Graph& graph, int like, const std::string& type, OpRole role);

// Multiplies the seed of dL/dloss (the `value` of the op autodiff made for
// Program.loss_grad) by `factor`: the passes that split the global batch
// (micro-batches 1/M, data parallel 1/D, gradient merge's average 1/k) make
// each part's mean loss contribute its share of the global mean's gradient.
// A stage without the loss has no seed: nothing to do. `pass` names the
// caller in errors.
absl::Status ScaleLossSeed(Graph& graph, double factor, absl::string_view pass);

}  // namespace strata

#endif  // STRATA_PASSES_PASS_HELPERS_H_
