#ifndef STRATA_COMPILER_AUTODIFF_H_
#define STRATA_COMPILER_AUTODIFF_H_

#include "absl/status/status.h"
#include <string>

#include "absl/status/statusor.h"
#include "compiler/graph.h"
#include "compiler/pass.h"
#include "proto/program.pb.h"

namespace strata {

// Appends the backward ops of `program` (validated and typed): seeds
// dL/dloss = 1, walks the forward ops in reverse calling each op's gradient
// maker, and sums the gradients of vars used more than once with add_n. Only
// ops on a path from a trainable parameter to the loss are differentiated,
// and only the input gradients leading to parameters are asked for. Records
// parameter -> gradient var in program.param_grad.
absl::Status AppendBackward(Graph* graph);
// The same on a Program (converted to a Graph and back).
absl::Status AppendBackward(Program* program);

// AppendBackward as a pass of the program pipeline.
class AutodiffPass : public Pass {
 public:
  std::string name() const override { return "autodiff"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext&) override {
    if (absl::Status s = AppendBackward(&graph); !s.ok()) return s;
    return true;
  }
};

}  // namespace strata

#endif  // STRATA_COMPILER_AUTODIFF_H_
