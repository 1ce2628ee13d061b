#ifndef STRATA_RUNTIME_TENSOR_H_
#define STRATA_RUNTIME_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/program.pb.h"
#include "proto/types.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/float16.h"

namespace strata {

template <typename T>
struct DataTypeOf;
template <>
struct DataTypeOf<float> { static constexpr DataType value = F32; };
template <>
struct DataTypeOf<double> { static constexpr DataType value = F64; };
template <>
struct DataTypeOf<int64_t> { static constexpr DataType value = I64; };
template <>
struct DataTypeOf<int32_t> { static constexpr DataType value = I32; };
template <>
struct DataTypeOf<bool> { static constexpr DataType value = BOOL; };
template <>
struct DataTypeOf<bfloat16> { static constexpr DataType value = BF16; };
template <>
struct DataTypeOf<float16> { static constexpr DataType value = F16; };

// A dense, row-major tensor on one device. Copies share the buffer (like a
// shared_ptr); the buffer returns its bytes to its allocator when the last
// copy goes. data() is the device's address: only a host tensor's may be
// dereferenced on the host; Fill, Clone, ValueAt and DebugString go through
// the device and work on every device.
class Tensor {
 public:
  Tensor() = default;
  // Uninitialized contents. Returns an undefined tensor if the allocator fails.
  // With an Allocator: host memory from that (host) allocator.
  static Tensor Empty(DataType dtype, Shape shape, Allocator* allocator = GetCpuAllocator());
  static Tensor Empty(DataType dtype, Shape shape, Device* device);
  static Tensor Zeros(DataType dtype, Shape shape, Allocator* allocator = GetCpuAllocator());
  static Tensor Zeros(DataType dtype, Shape shape, Device* device);

  bool defined() const { return buffer_ != nullptr; }
  // No other tensor shares the bytes (a view or a copy of this handle).
  bool sole_owner() const { return buffer_ != nullptr && buffer_.use_count() == 1; }
  // Where the bytes live; the host for an undefined tensor.
  Device* device() const { return buffer_ ? buffer_->device : GetCpuDevice(); }
  bool on_host() const { return device()->host_accessible(); }
  DataType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t num_elements() const { return NumElements(shape_); }
  size_t bytes() const { return num_elements() * DataTypeSize(dtype_); }

  void* raw_data() { return buffer_ ? buffer_->data : nullptr; }
  const void* raw_data() const { return buffer_ ? buffer_->data : nullptr; }
  template <typename T>
  T* data() { return static_cast<T*>(raw_data()); }
  template <typename T>
  const T* data() const { return static_cast<const T*>(raw_data()); }

  // Same buffer, another shape of the same element count.
  Tensor Reshaped(Shape shape) const;
  // A deep copy on the same device and allocator, or into host memory from
  // the host allocator `allocator`. Undefined if the allocation fails.
  Tensor Clone() const;
  Tensor Clone(Allocator* allocator) const;
  // A deep copy on `device` (host to device, device to host, or within one).
  absl::StatusOr<Tensor> CopyTo(Device* device) const;
  void Fill(double value);
  // Element i converted to double (0 for an undefined tensor or DT_INVALID).
  // On a GPU this copies the element to the host and waits for it.
  double ValueAt(int64_t i) const;
  std::string DebugString(int max_elements = 8) const;

 private:
  static Tensor Allocate(DataType dtype, Shape shape, Device* device, Allocator* allocator);

  struct Buffer {
    Device* device = nullptr;
    Allocator* allocator = nullptr;
    void* data = nullptr;
    size_t bytes = 0;
    ~Buffer() { allocator->Free(data, bytes); }
  };
  std::shared_ptr<Buffer> buffer_;
  DataType dtype_ = DT_INVALID;
  Shape shape_;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_TENSOR_H_
