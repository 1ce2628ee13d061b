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
//
// A matmul_bias whose output z only a tanh-form gelu reads (besides the
// backward's gelu_grad of that form) becomes, with the gelu, one
// matmul_bias_gelu writing the gelu's y and z, cuBLASLt's GELU_AUX_BIAS
// epilogue (its GELU is the tanh form; the erf form is left as it is). z
// keeps its name for the gelu_grad. On the CPU the fused kernel is
// matmul_bias's then gelu's: the unfused bits. Under mixed precision the
// gelu runs in 16 bits (passes/mixed_precision): matmul_bias's F32 output
// is cast down for it and for the backward's gelu_grad. The fused op then
// writes the gelu's 16-bit y and the 16-bit z (out_dtype and z_dtype:
// cuBLASLt's D and aux in one type, the only aux type it documents beside
// a 16-bit D), and the F32 z and its cast go; y becomes the gelu of the float
// z rather than of its rounding (one bf16 rounding fewer, as the fused
// GEMMs drop the product's).
//
// Its backward fuses too: a tanh-form gelu_grad(z, g) whose dy g is the
// output of a matmul (a 2-D b, no transpose_a: the GEMM of the gelu's
// output gradient, dh = dy @ W^T) that nothing else reads becomes one
// matmul_gelu_grad(a, b, z) in the matmul's place, cuBLASLt's DGELU
// epilogue (the derivative applied to the product before it is stored, z
// its aux), and g is never written. z, g and the gelu_grad's output share
// the matmul's dtype (F32, F64, or mixed precision's 16-bit gelu), the
// gelu_grad has no out_dtype, z is written once (before the matmul, or,
// recomputed, after it: then the fused op takes the gelu_grad's place). On the
// CPU the fused kernel keeps the product in T and applies gelu_grad's
// function: in F32/F64 the unfused bits; for 16-bit operands the product
// is no longer rounded to 16 bits first.
//
// A residual connection's add goes into the GEMM too (after the gelu
// fusion): a matmul_bias whose F32/F64 output y only an add(r, y) or
// add(y, r) reads, r of y's exact shape and dtype (no broadcasting), becomes
// a matmul_bias with r as its optional `residual` input, writing the add's
// output (cuBLASLt's C with beta 1: D = a @ op(b) + bias + r in one GEMM
// where the add made a second pass over y and r). Only where r is written
// once, by an op before the matmul_bias (the fused op reads it where the
// matmul_bias stands), y is an activation the program does not report, the
// add's output is written once, and the two ops share stage and role; not
// with out_dtype (fold-casts leaves a matmul_bias with a residual float).
// Under mixed precision the BF16 projections' F32 y fuse the same way. The
// backward is untouched: no gradient op reads y (the add's gradient is its
// dy itself). On the CPU the fused kernel adds r + y in y's type after the
// bias: the bits of matmul_bias then add. A GPT block's attention and MLP
// output projections both take the residual stream's add.
//
// The bias gradient goes into the weight gradient's GEMM the same way (after
// the forward fusion): sum_to_like(dy, bias) to a 1-D [N] and the weight
// gradient's GEMM over the same dy (matmul_shared_b_grad_b(x, dy) without
// transpose_a, or a 2-D matmul with transpose_a alone, x^T @ dy or
// dy^T @ x), in one stage and role, become one matmul_bias_grad_b writing
// both outputs (cuBLASLt's BGRAD epilogue sums the dy operand it reads).
// Under mixed precision the GEMM reads dy's cast to BF16/F16 and its
// product is cast back to F32: the fused op takes the 16-bit x and dy to
// F32 dW and dbias, so dW is no longer rounded to 16 bits, and dbias sums
// the 16-bit dy (in float) where the unfused sum read the F32 dy. Fused only
// where every reader of the bias gradient comes after the GEMM (the fused op
// takes the GEMM's place), and not for a 2-D F32/F64 matmul's weight
// gradient when the plan sums gradients over micro-batches or merged steps
// (the micro-batch pass makes that GEMM a matmul_accumulate). On the CPU the fused kernel runs the unfused
// ops' GEMM and sum: in float32 the bits of the unfused program.
//
// A residual connection's gradient sum, add_n(r, p) where p is a
// layer_norm_grad's dx that nothing else reads, becomes that
// layer_norm_grad's `residual` input: it writes r + its dx, the add_n's sum
// in the add_n's type (the same bits), instead of a second pass reading
// both. Only where r is written once and before the layer_norm_grad. A GPT
// block's two layer-norm gradients both take the residual stream's.
class FuseEpiloguesPass : public Pass {
 public:
  std::string name() const override { return "fuse-epilogues"; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_FUSE_EPILOGUES_H_
