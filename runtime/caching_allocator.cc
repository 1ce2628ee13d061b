#include "runtime/caching_allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "runtime/capture_pool_ids.h"

namespace strata {

// One piece of a segment. The blocks of a segment form a doubly linked list in
// address order, so a freed block finds its neighbours to merge with.
struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;
  bool small = false;   // which pool it belongs to
  int64_t pool_id = 0;  // its segment's capture pool; 0: the general cache
  // True from allocation until the block is back in its pool, so while it
  // waits for events it is neither handed out nor merged into.
  bool allocated = false;
  Block* prev = nullptr;
  Block* next = nullptr;
  // Streams other than the allocator's that use the block (RecordStream).
  std::vector<StreamHandle> stream_uses;
  int pending_events = 0;
};

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}

namespace {

size_t RoundUp(size_t bytes, size_t multiple) { return (bytes + multiple - 1) / multiple * multiple; }

// Beyond this, rounding and the oversize limit would overflow; no device has it.
constexpr size_t kMaxRequest = std::numeric_limits<size_t>::max() / 4;

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<Backend> backend, StreamHandle stream)
    : backend_(std::move(backend)), stream_(stream) {}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mu_);
  // Work queued on the device may still use any block.
  backend_->Synchronize();
  for (const auto& [event, block] : pending_events_) backend_->DestroyEvent(event);
  pending_events_.clear();
  for (Block* first : segments_) {
    backend_->Free(first->ptr);
    for (Block* block = first; block != nullptr;) {
      Block* next = block->next;
      delete block;
      block = next;
    }
  }
  segments_.clear();
}

std::string CachingAllocator::name() const { return backend_->name(); }

CachingAllocator::Pool& CachingAllocator::PoolOf(const Block* block) {
  if (block->pool_id == 0) return block->small ? small_blocks_ : large_blocks_;
  // A capture pool stays in capture_pools_ while it holds a segment.
  CapturePool& pool = *capture_pools_.at(block->pool_id);
  return block->small ? pool.small_blocks : pool.large_blocks;
}

CachingAllocator::Block* CachingAllocator::FindFreeBlock(int64_t pool_id, bool small, size_t size) {
  Block key;
  key.size = size;
  key.small = small;
  key.pool_id = pool_id;
  Pool& pool = PoolOf(&key);
  auto it = pool.lower_bound(&key);
  if (it == pool.end()) return nullptr;
  // Every later block is bigger still: a huge block would be nibbled away by
  // requests far smaller than it, so a fresh segment is better.
  if (!small && (*it)->size >= size + kMaxOversize) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::MallocSegment(int64_t pool_id, bool small, size_t segment_size) {
  void* ptr = backend_->Malloc(segment_size);
  if (ptr == nullptr) return nullptr;
  Block* block = new Block;
  block->ptr = static_cast<char*>(ptr);
  block->size = segment_size;
  block->small = small;
  block->pool_id = pool_id;
  segments_.insert(block);
  ++stats_.segment_allocations;
  stats_.reserved_bytes += static_cast<int64_t>(segment_size);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  if (pool_id != 0) {
    ++capture_pools_.at(pool_id)->segments;
    stats_.pool_reserved_bytes += static_cast<int64_t>(segment_size);
  }
  return block;
}

void CachingAllocator::FreeSegment(Block* block) {
  backend_->Free(block->ptr);
  segments_.erase(block);
  ++stats_.segment_frees;
  stats_.reserved_bytes -= static_cast<int64_t>(block->size);
  if (block->pool_id != 0) {
    --capture_pools_.at(block->pool_id)->segments;
    stats_.pool_reserved_bytes -= static_cast<int64_t>(block->size);
  }
  delete block;
}

void* CachingAllocator::RawAllocate(size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes > kMaxRequest) {
    ++stats_.out_of_memory;
    return nullptr;
  }
  const size_t size = RoundUp(bytes, kMinBlockSize);
  const bool small = size <= kSmallRequest;
  // While capturing, every block comes from the capture's pool, and the
  // device is neither queried nor synchronized (see BeginCapture).
  const int64_t pool_id = capture_pool_;
  if (pool_id == 0) ProcessEvents();
  Block* block = FindFreeBlock(pool_id, small, size);
  if (block != nullptr) {
    ++stats_.cache_hits;
  } else {
    const size_t segment_size = small ? kSegmentGranularity : RoundUp(size, kSegmentGranularity);
    block = MallocSegment(pool_id, small, segment_size);
    if (block == nullptr && pool_id == 0) {
      // The cache may hold what the device lacks, unless the device's
      // work does not finish within the limit (NCCL kernels waiting for a
      // peer that waits for this rank): then the request fails.
      if (SynchronizeAndReleaseCache(sync_limit_)) block = MallocSegment(pool_id, small, segment_size);
    }
    if (block == nullptr) {
      ++stats_.out_of_memory;
      return nullptr;
    }
  }
  // A remainder of up to 1 MiB stays with a large block: no large request
  // (> 1 MiB) could use it, and small requests have their own pool.
  const size_t remainder = block->size - size;
  if (small ? remainder >= kMinBlockSize : remainder > kSmallRequest) {
    Block* rest = new Block;
    rest->ptr = block->ptr + size;
    rest->size = remainder;
    rest->small = small;
    rest->pool_id = block->pool_id;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    PoolOf(rest).insert(rest);
  }
  block->allocated = true;
  allocated_blocks_[block->ptr] = block;
  return block->ptr;
}

