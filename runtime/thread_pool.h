#ifndef STRATA_RUNTIME_THREAD_POOL_H_
#define STRATA_RUNTIME_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace strata {

// A fixed set of worker threads for intra-op parallelism. The calling thread
// takes part in the work, so a pool of N threads uses N+1 cores at most.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  int num_threads() const { return static_cast<int>(workers_.size()); }

  // Calls fn(begin, end) over [0, n) in contiguous chunks of at least
  // `min_chunk` items, spread over the workers and the caller; returns when all are done.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  // Starts up to num_threads more workers; how many started.
  int Start(int num_threads);
  // Stops and joins every worker (none may have a task queued).
  void Stop();
  absl::Mutex mu_;
  std::vector<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> queued_{0};  // queue_.size(), which idle workers poll without the lock
  std::atomic<bool> stop_polling_{false};  // set first by the destructor; polling workers check it
  std::vector<std::thread> workers_;
};

// The process-wide pool: hardware threads minus one (the caller works too).
// STRATA_NUM_THREADS overrides the total thread count (1 to
// kMaxIntraOpThreads; another value is ignored here, refused by the tool).
inline constexpr int kMaxIntraOpThreads = 1024;
// STRATA_NUM_THREADS as a count in 1..kMaxIntraOpThreads; 0 when unset, -1
// when it is set to anything else.
int NumThreadsFromEnv();
ThreadPool* GetIntraOpPool();
// STRATA_SPIN_US: how long (microseconds) an idle pool thread, or a caller
// waiting for the workers' chunks, polls before it sleeps; default 100.
// -1 when unset, -2 when set to anything but 0..kMaxSpinMicros (ignored
// here, refused by the tool).
inline constexpr int kMaxSpinMicros = 1000000;
int SpinMicrosFromEnv();
// Threads asked for: the cores this process may run on, or
// STRATA_NUM_THREADS. The memory plan counts its per-thread scratch with it
// without starting the pool.
int IntraOpThreadsAsked();
// Threads Strata computes with (pool workers plus the caller): those asked
// for, unless the system refused some (starts the pool).
int IntraOpThreads();

// ParallelFor on the process-wide pool; runs inline for small n.
void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace strata

#endif  // STRATA_RUNTIME_THREAD_POOL_H_
