#include "kernels/optimizer_attrs.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "proto/status_macros.h"
#include "runtime/kernel.h"

namespace strata {

absl::StatusOr<kernel_math::SgdAttrs> ReadSgdAttrs(const Op& op) {
  kernel_math::SgdAttrs a;
  STRATA_ASSIGN_OR_RETURN(a.weight_decay, AttrFloat(op, "weight_decay"));
  return a;
}

absl::StatusOr<kernel_math::MomentumAttrs> ReadMomentumAttrs(const Op& op) {
  kernel_math::MomentumAttrs a;
  STRATA_ASSIGN_OR_RETURN(a.momentum, AttrFloat(op, "momentum"));
  STRATA_ASSIGN_OR_RETURN(a.nesterov, AttrBool(op, "nesterov"));
  STRATA_ASSIGN_OR_RETURN(a.weight_decay, AttrFloat(op, "weight_decay"));
  return a;
}

absl::StatusOr<kernel_math::AdamAttrs> ReadAdamAttrs(const Op& op) {
  kernel_math::AdamAttrs a;
  STRATA_ASSIGN_OR_RETURN(a.beta1, AttrFloat(op, "beta1"));
  STRATA_ASSIGN_OR_RETURN(a.beta2, AttrFloat(op, "beta2"));
  STRATA_ASSIGN_OR_RETURN(a.epsilon, AttrFloat(op, "epsilon"));
  STRATA_ASSIGN_OR_RETURN(a.weight_decay, AttrFloat(op, "weight_decay"));
  STRATA_ASSIGN_OR_RETURN(a.decoupled, AttrBool(op, "decoupled"));
  return a;
}

bool ScalesGrad(const Op& op) {
  auto it = op.attr().find("grad_scale");
  return it != op.attr().end() && it->second.b();
}

absl::StatusOr<DataType> ReadCopyDtype(const Op& op) { return SixteenBitDtypeAttr(op, "copy_dtype"); }

absl::StatusOr<LrScheduleAttrs> ReadLrScheduleAttrs(const Op& op) {
  LrScheduleAttrs a;
  kernel_math::LrSchedule& s = a.schedule;
  std::string dtype, kind;
  STRATA_ASSIGN_OR_RETURN(dtype, AttrString(op, "dtype"));
  STRATA_ASSIGN_OR_RETURN(kind, AttrString(op, "kind"));
  STRATA_ASSIGN_OR_RETURN(s.base_lr, AttrFloat(op, "base_lr"));
  STRATA_ASSIGN_OR_RETURN(s.warmup_steps, AttrInt(op, "warmup_steps"));
  STRATA_ASSIGN_OR_RETURN(s.decay_steps, AttrInt(op, "decay_steps"));
  STRATA_ASSIGN_OR_RETURN(s.alpha, AttrFloat(op, "alpha"));
  STRATA_ASSIGN_OR_RETURN(s.step_size, AttrInt(op, "step_size"));
  STRATA_ASSIGN_OR_RETURN(s.gamma, AttrFloat(op, "gamma"));
  if (dtype == "F32") {
    a.dtype = F32;
  } else if (dtype == "F64") {
    a.dtype = F64;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("lr_schedule: attr 'dtype' must be F32 or F64, got ", dtype));
  }
  if (kind == "constant") {
    s.kind = kernel_math::LrScheduleKind::kConstant;
  } else if (kind == "cosine") {
    s.kind = kernel_math::LrScheduleKind::kCosine;
  } else if (kind == "step") {
    s.kind = kernel_math::LrScheduleKind::kStep;
    if (s.step_size < 1) return absl::InvalidArgumentError("lr_schedule: attr 'step_size' must be >= 1");
  } else {
    return absl::InvalidArgumentError(absl::StrCat("lr_schedule: unknown attr 'kind' \"", kind, "\""));
  }
  if (s.warmup_steps < 0) return absl::InvalidArgumentError("lr_schedule: attr 'warmup_steps' must be >= 0");
  return a;
}

}  // namespace strata
