#ifndef STRATA_PASSES_PACK_QKV_H_
#define STRATA_PASSES_PACK_QKV_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// Attention reads the qkv projection in place (FlashAttention's qkvpacked
// form), on the forward program after attention-layout and before
// autodiff: a scaled_dot_product_attention of layout "bthd" whose q, k and
// v are the reshapes to [B, T, H, D] of outputs 0, 1 and 2 of one `split`
// of X [B, T, 3 * H * D] along its last axis into three equal sections
// becomes a `reshape` of X to [B, T, 3, H, D] (a view: no copy) and one
// scaled_dot_product_attention_qkv reading it, writing the same y and lse.
// The split and the three reshapes go. Autodiff then writes one
// scaled_dot_product_attention_qkv_grad whose dqkv is X's gradient's view,
// so the backward's three reshapes and the concat of dq, dk and dv go too:
// a GPT block loses a copy of its q, k and v each way (the split and the
// concat; 0.9 ms of GPT-2 124M's step on an H200, 2026-11-27). The packed
// kernels do the unpacked ones' arithmetic in the same order on rows
// 3 * H * D apart, so the program computes the same bits.
//
// Only where the split's outputs and the reshapes' outputs are each read
// by that one op, written once, activations the program does not report
// and no recompute checkpoint, all on the attention's stage. On a CPU plan
// any such attention (the CPU kernel reads every packed qkv in place); on a
// GPU plan (where it runs only with the tensor-core attention on) only the
// attention the flash kernels take (16-bit q with heads of 32, 64 or 128:
// FlashEligible in kernels/attention_budget.h), which read the packed
// layout in place (the other GPU paths, and more than 65535 batch x heads,
// unpack it through scratch: correct, the split's copies again). A GPT's
// attention (nanoGPT's split -> view -> transpose, after attention-layout
// dropped the transposes) is that pattern.
class PackQkvPass : public Pass {
 public:
  // device: the plans' (DEVICE_CUDA packs only what the flash kernels take).
  explicit PackQkvPass(DeviceKind device = DEVICE_CPU) : device_(device) {}
  std::string name() const override { return "pack-qkv"; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;

 private:
  DeviceKind device_;
};

}  // namespace strata

#endif  // STRATA_PASSES_PACK_QKV_H_
