#ifndef STRATA_KERNELS_CONV2D_GEOMETRY_H_
#define STRATA_KERNELS_CONV2D_GEOMETRY_H_

// conv2d's attrs, geometry and run-time shape checks, shared by the CPU
// kernels (kernels/cpu/conv2d.cc) and the CUDA kernels
// (kernels/cuda/cuda_conv_ops.cc), so both read the same attrs, compute the
// same output size and refuse the same inputs with the same words.

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
namespace conv2d {

// Everything about one convolution's geometry.
struct ConvGeometry {
  int64_t n, c, h, w;  // input
  int64_t o, kh, kw;   // filter [O, C/groups, kh, kw]
  int64_t ho, wo;      // output
  int64_t sh, sw, ph, pw, dh, dw, groups;

  int64_t pixels() const { return ho * wo; }        // P: output positions per image
  int64_t col_rows() const { return c * kh * kw; }  // rows of the im2col matrix
  int64_t group_rows() const { return col_rows() / groups; }
  int64_t group_out() const { return o / groups; }
};

struct ConvAttrs {
  std::vector<int64_t> strides, paddings, dilations;
  int64_t groups = 1;
};

inline absl::Status ReadConvAttrs(const Op& op, ConvAttrs* a) {
  auto s = AttrInts(op, "strides");
  if (!s.ok()) return s.status();
  auto p = AttrInts(op, "paddings");
  if (!p.ok()) return p.status();
  auto d = AttrInts(op, "dilations");
  if (!d.ok()) return d.status();
  auto g = AttrInt(op, "groups");
  if (!g.ok()) return g.status();
  if (s->size() != 2 || p->size() != 2 || d->size() != 2 || *g < 1) {
    return absl::InternalError(absl::StrCat(op.type(), ": attrs were not validated by the shape function"));
  }
  a->strides = *s;
  a->paddings = *p;
  a->dilations = *d;
  a->groups = *g;
  return absl::OkStatus();
}

// Geometry of x [N, C, H, W] * filter [O, C/groups, kh, kw]; an error if the
// run-time shapes disagree with what the shape function accepted.
inline absl::StatusOr<ConvGeometry> MakeGeometry(const ConvAttrs& a, const Shape& x, const Shape& filter,
                                                 const char* op) {
  ConvGeometry g;
  if (x.size() != 4 || filter.size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": expected rank-4 input and filter, got ", ShapeString(x),
                                                   " and ", ShapeString(filter)));
  }
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.o = filter[0], g.kh = filter[2], g.kw = filter[3];
  g.sh = a.strides[0], g.sw = a.strides[1];
  g.ph = a.paddings[0], g.pw = a.paddings[1];
  g.dh = a.dilations[0], g.dw = a.dilations[1];
  g.groups = a.groups;
  g.ho = WindowOutExtent(g.h, g.kh, g.sh, g.ph, g.dh);
  g.wo = WindowOutExtent(g.w, g.kw, g.sw, g.pw, g.dw);
  if (g.c != filter[1] * g.groups || g.o % g.groups != 0 || g.ho < 1 || g.wo < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": input ", ShapeString(x), " and filter ",
                                                   ShapeString(filter), " do not convolve with groups=", g.groups));
  }
  return g;
}

// conv2d_grad_input's geometry from dy [N, O, Ho, Wo], w and input_size, with its checks.
inline absl::StatusOr<ConvGeometry> GradInputGeometry(const ConvAttrs& a, const std::vector<int64_t>& input_size,
                                                      const Tensor& dy, const Tensor& w) {
  if (dy.rank() != 4 || w.rank() != 4) {
    return absl::InvalidArgumentError(absl::StrCat("conv2d_grad_input: expected rank-4 dy and w, got ",
                                                   ShapeString(dy.shape()), " and ", ShapeString(w.shape())));
  }
  const Shape xs{dy.dim(0), w.dim(1) * a.groups, input_size[0], input_size[1]};
  STRATA_ASSIGN_OR_RETURN(ConvGeometry g, MakeGeometry(a, xs, w.shape(), "conv2d_grad_input"));
  if (dy.dim(1) != g.o || dy.dim(2) != g.ho || dy.dim(3) != g.wo) {
    return absl::InvalidArgumentError(absl::StrCat("conv2d_grad_input: dy ", ShapeString(dy.shape()),
                                                   " is not the output of an input ", ShapeString(xs)));
  }
  return g;
}

// conv2d_grad_filter's geometry from x, dy [N, O, Ho, Wo] and filter_size, with its checks.
inline absl::StatusOr<ConvGeometry> GradFilterGeometry(const ConvAttrs& a, const std::vector<int64_t>& filter_size,
                                                       const Tensor& x, const Tensor& dy) {
  if (x.rank() != 4 || dy.rank() != 4 || x.dim(1) % a.groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat("conv2d_grad_filter: bad x ", ShapeString(x.shape()), " or dy ",
                                                   ShapeString(dy.shape())));
  }
  const Shape ws{dy.dim(1), x.dim(1) / a.groups, filter_size[0], filter_size[1]};
  STRATA_ASSIGN_OR_RETURN(ConvGeometry g, MakeGeometry(a, x.shape(), ws, "conv2d_grad_filter"));
  if (dy.dim(0) != g.n || dy.dim(2) != g.ho || dy.dim(3) != g.wo) {
    return absl::InvalidArgumentError(absl::StrCat("conv2d_grad_filter: dy ", ShapeString(dy.shape()),
                                                   " is not the output for x ", ShapeString(x.shape())));
  }
  return g;
}

// The geometry of a conv kernel's KernelDef (its input types and attrs), for
// the workspace functions of the memory plan.
inline absl::StatusOr<ConvGeometry> DefGeometry(const KernelDef& def) {
  const Op& op = *def.op;
  ConvAttrs attrs;
  STRATA_RETURN_IF_ERROR(ReadConvAttrs(op, &attrs));
  if (def.input_types.size() != 2) return absl::InvalidArgumentError(absl::StrCat(op.type(), ": expected 2 inputs"));
  const Shape& a = def.input_types[0].shape;
  const Shape& b = def.input_types[1].shape;
  if (a.size() != 4 || b.size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(op.type(), ": expected rank-4 inputs"));
  }
  Shape x = a, w = b;
  if (op.type() == "conv2d_grad_input") {
    STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> size, AttrInts(op, "input_size"));
    if (size.size() != 2) return absl::InternalError(absl::StrCat(op.type(), ": attr 'input_size' was not validated"));
    x = Shape{a[0], b[1] * attrs.groups, size[0], size[1]};
  } else if (op.type() == "conv2d_grad_filter") {
    STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> size, AttrInts(op, "filter_size"));
    if (size.size() != 2) {
      return absl::InternalError(absl::StrCat(op.type(), ": attr 'filter_size' was not validated"));
    }
    w = Shape{b[1], a[1] / attrs.groups, size[0], size[1]};
  }
  return MakeGeometry(attrs, x, w, op.type().c_str());
}

}  // namespace conv2d
}  // namespace strata

#endif  // STRATA_KERNELS_CONV2D_GEOMETRY_H_
