#ifndef STRATA_PASSES_ATTENTION_LAYOUT_H_
#define STRATA_PASSES_ATTENTION_LAYOUT_H_

#include "absl/status/statusor.h"
#include "compiler/pass.h"
#include "proto/program.pb.h"

namespace strata {

// The transposes around attention dropped: on the forward program before
// autodiff (after mixed precision and commute-casts, so it sees the final
// forward ops), a scaled_dot_product_attention of layout "bhtd" whose q, k
// and v are each written by a transpose perm (0, 2, 1, 3) that only it reads
// and whose output y only a transpose perm (0, 2, 1, 3) reads becomes one of
// layout "bthd" that reads the transposes' inputs ([B, T, H, D], a
// projection's heads as they lie) and writes the output transpose's var;
// the four transposes go. GPT's attention (nanoGPT's
// view -> transpose(1, 2) -> attention -> transpose(1, 2)) is that pattern;
// autodiff then writes a "bthd" gradient op and no transposes in the
// backward. The "bthd" kernels do the same arithmetic as "bhtd" in the same
// order, so the program computes the same bits. lse ([B, H, T] in both
// layouts) keeps its readers. Vars the program reports (the loss, fetches)
// and persistent vars are never dropped, so a transpose writing one stays
// and so does its attention's layout.
//
// On GPU plans only the attention the tensor-core flash kernels take is
// rewritten (16-bit q, k, v with heads of 32, 64 or 128: FlashEligible in
// kernels/attention_budget.h); the other paths would copy the layout
// through scratch.
class AttentionLayoutPass : public Pass {
 public:
  explicit AttentionLayoutPass(DeviceKind device = DEVICE_CPU) : device_(device) {}
  std::string name() const override { return "attention-layout"; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;

 private:
  DeviceKind device_;
};

}  // namespace strata

#endif  // STRATA_PASSES_ATTENTION_LAYOUT_H_
