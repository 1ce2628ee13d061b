#include "proto/types.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case F32: return 4;
    case F64: return 8;
    case I64: return 8;
    case I32: return 4;
    case BOOL: return 1;
    case BF16: return 2;
    case F16: return 2;
    default: return 0;
  }
}

std::string DataTypeName(DataType dtype) {
  if (!DataType_IsValid(dtype)) return absl::StrCat("dtype(", static_cast<int>(dtype), ")");
  return DataType_Name(dtype);
}

bool IsFloating(DataType dtype) { return dtype == F32 || dtype == F64; }
bool IsHalfFloating(DataType dtype) { return dtype == BF16 || dtype == F16; }

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string TensorType::ToString() const {
  return absl::StrCat(DataTypeName(dtype), ShapeString(shape));
}

}  // namespace strata
