#include "runtime/staging_allocator.h"

#include <cstdlib>
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
  void Pass() {
    for (bool* done : events) *done = true;
  }
};

class FakeHostBackend : public CachingAllocator::Backend {
 public:
  explicit FakeHostBackend(FakeStream* stream) : stream_(stream) {}
  std::string name() const override { return "fake:0"; }
  void* Malloc(size_t bytes) override {
    ++stream_->mallocs;
    return std::malloc(bytes);
  }
  void Free(void* ptr) override {
    ++stream_->frees;
    std::free(ptr);
  }
  void* RecordEvent(StreamHandle) override {
    bool* done = new bool(false);
    stream_->events.insert(done);
    return done;
  }
  bool EventDone(void* event) override { return *static_cast<bool*>(event); }
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

}  // namespace
}  // namespace strata
