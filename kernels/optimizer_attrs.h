#ifndef STRATA_KERNELS_OPTIMIZER_ATTRS_H_
#define STRATA_KERNELS_OPTIMIZER_ATTRS_H_

// The optimizer ops' attrs read from an Op, once for the CPU and the CUDA
// kernels (their Init), with the same refusals on both devices.

#include "absl/status/statusor.h"
#include "kernels/optimizer_math.h"
#include "proto/program.pb.h"
#include "proto/types.h"

namespace strata {

absl::StatusOr<kernel_math::SgdAttrs> ReadSgdAttrs(const Op& op);
absl::StatusOr<kernel_math::MomentumAttrs> ReadMomentumAttrs(const Op& op);
absl::StatusOr<kernel_math::AdamAttrs> ReadAdamAttrs(const Op& op);

// An update op's attr grad_scale (global-norm clipping's coefficient folded
// into the update: the op reads grad * its grad_scale input); false where a
// plan from before the attr has none.
bool ScalesGrad(const Op& op);

// An update op's attr copy_dtype: DT_INVALID for none (empty, or a plan from
// before the attr), else BF16 or F16: the op also writes its last output,
// the updated param converted as the cast kernel converts it (the
// mixed-precision weight copy, passes/hoist_param_casts.h).
absl::StatusOr<DataType> ReadCopyDtype(const Op& op);

// lr_schedule's schedule and its output dtype (attr `dtype`: F32 or F64).
struct LrScheduleAttrs {
  kernel_math::LrSchedule schedule;
  DataType dtype = F32;
};
absl::StatusOr<LrScheduleAttrs> ReadLrScheduleAttrs(const Op& op);

}  // namespace strata

#endif  // STRATA_KERNELS_OPTIMIZER_ATTRS_H_
