#ifndef STRATA_KERNELS_POOL2D_ATTRS_H_
#define STRATA_KERNELS_POOL2D_ATTRS_H_

// The pooling ops' attrs, geometry and run-time shape checks, shared by the
// CPU kernels (kernels/cpu/pool2d.cc) and the CUDA kernels
// (kernels/cuda/cuda_conv_ops.cc), so both read the same attrs and refuse the
// same inputs with the same words.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "proto/shape_rules.h"
#include "proto/status_macros.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace pool2d {

// planes = N * C; input H x W, output Ho x Wo; window kh x kw, strides, paddings.
struct PoolGeometry {
  int64_t planes, h, w, ho, wo;
  int64_t kh, kw, sh, sw, ph, pw;
};

struct PoolAttrs {
  std::vector<int64_t> kernel, strides, paddings;
  bool exclusive = false;

  absl::Status Read(const Op& op) {
    auto k = AttrInts(op, "kernel_size");
    if (!k.ok()) return k.status();
    auto s = AttrInts(op, "strides");
    if (!s.ok()) return s.status();
    auto p = AttrInts(op, "paddings");
    if (!p.ok()) return p.status();
    kernel = *k;
    strides = s->empty() ? *k : *s;
    paddings = *p;
    bool valid = kernel.size() == 2 && strides.size() == 2 && paddings.size() == 2;
    for (size_t i = 0; valid && i < 2; ++i) {
      // A window lying wholly in the padding would have no element to pick.
      valid = kernel[i] >= 1 && strides[i] >= 1 && paddings[i] >= 0 && 2 * paddings[i] <= kernel[i];
    }
    if (!valid) {
      return absl::InternalError(absl::StrCat(op.type(), ": attrs were not validated by the shape function"));
    }
    if (op.attr().count("exclusive")) {
      auto e = AttrBool(op, "exclusive");
      if (!e.ok()) return e.status();
      exclusive = *e;
    }
    return absl::OkStatus();
  }

  // Geometry for an input [N, C, H, W]; an error if the window does not fit.
  absl::StatusOr<PoolGeometry> Geometry(const Shape& x, const char* op) const {
    if (x.size() != 4) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": expected an [N, C, H, W] input, got ", ShapeString(x)));
    }
    PoolGeometry g{x[0] * x[1], x[2], x[3], 0, 0, kernel[0], kernel[1], strides[0], strides[1], paddings[0],
                   paddings[1]};
    if (g.h + 2 * g.ph < g.kh || g.w + 2 * g.pw < g.kw) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": window ", g.kh, "x", g.kw, " exceeds the padded input ",
                                                     ShapeString(x)));
    }
    g.ho = WindowOutExtent(g.h, g.kh, g.sh, g.ph);
    g.wo = WindowOutExtent(g.w, g.kw, g.sw, g.pw);
    return g;
  }
};

// max_pool2d_grad's geometry of x, with its check that dy has the pooled shape.
inline absl::StatusOr<PoolGeometry> MaxPoolGradGeometry(const PoolAttrs& attrs, const Tensor& x, const Tensor& dy) {
  STRATA_ASSIGN_OR_RETURN(PoolGeometry g, attrs.Geometry(x.shape(), "max_pool2d_grad"));
  if (dy.shape() != Shape{x.dim(0), x.dim(1), g.ho, g.wo}) {
    return absl::InvalidArgumentError(absl::StrCat("max_pool2d_grad: dy ", ShapeString(dy.shape()),
                                                   " is not the pooled shape of x ", ShapeString(x.shape())));
  }
  return g;
}

// avg_pool2d_grad's input shape [N, C, input_size] for dy, and its geometry,
// with its checks of dy.
inline absl::StatusOr<PoolGeometry> AvgPoolGradGeometry(const PoolAttrs& attrs, const std::vector<int64_t>& input_size,
                                                        const Tensor& dy, Shape* xs) {
  if (dy.rank() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("avg_pool2d_grad: expected an [N, C, Ho, Wo] dy, got ", ShapeString(dy.shape())));
  }
  *xs = Shape{dy.dim(0), dy.dim(1), input_size[0], input_size[1]};
  STRATA_ASSIGN_OR_RETURN(PoolGeometry g, attrs.Geometry(*xs, "avg_pool2d_grad"));
  if (dy.dim(2) != g.ho || dy.dim(3) != g.wo) {
    return absl::InvalidArgumentError(absl::StrCat("avg_pool2d_grad: dy ", ShapeString(dy.shape()),
                                                   " is not the pooled shape of ", ShapeString(*xs)));
  }
  return g;
}

// Base of the four pooling kernels of either device: reads the pooling attrs.
class PoolAttrsKernel : public OpKernel {
 public:
  explicit PoolAttrsKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) { return attrs_.Read(op); }

 protected:
  PoolAttrs attrs_;
};

}  // namespace pool2d
}  // namespace strata

#endif  // STRATA_KERNELS_POOL2D_ATTRS_H_
