#include "runtime/prefetcher.h"

#include <utility>

namespace strata {

FeedPrefetcher::FeedPrefetcher(LoadFn load) : load_(std::move(load)), thread_([this] { Loop(); }) {}

FeedPrefetcher::~FeedPrefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void FeedPrefetcher::Loop() {
  while (true) {
    Key key;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || queued_.has_value(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      key = *queued_;
      queued_.reset();
      loading_ = key;
      busy_ = true;
    }
    absl::StatusOr<Feeds> feeds = load_(key);
    absl::MutexLock lock(&mu_);
    result_ = std::move(feeds);
    busy_ = false;
  }
}

absl::StatusOr<FeedPrefetcher::Feeds> FeedPrefetcher::Get(const Key& key, const std::optional<Key>& next) {
  std::optional<absl::StatusOr<Feeds>> ahead;
  {
    absl::MutexLock lock(&mu_);
    // Wait until the loader is idle: a load in flight or queued finishes first.
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_ && !queued_.has_value(); };
    mu_.Await(absl::Condition(&idle));
    if (loading_.has_value() && *loading_ == key) ahead = std::move(result_);
    loading_.reset();
    result_.reset();
  }
  absl::StatusOr<Feeds> feeds = ahead.has_value() ? std::move(*ahead) : load_(key);
  if (ahead.has_value()) ++hits_;
  if (next.has_value()) {
    absl::MutexLock lock(&mu_);
    queued_ = next;
  }
  return feeds;
}

}  // namespace strata
