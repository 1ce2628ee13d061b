#ifndef STRATA_KERNELS_KERNEL_CHECKS_H_
#define STRATA_KERNELS_KERNEL_CHECKS_H_

// The run-time operand checks the CPU and CUDA kernels share, so both
// devices refuse the same inputs with the same words. Shape inference
// promises what they check; they keep a mismatched feed or a hand-built plan
// from reading out of bounds.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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

}  // namespace kernel_checks
}  // namespace strata

#endif  // STRATA_KERNELS_KERNEL_CHECKS_H_
