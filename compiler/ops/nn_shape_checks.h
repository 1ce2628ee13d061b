// Argument checks the shape functions of the nn op families share (matmul,
// conv, pooling, layer_norm, loss, dropout and embedding ops).
//
// Shape functions reject every shape, dtype and attr value their kernels
// cannot handle, so kernels (kernels/cpu/<op>.cc) only re-check what the
// batch dimension (-1 here) may change at run time.

#ifndef STRATA_COMPILER_OPS_NN_SHAPE_CHECKS_H_
#define STRATA_COMPILER_OPS_NN_SHAPE_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"
#include "proto/status_macros.h"

namespace strata {
namespace nn_shape_checks {

using Dims = Shape;

inline absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

inline std::string DimsString(const Dims& d) { return absl::StrCat("[", absl::StrJoin(d, ", "), "]"); }

// Messages name the schema's argument, not its index.
inline absl::Status ExpectFloatingArg(const ShapeContext& ctx, int i, const char* name) {
  if (!IsFloating(ctx.input(i).dtype)) {
    return Invalid(absl::StrCat("input '", name, "' must be F32 or F64, got ", ctx.input(i).ToString()));
  }
  return absl::OkStatus();
}

// The ops mixed precision runs in a low precision (the matmul and conv2d
// families, attention) also take BF16 and F16.
inline absl::Status ExpectComputeFloatingArg(const ShapeContext& ctx, int i, const char* name) {
  if (!IsFloating(ctx.input(i).dtype) && !IsHalfFloating(ctx.input(i).dtype)) {
    return Invalid(absl::StrCat("input '", name, "' must be F32, F64, BF16 or F16, got ", ctx.input(i).ToString()));
  }
  return absl::OkStatus();
}

inline absl::Status ExpectDtypeArg(const ShapeContext& ctx, int i, const char* name, DataType dtype) {
  if (ctx.input(i).dtype != dtype) {
    return Invalid(absl::StrCat("input '", name, "' must be ", DataTypeName(dtype), ", got ",
                                ctx.input(i).ToString()));
  }
  return absl::OkStatus();
}

inline absl::Status ExpectSameDtypeArg(const ShapeContext& ctx, int i, const char* name, int like, const char* like_name) {
  if (ctx.input(i).dtype != ctx.input(like).dtype) {
    return Invalid(absl::StrCat("input '", name, "' (", ctx.input(i).ToString(), ") must have the dtype of '",
                                like_name, "' (", ctx.input(like).ToString(), ")"));
  }
  return absl::OkStatus();
}

inline absl::Status ExpectSameTypeArg(const ShapeContext& ctx, int i, const char* name, int like, const char* like_name) {
  if (ctx.input(i) != ctx.input(like)) {
    return Invalid(absl::StrCat("input '", name, "' must have the type of '", like_name, "' (",
                                ctx.input(like).ToString(), "), got ", ctx.input(i).ToString()));
  }
  return absl::OkStatus();
}

// Ops that compute in float32 and may keep one side in 16 bits, where
// passes/fold_casts folds a mixed-precision cast into them: input i has the
// dtype of input `like`, or BF16 / F16 when that is F32 (read widened,
// which is exact).
inline absl::Status ExpectSameDtypeOrHalfArg(const ShapeContext& ctx, int i, const char* name, int like,
                                             const char* like_name) {
  if (ctx.input(i).dtype == ctx.input(like).dtype) return absl::OkStatus();
  if (ctx.input(like).dtype == F32 && IsHalfFloating(ctx.input(i).dtype)) return absl::OkStatus();
  return Invalid(absl::StrCat("input '", name, "' (", ctx.input(i).ToString(), ") must have the dtype of '",
                              like_name, "' (", ctx.input(like).ToString(), "), or BF16 / F16 where that is F32"));
}

// The dtype attr `out_dtype` gives such an op's output: "" (the default)
// for input `like`'s dtype; "BF16" or "F16" for an F32 `like`, the float32
// result rounded to nearest even as a cast rounds it.
inline absl::StatusOr<DataType> StoredOutputDtype(const ShapeContext& ctx, int like, const char* like_name) {
  const std::string name = ctx.attr_string("out_dtype");
  if (name.empty()) return ctx.input(like).dtype;
  DataType dtype = DT_INVALID;
  if (!DataType_Parse(name, &dtype) || !IsHalfFloating(dtype)) {
    return Invalid(absl::StrCat("attr 'out_dtype' must be \"\", \"BF16\" or \"F16\", got \"", name, "\""));
  }
  if (ctx.input(like).dtype != F32) {
    return Invalid(absl::StrCat("attr 'out_dtype' ", name, " needs an F32 '", like_name, "', got ",
                                ctx.input(like).ToString()));
  }
  return dtype;
}

inline absl::Status ExpectRankArg(const ShapeContext& ctx, int i, const char* name, int rank, const char* layout) {
  if (static_cast<int>(ctx.input(i).shape.size()) != rank) {
    return Invalid(absl::StrCat("input '", name, "' must have rank ", rank, " ", layout, ", got ",
                                ctx.input(i).ToString()));
  }
  return absl::OkStatus();
}

// Dims [from, rank) of input i must be known (> 0): only the batch dim may be -1.
inline absl::Status ExpectStaticDims(const ShapeContext& ctx, int i, const char* name, int from) {
  const Dims& s = ctx.input(i).shape;
  for (size_t d = from; d < s.size(); ++d) {
    if (s[d] <= 0) {
      return Invalid(absl::StrCat("input '", name, "' needs a known, positive size in dim ", d, ", got ",
                                  ctx.input(i).ToString()));
    }
  }
  return absl::OkStatus();
}

inline absl::Status ExpectScalarArg(const ShapeContext& ctx, int i, const char* name, DataType dtype) {
  const TensorType& t = ctx.input(i);
  if (t.dtype != dtype || !t.shape.empty()) {
    return Invalid(absl::StrCat("input '", name, "' must be a ", DataTypeName(dtype), " scalar (shape []), got ",
                                t.ToString()));
  }
  return absl::OkStatus();
}

// Two static sizes agree if equal; -1 (the batch dim) only agrees with -1.
inline bool SameSize(int64_t a, int64_t b) { return a == b; }

// A pair attr (one value per spatial dim) with every value >= `min`.
// `window`: a window attr a user writes (kernel_size, strides, paddings,
// dilations), bounded by 2^31; false for the shapes autodiff copies from
// the forward's tensors (input_size, filter_size), bounded by those.
inline absl::StatusOr<Dims> PairAttr(const ShapeContext& ctx, const char* attr, int64_t min, bool window = true) {
  const std::vector<int64_t> attr_value = ctx.attr_ints(attr);
  Dims v(attr_value.begin(), attr_value.end());
  if (v.size() != 2) {
    return Invalid(absl::StrCat("attr '", attr, "' must hold 2 ints (height, width), got ", DimsString(v)));
  }
  // Bounded above too, so the window arithmetic (in + 2 * padding, dilation
  // * (kernel - 1)) cannot overflow: no real window comes near 2^31.
  constexpr int64_t kMax = int64_t{1} << 31;
  for (int64_t x : v) {
    if (x < min) return Invalid(absl::StrCat("attr '", attr, "' values must be >= ", min, ", got ", DimsString(v)));
    if (window && x > kMax) return Invalid(absl::StrCat("attr '", attr, "' values must be at most 2^31, got ", DimsString(v)));
  }
  return v;
}

}  // namespace nn_shape_checks
}  // namespace strata

#endif  // STRATA_COMPILER_OPS_NN_SHAPE_CHECKS_H_
