#ifndef STRATA_TOOLS_MODEL_GEN_H_
#define STRATA_TOOLS_MODEL_GEN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

struct GenOptions {
  std::vector<int64_t> layers = {784, 256, 128, 100, 10};  // mlp: widths, input first, classes last
  int stages = 1;          // placements gpu:0 .. gpu:K-1: contiguous layers, balanced by estimated work
  std::string optimizer;   // sgd | momentum | adam | adamw; empty: adam (adamw for gpt)
  double learning_rate = 0;        // 0: the optimizer's usual default
  bool cosine = true;
  int blocks = 4;          // resmlp: residual blocks; width = layers[1]; gpt: transformer blocks
  double dropout = 0;      // dropout probability: mlp, resmlp, convnet and alexnet after each hidden
                           // layer; gpt after the embeddings, attention's projection and the MLP's
  std::string dtype = "F32";
  // gpt: GPT-2 124M's sizes by default.
  int64_t d_model = 768;
  int64_t heads = 12;
  int64_t seq = 1024;      // tokens per sample (the tokens and targets feeds' T)
  int64_t vocab = 50257;
  // gpt: the MLP's activation, "tanh" (GPT-2's own gelu_new, and what
  // cuBLASLt's GELU epilogue computes, so fuse-epilogues can fuse it) or
  // "erf" (the exact form, torch's nn.GELU() default).
  std::string gelu = "tanh";
};

// Program text for a model family: mlp, convnet, alexnet, resmlp, gpt.
absl::StatusOr<std::string> GenerateProgram(const std::string& model, const GenOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_MODEL_GEN_H_
