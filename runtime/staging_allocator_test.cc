#include "runtime/staging_allocator.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace strata {
namespace {

// Host memory and events the test completes by hand, standing in for
// page-locked memory and a GPU stream's events.
struct FakeStream {
  std::set<bool*> events;
  int mallocs = 0;
  int frees = 0;
  int synchronizes = 0;
  int events_recorded = 0;
  int event_queries = 0;              // EventDone calls
  size_t capacity = size_t{1} << 40;  // bytes Malloc may hand out at once
  size_t used = 0;
  void Pass() {
    for (bool* done : events) *done = true;
  }
};

class FakeHostBackend : public CachingAllocator::Backend {
 public:
  explicit FakeHostBackend(FakeStream* stream) : stream_(stream) {}
  std::string name() const override { return "fake:0"; }
  void* Malloc(size_t bytes) override {
    if (stream_->used + bytes > stream_->capacity) return nullptr;
    ++stream_->mallocs;
    void* ptr = std::malloc(bytes);
    stream_->used += bytes;
    sizes_[ptr] = bytes;
    return ptr;
  }
  void Free(void* ptr) override {
    ++stream_->frees;
    stream_->used -= sizes_[ptr];
    sizes_.erase(ptr);
    std::free(ptr);
  }
  void* RecordEvent(StreamHandle) override {
    ++stream_->events_recorded;
    bool* done = new bool(false);
    stream_->events.insert(done);
    return done;
  }
  bool EventDone(void* event) override {
    ++stream_->event_queries;
    return *static_cast<bool*>(event);
  }
  void DestroyEvent(void* event) override {
    stream_->events.erase(static_cast<bool*>(event));
    delete static_cast<bool*>(event);
  }
  void Synchronize() override {
    ++stream_->synchronizes;
    stream_->Pass();
  }

