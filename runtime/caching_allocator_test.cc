#include "runtime/caching_allocator.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

// What a fake device saw; it outlives the allocator so tests can check what
// the destructor gave back.
struct FakeDevice {
  struct Event {
    StreamHandle stream;
    bool done = false;
  };

  size_t capacity = size_t{1} << 40;  // bytes Malloc may hand out in all
  size_t used = 0;
  int mallocs = 0;  // that succeeded
  int failed_mallocs = 0;
  int frees = 0;
  int live_segments = 0;
  int synchronizes = 0;
  int events_recorded = 0;
  std::set<Event*> live_events;
  std::set<void*> segments;

  // The stream has passed every mark recorded on it so far.
  void FinishStream(StreamHandle stream) {
    for (Event* event : live_events) {
      if (event->stream == stream) event->done = true;
    }
  }
};

class FakeBackend : public CachingAllocator::Backend {
 public:
  explicit FakeBackend(FakeDevice* device) : device_(device) {}
  std::string name() const override { return "fake:0"; }
  void* Malloc(size_t bytes) override {
    if (device_->used + bytes > device_->capacity) {
      ++device_->failed_mallocs;
      return nullptr;
    }
    // Never touched, so even large segments cost only address space.
    void* ptr = std::aligned_alloc(512, bytes);
    device_->used += bytes;
    ++device_->mallocs;
    ++device_->live_segments;
    device_->segments.insert(ptr);
    sizes_[ptr] = bytes;
    return ptr;
  }
  void Free(void* ptr) override {
    EXPECT_EQ(device_->segments.erase(ptr), 1u) << "not a segment";
    device_->used -= sizes_[ptr];
    ++device_->frees;
    --device_->live_segments;
    std::free(ptr);
  }
  void* RecordEvent(StreamHandle stream) override {
    auto* event = new FakeDevice::Event{stream};
    device_->live_events.insert(event);
    ++device_->events_recorded;
    return event;
  }
  bool EventDone(void* event) override { return static_cast<FakeDevice::Event*>(event)->done; }
  void DestroyEvent(void* event) override {
    auto* e = static_cast<FakeDevice::Event*>(event);
    EXPECT_EQ(device_->live_events.erase(e), 1u) << "not a live event";
    delete e;
  }
  void Synchronize() override {
    ++device_->synchronizes;
    for (FakeDevice::Event* event : device_->live_events) event->done = true;
  }

 private:
  FakeDevice* device_;
  std::map<void*, size_t> sizes_;
};

StreamHandle const kComputeStream = nullptr;
int comm_stream_tag;
int copy_stream_tag;
StreamHandle const kCommStream = &comm_stream_tag;
StreamHandle const kCopyStream = &copy_stream_tag;

std::unique_ptr<CachingAllocator> MakeAllocator(FakeDevice* device) {
  return std::make_unique<CachingAllocator>(std::make_unique<FakeBackend>(device), kComputeStream);
}

char* At(void* ptr, size_t offset) { return static_cast<char*>(ptr) + offset; }

TEST(CachingAllocatorTest, NameIsTheBackends) {
  FakeDevice device;
  EXPECT_EQ(MakeAllocator(&device)->name(), "fake:0");
}

TEST(CachingAllocatorTest, SameSizeAfterFreeIsACacheHit) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  for (size_t bytes : {size_t{1000}, 8 * kMiB}) {
    void* first = allocator->Allocate(bytes);
    ASSERT_NE(first, nullptr);
    allocator->Free(first, bytes);
    void* second = allocator->Allocate(bytes);
    EXPECT_EQ(second, first) << bytes;
    allocator->Free(second, bytes);
  }
  // One small segment (2 MiB) and one large (8 MiB), each hit once.
  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(device.mallocs, 2);
  EXPECT_EQ(stats.segment_allocations, 2);
  EXPECT_EQ(stats.cache_hits, 2);
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(10 * kMiB));
}

