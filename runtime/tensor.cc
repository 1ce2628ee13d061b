#include "runtime/tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata {

Tensor Tensor::Allocate(DataType dtype, Shape shape, Device* device, Allocator* allocator) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  auto buffer = std::make_shared<Buffer>();
  buffer->device = device;
  buffer->allocator = allocator;
  buffer->bytes = t.bytes();
  buffer->data = allocator->Allocate(buffer->bytes);
  if (buffer->data == nullptr) return Tensor();
  t.buffer_ = std::move(buffer);
  return t;
}

Tensor Tensor::Empty(DataType dtype, Shape shape, Allocator* allocator) {
  return Allocate(dtype, std::move(shape), GetCpuDevice(), allocator);
}

Tensor Tensor::Empty(DataType dtype, Shape shape, Device* device) {
  return Allocate(dtype, std::move(shape), device, device->allocator());
}

Tensor Tensor::Zeros(DataType dtype, Shape shape, Allocator* allocator) {
  Tensor t = Empty(dtype, std::move(shape), allocator);
  if (t.defined()) std::memset(t.raw_data(), 0, t.bytes());
  return t;
}

Tensor Tensor::Zeros(DataType dtype, Shape shape, Device* device) {
  Tensor t = Empty(dtype, std::move(shape), device);
  if (t.defined()) device->NoteError(device->Memset(t.raw_data(), 0, t.bytes()));
  return t;
}

Tensor Tensor::Reshaped(Shape shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::Clone() const {
  if (!defined()) return Tensor();
  Tensor t = Allocate(dtype_, shape_, buffer_->device, buffer_->allocator);
  if (t.defined()) buffer_->device->NoteError(buffer_->device->CopyOnDevice(t.raw_data(), raw_data(), bytes()));
  return t;
}

Tensor Tensor::Clone(Allocator* allocator) const {
  if (!defined()) return Tensor();
  Tensor t = Empty(dtype_, shape_, allocator);
  if (t.defined()) buffer_->device->NoteError(buffer_->device->CopyToHost(t.raw_data(), raw_data(), bytes()));
  return t;
}

absl::StatusOr<Tensor> Tensor::CopyTo(Device* device) const {
  if (!defined()) return Tensor();
  Tensor t = Empty(dtype_, shape_, device);
  if (!t.defined()) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory copying ", DataTypeName(dtype_),
                                                     ShapeString(shape_), " to ", device->name()));
  }
  Device* from = buffer_->device;
  absl::Status s;
  if (from == device || (from->host_accessible() && device->host_accessible())) {
    s = device->CopyOnDevice(t.raw_data(), raw_data(), bytes());
  } else if (from->host_accessible()) {
    s = device->CopyFromHost(t.raw_data(), raw_data(), bytes());
  } else if (device->host_accessible()) {
    s = from->CopyToHost(t.raw_data(), raw_data(), bytes());
  } else {  // between two devices: through the host
    Tensor host = Clone(GetCpuAllocator());
    if (!host.defined()) return absl::ResourceExhaustedError("out of host memory staging a device copy");
    if (absl::Status synced = from->Synchronize(); !synced.ok()) return synced;
    s = device->CopyFromHost(t.raw_data(), host.raw_data(), bytes());
  }
  if (!s.ok()) return s;
  return t;
}

namespace {

// Writes `value` into n elements of host memory of type dtype.
void FillHost(void* data, DataType dtype, int64_t n, double value) {
  switch (dtype) {
    case F32: { float* p = static_cast<float*>(data); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(value); break; }
    case F64: { double* p = static_cast<double*>(data); for (int64_t i = 0; i < n; ++i) p[i] = value; break; }
    case I64: { int64_t* p = static_cast<int64_t*>(data); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(value); break; }
    case I32: { int32_t* p = static_cast<int32_t*>(data); for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value); break; }
    case BOOL: { bool* p = static_cast<bool*>(data); for (int64_t i = 0; i < n; ++i) p[i] = value != 0; break; }
    case BF16: { bfloat16* p = static_cast<bfloat16*>(data); for (int64_t i = 0; i < n; ++i) p[i] = ToBfloat16(static_cast<float>(value)); break; }
    case F16: { float16* p = static_cast<float16*>(data); for (int64_t i = 0; i < n; ++i) p[i] = ToFloat16(static_cast<float>(value)); break; }
    default: break;
  }
}

// Host element i of type dtype as a double.
double HostValue(const void* data, DataType dtype, int64_t i) {
  switch (dtype) {
    case F32: return static_cast<const float*>(data)[i];
    case F64: return static_cast<const double*>(data)[i];
    case I64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case I32: return static_cast<const int32_t*>(data)[i];
    case BOOL: return static_cast<const bool*>(data)[i] ? 1 : 0;
    case BF16: return ToFloat(static_cast<const bfloat16*>(data)[i]);
    case F16: return ToFloat(static_cast<const float16*>(data)[i]);
    default: return 0;
  }
}

}  // namespace

void Tensor::Fill(double value) {
  if (!defined()) return;
  if (on_host()) {
    FillHost(raw_data(), dtype_, num_elements(), value);
    return;
  }
  Tensor host = Empty(dtype_, shape_, GetCpuAllocator());
  if (!host.defined()) {
    device()->NoteError(absl::ResourceExhaustedError("out of host memory filling a device tensor"));
    return;
  }
  FillHost(host.raw_data(), dtype_, num_elements(), value);
  device()->NoteError(device()->CopyFromHost(raw_data(), host.raw_data(), bytes()));
}

double Tensor::ValueAt(int64_t i) const {
  if (!defined() || i < 0 || i >= num_elements()) return 0;
  if (on_host()) return HostValue(raw_data(), dtype_, i);
  alignas(8) char element[8] = {};
  const size_t size = DataTypeSize(dtype_);
  if (size == 0) return 0;
  absl::Status s = device()->CopyToHost(element, static_cast<const char*>(raw_data()) + i * size, size);
  if (!s.ok()) {
    device()->NoteError(std::move(s));
    return 0;
  }
  return HostValue(element, dtype_, 0);
}

std::string Tensor::DebugString(int max_elements) const {
  std::string s = absl::StrCat(DataTypeName(dtype_), ShapeString(shape_), " {");
  int64_t n = std::min<int64_t>(num_elements(), max_elements);
  const Tensor host = on_host() ? *this : Clone(GetCpuAllocator());
  if (!host.defined()) n = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i) s += ", ";
    switch (dtype_) {
      case F32: absl::StrAppend(&s, host.data<float>()[i]); break;
      case F64: absl::StrAppend(&s, host.data<double>()[i]); break;
      case I64: absl::StrAppend(&s, host.data<int64_t>()[i]); break;
      case I32: absl::StrAppend(&s, host.data<int32_t>()[i]); break;
      case BOOL: absl::StrAppend(&s, host.data<bool>()[i] ? "true" : "false"); break;
      case BF16: absl::StrAppend(&s, ToFloat(host.data<bfloat16>()[i])); break;
      case F16: absl::StrAppend(&s, ToFloat(host.data<float16>()[i])); break;
      default: break;
    }
  }
  if (num_elements() > n) s += ", ...";
  return s + "}";
}

}  // namespace strata
