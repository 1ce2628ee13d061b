#ifndef STRATA_KERNELS_ATTR_KERNELS_H_
#define STRATA_KERNELS_ATTR_KERNELS_H_

// Device-neutral bases of kernels that read their op's attrs in Init
// (register them with InitFactory): an op's CPU and CUDA kernels derive from
// the same one, so both read the same attrs with the same refusals.

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/program.pb.h"
#include "proto/shape_rules.h"
#include "proto/status_macros.h"
#include "runtime/float16.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {

// Keeps the op, for messages that name it.
class OpKeepingKernel : public OpKernel {
 public:
  OpKeepingKernel() = default;
  explicit OpKeepingKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    op_ = op;
    return absl::OkStatus();
  }

 protected:
  Op op_;
};

// concat, split and their grads: `axis`, and with kSections `sections`.
template <bool kSections>
class AxisAttrsKernel : public OpKeepingKernel {
 public:
  using OpKeepingKernel::OpKeepingKernel;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(OpKeepingKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(axis_, AttrInt(op, "axis"));
    if constexpr (kSections) {
      STRATA_ASSIGN_OR_RETURN(sections_, AttrInts(op, "sections"));
    }
    return absl::OkStatus();
  }

 protected:
  int64_t axis_ = 0;
  std::vector<int64_t> sections_;
};

// slice and its gradient: `axes`, `starts`, `ends`.
class SliceAttrsKernel : public OpKeepingKernel {
 public:
  using OpKeepingKernel::OpKeepingKernel;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(OpKeepingKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(axes_, AttrInts(op, "axes"));
    STRATA_ASSIGN_OR_RETURN(starts_, AttrInts(op, "starts"));
    STRATA_ASSIGN_OR_RETURN(ends_, AttrInts(op, "ends"));
    return absl::OkStatus();
  }

 protected:
  std::vector<int64_t> axes_, starts_, ends_;
};

// pad: `axis` and `after`, and the padded shape of an x (errors name the op).
class PadAttrsKernel : public OpKeepingKernel {
 public:
  using OpKeepingKernel::OpKeepingKernel;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(OpKeepingKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(axis_, AttrInt(op, "axis"));
    STRATA_ASSIGN_OR_RETURN(after_, AttrInt(op, "after"));
    return absl::OkStatus();
  }

 protected:
  // x's shape with the padded axis `after` longer; *axis its index.
  absl::StatusOr<Shape> PaddedShape(const Tensor& x, int* axis) const {
    auto a = NormalizeAxis(axis_, x.rank(), "attr 'axis'");
    constexpr int64_t kMaxPaddedDim = int64_t{1} << 40;  // the schema's bound
    if (!a.ok() || after_ < 0 || after_ > kMaxPaddedDim - x.dim(*a)) {
      return absl::InvalidArgumentError(
          absl::StrCat("pad '", op_.name(), "': ",
                       a.ok() ? absl::StrCat("attr 'after' ", after_, " is negative or passes 2^40 elements")
                              : std::string(a.status().message())));
    }
    *axis = *a;
    Shape y = x.shape();
    y[*a] += after_;
    return y;
  }
  int64_t axis_ = 0;
  int64_t after_ = 0;
};

// dropout and its gradient: `p` (validated to [0, 1) by the schema) and the
// op's uid, which keys its mask stream.
class DropoutAttrsKernel : public OpKernel {
 public:
  DropoutAttrsKernel() = default;
  explicit DropoutAttrsKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(p_, AttrFloat(op, "p"));
    if (!(p_ >= 0.0 && p_ < 1.0)) {
      return absl::InternalError(absl::StrCat(op.type(), ": attr 'p' = ", p_, " was not validated"));
    }
    uid_ = op.uid();
    return absl::OkStatus();
  }

 protected:
  double p_ = 0.5;
  int64_t uid_ = 0;
};

// embedding_grad: `num_embeddings` (the table's V; >= 1 by the schema).
class EmbeddingGradAttrsKernel : public OpKernel {
 public:
  EmbeddingGradAttrsKernel() = default;
  explicit EmbeddingGradAttrsKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(vocab_, AttrInt(op, "num_embeddings"));
    if (vocab_ < 1) return absl::InternalError("embedding_grad: attr 'num_embeddings' was not validated");
    return absl::OkStatus();
  }

 protected:
  int64_t vocab_ = 0;
};

// layer_norm and its gradient: `epsilon`.
class EpsilonAttrKernel : public OpKernel {
 public:
  EpsilonAttrKernel() = default;
  explicit EpsilonAttrKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(epsilon_, AttrFloat(op, "epsilon"));
    return absl::OkStatus();
  }

 protected:
  double epsilon_ = 1e-5;
};

