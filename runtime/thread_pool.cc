#include "runtime/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "absl/strings/numbers.h"

namespace strata {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 0; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      task = std::move(queue_.back());
      queue_.pop_back();
    }
    task();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(min_chunk, 1);
  int64_t max_parts = std::min<int64_t>(num_threads() + 1, (n + min_chunk - 1) / min_chunk);
  if (max_parts <= 1) {
    fn(0, n);
    return;
  }
  int64_t chunk = (n + max_parts - 1) / max_parts;
  int64_t parts = (n + chunk - 1) / chunk;
  absl::Mutex done_mu;
  int64_t remaining = parts - 1;
  {
    absl::MutexLock lock(&mu_);
    for (int64_t p = 1; p < parts; ++p) {
      int64_t begin = p * chunk, end = std::min(n, begin + chunk);
      queue_.push_back([&, begin, end] {
        fn(begin, end);
        absl::MutexLock done_lock(&done_mu);
        --remaining;
      });
    }
  }
  fn(0, std::min(n, chunk));
  absl::MutexLock done_lock(&done_mu);
  auto all_done = [&remaining]() { return remaining == 0; };
  done_mu.Await(absl::Condition(&all_done));
}

int NumThreadsFromEnv() {
  const char* env = std::getenv("STRATA_NUM_THREADS");
  if (env == nullptr) return 0;
  int v = 0;
  return absl::SimpleAtoi(env, &v) && v >= 1 && v <= kMaxIntraOpThreads ? v : -1;
}

int IntraOpThreads() {
  static int threads = [] {
    // The cores this process may run on (taskset, cgroups, --bind_cores),
    // else every hardware thread.
    int n = static_cast<int>(std::thread::hardware_concurrency());
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) n = CPU_COUNT(&set);
    // Past the bound, creating the threads could fail and abort the process.
    if (const int v = NumThreadsFromEnv(); v > 0) n = v;
    return std::max(n, 1);
  }();
  return threads;
}

ThreadPool* GetIntraOpPool() {
  static ThreadPool* pool = new ThreadPool(IntraOpThreads() - 1);
  return pool;
}

void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  GetIntraOpPool()->ParallelFor(n, min_chunk, fn);
}

}  // namespace strata