void CachingAllocator::RawFree(void* ptr, size_t /*bytes: the block knows its size*/) {
  absl::MutexLock lock(&mu_);
  auto it = allocated_blocks_.find(ptr);
  // Not ours, or freed twice: a programmer error, but the codebase has no
  // logging to report it, and touching unknown memory would be worse.
  if (it == allocated_blocks_.end()) return;
  Block* block = it->second;
  allocated_blocks_.erase(it);
  if (capture_pool_ != 0) {
    // A capture pool's block with no other stream's uses goes back to its
    // pool now: the capture's own (reused later in the capture, in stream
    // order) or another's (whose next capture is after this one). Anything
    // else would need an event now: it waits for EndCapture.
    if (block->pool_id != 0 && block->stream_uses.empty()) {
      FreeBlock(block);
    } else {
      capture_deferred_frees_.push_back(block);
    }
    return;
  }
  ReleaseBlock(block);
}

void CachingAllocator::ReleaseBlock(Block* block) {
  if (block->stream_uses.empty()) {
    // Later work on the allocator's stream runs after the work that used the
    // block, so it may reuse it at once.
    FreeBlock(block);
    return;
  }
  for (StreamHandle stream : block->stream_uses) {
    pending_events_.emplace_back(backend_->RecordEvent(stream), block);
    ++block->pending_events;
  }
  block->stream_uses.clear();
  ++stats_.pending_frees;
}

void CachingAllocator::FreeBlock(Block* block) {
  block->allocated = false;
  // Merging keeps the earlier block object, so a segment's first block lives
  // as long as the segment.
  if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {
    PoolOf(prev).erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next != nullptr) prev->next->prev = prev;
    delete block;
    block = prev;
  }
  if (Block* next = block->next; next != nullptr && !next->allocated) {
    PoolOf(next).erase(next);
    block->size += next->size;
    block->next = next->next;
    if (block->next != nullptr) block->next->prev = block;
    delete next;
  }
  if (block->pool_id != 0 && block->prev == nullptr && block->next == nullptr && capture_pool_ == 0) {
    // The last block of a released pool's segment: the segment goes back.
    // (While capturing, a backend Free must wait: EndCapture sweeps.)
    auto it = capture_pools_.find(block->pool_id);
    if (it->second->released) {
      FreeSegment(block);
      if (it->second->segments == 0) capture_pools_.erase(it);
      return;
    }
  }
  PoolOf(block).insert(block);
}

void CachingAllocator::ProcessEvents() {
  size_t kept = 0;
  for (const auto& [event, block] : pending_events_) {
    if (!backend_->EventDone(event)) {
      pending_events_[kept++] = {event, block};
      continue;
    }
    backend_->DestroyEvent(event);
    if (--block->pending_events == 0) {
      --stats_.pending_frees;
      FreeBlock(block);
    }
  }
  pending_events_.resize(kept);
}