TEST(CachingAllocatorTest, SmallRequestsShareASegmentAndMergeBackWhenFreed) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  void* a = allocator->Allocate(1000);        // 1024 bytes
  void* b = allocator->Allocate(5000);        // 5120
  void* c = allocator->Allocate(512 * kKiB);  // 524288
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(b, At(a, 1024));
  EXPECT_EQ(c, At(a, 1024 + 5120));
  EXPECT_EQ(device.mallocs, 1);
  EXPECT_EQ(allocator->stats().cache_hits, 2);
  EXPECT_EQ(allocator->stats().reserved_bytes, static_cast<int64_t>(2 * kMiB));

  // The middle block first, so each later free merges on a different side.
  allocator->Free(b, 5000);
  allocator->Free(a, 1000);
  allocator->Free(c, 512 * kKiB);
  // Unmerged, the 1 MiB would come from the tail after c (2 MiB - 530432 bytes
  // is enough); merged, the whole segment is one block starting at a.
  void* d = allocator->Allocate(kMiB);
  EXPECT_EQ(d, a);
  allocator->Free(d, kMiB);

  allocator->EmptyCache();
  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(stats.segment_frees, 1);
  EXPECT_EQ(stats.reserved_bytes, 0);
  EXPECT_EQ(stats.peak_reserved_bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(device.synchronizes, 1);
  EXPECT_EQ(device.live_segments, 0);
}

TEST(CachingAllocatorTest, EmptyCacheKeepsSegmentsInUse) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  void* small = allocator->Allocate(1000);
  void* large = allocator->Allocate(4 * kMiB);
  allocator->Free(large, 4 * kMiB);
  allocator->EmptyCache();
  EXPECT_EQ(device.live_segments, 1);
  EXPECT_EQ(allocator->stats().reserved_bytes, static_cast<int64_t>(2 * kMiB));
  allocator->Free(small, 1000);
}

TEST(CachingAllocatorTest, BestFitPicksTheSmallestAdequateBlock) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  // Free holes of 4096, 2048 and 8192 bytes, kept apart by 512-byte blocks;
  // the segment's tail (2 MiB - 15872 bytes) is free too.
  void* a = allocator->Allocate(4096);
  void* sep1 = allocator->Allocate(512);
  void* b = allocator->Allocate(2048);
  void* sep2 = allocator->Allocate(512);
  void* c = allocator->Allocate(8192);
  void* sep3 = allocator->Allocate(512);
  EXPECT_EQ(sep3, At(a, 4096 + 512 + 2048 + 512 + 8192));
  allocator->Free(a, 4096);
  allocator->Free(b, 2048);
  allocator->Free(c, 8192);

  EXPECT_EQ(allocator->Allocate(2048), b);  // exact fit
  void* x = allocator->Allocate(3000);      // 3072: the 4096 hole, split
  EXPECT_EQ(x, a);
  EXPECT_EQ(allocator->Allocate(1024), At(a, 3072));  // the 1024 left of that hole
  EXPECT_EQ(allocator->Allocate(5000), c);            // 5120: the 8192 hole
  EXPECT_EQ(device.mallocs, 1);
  for (void* p : {sep1, sep2, sep3}) allocator->Free(p, 512);
}

TEST(CachingAllocatorTest, LargeRequestDoesNotNibbleAFarBiggerCachedBlock) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  void* huge = allocator->Allocate(40 * kMiB);
  allocator->Free(huge, 40 * kMiB);

  // 40 MiB >= 2 MiB + 20 MiB: a fresh segment.
  void* two = allocator->Allocate(2 * kMiB);
  EXPECT_NE(two, huge);
  EXPECT_EQ(device.mallocs, 2);
  EXPECT_EQ(allocator->stats().reserved_bytes, static_cast<int64_t>(42 * kMiB));
  allocator->Free(two, 2 * kMiB);

  // 40 MiB < 21 MiB + 20 MiB: the cached block is split, its 19 MiB rest kept.
  void* a = allocator->Allocate(21 * kMiB);
  EXPECT_EQ(a, huge);
  void* b = allocator->Allocate(19 * kMiB);
  EXPECT_EQ(b, At(huge, 21 * kMiB));
  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(stats.segment_allocations, 2);
  EXPECT_EQ(stats.cache_hits, 2);
  EXPECT_EQ(device.mallocs, 2);
  allocator->Free(a, 21 * kMiB);
  allocator->Free(b, 19 * kMiB);
}

