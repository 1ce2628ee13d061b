#ifndef STRATA_RUNTIME_PREFETCHER_H_
#define STRATA_RUNTIME_PREFETCHER_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/tensor.h"

namespace strata {

// Loads the next micro-batch's feeds on a background thread while the
// executor computes the current one: the double buffer of Paddle's
// DataLoader and the prefetching of PyTorch's, one micro-batch ahead.
// What a load returns depends only on its key, so a run with the prefetcher
// trains exactly what a run without it trains.
class FeedPrefetcher {
 public:
  struct Key {
    int64_t step = 0;   // optimizer step
    int64_t first = 0;  // first row of the micro-batch within the step's batch
    int64_t rows = 0;
    bool operator==(const Key& o) const { return step == o.step && first == o.first && rows == o.rows; }
  };
  using Feeds = std::map<std::string, Tensor>;
  // Never runs concurrently with itself: either on the loader thread or,
  // when the key was not foreseen, on the caller's while the loader is idle.
  using LoadFn = std::function<absl::StatusOr<Feeds>(const Key&)>;

  explicit FeedPrefetcher(LoadFn load);
  ~FeedPrefetcher();  // waits for a load in flight, then stops the thread
  FeedPrefetcher(const FeedPrefetcher&) = delete;
  FeedPrefetcher& operator=(const FeedPrefetcher&) = delete;

  // The feeds of `key`: the background load's result when the previous call
  // foresaw this key, else loaded now. Then starts loading `next`, if any.
  absl::StatusOr<Feeds> Get(const Key& key, const std::optional<Key>& next);

  // Calls to Get whose key had been loaded ahead (for tests and reports).
  int64_t hits() const { return hits_; }

 private:
  void Loop();

  LoadFn load_;
  absl::Mutex mu_;
  std::optional<Key> queued_ ABSL_GUARDED_BY(mu_);  // to load next
  std::optional<Key> loading_ ABSL_GUARDED_BY(mu_);  // being loaded, or loaded into result_
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::StatusOr<Feeds>> result_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t hits_ = 0;
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_PREFETCHER_H_
