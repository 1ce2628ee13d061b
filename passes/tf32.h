#ifndef STRATA_PASSES_TF32_H_
#define STRATA_PASSES_TF32_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// The strategy's `allow_tf32: true`, for plans made for a GPU: every matmul
// of the family (matmul, its shared-b gradients, matmul_accumulate,
// matmul_bias, matmul_bias_gelu, matmul_gelu_grad) whose operands are F32 gets `allow_tf32:
// true`, and its CUDA kernel asks cuBLASLt for CUBLAS_COMPUTE_32F_FAST_TF32. A per-op precision,
// as XLA's dot carries its PrecisionConfig: the plan says which GEMMs may
// round, where PyTorch's flag is process-wide. Runs last in the program
// pipeline, so the gradients autodiff made are marked too (the micro-batch
// pass keeps the attr when it turns a gradient into matmul_accumulate).
class Tf32Pass : public Pass {
 public:
  std::string name() const override { return "tf32"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_TF32_H_
