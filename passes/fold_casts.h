#ifndef STRATA_PASSES_FOLD_CASTS_H_
#define STRATA_PASSES_FOLD_CASTS_H_

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// Mixed precision's casts folded into the float32 ops beside them, after
// autodiff (and on GPU plans after the epilogue fusion and the backward's
// cast commuting), so a 16-bit value goes straight into or out of the op
// that computes in float32 without a float32 copy in memory:
//
//   - layer_norm -> cast down: layer_norm writes the 16-bit y itself
//     (out_dtype), the float32 y rounded as the cast rounds it;
//   - gelu_grad -> cast down: gelu_grad writes the 16-bit dx (out_dtype;
//     a float32 gelu's: mixed precision runs gelu in the low dtype, so this
//     and gelu_grad's dy fold below are for a program's own casts around a
//     float32 gelu);
//   - matmul_bias -> cast down, and matmul_bias_gelu's gelu output -> cast
//     down (GPU plans, whose epilogue fusion made them; 16-bit operands, F32
//     bias): the GEMM stores its float result rounded once to the operands'
//     type (out_dtype; cuBLASLt's D in that type), matmul_bias_gelu's
//     pre-activation z staying float for gelu_grad (the gelu fusion itself
//     writes a 16-bit y and z where mixed precision ran the gelu in 16
//     bits). passes/cast_bias then casts such a GEMM's F32 bias to 16 bits
//     and drops its out_dtype (torch autocast's bias; not the same bits,
//     which is why the same-bits tests run with it off);
//   - cast up -> gelu_grad's dy or layer_norm_grad's dy: the op reads the
//     16-bit value and widens it as it loads (exact);
//   - layer_norm_grad's dx -> cast down where other ops read the float32 dx
//     too (the residual stream's gradient, cast for the GEMMs while the
//     next layer_norm_grad reads it as its residual): the op writes both,
//     dx and its 16-bit copy (out_dtype and a fourth output, dx_low), in
//     the same pass over the rows.
//
// Each fold needs the float32 var to be an activation the program does not
// report, written once, read only by the cast (or only by the op, once), on
// the op's stage; layer_norm_grad's dx instead must be written once and
// read by other ops too (it stays; the cast on the op's stage). The kernels
// compute in float32 as before and round through the cast kernel's own
// conversion, so the program computes the same bits
// (MixedPrecisionTrainTest checks losses and weights with and without). A
// BF16 GPT block on a GPU plan loses seven casts: layer_norm's two,
// layer_norm_grad's two dy casts and two dx casts (the residual stream's
// gradient for the output projections' GEMMs; not the first block's first
// layer norm's, whose dx only the embeddings read) and the qkv
// projection's; the float32 copies of the layer-norm outputs, of q, k and
// v, and the layer-norm input gradients never exist, and the residual
// stream's gradient is not read a second time for its cast. On a CPU plan
// four, and the final layer norm's dx once: there is no matmul_bias, and
// the other layer-norm gradients feed add_n alone. (The MLP's gelu and
// gelu_grad read and write 16 bits themselves: no casts.)
class FoldCastsPass : public Pass {
 public:
  std::string name() const override { return "fold-casts"; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_FOLD_CASTS_H_
