#ifndef STRATA_PASSES_FUSE_OPTIMIZER_H_
#define STRATA_PASSES_FUSE_OPTIMIZER_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// Multi-tensor optimizer fusion, last in the per-rank pipeline of plans made
// for a GPU (--device gpu), after the optimizer pass made one update op per
// parameter and loss scaling, gradient merge and data parallel rewired them:
// the sgd_update / momentum_update / adam_update ops that agree on type,
// attrs, scalar inputs (lr, adam's step, loss scaling's found_inf), dtype,
// stage, role and device become one sgd_update_multi / momentum_update_multi
// / adam_update_multi (compiler/ops/optimizer_ops.cc), as apex's
// multi_tensor_apply and torch's fused AdamW do: one launch for what was one
// per parameter (about 150 on GPT-2 124M).
//
// The multi op takes the place of the group's LAST member, where every
// member's gradient is ready. A group is closed before an op that would see
// the difference: an op between its members that reads a var a member
// before it wrote (a parameter or state, updated early before fusion and
// late after) or writes a var a member before it read; and before a member
// that reads or writes what an earlier member wrote or writes what an
// earlier one read. A group of one stays as it was. Updates that write
// their param's 16-bit copy (attr copy_dtype, passes/hoist_param_casts.h)
// group with those of the same copy dtype, their copies the multi op's last
// n outputs. Each member's math is the
// single op's, so the fused plan trains bit for bit like the unfused one
// (tests/fuse_optimizer_parity_test.cc).
class FuseOptimizerPass : public Pass {
 public:
  // max_group_size: at most this many updates in one multi op (0: no bound).
  explicit FuseOptimizerPass(int max_group_size = 0) : max_group_size_(max_group_size) {}
  std::string name() const override { return "fuse-optimizer"; }
  bool optional() const override { return true; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;

 private:
  int max_group_size_;
};

}  // namespace strata

#endif  // STRATA_PASSES_FUSE_OPTIMIZER_H_
