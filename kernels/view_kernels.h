#ifndef STRATA_KERNELS_VIEW_KERNELS_H_
#define STRATA_KERNELS_VIEW_KERNELS_H_

// reshape, flatten, reshape_like and identity: the output is a view of the
// input's buffer (in another shape), so one kernel serves every device
// (registered by kernels/cpu/shape_ops.cc and utility.cc for the CPU,
// kernels/cuda/cuda_unary_ops.cc for CUDA). Output shapes come from the schemas' own rules
// (proto/shape_rules.h), so a kernel refuses what its schema refuses, in the
// same words, prefixed with the op's type.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/attr_kernels.h"
#include "proto/shape_rules.h"
#include "proto/status_macros.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace view_kernels {

inline absl::Status OpError(const Op& op, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(op.type(), ": ", message));
}

// Kernels with an Init(const Op&): register with InitFactory.
class ViewKernel : public OpKeepingKernel {
 public:
  using OpKeepingKernel::OpKeepingKernel;

 protected:
  // `out`, or its error naming the op.
  absl::Status SetView(KernelContext& ctx, const Tensor& x, const absl::StatusOr<Shape>& out) {
    if (!out.ok()) return OpError(op_, out.status().message());
    ctx.SetOutput(0, x.Reshaped(*out));
    return absl::OkStatus();
  }

};

class ReshapeKernel : public ViewKernel {
 public:
  using ViewKernel::ViewKernel;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(ViewKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(spec_, AttrInts(op, "shape"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    return SetView(ctx, x, ResolveReshape(x.shape(), spec_));
  }

 private:
  std::vector<int64_t> spec_;
};

class FlattenKernel : public ViewKernel {
 public:
  using ViewKernel::ViewKernel;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(ViewKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(start_, AttrInt(op, "start_axis"));
    STRATA_ASSIGN_OR_RETURN(end_, AttrInt(op, "end_axis"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    return SetView(ctx, x, FlattenShape(x.shape(), start_, end_));
  }

 private:
  int64_t start_ = 0, end_ = 0;
};

// reshape_like(dy, like): dy's buffer in like's shape.
class ReshapeLikeKernel : public ViewKernel {
 public:
  using ViewKernel::ViewKernel;
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& dy = ctx.input(0);
    const Tensor& like = ctx.input(1);
    if (dy.num_elements() != like.num_elements()) {
      return OpError(op_, absl::StrCat("dy ", ShapeString(dy.shape()), " does not fit ", ShapeString(like.shape())));
    }
    ctx.SetOutput(0, dy.Reshaped(like.shape()));
    return absl::OkStatus();
  }
};

// identity: the output is the input, its buffer included.
class IdentityKernel : public OpKernel {
 public:
  explicit IdentityKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    ctx.SetOutput(0, ctx.input(0));
    return absl::OkStatus();
  }
};

}  // namespace view_kernels
}  // namespace strata

#endif  // STRATA_KERNELS_VIEW_KERNELS_H_