TEST(CachingAllocatorTest, LargeSegmentIsSplitWhenTheRestIsLarge) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  void* a = allocator->Allocate(2560 * kKiB);  // a 4 MiB segment; the 1.5 MiB rest is split off
  void* b = allocator->Allocate(1536 * kKiB);
  EXPECT_EQ(b, At(a, 2560 * kKiB));
  EXPECT_EQ(device.mallocs, 1);
  EXPECT_EQ(allocator->stats().cache_hits, 1);
  allocator->Free(a, 2560 * kKiB);
  allocator->Free(b, 1536 * kKiB);
}

TEST(CachingAllocatorTest, BlockUsedOnAnotherStreamWaitsForItsEvent) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  void* p = allocator->Allocate(1000);
  allocator->RecordStream(p, kCommStream);
  allocator->Free(p, 1000);
  EXPECT_EQ(allocator->stats().pending_frees, 1);
  EXPECT_EQ(device.live_events.size(), 1u);
  EXPECT_EQ(allocator->live_bytes(), 0);

  // The comm stream may still read p: the same size comes from the rest of
  // the segment instead.
  void* q = allocator->Allocate(1000);
  EXPECT_EQ(q, At(p, 1024));
  EXPECT_EQ(allocator->stats().pending_frees, 1);

  device.FinishStream(kCommStream);
  void* r = allocator->Allocate(1000);
  EXPECT_EQ(r, p);
  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(stats.pending_frees, 0);
  EXPECT_EQ(stats.segment_allocations, 1);
  EXPECT_EQ(device.events_recorded, 1);
  EXPECT_EQ(device.live_events.size(), 0u);
  EXPECT_EQ(device.synchronizes, 0);
  allocator->Free(q, 1000);
  allocator->Free(r, 1000);
}

TEST(CachingAllocatorTest, BlockUsedOnTwoStreamsWaitsForBoth) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  void* p = allocator->Allocate(4 * kMiB);
  allocator->RecordStream(p, kCommStream);
  allocator->RecordStream(p, kCopyStream);
  allocator->RecordStream(p, kCommStream);  // recorded once
  allocator->Free(p, 4 * kMiB);
  EXPECT_EQ(device.live_events.size(), 2u);

  device.FinishStream(kCommStream);
  void* q = allocator->Allocate(4 * kMiB);
  EXPECT_NE(q, p);
  EXPECT_EQ(allocator->stats().pending_frees, 1);
  EXPECT_EQ(device.live_events.size(), 1u);

  device.FinishStream(kCopyStream);
  void* r = allocator->Allocate(4 * kMiB);
  EXPECT_EQ(r, p);
  EXPECT_EQ(allocator->stats().pending_frees, 0);
  EXPECT_EQ(device.live_events.size(), 0u);
  EXPECT_EQ(device.mallocs, 2);
  allocator->Free(q, 4 * kMiB);
  allocator->Free(r, 4 * kMiB);
}

TEST(CachingAllocatorTest, RecordingTheAllocatorsOwnStreamNeedsNoEvent) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  void* p = allocator->Allocate(1000);
  allocator->RecordStream(p, kComputeStream);
  allocator->Free(p, 1000);
  EXPECT_EQ(allocator->stats().pending_frees, 0);
  EXPECT_EQ(device.events_recorded, 0);
  EXPECT_EQ(allocator->Allocate(1000), p);
  allocator->Free(p, 1000);
}

