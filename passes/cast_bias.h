#ifndef STRATA_PASSES_CAST_BIAS_H_
#define STRATA_PASSES_CAST_BIAS_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// The F32 bias of each fused GEMM that stores 16 bits, cast to that 16-bit
// type first, as torch autocast casts a linear layer's bias with its
// weight: GPU plans under mixed precision, on the whole program after
// fold-casts (whose out_dtype makes the qkv projection's GEMM store 16
// bits; the MLP's matmul_bias_gelu stores its 16-bit y and z from
// fuse-epilogues on, mixed precision running its gelu in 16 bits).
//
// A matmul_bias with out_dtype BF16/F16 (no residual), or a
// matmul_bias_gelu whose y and z are both 16-bit (out_dtype and z_dtype:
// mixed precision's gelu), reads a `cast` of its F32 bias into the
// operands' type instead, and drops the attrs: y (and z) are then of the
// bias's type (compiler/ops/matmul_ops.cc). The GEMM then takes D, aux and
// bias of one 16-bit type, the combination cuBLASLt documents for every
// epilogue and PyTorch's bf16 linear passes it; cuBLASLt refuses a float
// bias beside a 16-bit D at GPT-2's qkv (N 2304) and MLP (N 3072) shapes,
// where those GEMMs ran as two passes (the GEMM into float scratch, then a
// cast): about 1.2 ms of a 22.5 ms GPT-2 124M step on an H200.
//
// This changes the numbers, deliberately: y = round(a @ op(b) +
// round(bias)) in place of round(a @ op(b) + bias), the bias rounded to 16
// bits once (bf16's 8 bits of mantissa) as PyTorch rounds it. The gradient
// does not change: the pass runs after autodiff, so the bias's gradient is
// still the float sum of dy and its master weight float (a straight-through
// cast). The cast is an op of the forward, once per bias on each stage
// (a recomputed op reads the forward's), so hoist-param-casts moves it to
// the update's end where a plan runs several micro-batches an update or
// merges gradients; with one micro-batch an update it stays in the
// forward, recompute or not (its one cast is once an update already; a
// recomputed GEMM reads its output, N elements held through the step).
// Optional
// (--disable_passes cast-bias keeps the float bias and its two-pass
// GEMMs); CPU plans have no fused GEMMs, so it is not among their passes.
class CastBiasPass : public Pass {
 public:
  std::string name() const override { return "cast-bias"; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_CAST_BIAS_H_
