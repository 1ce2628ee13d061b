#ifndef STRATA_PROTO_TYPES_H_
#define STRATA_PROTO_TYPES_H_

// The value types the compiler and the runtime share: a shape, a var's
// static type, and what a dtype is. Below both (compiler/ includes nothing of
// runtime/), beside the protos they describe.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "proto/program.pb.h"

namespace strata {

using Shape = absl::InlinedVector<int64_t, 6>;

// Bytes per element; 0 for DT_INVALID.
size_t DataTypeSize(DataType dtype);
std::string DataTypeName(DataType dtype);
// F32 or F64: the dtypes kernels compute in.
bool IsFloating(DataType dtype);
// BF16 or F16: stored in 16 bits, computed in float32.
bool IsHalfFloating(DataType dtype);
int64_t NumElements(absl::Span<const int64_t> shape);
std::string ShapeString(absl::Span<const int64_t> shape);

// Whether a finite double rounds to an infinity as a float32: at or past
// halfway between float32's largest value and 2^128 (round to nearest
// even), said without converting, which C++ leaves undefined out of range.
inline bool InfiniteAsFloat32(double v) { return v >= 0x1.ffffffp127 || v <= -0x1.ffffffp127; }

// A var's static type: dtype and shape, -1 where the batch dimension goes.
struct TensorType {
  DataType dtype = DT_INVALID;
  Shape shape;
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
  std::string ToString() const;
};

}  // namespace strata

#endif  // STRATA_PROTO_TYPES_H_
