#ifndef STRATA_PASSES_COMMUTE_CASTS_H_
#define STRATA_PASSES_COMMUTE_CASTS_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// Casts commuted with the ops that only move elements, on the forward
// program right after mixed precision (before autodiff), so the moves run
// in the low dtype on half the bytes. A rounding cast commutes with a move
// exactly (it rounds each element alone), so the program computes the same
// bits:
//
//   - A cast down (F32 -> BF16/F16) whose input only it reads, written by a
//     transpose, reshape or flatten, moves above that op: the op then moves
//     the cast copy of its input. Through a split, when every output of the
//     split is read only by such a cast to the same dtype: one cast of the
//     split's input, and the split writes the casts' outputs.
//   - A cast down of a cast up of a low-dtype var is that var (a cast up is
//     exact, and the cast down of an exact value gives it back).
//
// A GPT under BF16 casts q, k and v to bf16 after their split and
// transposes; after this pass one cast of the qkv projection's output comes
// first and the split and transposes move bf16. The attention output's cast
// up, transpose, reshape and cast down for the projection become a bf16
// transpose and reshape. Autodiff then writes their gradients in bf16 too.
// The loss, fetches and persistent vars are never rewritten.
//
// On a GPU plan under mixed precision it runs a second time, as
// "commute-casts-backward", after the epilogue fusion: autodiff writes the
// gradient of each cast as a cast back, so a bf16 gradient cast up to float
// for a bias add's sum (the qkv projection's) and down again for the
// matmul's gradient is a round trip once the fusion sums the bias from the
// bf16 gradient itself; the same rules drop it and move the backward's
// casts above its moves.
class CommuteCastsPass : public Pass {
 public:
  explicit CommuteCastsPass(std::string name = "commute-casts") : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;

 private:
  std::string name_;
};

}  // namespace strata

#endif  // STRATA_PASSES_COMMUTE_CASTS_H_
