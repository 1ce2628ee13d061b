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
  // Blocks held from the backend (live, cached or pending).
  int64_t backend_blocks() const;

 protected:
  void* RawAllocate(size_t bytes) override;
  void RawFree(void* ptr, size_t bytes) override;

 private:
  struct Pending {
    void* event;
    void* ptr;
    size_t bytes;
  };
  // Moves the pending blocks whose events are done into the cache.
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<CachingAllocator::Backend> backend_;
  const StreamHandle stream_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<void*>> cache_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  int64_t backend_blocks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_STAGING_ALLOCATOR_H_
