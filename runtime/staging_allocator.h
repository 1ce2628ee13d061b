#ifndef STRATA_RUNTIME_STAGING_ALLOCATOR_H_
#define STRATA_RUNTIME_STAGING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "runtime/allocator.h"
#include "runtime/caching_allocator.h"

namespace strata {

// Host buffers that stage a device's tensors (Device::staging_allocator):
// blocks from a backend (page-locked memory on a GPU) cached by exact size,
// since a step stages the same sizes every time. A free is stream-ordered
// for a host user: the block is handed out again only once `stream` has
// passed an event recorded at the free, because a host-to-device copy out
// of the block may still be running then, and the next user is the host
// itself (Gloo writing into it), which the stream does not order.
class StagingAllocator final : public Allocator {
 public:
  // `backend` gives host memory (Malloc/Free) and the events of `stream`.
  StagingAllocator(std::unique_ptr<CachingAllocator::Backend> backend, StreamHandle stream);
  // Synchronizes, then returns every block, cached or pending.
  ~StagingAllocator() override;
  StagingAllocator(const StagingAllocator&) = delete;
  StagingAllocator& operator=(const StagingAllocator&) = delete;

  std::string name() const override;
  // Blocks freed but still waiting for their event.
  int64_t pending_frees() const;
  // Blocks held from the backend (live, cached or pending), capture pools' included.
  int64_t backend_blocks() const;

  // Capture pools, as CachingAllocator's (see there): from BeginCapture until
  // EndCapture every block comes from pool `pool`'s own cache (0: a new pool,
  // whose id (> 0) is returned; an earlier id: share that pool) or from the
  // backend, never from the general cache. A pool's block, freed during or
  // after the capture, goes straight back to that pool's cache with no
  // event (the graph orders its uses), for later captures into the pool
  // only. While capturing there is no EventDone, RecordEvent, Synchronize or
  // backend Free: a failed Malloc returns nullptr, and a general block freed
  // during the capture waits for EndCapture to be freed as usual (the
  // captured work must not use it after its Free, at replay included). A
  // BeginCapture while capturing keeps the current pool; an id never
  // returned or released starts a new one (reported on stderr).
  int64_t BeginCapture(int64_t pool = 0);
  // Does nothing when not capturing.
  void EndCapture();
  // Frees the pool's cached blocks to the backend now (after EndCapture if
  // capturing), the rest when they are freed; the id is not handed out
  // again. Releasing the pool being captured into, or an unknown one, does nothing.
  void ReleasePool(int64_t pool);
  bool capturing() const;

 protected:
  void* RawAllocate(size_t bytes) override;
  void RawFree(void* ptr, size_t bytes) override;

 private:
  struct Pending {
    void* event;
    void* ptr;
    size_t bytes;
  };
  struct CapturePool {
    // Free blocks by exact size.
    absl::flat_hash_map<size_t, std::vector<void*>> cache;
    int64_t blocks = 0;  // held from the backend: live or cached
    bool released = false;
  };
  // Moves the pending blocks whose events are done into the cache.
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A general block's free outside a capture: cached once the stream passed an event.
  void FreeToGeneralCache(void* ptr, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the cached blocks of released pools and forgets the pools that
  // hold none. Not while capturing.
  void SweepReleasedPools() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<CachingAllocator::Backend> backend_;
  const StreamHandle stream_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<void*>> cache_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  int64_t backend_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int64_t, std::unique_ptr<CapturePool>> capture_pools_ ABSL_GUARDED_BY(mu_);
  // The pool of every block held from the backend for a capture pool.
  absl::flat_hash_map<void*, int64_t> pool_of_ ABSL_GUARDED_BY(mu_);
  int64_t next_pool_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t capture_pool_ ABSL_GUARDED_BY(mu_) = 0;  // 0: not capturing
  // General blocks (ptr, bytes) freed during the capture, freed at EndCapture.
  std::vector<std::pair<void*, size_t>> capture_deferred_frees_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_RUNTIME_STAGING_ALLOCATOR_H_
