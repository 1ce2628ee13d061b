#include "runtime/prefetcher.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace strata {
namespace {

using Key = FeedPrefetcher::Key;

// A load whose single tensor holds step * 1000 + first, from the thread it ran on.
FeedPrefetcher::LoadFn CountingLoad(std::atomic<int>* loads, std::thread::id* last_thread) {
  return [=](const Key& key) -> absl::StatusOr<FeedPrefetcher::Feeds> {
    loads->fetch_add(1);
    *last_thread = std::this_thread::get_id();
    if (key.step < 0) return absl::InvalidArgumentError("bad step");
    Tensor t = Tensor::Empty(F64, {key.rows});
    t.Fill(static_cast<double>(key.step * 1000 + key.first));
    return FeedPrefetcher::Feeds{{"x", t}};
  };
}

TEST(FeedPrefetcherTest, ForeseenKeysComeFromTheLoaderThread) {
  std::atomic<int> loads{0};
  std::thread::id thread;
  FeedPrefetcher p(CountingLoad(&loads, &thread));
  // Two steps of three micro-batches of 4 rows, each call naming the next.
  std::vector<Key> keys = {{0, 0, 4}, {0, 4, 4}, {0, 8, 4}, {1, 0, 4}, {1, 4, 4}, {1, 8, 4}};
  for (size_t i = 0; i < keys.size(); ++i) {
    std::optional<Key> next;
    if (i + 1 < keys.size()) next = keys[i + 1];
    auto feeds = p.Get(keys[i], next);
    ASSERT_TRUE(feeds.ok()) << feeds.status().message();
    const Tensor& x = feeds->at("x");
    ASSERT_EQ(x.num_elements(), 4);
    EXPECT_EQ(x.ValueAt(3), keys[i].step * 1000 + keys[i].first);
    if (i > 0) {
      EXPECT_NE(thread, std::this_thread::get_id()) << "call " << i;
    }
  }
  EXPECT_EQ(p.hits(), 5);  // all but the first
  EXPECT_EQ(loads.load(), 6);
}

TEST(FeedPrefetcherTest, AnUnforeseenKeyIsLoadedInline) {
  std::atomic<int> loads{0};
  std::thread::id thread;
  FeedPrefetcher p(CountingLoad(&loads, &thread));
  ASSERT_TRUE(p.Get({0, 0, 2}, Key{0, 2, 2}).ok());
  auto feeds = p.Get({5, 0, 2}, std::nullopt);  // not what was foreseen
  ASSERT_TRUE(feeds.ok());
  EXPECT_EQ(feeds->at("x").ValueAt(0), 5000);
  EXPECT_EQ(thread, std::this_thread::get_id());
  EXPECT_EQ(p.hits(), 0);
  EXPECT_EQ(loads.load(), 3);  // the foreseen load ran and was dropped
}

TEST(FeedPrefetcherTest, ErrorsOfBackgroundLoadsReachTheCaller) {
  std::atomic<int> loads{0};
  std::thread::id thread;
  FeedPrefetcher p(CountingLoad(&loads, &thread));
  ASSERT_TRUE(p.Get({0, 0, 2}, Key{-1, 0, 2}).ok());
  auto feeds = p.Get({-1, 0, 2}, std::nullopt);
  ASSERT_FALSE(feeds.ok());
  EXPECT_EQ(feeds.status().message(), "bad step");
  EXPECT_EQ(p.hits(), 1);
}

TEST(FeedPrefetcherTest, DestroyedWithALoadInFlight) {
  std::atomic<bool> started{false};
  const std::thread::id main_thread = std::this_thread::get_id();
  {
    FeedPrefetcher p([&](const Key&) -> absl::StatusOr<FeedPrefetcher::Feeds> {
      if (std::this_thread::get_id() == main_thread) return FeedPrefetcher::Feeds{};
      started = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return FeedPrefetcher::Feeds{};
    });
    ASSERT_TRUE(p.Get({0, 0, 1}, Key{0, 1, 1}).ok());
    while (!started) std::this_thread::yield();
  }  // joins, after the load in flight, without hanging or crashing
  EXPECT_TRUE(started);
}

}  // namespace
}  // namespace strata
