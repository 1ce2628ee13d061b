#include "runtime/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata {

ThreadPool::ThreadPool(int num_threads) {
  // std::thread throws where the system refuses a thread (a ulimit on
  // threads or address space). Rather than let that end the process, the
  // pool starts again with half the workers it got, leaving the process
  // room for its other threads (the feed prefetcher, the communicators);
  // the caller computes too, so even none works.
  const int started = Start(num_threads);
  if (started < num_threads) {
    Stop();
    Start(started / 2);
  }
}

int ThreadPool::Start(int num_threads) {
  for (int i = 0; i < num_threads; ++i) {
    try {
      workers_.emplace_back([this] { WorkerLoop(); });
    } catch (const std::system_error&) {
      return i;
    }
  }
  return num_threads;
}

void ThreadPool::Stop() {
  stop_polling_.store(true, std::memory_order_release);  // workers still polling leave at once
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : workers_) t.join();
  workers_.clear();
  absl::MutexLock lock(&mu_);
  stopping_ = false;
  stop_polling_.store(false, std::memory_order_release);
}

ThreadPool::~ThreadPool() { Stop(); }

namespace {

// How long a thread that ran out of work polls for more before it sleeps on
// a mutex: 100 us, or STRATA_SPIN_US. A step's kernels come microseconds
// apart, and putting a thread to sleep and waking it costs about as much as
// a small kernel's chunk on a virtual machine (before this, 16% of the tiny
// GPT's CPU step's samples were the guest kernel's interrupt handling
// around futex waits and wake-ups). OpenMP runtimes, which PyTorch's CPU
// ops run on, spin before they sleep too (libgomp's GOMP_SPINCOUNT, Intel's
// KMP_BLOCKTIME of 200 ms). After the first polls each one yields the core,
// so a thread spinning where ranks share cores gives way to one with work.
absl::Duration SpinTime() {
  static const absl::Duration spin = [] {
    const int us = SpinMicrosFromEnv();
    return absl::Microseconds(us >= 0 ? us : 100);
  }();
  return spin;
}

// Polls `done` until it holds or SpinTime() has passed; whether it holds.
template <typename Done>
bool SpinUntil(const Done& done) {
  const absl::Duration spin = SpinTime();
  if (spin == absl::ZeroDuration()) return done();
  const absl::Time until = absl::Now() + spin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (i < 64) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      __asm__ __volatile__("yield");
#endif
    } else {
      if (absl::Now() > until) return false;
      std::this_thread::yield();
    }
  }
}

}  // namespace

void ThreadPool::WorkerLoop() {
  while (true) {
    const bool polled = SpinUntil([this] {
      return queued_.load(std::memory_order_acquire) > 0 || stop_polling_.load(std::memory_order_acquire);
    });
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      // Another thread took the task this one saw queued: poll again rather
      // than sleep, since more of the same call's chunks may follow. Not
      // once the pool is stopping: that poll would return at once, a busy
      // loop on the mutex until the destructor takes it.
      if (polled && queue_.empty() && !stopping_ && !stop_polling_.load(std::memory_order_acquire)) continue;
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      task = std::move(queue_.back());
      queue_.pop_back();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    task();
  }
}

// The chunks are fixed by n and min_chunk alone; which thread runs one does
// not change what it computes. The caller takes chunk 0 and then any chunk
// no worker has taken yet (a worker still waking up costs nothing then), so
// each chunk is taken once, through `next`. The workers' tasks share the
// job's counters (a task that starts after the caller returned finds no
// chunk left and touches nothing else).
void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(min_chunk, 1);
  int64_t max_parts = std::min<int64_t>(num_threads() + 1, (n + min_chunk - 1) / min_chunk);
  if (max_parts <= 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + max_parts - 1) / max_parts;
  const int64_t parts = (n + chunk - 1) / chunk;
  struct Job {
    std::atomic<int64_t> next{1};  // the next chunk to take; 0 is the caller's
    std::atomic<int64_t> done{0};  // chunks finished
    absl::Mutex mu;                // what a caller that stops spinning sleeps on
  };
  auto job = std::make_shared<Job>();
  // Runs chunks until none is left.
  auto take = [&fn, chunk, n, parts](Job& j) {
    for (int64_t p; (p = j.next.fetch_add(1, std::memory_order_relaxed)) < parts;) {
      fn(p * chunk, std::min(n, (p + 1) * chunk));
      if (j.done.fetch_add(1, std::memory_order_acq_rel) + 1 == parts) {
        absl::MutexLock wake(&j.mu);  // the sleeping caller's condition is checked as this unlocks
      }
    }
  };
  {
    absl::MutexLock lock(&mu_);
    for (int64_t p = 1; p < parts; ++p) queue_.push_back([job, take] { take(*job); });
    queued_.fetch_add(parts - 1, std::memory_order_release);
  }
  fn(0, std::min(n, chunk));
  job->done.fetch_add(1, std::memory_order_acq_rel);
  take(*job);
  auto all_done = [&job, parts]() -> bool { return job->done.load(std::memory_order_acquire) == parts; };
  if (SpinUntil(all_done)) return;
  absl::MutexLock lock(&job->mu);
  job->mu.Await(absl::Condition(&all_done));
}

int SpinMicrosFromEnv() {
  const char* env = std::getenv("STRATA_SPIN_US");
  if (env == nullptr) return -1;
  int v = 0;
  return absl::SimpleAtoi(env, &v) && v >= 0 && v <= kMaxSpinMicros ? v : -2;
}

int NumThreadsFromEnv() {
  const char* env = std::getenv("STRATA_NUM_THREADS");
  if (env == nullptr) return 0;
  int v = 0;
  return absl::SimpleAtoi(env, &v) && v >= 1 && v <= kMaxIntraOpThreads ? v : -1;
}

int IntraOpThreadsAsked() {
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
  static ThreadPool* pool = [] {
    auto* p = new ThreadPool(IntraOpThreadsAsked() - 1);
    if (p->num_threads() < IntraOpThreadsAsked() - 1) {
      std::fprintf(stderr, "note: the system started %d of the %d intra-op threads asked for; computing with %d\n",
                   p->num_threads() + 1, IntraOpThreadsAsked(), p->num_threads() + 1);
    }
    return p;
  }();
  return pool;
}

int IntraOpThreads() {
  static const int threads = GetIntraOpPool()->num_threads() + 1;
  return threads;
}

void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  GetIntraOpPool()->ParallelFor(n, min_chunk, fn);
}

}  // namespace strata
