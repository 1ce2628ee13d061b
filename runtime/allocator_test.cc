#include "runtime/allocator.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(CpuAllocatorTest, CountsLiveAndPeakBytes) {
  CpuAllocator a;
  void* x = a.Allocate(1000);
  void* y = a.Allocate(3000);
  EXPECT_EQ(a.live_bytes(), 4000);
  EXPECT_EQ(a.peak_bytes(), 4000);
  a.Free(x, 1000);
  EXPECT_EQ(a.live_bytes(), 3000);
  EXPECT_EQ(a.peak_bytes(), 4000);
  a.ResetPeak();
  EXPECT_EQ(a.peak_bytes(), 3000);
  a.Free(y, 3000);
  EXPECT_EQ(a.live_bytes(), 0);
  EXPECT_EQ(a.total_allocations(), 2);
}

TEST(CpuAllocatorTest, BlocksAre64ByteAligned) {
  CpuAllocator a;
  for (size_t bytes : {1, 63, 65, 4096, 100000}) {
    void* p = a.Allocate(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    a.Free(p, bytes);
  }
}

TEST(CpuAllocatorTest, LargeFreedBlocksAreReusedAndNotCountedLive) {
  CpuAllocator a;
  const size_t big = 256 << 10;
  void* p = a.Allocate(big);
  a.Free(p, big);
  EXPECT_EQ(a.live_bytes(), 0);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(big));
  // The same size gets the same block back, counted live again.
  void* q = a.Allocate(big);
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.cached_bytes(), 0);
  EXPECT_EQ(a.live_bytes(), static_cast<int64_t>(big));
  // Another size does not take it.
  a.Free(q, big);
  void* r = a.Allocate(big + 4096);
  EXPECT_NE(r, q);
  a.Free(r, big + 4096);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(2 * big + 4096));
  a.EmptyCache();
  EXPECT_EQ(a.cached_bytes(), 0);
  EXPECT_EQ(a.live_bytes(), 0);
}

TEST(CpuAllocatorTest, SmallBlocksAreNotCached) {
  CpuAllocator a;
  void* p = a.Allocate(1024);
  a.Free(p, 1024);
  EXPECT_EQ(a.cached_bytes(), 0);
}

}  // namespace
}  // namespace strata
