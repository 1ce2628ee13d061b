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
  // SynchronizeWithin: the limits asked for, and whether the peer-waiting
  // work finishes in time (false: NCCL kernels waiting for a peer).
  std::vector<absl::Duration> sync_limits;
  bool peers_finish = true;
  int events_recorded = 0;
  int event_queries = 0;  // EventDone calls
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
  bool EventDone(void* event) override {
    ++device_->event_queries;
    return static_cast<FakeDevice::Event*>(event)->done;
  }
  void DestroyEvent(void* event) override {
    auto* e = static_cast<FakeDevice::Event*>(event);
    EXPECT_EQ(device_->live_events.erase(e), 1u) << "not a live event";
    delete e;
  }
  void Synchronize() override {
    ++device_->synchronizes;
    for (FakeDevice::Event* event : device_->live_events) event->done = true;
  }
  bool SynchronizeWithin(absl::Duration limit) override {
    device_->sync_limits.push_back(limit);
    if (!device_->peers_finish) return false;
    Synchronize();
    return true;
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

// With a limit on the wait (set_sync_limit: the executor's comm timeout on
// a GPU rank), a miss waits for the device's work that long at most; work
// that does not finish (NCCL kernels waiting for a peer that waits for this
// rank) makes the request fail, naming nothing released, where a full
// synchronization would hang.
TEST(CachingAllocatorTest, OutOfMemoryWaitsForTheDeviceOnlyWithinItsLimit) {
  FakeDevice device;
  device.capacity = 4 * kMiB;
  auto allocator = MakeAllocator(&device);
  allocator->set_sync_limit(absl::Seconds(7));
  void* large = allocator->Allocate(3 * kMiB);
  allocator->Free(large, 3 * kMiB);
  device.peers_finish = false;
  EXPECT_EQ(allocator->Allocate(1000), nullptr);
  EXPECT_EQ(device.sync_limits, (std::vector<absl::Duration>{absl::Seconds(7)}));
  EXPECT_EQ(device.synchronizes, 0);
  EXPECT_EQ(device.frees, 0) << "nothing released while the device's work may run";
  EXPECT_EQ(allocator->stats().out_of_memory, 1);
  EXPECT_EQ(allocator->stats().reserved_bytes, static_cast<int64_t>(4 * kMiB));
  // Once the peers' work finishes in time, the same miss empties the cache.
  device.peers_finish = true;
  void* small = allocator->Allocate(1000);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(device.frees, 1);
  EXPECT_EQ(device.sync_limits.size(), 2u);
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

// What a capture must never do: synchronize, query or record events. Taken
// before BeginCapture and compared before EndCapture.
struct DeviceCalls {
  int synchronizes;
  int event_queries;
  int events_recorded;
  int frees;
  explicit DeviceCalls(const FakeDevice& device)
      : synchronizes(device.synchronizes),
        event_queries(device.event_queries),
        events_recorded(device.events_recorded),
        frees(device.frees) {}
};

void ExpectNoDeviceCallsSince(const FakeDevice& device, const DeviceCalls& before) {
  EXPECT_EQ(device.synchronizes, before.synchronizes);
  EXPECT_EQ(device.event_queries, before.event_queries);
  EXPECT_EQ(device.events_recorded, before.events_recorded);
  EXPECT_EQ(device.frees, before.frees);
}

TEST(CachingAllocatorCaptureTest, CaptureAllocatesFromSegmentsOfItsOwn) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  // The general cache holds a free small block and a free 8 MiB segment.
  void* general_small = allocator->Allocate(1000);
  void* general_large = allocator->Allocate(8 * kMiB);
  allocator->Free(general_small, 1000);
  allocator->Free(general_large, 8 * kMiB);
  ASSERT_EQ(device.mallocs, 2);
  EXPECT_FALSE(allocator->capturing());

  const DeviceCalls before(device);
  const int64_t pool = allocator->BeginCapture();
  EXPECT_GT(pool, 0);
  EXPECT_TRUE(allocator->capturing());
  void* small = allocator->Allocate(1000);
  void* large = allocator->Allocate(8 * kMiB);
  ASSERT_NE(small, nullptr);
  ASSERT_NE(large, nullptr);
  EXPECT_NE(small, general_small);
  EXPECT_NE(large, general_large);
  EXPECT_EQ(device.mallocs, 4);
  // Later small requests of the capture share its small segment.
  EXPECT_EQ(allocator->Allocate(2000), At(small, 1024));
  ExpectNoDeviceCallsSince(device, before);
  allocator->EndCapture();
  EXPECT_FALSE(allocator->capturing());

  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(20 * kMiB));
  EXPECT_EQ(stats.pool_reserved_bytes, static_cast<int64_t>(10 * kMiB));
  allocator->Free(small, 1000);
  allocator->Free(large, 8 * kMiB);
  allocator->Free(At(small, 1024), 2000);

  // EmptyCache returns the general cache's segments only: graphs hold the pool's addresses.
  allocator->EmptyCache();
  stats = allocator->stats();
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(10 * kMiB));
  EXPECT_EQ(stats.pool_reserved_bytes, static_cast<int64_t>(10 * kMiB));
  EXPECT_EQ(device.live_segments, 2);
}

