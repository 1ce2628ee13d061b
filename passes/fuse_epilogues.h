#ifndef STRATA_PASSES_FUSE_EPILOGUES_H_
#define STRATA_PASSES_FUSE_EPILOGUES_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// Epilogue fusion, on the whole program after autodiff and recompute, for
// plans made for a GPU (--device gpu): each `matmul` whose output only an
// `add` of a 1-D bias [N] reads becomes one `matmul_bias` writing the add's
// output, the bias added in the GEMM's epilogue (cuBLASLt's BIAS) instead of
// a second pass over y, and the product itself never stored. Under mixed
// precision the pattern is matmul (BF16) -> cast to F32 -> add, and the fused
// op takes the BF16 operands straight to an F32 y: one GEMM, no cast, no
// BF16 rounding of the product.
//
// Fused only when the matmul has a 2-D b and no transpose_a (the GEMM over a's
// folded rows), the product and its F32 cast have no other reader, and the
// ops share stage and role. Backward is untouched: no gradient op reads the
// product (the add's gradient is dy itself, the bias's a sum of dy), so the
// fusion changes no other op. On the CPU the fused kernel adds the bias after
// the GEMM, the bits of matmul then add (the fusion test's parity holds bit
// for bit there).
class FuseEpiloguesPass : public Pass {
 public:
  std::string name() const override { return "fuse-epilogues"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_FUSE_EPILOGUES_H_
