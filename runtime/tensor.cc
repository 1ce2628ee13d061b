#include "runtime/tensor.h"

#include <cstring>

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

Tensor Tensor::Empty(DataType dtype, Shape shape, Allocator* allocator) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  auto buffer = std::make_shared<Buffer>();
  buffer->allocator = allocator;
  buffer->bytes = t.bytes();
  buffer->data = allocator->Allocate(buffer->bytes);
  if (buffer->data == nullptr) return Tensor();
  t.buffer_ = std::move(buffer);
  return t;
}

Tensor Tensor::Zeros(DataType dtype, Shape shape, Allocator* allocator) {
  Tensor t = Empty(dtype, std::move(shape), allocator);
  if (t.defined()) std::memset(t.raw_data(), 0, t.bytes());
  return t;
}

Tensor Tensor::Reshaped(Shape shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::Clone() const { return defined() ? Clone(buffer_->allocator) : Tensor(); }

Tensor Tensor::Clone(Allocator* allocator) const {
  if (!defined()) return Tensor();
  Tensor t = Empty(dtype_, shape_, allocator);
  if (t.defined()) std::memcpy(t.raw_data(), raw_data(), bytes());
  return t;
}

void Tensor::Fill(double value) {
  int64_t n = num_elements();
  switch (dtype_) {
    case F32: { float* p = data<float>(); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(value); break; }
    case F64: { double* p = data<double>(); for (int64_t i = 0; i < n; ++i) p[i] = value; break; }
    case I64: { int64_t* p = data<int64_t>(); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(value); break; }
    case I32: { int32_t* p = data<int32_t>(); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value); break; }
    case BOOL: { bool* p = data<bool>(); for (int64_t i = 0; i < n; ++i) p[i] = value != 0; break; }
    case BF16: { bfloat16* p = data<bfloat16>(); for (int64_t i = 0; i < n; ++i) p[i] = ToBfloat16(static_cast<float>(value)); break; }
    case F16: { float16* p = data<float16>(); for (int64_t i = 0; i < n; ++i) p[i] = ToFloat16(static_cast<float>(value)); break; }
    default: break;
  }
}

double Tensor::ValueAt(int64_t i) const {
  if (!defined() || i < 0 || i >= num_elements()) return 0;
  switch (dtype_) {
    case F32: return data<float>()[i];
    case F64: return data<double>()[i];
    case I64: return static_cast<double>(data<int64_t>()[i]);
    case I32: return data<int32_t>()[i];
    case BOOL: return data<bool>()[i] ? 1 : 0;
    case BF16: return ToFloat(data<bfloat16>()[i]);
    case F16: return ToFloat(data<float16>()[i]);
    default: return 0;
  }
}

std::string Tensor::DebugString(int max_elements) const {
  std::string s = absl::StrCat(DataTypeName(dtype_), ShapeString(shape_), " {");
  int64_t n = std::min<int64_t>(num_elements(), max_elements);
  for (int64_t i = 0; i < n; ++i) {
    if (i) s += ", ";
    switch (dtype_) {
      case F32: absl::StrAppend(&s, data<float>()[i]); break;
      case F64: absl::StrAppend(&s, data<double>()[i]); break;
      case I64: absl::StrAppend(&s, data<int64_t>()[i]); break;
      case I32: absl::StrAppend(&s, data<int32_t>()[i]); break;
      case BOOL: absl::StrAppend(&s, data<bool>()[i] ? "true" : "false"); break;
      case BF16: absl::StrAppend(&s, ToFloat(data<bfloat16>()[i])); break;
      case F16: absl::StrAppend(&s, ToFloat(data<float16>()[i])); break;
      default: break;
    }
  }
  if (num_elements() > n) s += ", ...";
  return s + "}";
}

}  // namespace strata
