#ifndef STRATA_KERNELS_KERNEL_CHECKS_H_
#define STRATA_KERNELS_KERNEL_CHECKS_H_

// The run-time operand checks the CPU and CUDA kernels share, so both
// devices refuse the same inputs with the same words. Shape inference
// promises what they check; they keep a mismatched feed or a hand-built plan
// from reading out of bounds.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "proto/shape_rules.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace kernel_checks {

// The update ops own their inputs' buffers (persistent vars): writing through
// the const input is the in-place update the schema declares.
template <typename T>
T* MutableData(const Tensor& t) {
  return const_cast<T*>(t.data<T>());
}

// Input i has input `like`'s dtype and element count.
inline absl::Status ExpectLike(const KernelContext& ctx, const char* op, int i, const char* name, int like,
                               const char* like_name) {
  const Tensor& a = ctx.input(i);
  const Tensor& b = ctx.input(like);
  if (a.dtype() != b.dtype() || a.num_elements() != b.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": input '", name, "' is ", DataTypeName(a.dtype()),
                                                   ShapeString(a.shape()), " but '", like_name, "' is ",
                                                   DataTypeName(b.dtype()), ShapeString(b.shape())));
  }
  return absl::OkStatus();
}

// Input i is one element of `dtype`.
inline absl::Status ExpectScalar(const KernelContext& ctx, const char* op, int i, const char* name, DataType dtype) {
  const Tensor& t = ctx.input(i);
  if (t.dtype() != dtype || t.num_elements() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": input '", name, "' must be a ", DataTypeName(dtype),
                                                   " scalar, got ", DataTypeName(t.dtype()),
                                                   ShapeString(t.shape())));
  }
  return absl::OkStatus();
}

// An update op's attr grad_scale input i (clipping's coefficient, a scalar
// of the param's dtype T) where `scaled`: its data, or null without the attr.
template <typename T>
absl::StatusOr<const T*> GradScaleInput(const KernelContext& ctx, const char* op, bool scaled, int i) {
  if (!scaled) return nullptr;
  if (ctx.num_inputs() <= i) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": attr 'grad_scale' needs input 'grad_scale' #", i));
  }
  if (absl::Status s = ExpectScalar(ctx, op, i, "grad_scale", DataTypeOf<T>::value); !s.ok()) return s;
  return ctx.input(i).data<T>();
}

// Input i holds `dtype` (sum_squares: "input #1 is F64, expected F32").
inline absl::Status ExpectInputDtype(const KernelContext& ctx, const char* op, int i, DataType dtype) {
  const Tensor& t = ctx.input(i);
  if (t.dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": input #", i, " is ", DataTypeName(t.dtype()), ", expected ", DataTypeName(dtype)));
  }
  return absl::OkStatus();
}

// Input i, named `name`, holds `dtype` (sum_squares_grad: "input 'x' is F64").
inline absl::Status ExpectNamedInputDtype(const KernelContext& ctx, const char* op, int i, const char* name,
                                          DataType dtype) {
  const Tensor& t = ctx.input(i);
  if (t.dtype() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": input '", name, "' is ", DataTypeName(t.dtype())));
  }
  return absl::OkStatus();
}

// t holds one element ("mse_loss_grad: dloss must be a scalar, got [2]").
inline absl::Status ExpectOneElement(const char* op, const char* name, const Tensor& t) {
  if (t.num_elements() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " must be a scalar, got ", ShapeString(t.shape())));
  }
  return absl::OkStatus();
}

// mse_loss(_grad): pred and target have one dtype and one shape.
inline absl::Status CheckPredAndTarget(const char* op, const Tensor& pred, const Tensor& target) {
  if (pred.shape() != target.shape() || pred.dtype() != target.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": pred ", DataTypeName(pred.dtype()),
                                                   ShapeString(pred.shape()), " and target ",
                                                   DataTypeName(target.dtype()), ShapeString(target.shape()),
                                                   " differ"));
  }
  return absl::OkStatus();
}

// Rows R and classes C of logits [..., C] with I64 labels [...]. The labels'
// values (each in [0, C)) are the caller's to check where it can read them.
inline absl::Status CheckLogitsAndLabelShapes(const char* op, const Tensor& logits, const Tensor& label,
                                              int64_t* rows, int64_t* classes) {
  const int r = logits.rank();
  bool ok = r >= 2 && label.dtype() == I64 && label.rank() == r - 1;
  for (int i = 0; ok && i < r - 1; ++i) ok = logits.dim(i) == label.dim(i);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": label ", DataTypeName(label.dtype()),
                                                   ShapeString(label.shape()), " does not match logits ",
                                                   ShapeString(logits.shape())));
  }
  *classes = logits.dim(r - 1);
  *rows = label.num_elements();
  return absl::OkStatus();
}

