#ifndef STRATA_RUNTIME_CACHING_ALLOCATOR_H_
#define STRATA_RUNTIME_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "runtime/allocator.h"

namespace strata {


// Device memory cut from cached segments in stream order, as PyTorch's
// CUDACachingAllocator and TensorFlow's BFC allocator do: every training step
// asks for the same sizes, and a device malloc synchronizes the device. The
// device-independent core; the CUDA side plugs in a Backend.
class CachingAllocator : public Allocator {
 public:
  // Where device memory and stream events come from.
  class Backend {
   public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;  // e.g. "cuda:0"
    // Returns nullptr when the device is out of memory.
    virtual void* Malloc(size_t bytes) = 0;
    virtual void Free(void* ptr) = 0;
    // Marks "now" on `stream`.
    virtual void* RecordEvent(StreamHandle stream) = 0;
    // Whether the stream has passed the mark.
    virtual bool EventDone(void* event) = 0;
    virtual void DestroyEvent(void* event) = 0;
    // Waits for all the device's work.
    virtual void Synchronize() = 0;
  };

  struct Stats {
    int64_t reserved_bytes = 0;  // held from the backend (segments)
    int64_t peak_reserved_bytes = 0;
    int64_t segment_allocations = 0;  // backend Malloc calls that succeeded
    int64_t segment_frees = 0;
    int64_t cache_hits = 0;     // allocations served without a backend Malloc
    int64_t out_of_memory = 0;  // requests that failed even after emptying the cache
    int64_t pending_frees = 0;  // blocks now waiting for other streams' events
  };

  // Sizes are rounded up to this; it is also the smallest block a split leaves.
  static constexpr size_t kMinBlockSize = 512;
  // Requests up to this size are carved from small segments.
  static constexpr size_t kSmallRequest = size_t{1} << 20;
  // The size of a small-pool segment; large segments are rounded up to a multiple of it.
  static constexpr size_t kSegmentGranularity = size_t{2} << 20;
  // A large request takes a cached block only if block size < request + this.
  static constexpr size_t kMaxOversize = size_t{20} << 20;

  // Blocks are handed out for work on `stream` (the device's compute stream).
  CachingAllocator(std::unique_ptr<Backend> backend, StreamHandle stream);
  // Returns every segment, blocks still allocated included (after Synchronize).
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  std::string name() const override;
  // The block holding `ptr` (as returned by Allocate) is also used by work on
  // `stream`: when it is freed, it is reused only once that stream has passed
  // the free. The allocator's own stream needs no record.
  void RecordStream(void* ptr, StreamHandle stream);
  // Returns every wholly free segment to the backend (after Synchronize, which
  // also releases the blocks waiting for events).
  void EmptyCache();
  Stats stats() const;

 protected:
  void* RawAllocate(size_t bytes) override;
  void RawFree(void* ptr, size_t bytes) override;

 private:
  struct Block;
  // Best-fit order: (size, address).
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockLess>;

  Pool& PoolOf(const Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The smallest free block of the pool that fits `size`, or nullptr.
  Block* FindFreeBlock(bool small, size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fresh segment from the backend, not in any pool yet; nullptr when Malloc fails.
  Block* MallocSegment(bool small, size_t segment_size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges `block` with its free neighbours and puts the result in its pool.
  void FreeBlock(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the blocks whose events are all done.
  void ProcessEvents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Synchronizes, releases every pending block, returns every wholly free segment.
  void SynchronizeAndReleaseCache() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<Backend> backend_;
  const StreamHandle stream_;
  mutable absl::Mutex mu_;
  Pool small_blocks_ ABSL_GUARDED_BY(mu_);
  Pool large_blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, Block*> allocated_blocks_ ABSL_GUARDED_BY(mu_);
  // The first block of each segment: it keeps the segment's address through
  // splits and merges, so it names the segment.
  absl::flat_hash_set<Block*> segments_ ABSL_GUARDED_BY(mu_);
  // (event, block) for freed blocks used on other streams.
  std::vector<std::pair<void*, Block*>> pending_events_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_RUNTIME_CACHING_ALLOCATOR_H_
