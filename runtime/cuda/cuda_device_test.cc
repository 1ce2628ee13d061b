// CudaDevice on a real GPU: copies, Tensor through the device, the caching
// allocator's counters over repeated steps, stream-ordered reuse across
// streams, and out-of-memory as a clean failure. Tagged gpu: without a CUDA
// device every test FAILS (never skips).

#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/cuda_test_util.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = testing::CudaDeviceOrFail();
    ASSERT_NE(device_, nullptr);
  }
  std::unique_ptr<CudaDevice> device_;
};

TEST(CudaDeviceCreateTest, AnOrdinalPastTheCountIsACleanError) {
  auto device = CudaDevice::Create(1 << 20);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition) << device.status();
}

TEST_F(CudaDeviceTest, NamesItself) {
  EXPECT_EQ(device_->kind(), DEVICE_CUDA);
  EXPECT_EQ(device_->name(), "cuda:0");
  EXPECT_FALSE(device_->host_accessible());
  EXPECT_NE(device_->compute_stream(), nullptr);
  EXPECT_NE(device_->comm_stream(), device_->compute_stream());
}

TEST_F(CudaDeviceTest, TensorsRoundTripThroughTheDevice) {
  Tensor host = Tensor::Empty(F32, {3, 5});
  for (int i = 0; i < 15; ++i) host.data<float>()[i] = 0.25f * i - 1;
  absl::StatusOr<Tensor> on_gpu = host.CopyTo(device_.get());
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  EXPECT_EQ(on_gpu->device(), device_.get());
  EXPECT_FALSE(on_gpu->on_host());
  // Read, clone, fill and copy back, all through the device.
  EXPECT_EQ(on_gpu->ValueAt(14), 0.25f * 14 - 1);
  Tensor clone = on_gpu->Clone();
  ASSERT_TRUE(clone.defined());
  EXPECT_EQ(clone.device(), device_.get());
  on_gpu->Fill(7);
  EXPECT_EQ(on_gpu->ValueAt(3), 7);
  EXPECT_EQ(clone.ValueAt(3), 0.25f * 3 - 1);  // the clone is its own buffer
  Tensor back = clone.Clone(GetCpuAllocator());
  ASSERT_TRUE(back.on_host());
  EXPECT_EQ(std::memcmp(back.raw_data(), host.raw_data(), host.bytes()), 0);
  EXPECT_NE(clone.DebugString().find("-1, -0.75"), std::string::npos) << clone.DebugString();
  Tensor zeros = Tensor::Zeros(F64, {4}, device_.get());
  EXPECT_EQ(zeros.ValueAt(2), 0.0);
  EXPECT_TRUE(device_->Synchronize().ok());
}

TEST_F(CudaDeviceTest, HalfTensorsFillAndReadOnTheDevice) {
  Tensor t = Tensor::Empty(BF16, {9}, device_.get());
  ASSERT_TRUE(t.defined());
  t.Fill(1.5);
  EXPECT_EQ(t.ValueAt(8), 1.5);
  EXPECT_TRUE(device_->Synchronize().ok());
}

// What a training step does to the allocator: the same sizes every step.
// After the first step every allocation is a cache hit; no new cudaMalloc.
TEST_F(CudaDeviceTest, RepeatedStepsReuseTheCache) {
  CachingAllocator* allocator = device_->caching_allocator();
  auto step = [&] {
    std::vector<Tensor> live;
    for (int64_t elements : {int64_t{1} << 10, int64_t{3} << 20, int64_t{100}, int64_t{1} << 22}) {
      live.push_back(Tensor::Empty(F32, {elements}, device_.get()));
      ASSERT_TRUE(live.back().defined());
      live.back().Fill(1);
    }
  };
  step();
  const CachingAllocator::Stats first = allocator->stats();
  const int64_t live_after_first = allocator->live_bytes();
  step();
  step();
  const CachingAllocator::Stats third = allocator->stats();
  EXPECT_EQ(third.segment_allocations, first.segment_allocations);
  EXPECT_EQ(third.reserved_bytes, first.reserved_bytes);
  EXPECT_EQ(third.cache_hits - first.cache_hits, 8);
  EXPECT_EQ(allocator->live_bytes(), live_after_first);
  // Peak bytes are the requested bytes of one step (the allocator counts what
  // the memory plan predicts), not the rounded segments.
  EXPECT_GE(allocator->peak_bytes(), ((int64_t{1} << 10) + (int64_t{3} << 20) + 100 + (int64_t{1} << 22)) * 4);
  EXPECT_TRUE(device_->Synchronize().ok());
}

// A kernel on the comm stream still reads a block when the host frees it:
// the block must not serve the compute stream until that kernel has passed.
TEST_F(CudaDeviceTest, ABlockUsedOnTheCommStreamWaitsForIt) {
  CachingAllocator* allocator = device_->caching_allocator();
  const size_t bytes = size_t{64} << 20;
  void* block = allocator->Allocate(bytes);
  ASSERT_NE(block, nullptr);
  // Keep the comm stream busy reading the block: 200 copies of 64 MiB, some
  // milliseconds of work, far longer than the host takes to free it.
  void* sink = allocator->Allocate(bytes);
  ASSERT_NE(sink, nullptr);
  cudaStream_t comm = static_cast<cudaStream_t>(device_->comm_stream());
  for (int i = 0; i < 200; ++i) ASSERT_EQ(cudaMemcpyAsync(sink, block, bytes, cudaMemcpyDeviceToDevice, comm), cudaSuccess);
  device_->RecordUse(block, comm);
  allocator->Free(block, bytes);
  EXPECT_EQ(allocator->stats().pending_frees, 1);
  // Once the comm stream is done, the block is free again and reused.
  ASSERT_EQ(cudaStreamSynchronize(comm), cudaSuccess);
  const int64_t segments = allocator->stats().segment_allocations;
  void* again = allocator->Allocate(bytes);
  EXPECT_EQ(again, block);
  EXPECT_EQ(allocator->stats().pending_frees, 0);
  EXPECT_EQ(allocator->stats().segment_allocations, segments);
  allocator->Free(again, bytes);
  allocator->Free(sink, bytes);
  EXPECT_TRUE(device_->Synchronize().ok());
}

TEST_F(CudaDeviceTest, OutOfMemoryIsACleanErrorThatLeavesTheDeviceUsable) {
  RunContext run;
  run.device = device_.get();
  std::vector<Tensor> outputs(1);
  KernelContext ctx(&run, {}, absl::MakeSpan(outputs));
  // 2^46 floats: 256 TiB, more than any GPU has.
  absl::StatusOr<Tensor*> huge = ctx.AllocateOutput(0, F32, {int64_t{1} << 46});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("cuda:0"), std::string::npos) << huge.status();
  EXPECT_EQ(device_->caching_allocator()->stats().out_of_memory, 1);
  // The failed cudaMalloc is not sticky: the device still works.
  Tensor small = Tensor::Zeros(F32, {16}, device_.get());
  ASSERT_TRUE(small.defined());
  EXPECT_EQ(small.ValueAt(15), 0.0);
  EXPECT_TRUE(device_->Synchronize().ok());
}

}  // namespace
}  // namespace strata
