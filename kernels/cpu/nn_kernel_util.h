#ifndef STRATA_KERNELS_CPU_NN_KERNEL_UTIL_H_
#define STRATA_KERNELS_CPU_NN_KERNEL_UTIL_H_

// Small helpers shared by the nn kernels (matmul, conv2d, pool2d, layer_norm,
// losses, dropout, embedding) and the shape kernels.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/work_split.h"  // kParallelGrain, MinChunk
#include "proto/status_macros.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace nn_kernels {

using ::strata::InitFactory;

// A two-int attr (height, width) such as input_size; the shape function has
// checked it, so another length is an Internal error.
inline absl::StatusOr<std::vector<int64_t>> AttrPair(const Op& op, const char* name) {
  STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> v, AttrInts(op, name));
  if (v.size() != 2) return absl::InternalError(absl::StrCat(op.type(), ": attr '", name, "' was not validated"));
  return v;
}

// Scratch memory for a kernel, drawn from its device's allocator so that the
// live/peak byte counters see it.
inline absl::StatusOr<Tensor> Scratch(const KernelContext& ctx, DataType dtype, int64_t elements) {
  Tensor t = Tensor::Empty(dtype, Shape{elements}, &ctx.device());
  if (!t.defined()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory allocating ", elements, " ",
                                                     DataTypeName(dtype), " scratch elements on ",
                                                     ctx.device().name()));
  }
  return t;
}

}  // namespace nn_kernels
}  // namespace strata

#endif  // STRATA_KERNELS_CPU_NN_KERNEL_UTIL_H_