// A string attr naming a 16-bit dtype: BF16 or F16, or DT_INVALID for ""
// or no attr. Anything else is InvalidArgument naming the op and the attr
// (the schema refuses it first in a plan).
inline absl::StatusOr<DataType> SixteenBitDtypeAttr(const Op& op, const char* attr) {
  auto it = op.attr().find(attr);
  if (it == op.attr().end() || it->second.s().empty()) return DT_INVALID;
  DataType dtype = DT_INVALID;
  if (!DataType_Parse(it->second.s(), &dtype) || (dtype != BF16 && dtype != F16)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op.type(), ": attr '", attr, "' must be \"\", \"BF16\" or \"F16\", got \"", it->second.s(), "\""));
  }
  return dtype;
}

// `out_dtype` of the ops a mixed-precision cast folds into (layer_norm's y,
// gelu_grad's dx; passes/fold_casts), DT_INVALID for the input's dtype.
inline absl::StatusOr<DataType> StoredOutDtype(const Op& op) { return SixteenBitDtypeAttr(op, "out_dtype"); }

// matmul_bias_gelu's `z_dtype` (mixed precision, whose gelu_grad reads a
// 16-bit z): "" (or no attr: an op built by hand) keeps z float (F64 for
// F64 operands); else a's 16-bit type, for BF16 / F16 operands only.
// Anything else is InvalidArgument naming the op (the schema refuses it
// first in a plan).
template <typename In>
absl::StatusOr<DataType> MatmulBiasGeluZDtype(const Op& op) {
  auto it = op.attr().find("z_dtype");
  if (it == op.attr().end() || it->second.s().empty()) return DT_INVALID;
  constexpr bool kHalf = std::is_same_v<In, bfloat16> || std::is_same_v<In, float16>;
  DataType dtype = DT_INVALID;
  if (!kHalf || !DataType_Parse(it->second.s(), &dtype) || dtype != DataTypeOf<In>::value) {
    return absl::InvalidArgumentError(
        absl::StrCat(op.type(), ": attr 'z_dtype' must be \"\"",
                     kHalf ? absl::StrCat(" or \"", DataTypeName(DataTypeOf<In>::value), "\"") : std::string(), " for ",
                     DataTypeName(DataTypeOf<In>::value), " a and b, got \"", it->second.s(), "\""));
  }
  return dtype;
}

// gelu's form, for gelu, gelu_grad and matmul_bias_gelu: true for approximate
// "tanh", false for "none" (or no attr: an op built by hand); anything else
// is InvalidArgument naming the op (the schema refuses it first in a plan).
inline absl::StatusOr<bool> GeluIsTanh(const Op& op) {
  auto it = op.attr().find("approximate");
  if (it == op.attr().end() || it->second.s() == "none") return false;
  if (it->second.s() == "tanh") return true;
  return absl::InvalidArgumentError(absl::StrCat(op.type(), ": attr 'approximate' must be \"none\" or \"tanh\", got \"",
                                                 it->second.s(), "\""));
}

// gelu and gelu_grad: `approximate`.
class GeluAttrKernel : public OpKernel {
 public:
  GeluAttrKernel() = default;
  explicit GeluAttrKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(tanh_, GeluIsTanh(op));
    return absl::OkStatus();
  }

 protected:
  bool tanh_ = false;
};

// The matmul family: `transpose_a` and `transpose_b`.
class TransposeAttrsKernel : public OpKernel {
 public:
  TransposeAttrsKernel() = default;
  explicit TransposeAttrsKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(ta_, AttrBool(op, "transpose_a"));
    STRATA_ASSIGN_OR_RETURN(tb_, AttrBool(op, "transpose_b"));
    return absl::OkStatus();
  }

 protected:
  bool ta_ = false, tb_ = false;
};

// The ops with a shared b's transpose only (matmul_bias, matmul_bias_grad_b).
class TransposeBAttrKernel : public OpKernel {
 public:
  TransposeBAttrKernel() = default;
  explicit TransposeBAttrKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(tb_, AttrBool(op, "transpose_b"));
    return absl::OkStatus();
  }

 protected:
  bool tb_ = false;
};

// scaled_dot_product_attention(_grad)'s layout attr; an op built by hand
// (kernel tests) may lack it: "bhtd".
inline absl::StatusOr<AttentionLayout> AttentionLayoutAttr(const Op& op) {
  const auto layout = op.attr().find("layout");
  if (layout == op.attr().end()) return AttentionLayout::kBhtd;
  absl::StatusOr<AttentionLayout> parsed = ParseAttentionLayout(layout->second.s());
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat(op.type(), ": ", parsed.status().message()));
  return *parsed;
}