 private:
  FakeStream* stream_;
  std::map<void*, size_t> sizes_;
};

TEST(StagingAllocatorTest, AFreedBlockWaitsForTheStreamBeforeItIsHandedOutAgain) {
  FakeStream stream;
  {
    StagingAllocator allocator(std::make_unique<FakeHostBackend>(&stream), nullptr);
    void* a = allocator.Allocate(4096);
    ASSERT_NE(a, nullptr);
    allocator.Free(a, 4096);
    EXPECT_EQ(allocator.pending_frees(), 1);
    // The copy out of `a` may still run: a second request gets fresh memory.
    void* b = allocator.Allocate(4096);
    EXPECT_NE(b, a);
    EXPECT_EQ(stream.mallocs, 2);
    stream.Pass();
    // Once the stream passed the free, the block is reused, by exact size only.
    void* c = allocator.Allocate(4096);
    EXPECT_EQ(c, a);
    EXPECT_EQ(allocator.pending_frees(), 0);
    void* d = allocator.Allocate(1024);
    EXPECT_EQ(stream.mallocs, 3);
    EXPECT_EQ(allocator.live_bytes(), 4096 * 2 + 1024);
    allocator.Free(b, 4096);
    allocator.Free(c, 4096);
    allocator.Free(d, 1024);
    EXPECT_EQ(allocator.live_bytes(), 0);
    EXPECT_EQ(allocator.backend_blocks(), 3);
  }
  // The destructor synchronizes and returns every block, pending ones too.
  EXPECT_EQ(stream.synchronizes, 1);
  EXPECT_EQ(stream.frees, 3);
  EXPECT_TRUE(stream.events.empty());
}

// Counts of what a capture must never call, to compare before EndCapture.
struct StreamCalls {
  int synchronizes;
  int events_recorded;
  int event_queries;
  int frees;
  explicit StreamCalls(const FakeStream& stream)
      : synchronizes(stream.synchronizes),
        events_recorded(stream.events_recorded),
        event_queries(stream.event_queries),
        frees(stream.frees) {}
};

void ExpectNoStreamCallsSince(const FakeStream& stream, const StreamCalls& before) {
  EXPECT_EQ(stream.synchronizes, before.synchronizes);
  EXPECT_EQ(stream.events_recorded, before.events_recorded);
  EXPECT_EQ(stream.event_queries, before.event_queries);
  EXPECT_EQ(stream.frees, before.frees);
}

TEST(StagingAllocatorCaptureTest, PoolBlocksComeBackWithoutEventsForTheirPoolOnly) {
  FakeStream stream;
  StagingAllocator allocator(std::make_unique<FakeHostBackend>(&stream), nullptr);
  // A general block of the same size, cached and ready.
  void* general = allocator.Allocate(4096);
  allocator.Free(general, 4096);
  stream.Pass();
  // And one still waiting for its event.
  void* waiting = allocator.Allocate(8192);
  allocator.Free(waiting, 8192);

  const StreamCalls before(stream);
  const int64_t pool = allocator.BeginCapture();
  EXPECT_GT(pool, 0);
  EXPECT_TRUE(allocator.capturing());
  void* a = allocator.Allocate(4096);
  EXPECT_NE(a, general);
  allocator.Free(a, 4096);
  EXPECT_EQ(allocator.Allocate(4096), a);  // same capture, stream order: no event
  allocator.Free(a, 4096);
  ExpectNoStreamCallsSince(stream, before);
  EXPECT_EQ(allocator.pending_frees(), 1);  // `waiting` was not reaped
  allocator.EndCapture();
  EXPECT_FALSE(allocator.capturing());

  // Outside a capture the general block, never the pool's.
  EXPECT_EQ(allocator.Allocate(4096), general);
  // Another pool gets a block of its own.
  const int64_t other = allocator.BeginCapture();
  EXPECT_NE(other, pool);
  void* b = allocator.Allocate(4096);
  EXPECT_NE(b, a);
  EXPECT_NE(b, general);
  allocator.Free(b, 4096);
  allocator.EndCapture();
  // A capture sharing the pool reuses its block.
  EXPECT_EQ(allocator.BeginCapture(pool), pool);
  EXPECT_EQ(allocator.Allocate(4096), a);
  allocator.EndCapture();
  allocator.Free(a, 4096);  // after the capture: to the pool, no event
  EXPECT_EQ(allocator.pending_frees(), 1);
  allocator.Free(general, 4096);
  EXPECT_EQ(allocator.backend_blocks(), 4);
}

TEST(StagingAllocatorCaptureTest, GeneralBlockFreedDuringCaptureGetsItsEventAtEndCapture) {
  FakeStream stream;
  StagingAllocator allocator(std::make_unique<FakeHostBackend>(&stream), nullptr);
  void* general = allocator.Allocate(4096);
  const StreamCalls before(stream);
  allocator.BeginCapture();
  allocator.Free(general, 4096);
  EXPECT_EQ(allocator.pending_frees(), 0);
  void* captured = allocator.Allocate(4096);
  EXPECT_NE(captured, general);
  allocator.Free(captured, 4096);
  ExpectNoStreamCallsSince(stream, before);
  allocator.EndCapture();
  EXPECT_EQ(stream.events_recorded, 1);
  EXPECT_EQ(allocator.pending_frees(), 1);
  stream.Pass();
  EXPECT_EQ(allocator.Allocate(4096), general);
  allocator.Free(general, 4096);
}

TEST(StagingAllocatorCaptureTest, FailedMallocDuringCaptureReturnsNullAndKeepsTheCache) {
  FakeStream stream;
  stream.capacity = 8192;
  StagingAllocator allocator(std::make_unique<FakeHostBackend>(&stream), nullptr);
  void* general = allocator.Allocate(8192);
  allocator.Free(general, 8192);
  stream.Pass();

  const StreamCalls before(stream);
  allocator.BeginCapture();
  EXPECT_EQ(allocator.Allocate(4096), nullptr);
  ExpectNoStreamCallsSince(stream, before);
  EXPECT_EQ(allocator.backend_blocks(), 1);
  allocator.EndCapture();
  // Outside a capture the cache goes back to make room.
  void* p = allocator.Allocate(4096);
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(stream.frees, 1);
  allocator.Free(p, 4096);
}

TEST(StagingAllocatorCaptureTest, ReleasePoolFreesCachedBlocksNowAndLiveOnesWhenFreed) {
  FakeStream stream;
  {
    StagingAllocator allocator(std::make_unique<FakeHostBackend>(&stream), nullptr);
    const int64_t pool = allocator.BeginCapture();
    void* cached = allocator.Allocate(4096);
    void* live = allocator.Allocate(1024);
    allocator.Free(cached, 4096);
    allocator.EndCapture();
    EXPECT_EQ(allocator.backend_blocks(), 2);

    allocator.ReleasePool(pool);
    EXPECT_EQ(stream.frees, 1);
    EXPECT_EQ(allocator.backend_blocks(), 1);
    allocator.Free(live, 1024);
    EXPECT_EQ(stream.frees, 2);
    EXPECT_EQ(allocator.backend_blocks(), 0);
    EXPECT_EQ(stream.events_recorded, 0);
    EXPECT_EQ(stream.synchronizes, 0);

    // A released id starts a new pool.
    const int64_t next = allocator.BeginCapture(pool);
    EXPECT_NE(next, pool);
    void* held = allocator.Allocate(2048);
    allocator.EndCapture();

    // Released during another capture: the backend Free waits for EndCapture.
    const StreamCalls before(stream);
    allocator.BeginCapture();
    allocator.ReleasePool(next);
    allocator.Free(held, 2048);
    void* kept = allocator.Allocate(2048);
    EXPECT_NE(kept, held);
    allocator.Free(kept, 2048);
    ExpectNoStreamCallsSince(stream, before);
    allocator.EndCapture();
    EXPECT_EQ(stream.frees, 3);
    EXPECT_EQ(allocator.backend_blocks(), 1);  // `kept`, in its pool's cache
  }
  // The destructor returns the pools' cached blocks too.
  EXPECT_EQ(stream.frees, 4);
}

}  // namespace
}  // namespace strata
