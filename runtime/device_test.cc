// The host Device: copies, errors noted without a status, and tensors moved
// between devices with their own allocators.

#include "runtime/device.h"

#include <cstring>

#include "gtest/gtest.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

TEST(CpuDeviceTest, NamesItselfAndHasNoStreams) {
  CpuDevice device;
  EXPECT_EQ(device.kind(), DEVICE_CPU);
  EXPECT_EQ(device.name(), "cpu:0");
  EXPECT_TRUE(device.host_accessible());
  EXPECT_EQ(device.compute_stream(), nullptr);
  EXPECT_EQ(device.comm_stream(), nullptr);
  EXPECT_EQ(device.allocator(), GetCpuAllocator());
}

TEST(CpuDeviceTest, SynchronizeReturnsTheFirstNotedErrorOnce) {
  CpuDevice device;
  EXPECT_TRUE(device.Synchronize().ok());
  device.NoteError(absl::OkStatus());
  device.NoteError(absl::InternalError("first"));
  device.NoteError(absl::InternalError("second"));
  const absl::Status s = device.Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "first");
  EXPECT_TRUE(device.Synchronize().ok());
}

TEST(CpuDeviceTest, TensorsCountOnTheirDevicesAllocator) {
  CpuAllocator a, b;
  CpuDevice da(&a), db(&b);
  Tensor t = Tensor::Empty(F64, {2, 3}, &da);
  ASSERT_TRUE(t.defined());
  EXPECT_EQ(t.device(), &da);
  EXPECT_EQ(a.live_bytes(), 48);
  for (int i = 0; i < 6; ++i) t.data<double>()[i] = i;
  absl::StatusOr<Tensor> moved = t.CopyTo(&db);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->device(), &db);
  EXPECT_EQ(b.live_bytes(), 48);
  EXPECT_EQ(std::memcmp(moved->raw_data(), t.raw_data(), 48), 0);
  Tensor clone = moved->Clone();  // same device, same allocator
  EXPECT_EQ(clone.device(), &db);
  EXPECT_EQ(b.live_bytes(), 96);
  Tensor zeros = Tensor::Zeros(I32, {5}, &db);
  EXPECT_EQ(zeros.ValueAt(4), 0);
  EXPECT_EQ(b.live_bytes(), 116);
  t = Tensor();
  EXPECT_EQ(a.live_bytes(), 0);
}

TEST(CpuDeviceTest, AnUndefinedTensorIsOnTheHost) {
  Tensor t;
  EXPECT_EQ(t.device(), GetCpuDevice());
  EXPECT_TRUE(t.on_host());
  absl::StatusOr<Tensor> copy = t.CopyTo(GetCpuDevice());
  ASSERT_TRUE(copy.ok());
  EXPECT_FALSE(copy->defined());
}

}  // namespace
}  // namespace strata