// scaled_dot_product_attention and its gradient: `causal` and `scale` (0:
// 1/sqrt(D), resolved per call by ScaleFor), and `layout`.
class AttentionAttrsKernel : public OpKernel {
 public:
  AttentionAttrsKernel() = default;
  explicit AttentionAttrsKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(causal_, AttrBool(op, "causal"));
    STRATA_ASSIGN_OR_RETURN(scale_, AttrFloat(op, "scale"));
    STRATA_ASSIGN_OR_RETURN(layout_, AttentionLayoutAttr(op));
    return absl::OkStatus();
  }

 protected:
  double ScaleFor(int64_t D) const { return scale_ != 0 ? scale_ : 1.0 / std::sqrt(static_cast<double>(D)); }
  bool bthd() const { return layout_ == AttentionLayout::kBthd; }
  bool causal_ = true;
  double scale_ = 0;
  AttentionLayout layout_ = AttentionLayout::kBhtd;
};

// Base of softmax_cross_entropy(_grad)'s kernels: the `classes` attr (0:
// every column of the logits is a class; else the first `classes`, the
// rest padding of a row-aligned LM head, never read).
class ClassesAttrKernel : public OpKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(classes_, AttrInt(op, "classes"));
    return absl::OkStatus();
  }

 protected:
  // The classes among C columns; InvalidArgument naming `op` when the attr
  // asks for more than C (or fewer than 0).
  absl::StatusOr<int64_t> Classes(const char* op, int64_t C) const {
    if (classes_ == 0) return C;
    if (classes_ < 0 || classes_ > C) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": attr 'classes' ", classes_, " must be in [1, ", C, "] (the logits' columns)"));
    }
    return classes_;
  }
  int64_t classes_ = 0;
};

// softmax_cross_entropy_grad's kernels: `classes`, and `in_place`
// (passes/in_place_loss_grad), where dlogits takes the logits' buffer.
class CrossEntropyGradAttrsKernel : public ClassesAttrKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(ClassesAttrKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(in_place_, AttrBool(op, "in_place"));
    return absl::OkStatus();
  }

 protected:
  // dlogits: the logits' own buffer with in_place (the kernel reads each
  // value before it writes it), else a new output shaped like them.
  static absl::StatusOr<Tensor*> Dlogits(KernelContext& ctx, const Tensor& logits, bool in_place) {
    if (!in_place) return ctx.AllocateOutput(0, logits.dtype(), logits.shape());
    ctx.SetOutput(0, logits);
    return ctx.output(0);
  }
  bool in_place_ = false;
};

// Calls f(S{}) with S the C++ storage of `dtype`: T's own, or bfloat16 /
// float16 for BF16 / F16 when T is float (what the ops fold-casts folds a
// cast into read or write). Another dtype is InvalidArgument naming the op
// and the tensor ("gelu_grad: dy BF16 for an F64 x").
template <typename T, typename F>
absl::Status WithStorage(DataType dtype, const char* op, const char* what, F&& f) {
  if (dtype == DataTypeOf<T>::value) return f(T{});
  if constexpr (std::is_same_v<T, float>) {
    if (dtype == BF16) return f(bfloat16{});
    if (dtype == F16) return f(float16{});
  }
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " ", DataTypeName(dtype), " for an ",
                                                 DataTypeName(DataTypeOf<T>::value), " x"));
}

// Base of the kernels of the ops that store an output in 16 bits with
// out_dtype (layer_norm, gelu_grad): Base's attrs and out_dtype.
template <typename Base>
class StoredOutKernel : public Base {
 public:
  using Base::Base;
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(Base::Init(op));
    STRATA_ASSIGN_OR_RETURN(out_dtype_, StoredOutDtype(op));
    return absl::OkStatus();
  }

 protected:
  // The output's dtype for an input of T: out_dtype, or T's when none.
  template <typename T>
  DataType OutDtype() const {
    return out_dtype_ == DT_INVALID ? DataTypeOf<T>::value : out_dtype_;
  }
  // Whether out_dtype asks the output be stored as S.
  template <typename S>
  bool StoresAs() const {
    return out_dtype_ != DT_INVALID && out_dtype_ == DataTypeOf<S>::value;
  }

  DataType out_dtype_ = DT_INVALID;
};

}  // namespace strata

#endif  // STRATA_KERNELS_ATTR_KERNELS_H_
