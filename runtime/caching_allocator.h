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
#include "absl/time/time.h"
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
    // The same, but waits at most `limit` for the streams whose work may
    // wait on other processes (NCCL's): false, having waited for nothing
    // else, when they did not finish in time. A backend without such
    // streams waits for everything.
    virtual bool SynchronizeWithin(absl::Duration limit) {
      Synchronize();
      return true;
    }
  };

  struct Stats {
    int64_t reserved_bytes = 0;  // held from the backend (segments)
    int64_t peak_reserved_bytes = 0;
    int64_t segment_allocations = 0;  // backend Malloc calls that succeeded
    int64_t segment_frees = 0;
    int64_t cache_hits = 0;     // allocations served without a backend Malloc
    int64_t out_of_memory = 0;  // requests that failed even after emptying the cache (while capturing: not emptied)
    int64_t pending_frees = 0;  // blocks now waiting for other streams' events
    // Bytes of segments held by capture pools, released ones still holding
    // live blocks included; part of reserved_bytes too.
    int64_t pool_reserved_bytes = 0;
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
  // also releases the blocks waiting for events); does nothing while
  // capturing, where Synchronize would break the capture.
  void EmptyCache();
  Stats stats() const;

  // Capture pools (PyTorch's graph private pools, torch.cuda.graph's `pool`).
  // A CUDA graph hard-codes every address its kernels touch, so from
  // BeginCapture until EndCapture every allocation is served from pool `pool`
  // (0: a new pool, whose id (> 0) is returned; an id returned before: share
  // that pool, as graphs that never replay at the same time may), in segments
  // of its own, never from the general cache. A block of a pool, freed during
  // or after the capture, goes back to that pool only: later captures into
  // the pool reuse it (the graph keeps the stream's order, so reuse within
  // one capture is safe too), nothing else does, until ReleasePool.
  //
  // While capturing, nothing here synchronizes or queries the device: no
  // Synchronize (a failed Malloc returns nullptr without emptying the cache;
  // EmptyCache does nothing), no EventDone (the blocks waiting for events
  // wait until after EndCapture), no RecordEvent and no backend Free. A block
  // freed during the capture with uses on other streams (RecordStream), and
  // every block of the general cache freed during it, is held until
  // EndCapture: a block of the captured pool then goes back to the pool with
  // no event (the graph orders its uses), any other block is freed as it
  // would have been at its Free. The caller's rule: captured work must not
  // use a general block after the capture's Free of it, at replay included
  // (the graph does not keep it alive; keep the tensor alive instead).
  //
  // Allocate takes no stream, so an allocation from any thread during the
  // capture comes from the pool too. Capture on the allocator's stream only,
  // one capture at a time: a BeginCapture while capturing is ignored and
  // returns the current pool, and an id never returned or already released
  // starts a new pool (both programmer errors, reported on stderr; nothing
  // aborts).
  int64_t BeginCapture(int64_t pool = 0);
  // Does nothing when not capturing.
  void EndCapture();
  // The pool's blocks go back to general use: its free segments are returned
  // to the backend now (no Synchronize needed: the caller has synchronised
  // or destroyed the graph), blocks still allocated when their Free comes.
  // The id is never handed out again. While capturing, the backend Frees
  // wait for EndCapture; releasing the pool being captured into, or an
  // unknown pool, does nothing.
  void ReleasePool(int64_t pool);
  bool capturing() const;
  // How long an allocation that misses on the device waits for the
  // device's work before returning the cache's segments and trying again
  // (Backend::SynchronizeWithin; unbounded by default). A rank's NCCL
  // kernels may wait for a peer that waits for this rank: past the limit
  // the allocation fails, naming its bytes, where the wait would hang.
  void set_sync_limit(absl::Duration limit);

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
  // The free blocks of one capture pool (0 is the general cache, kept in
  // small_blocks_ and large_blocks_).
  struct CapturePool {
    Pool small_blocks;
    Pool large_blocks;
    int64_t segments = 0;  // held from the backend, free or not
    bool released = false;
  };

  Pool& PoolOf(const Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The smallest free block of the pool (`pool_id`, small or large) that fits `size`, or nullptr.
  Block* FindFreeBlock(int64_t pool_id, bool small, size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fresh segment from the backend for pool `pool_id`, not in any free set
  // yet; nullptr when Malloc fails.
  Block* MallocSegment(int64_t pool_id, bool small, size_t segment_size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns a wholly free segment (a block with no neighbours, in no free set) to the backend.
  void FreeSegment(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges `block` with its free neighbours and puts the result in its pool;
  // a whole segment of a released capture pool goes back to the backend
  // instead (after the capture, if one runs).
  void FreeBlock(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A freed block (no longer in allocated_blocks_) that nothing holds back:
  // free it, or record events for its uses on other streams.
  void ReleaseBlock(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns the free segments of released capture pools and forgets the
  // pools that hold none. Not while capturing.
  void SweepReleasedPools() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the blocks whose events are all done.
  void ProcessEvents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Synchronizes, releases every pending block, returns every wholly free segment.
  // False, releasing nothing, when the device's work did not finish
  // within `limit`.
  bool SynchronizeAndReleaseCache(absl::Duration limit = absl::InfiniteDuration()) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<Backend> backend_;
  const StreamHandle stream_;
  mutable absl::Mutex mu_;
  Pool small_blocks_ ABSL_GUARDED_BY(mu_);
  Pool large_blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, Block*> allocated_blocks_ ABSL_GUARDED_BY(mu_);
  absl::Duration sync_limit_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();
  // The first block of each segment: it keeps the segment's address through
  // splits and merges, so it names the segment.
  absl::flat_hash_set<Block*> segments_ ABSL_GUARDED_BY(mu_);
  // (event, block) for freed blocks used on other streams.
  std::vector<std::pair<void*, Block*>> pending_events_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Capture pools by id; a released pool stays until its last segment is gone.
  absl::flat_hash_map<int64_t, std::unique_ptr<CapturePool>> capture_pools_ ABSL_GUARDED_BY(mu_);
  int64_t next_pool_id_ ABSL_GUARDED_BY(mu_) = 1;
  // The pool being captured into; 0 when not capturing.
  int64_t capture_pool_ ABSL_GUARDED_BY(mu_) = 0;
  // Blocks freed during the capture that wait for EndCapture (see BeginCapture).
  std::vector<Block*> capture_deferred_frees_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_RUNTIME_CACHING_ALLOCATOR_H_