TEST(CachingAllocatorCaptureTest, PoolBlocksAreReusedOnlyByCapturesIntoTheirPool) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  const int64_t pool = allocator->BeginCapture();
  void* x = allocator->Allocate(4 * kMiB);
  allocator->Free(x, 4 * kMiB);
  // Freed within the capture: the same capture reuses it (stream order).
  EXPECT_EQ(allocator->Allocate(4 * kMiB), x);
  allocator->EndCapture();
  allocator->Free(x, 4 * kMiB);  // after the capture: back to the pool
  EXPECT_EQ(device.mallocs, 1);

  // Not for an allocation outside a capture.
  void* general = allocator->Allocate(4 * kMiB);
  EXPECT_NE(general, x);
  EXPECT_EQ(device.mallocs, 2);
  // Not for a capture into another pool.
  const int64_t other = allocator->BeginCapture();
  EXPECT_NE(other, pool);
  void* y = allocator->Allocate(4 * kMiB);
  EXPECT_NE(y, x);
  EXPECT_NE(y, general);
  allocator->Free(y, 4 * kMiB);
  allocator->EndCapture();
  EXPECT_EQ(device.mallocs, 3);
  // A capture sharing the pool does.
  EXPECT_EQ(allocator->BeginCapture(pool), pool);
  EXPECT_EQ(allocator->Allocate(4 * kMiB), x);
  allocator->EndCapture();
  EXPECT_EQ(device.mallocs, 3);
  EXPECT_EQ(allocator->stats().pool_reserved_bytes, static_cast<int64_t>(8 * kMiB));
  allocator->Free(x, 4 * kMiB);
  allocator->Free(general, 4 * kMiB);
}

TEST(CachingAllocatorCaptureTest, GeneralBlocksFreedDuringCaptureWaitForEndCapture) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  void* a = allocator->Allocate(1000);
  void* b = allocator->Allocate(1000);
  allocator->RecordStream(a, kCommStream);

  const DeviceCalls before(device);
  allocator->BeginCapture();
  allocator->Free(a, 1000);
  allocator->Free(b, 1000);
  EXPECT_EQ(allocator->live_bytes(), 0);
  EXPECT_EQ(allocator->stats().pending_frees, 0);  // no event yet
  void* captured = allocator->Allocate(1000);
  EXPECT_NE(captured, a);
  EXPECT_NE(captured, b);
  ExpectNoDeviceCallsSince(device, before);
  allocator->EndCapture();

  // Now freed as at their Free: a waits for the comm stream, b is free.
  EXPECT_EQ(device.events_recorded, 1);
  EXPECT_EQ(allocator->stats().pending_frees, 1);
  EXPECT_EQ(allocator->Allocate(1000), b);
  void* c = allocator->Allocate(1000);  // the rest of a's segment, not a
  EXPECT_NE(c, a);
  device.FinishStream(kCommStream);
  allocator->Free(c, 1000);
  EXPECT_EQ(allocator->Allocate(1000), a);
  EXPECT_EQ(allocator->stats().pending_frees, 0);
  allocator->Free(a, 1000);
  allocator->Free(b, 1000);
  allocator->Free(captured, 1000);
}

TEST(CachingAllocatorCaptureTest, CaptureBlockUsedOnAnotherStreamGoesBackToThePoolAtEndCapture) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  const DeviceCalls before(device);
  allocator->BeginCapture();
  void* p = allocator->Allocate(1000);
  allocator->RecordStream(p, kCommStream);
  allocator->Free(p, 1000);
  // Held: the capture does not reuse it, and records no event for it.
  void* q = allocator->Allocate(1000);
  EXPECT_EQ(q, At(p, 1024));
  ExpectNoDeviceCallsSince(device, before);
  allocator->EndCapture();
  // Back in the pool with no event: the graph orders the comm stream's use.
  EXPECT_EQ(device.events_recorded, 0);
  EXPECT_EQ(allocator->stats().pending_frees, 0);
  allocator->Free(q, 1000);
  EXPECT_EQ(device.mallocs, 1);
}

TEST(CachingAllocatorCaptureTest, OutOfMemoryDuringCaptureReturnsNullWithoutTouchingTheDevice) {
  FakeDevice device;
  device.capacity = 6 * kMiB;
  auto allocator = MakeAllocator(&device);
  // The general cache holds a free 4 MiB segment and a small block waiting for an event.
  void* large = allocator->Allocate(3 * kMiB);
  allocator->Free(large, 3 * kMiB);
  void* p = allocator->Allocate(1000);
  allocator->RecordStream(p, kCommStream);
  allocator->Free(p, 1000);
  device.FinishStream(kCommStream);

  const DeviceCalls before(device);
  allocator->BeginCapture();
  EXPECT_EQ(allocator->Allocate(1000), nullptr);
  allocator->EmptyCache();  // would synchronize: does nothing while capturing
  ExpectNoDeviceCallsSince(device, before);
  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(stats.out_of_memory, 1);
  EXPECT_EQ(stats.pending_frees, 1);
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(6 * kMiB));
  EXPECT_EQ(device.failed_mallocs, 1);
  EXPECT_EQ(allocator->total_allocations(), 2);
  allocator->EndCapture();

  // Outside the capture, the block whose event is done is reused again.
  void* q = allocator->Allocate(1000);
  EXPECT_EQ(q, p);
  allocator->Free(q, 1000);
}