// dx = f(a, dy) helpers (sqrt_grad, relu_grad, ...): a and dy have one shape.
inline absl::Status CheckSameShapes(const Tensor& a, const Tensor& dy) {
  if (a.shape() != dy.shape()) {
    return absl::InvalidArgumentError(absl::StrCat("inputs have shapes ", ShapeString(a.shape()), " and ",
                                                   ShapeString(dy.shape()), "; they must match"));
  }
  return absl::OkStatus();
}

// add_n: every input has xs[0]'s shape.
inline absl::Status CheckAddNShapes(const KernelContext& ctx) {
  const Tensor& first = ctx.input(0);
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    if (ctx.input(i).shape() != first.shape()) {
      return absl::InvalidArgumentError(absl::StrCat("xs[", i, "] has shape ", ShapeString(ctx.input(i).shape()),
                                                     " but xs[0] has ", ShapeString(first.shape())));
    }
  }
  return absl::OkStatus();
}

// accumulate: acc and x have one element count.
inline absl::Status CheckAccumulateOperands(const Tensor& acc, const Tensor& x) {
  if (acc.num_elements() != x.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("accumulate: accumulator ", ShapeString(acc.shape()),
                                                   " and value ", ShapeString(x.shape()), " differ"));
  }
  return absl::OkStatus();
}

// fill_scalar's output dtype, from the kernel's one output type.
inline absl::StatusOr<DataType> FillScalarDtype(const KernelDef& def) {
  if (def.output_types.size() != 1) return absl::InvalidArgumentError("fill_scalar: one output");
  return def.output_types[0].dtype;
}

// cast's `dtype` attr: one of the dtypes cast converts to.
inline absl::StatusOr<DataType> CastTarget(const Op& op) {
  absl::StatusOr<std::string> name = AttrString(op, "dtype");
  if (!name.ok()) return name.status();
  DataType dtype = DT_INVALID;
  DataType_Parse(*name, &dtype);
  switch (dtype) {
    case F32:
    case F64:
    case I64:
    case I32:
    case BOOL:
    case BF16:
    case F16:
      return dtype;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("cast: unknown dtype '", *name, "'"));
}

// ---- nn ops (kernels/cpu/softmax.cc, layer_norm.cc, embedding.cc) ---------

// softmax_grad, log_softmax_grad: dy has y's shape.
inline absl::Status CheckSameShapeAsY(const Tensor& y, const Tensor& dy) {
  if (dy.shape() != y.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat("y ", ShapeString(y.shape()), " and dy ", ShapeString(dy.shape()), " must match"));
  }
  return absl::OkStatus();
}

// layer_norm(_grad): gamma (or beta) is [D], D the last dim of x.
inline absl::Status CheckLayerNormParam(const char* op, const Tensor& x, const Tensor& gamma) {
  if (x.rank() < 1 || gamma.shape() != Shape{x.dim(x.rank() - 1)}) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": gamma ", ShapeString(gamma.shape()),
                                                   " does not match the last dim of x ", ShapeString(x.shape())));
  }
  return absl::OkStatus();
}

// layer_norm_grad: dy has x's shape.
inline absl::Status CheckLayerNormDy(const Tensor& x, const Tensor& dy) {
  if (dy.shape() != x.shape()) {
    return absl::InvalidArgumentError(absl::StrCat("layer_norm_grad: dy ", ShapeString(dy.shape()),
                                                   " does not match x ", ShapeString(x.shape())));
  }
  return absl::OkStatus();
}

// layer_norm_grad's out_dtype (`low`, DT_INVALID for none) and its output
// dx_low go together, and only for an F32 x.
inline absl::Status CheckLayerNormDxLow(const Tensor& x, DataType low, int num_outputs) {
  if ((low != DT_INVALID) != (num_outputs > 3) || (low != DT_INVALID && x.dtype() != F32)) {
    return absl::InvalidArgumentError(absl::StrCat("layer_norm_grad: out_dtype ",
                                                   low == DT_INVALID ? "unset" : DataTypeName(low), " with ",
                                                   num_outputs, " outputs for an ", DataTypeName(x.dtype()),
                                                   " x: dx_low needs out_dtype BF16 or F16 and an F32 x"));
  }
  return absl::OkStatus();
}

// layer_norm_grad's optional residual: x's type.
inline absl::Status CheckLayerNormResidual(const Tensor& x, const Tensor& residual) {
  if (residual.shape() != x.shape() || residual.dtype() != x.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("layer_norm_grad: residual ", DataTypeName(residual.dtype()),
                                                   ShapeString(residual.shape()), " does not match x ",
                                                   DataTypeName(x.dtype()), ShapeString(x.shape())));
  }
  return absl::OkStatus();
}