TEST(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetries) {
  FakeDevice device;
  device.capacity = 4 * kMiB;
  auto allocator = MakeAllocator(&device);
  void* large = allocator->Allocate(3 * kMiB);  // a 4 MiB segment, then cached
  allocator->Free(large, 3 * kMiB);

  // The small pool is empty and the device full: the cached large segment goes back.
  void* small = allocator->Allocate(1000);
  ASSERT_NE(small, nullptr);
  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(device.failed_mallocs, 1);
  EXPECT_EQ(device.synchronizes, 1);
  EXPECT_EQ(device.mallocs, 2);
  EXPECT_EQ(device.frees, 1);
  EXPECT_EQ(stats.segment_allocations, 2);
  EXPECT_EQ(stats.segment_frees, 1);
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(stats.peak_reserved_bytes, static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(stats.out_of_memory, 0);
  allocator->Free(small, 1000);
}

TEST(CachingAllocatorTest, OutOfMemoryReleasesBlocksWaitingForEvents) {
  FakeDevice device;
  device.capacity = 2 * kMiB;
  auto allocator = MakeAllocator(&device);
  void* p = allocator->Allocate(1000);
  allocator->RecordStream(p, kCommStream);
  allocator->Free(p, 1000);

  // Synchronize finishes the comm stream, p merges back into a wholly free
  // segment, which goes back to make room.
  void* large = allocator->Allocate(2 * kMiB);
  ASSERT_NE(large, nullptr);
  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(stats.pending_frees, 0);
  EXPECT_EQ(stats.segment_frees, 1);
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(device.live_events.size(), 0u);
  EXPECT_EQ(device.synchronizes, 1);
  allocator->Free(large, 2 * kMiB);
}

TEST(CachingAllocatorTest, OutOfMemoryWithNothingCachedReturnsNull) {
  FakeDevice device;
  device.capacity = 2 * kMiB;
  auto allocator = MakeAllocator(&device);
  void* p = allocator->Allocate(kMiB);  // a small segment, half used
  ASSERT_NE(p, nullptr);

  EXPECT_EQ(allocator->Allocate(4 * kMiB), nullptr);
  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(stats.out_of_memory, 1);
  EXPECT_EQ(stats.segment_frees, 0);
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(device.failed_mallocs, 2);
  EXPECT_EQ(device.synchronizes, 1);
  EXPECT_EQ(allocator->live_bytes(), static_cast<int64_t>(kMiB));
  EXPECT_EQ(allocator->total_allocations(), 1);

  // The rest of the segment still serves small requests.
  EXPECT_EQ(allocator->Allocate(kMiB), At(p, kMiB));
  EXPECT_EQ(allocator->stats().cache_hits, 1);
  allocator->Free(p, kMiB);
  allocator->Free(At(p, kMiB), kMiB);
}

TEST(CachingAllocatorTest, LiveBytesAreRequestedAndReservedBytesAreSegments) {
  FakeDevice device;
  {
    auto allocator = MakeAllocator(&device);
    void* a = allocator->Allocate(1000);
    void* b = allocator->Allocate(3 * kMiB + 1);  // a 4 MiB segment
    EXPECT_EQ(allocator->live_bytes(), static_cast<int64_t>(1000 + 3 * kMiB + 1));
    EXPECT_EQ(allocator->peak_bytes(), static_cast<int64_t>(1000 + 3 * kMiB + 1));
    allocator->Free(a, 1000);
    allocator->Free(b, 3 * kMiB + 1);
    EXPECT_EQ(allocator->live_bytes(), 0);
    EXPECT_EQ(allocator->peak_bytes(), static_cast<int64_t>(1000 + 3 * kMiB + 1));
    CachingAllocator::Stats stats = allocator->stats();
    EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(6 * kMiB));  // cached, still held
    EXPECT_EQ(stats.peak_reserved_bytes, static_cast<int64_t>(6 * kMiB));

    // Still allocated and still waiting for an event when the allocator goes.
    void* c = allocator->Allocate(1000);
    void* d = allocator->Allocate(2000);
    allocator->RecordStream(d, kCommStream);
    allocator->Free(d, 2000);
    EXPECT_NE(c, nullptr);
    EXPECT_EQ(device.live_segments, 2);
    EXPECT_EQ(device.live_events.size(), 1u);
  }
  EXPECT_EQ(device.synchronizes, 1);
  EXPECT_EQ(device.frees, 2);
  EXPECT_EQ(device.live_segments, 0);
  EXPECT_EQ(device.live_events.size(), 0u);
}

TEST(CachingAllocatorTest, UnknownPointersAreIgnored) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  void* p = allocator->Allocate(1000);
  int not_ours;
  allocator->RecordStream(&not_ours, kCommStream);
  allocator->Free(At(p, 512), 512);  // inside a block, not its start
  allocator->Free(p, 1000);
  EXPECT_EQ(allocator->Allocate(1000), p);
  EXPECT_EQ(device.events_recorded, 0);
  allocator->Free(p, 1000);
}

}  // namespace
}  // namespace strata