TEST(CachingAllocatorCaptureTest, ReleasePoolReturnsFreeSegmentsNowAndTheRestWhenFreed) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  const int64_t pool = allocator->BeginCapture();
  void* small = allocator->Allocate(1000);
  void* large = allocator->Allocate(4 * kMiB);
  allocator->Free(large, 4 * kMiB);
  allocator->EndCapture();
  ASSERT_EQ(allocator->stats().pool_reserved_bytes, static_cast<int64_t>(6 * kMiB));

  allocator->ReleasePool(pool);
  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(device.frees, 1);
  EXPECT_EQ(stats.segment_frees, 1);
  EXPECT_EQ(stats.pool_reserved_bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(2 * kMiB));
  allocator->ReleasePool(pool);  // twice: nothing more
  EXPECT_EQ(device.frees, 1);

  allocator->Free(small, 1000);  // the last block of its segment
  stats = allocator->stats();
  EXPECT_EQ(device.frees, 2);
  EXPECT_EQ(device.live_segments, 0);
  EXPECT_EQ(stats.pool_reserved_bytes, 0);
  EXPECT_EQ(stats.reserved_bytes, 0);
  EXPECT_EQ(device.synchronizes, 0);

  // A released id is not handed out again: capturing into it starts a new pool.
  const int64_t next = allocator->BeginCapture(pool);
  EXPECT_NE(next, pool);
  EXPECT_GT(next, 0);
  // So does an id never returned.
  allocator->EndCapture();
  const int64_t unknown = allocator->BeginCapture(next + 100);
  EXPECT_NE(unknown, next + 100);
  EXPECT_NE(unknown, next);
  allocator->EndCapture();
}

TEST(CachingAllocatorCaptureTest, ReleasingDuringAnotherCaptureFreesSegmentsAtEndCapture) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  const int64_t first = allocator->BeginCapture();
  void* a = allocator->Allocate(4 * kMiB);
  void* b = allocator->Allocate(1000);
  allocator->Free(a, 4 * kMiB);
  allocator->EndCapture();

  const DeviceCalls before(device);
  const int64_t second = allocator->BeginCapture();
  EXPECT_NE(second, first);
  allocator->ReleasePool(first);
  allocator->Free(b, 1000);
  allocator->ReleasePool(second);  // the pool being captured into: kept
  void* c = allocator->Allocate(1000);
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c, b);  // never a released pool's block
  ExpectNoDeviceCallsSince(device, before);
  EXPECT_EQ(allocator->stats().pool_reserved_bytes, static_cast<int64_t>(8 * kMiB));
  allocator->EndCapture();

  CachingAllocator::Stats stats = allocator->stats();
  EXPECT_EQ(device.frees, 2);
  EXPECT_EQ(stats.pool_reserved_bytes, static_cast<int64_t>(2 * kMiB));
  allocator->Free(c, 1000);
  // The second pool was not released: its segment stays.
  EXPECT_EQ(allocator->BeginCapture(second), second);
  EXPECT_EQ(allocator->Allocate(1000), c);
  allocator->EndCapture();
  allocator->Free(c, 1000);
}

TEST(CachingAllocatorCaptureTest, NestedBeginCaptureKeepsTheCurrentPool) {
  FakeDevice device;
  auto allocator = MakeAllocator(&device);
  const int64_t pool = allocator->BeginCapture();
  EXPECT_EQ(allocator->BeginCapture(), pool);
  allocator->EndCapture();
  EXPECT_FALSE(allocator->capturing());
  allocator->EndCapture();  // not capturing: nothing
  EXPECT_FALSE(allocator->capturing());
}

TEST(CachingAllocatorCaptureTest, DestructorReturnsPoolSegmentsToo) {
  FakeDevice device;
  {
    auto allocator = MakeAllocator(&device);
    void* general = allocator->Allocate(1000);
    const int64_t pool = allocator->BeginCapture();
    void* live = allocator->Allocate(1000);
    void* freed = allocator->Allocate(4 * kMiB);
    allocator->Free(freed, 4 * kMiB);
    allocator->EndCapture();
    allocator->BeginCapture(pool);
    void* deferred = allocator->Allocate(2000);
    allocator->RecordStream(deferred, kCommStream);
    allocator->Free(deferred, 2000);
    allocator->Free(general, 1000);
    allocator->EndCapture();
    allocator->BeginCapture();
    allocator->Allocate(8 * kMiB);  // still capturing, still allocated
    EXPECT_NE(live, nullptr);
    EXPECT_EQ(device.live_segments, 4);
  }
  EXPECT_EQ(device.live_segments, 0);
  EXPECT_EQ(device.frees, 4);
  EXPECT_TRUE(device.live_events.empty());
}

}  // namespace
}  // namespace strata