// scaled_dot_product_attention(_grad): q, k, v (and y, dy) are one
// [B, H, T, D] type ([B, T, H, D] for layout "bthd"); lse (and dlse) are
// [B, H, T] in both layouts, F32 when q is BF16 or F16
// (the schema's LseType), else q's dtype.
inline absl::Status CheckAttentionOperands(const KernelContext& ctx, const char* op, bool grad,
                                           AttentionLayout layout = AttentionLayout::kBhtd) {
  const Tensor& q = ctx.input(0);
  const bool bthd = layout == AttentionLayout::kBthd;
  if (q.rank() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": q must be ", bthd ? "[B, T, H, D]" : "[B, H, T, D]", ", got ", ShapeString(q.shape())));
  }
  const char* names[] = {"q", "k", "v", "y", "lse", "dy", "dlse"};
  const Shape lse = bthd ? Shape{q.dim(0), q.dim(2), q.dim(1)} : Shape{q.dim(0), q.dim(1), q.dim(2)};
  const int n = grad ? ctx.num_inputs() : 3;
  // lse and dlse are float32 for 16-bit q (the schema's LseType).
  const DataType lse_dtype = IsHalfFloating(q.dtype()) ? F32 : q.dtype();
  for (int i = 1; i < n; ++i) {
    const Tensor& t = ctx.input(i);
    const bool is_lse = i == 4 || i == 6;
    const DataType want = is_lse ? lse_dtype : q.dtype();
    if (t.dtype() != want || t.shape() != (is_lse ? lse : q.shape())) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": input '", names[i], "' is ", DataTypeName(t.dtype()),
                                                     ShapeString(t.shape()), ", expected ", DataTypeName(want),
                                                     ShapeString(is_lse ? lse : q.shape())));
    }
  }
  return absl::OkStatus();
}

// gelu_grad of a BF16 / F16 x (mixed precision's gelu in 16 bits): a dy of
// x's type and no out_dtype (dx has x's type), the schema's rule.
inline absl::Status CheckHalfGeluGrad(DataType x, DataType dy, bool out_dtype) {
  if (dy != x) {
    return absl::InvalidArgumentError(
        absl::StrCat("gelu_grad: a ", DataTypeName(x), " x takes a dy of its type, got ", DataTypeName(dy)));
  }
  if (out_dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("gelu_grad: a ", DataTypeName(x), " x takes no out_dtype (dx has x's type)"));
  }
  return absl::OkStatus();
}

// scaled_dot_product_attention_qkv(_grad): qkv [B, T, 3, H, D]; y and dy
// [B, T, H, D] of its type, lse and dlse [B, H, T] (F32 for 16-bit qkv).
inline absl::Status CheckPackedAttentionOperands(const KernelContext& ctx, const char* op, bool grad) {
  const Tensor& qkv = ctx.input(0);
  if (qkv.rank() != 5 || qkv.dim(2) != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": qkv must be [B, T, 3, H, D], got ", ShapeString(qkv.shape())));
  }
  if (!grad) return absl::OkStatus();
  if (ctx.num_inputs() != 4 && ctx.num_inputs() != 5) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": takes qkv, y, lse, dy and optionally dlse, got ", ctx.num_inputs(), " inputs"));
  }
  const char* names[] = {"qkv", "y", "lse", "dy", "dlse"};
  const Shape y{qkv.dim(0), qkv.dim(1), qkv.dim(3), qkv.dim(4)};
  const Shape lse{qkv.dim(0), qkv.dim(3), qkv.dim(1)};
  const DataType lse_dtype = IsHalfFloating(qkv.dtype()) ? F32 : qkv.dtype();
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    const bool is_lse = i == 2 || i == 4;
    const DataType want = is_lse ? lse_dtype : qkv.dtype();
    if (t.dtype() != want || t.shape() != (is_lse ? lse : y)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": input '", names[i], "' is ", DataTypeName(t.dtype()),
                                                     ShapeString(t.shape()), ", expected ", DataTypeName(want),
                                                     ShapeString(is_lse ? lse : y)));
    }
  }
  return absl::OkStatus();
}

// embedding(_grad): ids are I64. Their values (each in [0, V)) are the
// caller's to check where it can read them.
inline absl::Status CheckIdsDtype(const char* op, const Tensor& ids) {
  if (ids.dtype() != I64) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ids must be I64, got ", DataTypeName(ids.dtype())));
  }
  return absl::OkStatus();
}

// embedding: the table is [V, D].
inline absl::Status CheckEmbeddingTable(const Tensor& table) {
  if (table.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding: table must be [V, D], got ", ShapeString(table.shape())));
  }
  return absl::OkStatus();
}

// embedding_grad: dy is ids' shape plus one trailing dim.
inline absl::Status CheckEmbeddingGradShapes(const Tensor& ids, const Tensor& dy) {
  bool ok = dy.rank() == ids.rank() + 1;
  for (int i = 0; ok && i < ids.rank(); ++i) ok = ids.dim(i) == dy.dim(i);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("embedding_grad: dy ", ShapeString(dy.shape()),
                                                   " does not match ids ", ShapeString(ids.shape())));
  }
  return absl::OkStatus();
}

}  // namespace kernel_checks
}  // namespace strata

#endif  // STRATA_KERNELS_KERNEL_CHECKS_H_
