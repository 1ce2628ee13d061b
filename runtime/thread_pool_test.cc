// ThreadPool::ParallelFor: every index in exactly one chunk, the chunks
// fixed by n and min_chunk alone, whichever thread runs them; callers on
// several threads at once sharing one pool; a pool destroyed while its
// workers poll for work; calls nested in a chunk.

#include "runtime/thread_pool.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

// The chunks one call makes, each once, and every index covered once.
std::set<std::pair<int64_t, int64_t>> Chunks(ThreadPool& pool, int64_t n, int64_t min_chunk) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex mu;
  std::set<std::pair<int64_t, int64_t>> chunks;
  pool.ParallelFor(n, min_chunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(chunks.insert({begin, end}).second) << begin << ", " << end;
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
  return chunks;
}

TEST(ThreadPoolTest, EveryIndexOnceInChunksFixedByTheSizes) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    for (int64_t min_chunk : {1, 5, 100, 5000}) {
      SCOPED_TRACE(testing::Message() << "n " << n << ", min_chunk " << min_chunk);
      const auto first = Chunks(pool, n, min_chunk);
      ASSERT_FALSE(first.empty());
      EXPECT_LE(first.size(), 4u);  // the workers and the caller
      // One size, the last chunk the rest.
      const int64_t size = first.begin()->second;
      for (const auto& [begin, end] : first) {
        EXPECT_EQ(begin % size, 0);
        if (end != n) {
          EXPECT_EQ(end - begin, size);
        }
      }
      for (int again = 0; again < 20; ++again) EXPECT_EQ(Chunks(pool, n, min_chunk), first);
    }
  }
  pool.ParallelFor(0, 1, [](int64_t, int64_t) { ADD_FAILURE() << "called for n = 0"; });
}

TEST(ThreadPoolTest, CallersOnSeveralThreadsShareOnePool) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int call = 0; call < 500; ++call) {
        pool.ParallelFor(1000, 10, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 500 * 1000);
}

TEST(ThreadPoolTest, APoolWithoutWorkersRunsOnTheCaller) {
  ThreadPool pool(0);
  const std::thread::id me = std::this_thread::get_id();
  int calls = 0;
  pool.ParallelFor(100, 1, [&](int64_t begin, int64_t end) {
    EXPECT_EQ(std::this_thread::get_id(), me);
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 100);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

// Workers that just ran a task poll for the next one; the destructor must
// still stop them (the test ends rather than hangs).
TEST(ThreadPoolTest, DestroyedRightAfterWork) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(3);
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(64, 1, [&](int64_t begin, int64_t end) { sum.fetch_add(end - begin); });
    EXPECT_EQ(sum.load(), 64);
  }
}

// A chunk that calls ParallelFor on its own pool: the inner caller takes
// whatever chunks no worker has, so this ends even when every worker is
// inside an outer chunk (a pool whose callers only waited hung here).
TEST(ThreadPoolTest, NestedCallsEnd) {
  ThreadPool pool(1);
  std::atomic<int64_t> total{0};
  for (int call = 0; call < 200; ++call) {
    pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
      pool.ParallelFor(100, 1, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
    });
  }
  EXPECT_EQ(total.load(), 200 * 2 * 100);
}

}  // namespace
}  // namespace strata
