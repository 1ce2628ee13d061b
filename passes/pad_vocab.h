#ifndef STRATA_PASSES_PAD_VOCAB_H_
#define STRATA_PASSES_PAD_VOCAB_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// Pads the vocabulary of an LM head on GPU plans, as Megatron's
// make-vocab-size-divisible-by and nanoGPT's 50304 do, but without
// changing the model: GPT-2's 50257 logits a row make rows that start
// off 16-byte boundaries, which cuBLASLt runs at a fraction of its speed
// or LtGemm copies through padded scratch (kernels/gemm_staging.h), three
// times a step for [8192, 50257]. Where a matmul's output is read only by
// softmax_cross_entropy (the logits), on the same stage, its rows are not
// a multiple of 16 bytes, and its weight has at least 2^20 elements (a
// vocabulary's embedding, not a classifier's few columns):
//
//   logits = matmul(x, w)                        w [V, K] with transpose_b, else [K, V]
//   loss = softmax_cross_entropy(logits, label)
//
// becomes
//
//   w@pad = pad(w, axis, V' - V)                 zeros after the V classes
//   logits@pad = matmul(x, w@pad)                [..., V'], V' = V rounded up to 64
//   loss = softmax_cross_entropy(logits@pad, label, classes: V)
//
// The padding columns are zero and never read by the loss (its `classes`),
// whose gradient is zero there, so x's and w's gradients are the unpadded
// ones (the pad's gradient is a slice of w@pad's). Runs on the forward
// program before autodiff, after mixed precision. Every other column is the
// same dot product, but a GEMM library may take other kernels, and so other
// summation orders, for the wider shape (OpenBLAS's edge kernels, the CPU
// pool's panels; a GPU's algorithms), so the padded plan trains what the
// unpadded one trains up to rounding
// (MixedPrecisionTrainTest.PaddedVocabTrainsWhatTheUnpaddedHeadTrains).
class PadVocabPass : public Pass {
 public:
  std::string name() const override { return "pad-vocab"; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

// V rounded up to the multiple of 64 the pass pads to.
int64_t PaddedVocab(int64_t v);

}  // namespace strata

#endif  // STRATA_PASSES_PAD_VOCAB_H_