void CachingAllocator::set_sync_limit(absl::Duration limit) {
  absl::MutexLock lock(&mu_);
  sync_limit_ = limit;
}

bool CachingAllocator::SynchronizeAndReleaseCache(absl::Duration limit) {
  // Also makes sure no queued work on the allocator's own stream still uses a
  // cached block when its segment goes back.
  if (limit == absl::InfiniteDuration()) {
    backend_->Synchronize();
  } else if (!backend_->SynchronizeWithin(limit)) {
    return false;
  }
  for (const auto& [event, block] : pending_events_) {
    backend_->DestroyEvent(event);
    if (--block->pending_events == 0) {
      --stats_.pending_frees;
      FreeBlock(block);
    }
  }
  pending_events_.clear();
  // Only the general cache: a capture pool keeps its segments until
  // ReleasePool, since its graphs hard-code their addresses.
  for (Pool* pool : {&small_blocks_, &large_blocks_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev != nullptr || block->next != nullptr) {
        ++it;
        continue;
      }
      it = pool->erase(it);
      FreeSegment(block);
    }
  }
  return true;
}

void CachingAllocator::SweepReleasedPools() {
  for (auto pool_it = capture_pools_.begin(); pool_it != capture_pools_.end();) {
    CapturePool& pool = *pool_it->second;
    if (!pool.released) {
      ++pool_it;
      continue;
    }
    for (Pool* blocks : {&pool.small_blocks, &pool.large_blocks}) {
      for (auto it = blocks->begin(); it != blocks->end();) {
        Block* block = *it;
        if (block->prev != nullptr || block->next != nullptr) {
          ++it;
          continue;
        }
        it = blocks->erase(it);
        FreeSegment(block);
      }
    }
    if (pool.segments == 0) {
      capture_pools_.erase(pool_it++);
    } else {
      ++pool_it;
    }
  }
}

void CachingAllocator::RecordStream(void* ptr, StreamHandle stream) {
  if (stream == stream_) return;
  absl::MutexLock lock(&mu_);
  auto it = allocated_blocks_.find(ptr);
  if (it == allocated_blocks_.end()) return;  // see RawFree
  std::vector<StreamHandle>& uses = it->second->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
}

void CachingAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  if (capture_pool_ != 0) return;  // Synchronize would break the capture
  SynchronizeAndReleaseCache();
}

int64_t CachingAllocator::BeginCapture(int64_t pool) {
  absl::MutexLock lock(&mu_);
  capture_pool_ = ChooseCapturePool(backend_->name(), pool, capture_pool_, capture_pools_, next_pool_id_);
  return capture_pool_;
}

void CachingAllocator::EndCapture() {
  absl::MutexLock lock(&mu_);
  if (capture_pool_ == 0) return;
  const int64_t pool = capture_pool_;
  capture_pool_ = 0;
  for (Block* block : capture_deferred_frees_) {
    if (block->pool_id == pool) {
      // Its uses on other streams were captured into the graph, which orders them.
      block->stream_uses.clear();
      FreeBlock(block);
    } else {
      ReleaseBlock(block);
    }
  }
  capture_deferred_frees_.clear();
  SweepReleasedPools();
}

void CachingAllocator::ReleasePool(int64_t pool) {
  absl::MutexLock lock(&mu_);
  auto it = capture_pools_.find(pool);
  if (it == capture_pools_.end() || it->second->released) return;
  if (pool == capture_pool_) {
    std::fprintf(stderr, "warning: %s: ReleasePool(%lld) while capturing into it; the pool is kept\n",
                 backend_->name().c_str(), static_cast<long long>(pool));
    return;
  }
  it->second->released = true;
  if (capture_pool_ == 0) SweepReleasedPools();
}

bool CachingAllocator::capturing() const {
  absl::MutexLock lock(&mu_);
  return capture_pool_ != 0;
}

CachingAllocator::Stats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace strata
