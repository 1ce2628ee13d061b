#include "runtime/staging_allocator.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "runtime/capture_pool_ids.h"

namespace strata {

StagingAllocator::StagingAllocator(std::unique_ptr<CachingAllocator::Backend> backend, StreamHandle stream)
    : backend_(std::move(backend)), stream_(stream) {}

StagingAllocator::~StagingAllocator() {
  backend_->Synchronize();
  absl::MutexLock lock(&mu_);
  for (const Pending& p : pending_) {
    backend_->DestroyEvent(p.event);
    backend_->Free(p.ptr);
  }
  for (auto& [bytes, blocks] : cache_) {
    for (void* ptr : blocks) backend_->Free(ptr);
  }
  for (const auto& [ptr, bytes] : capture_deferred_frees_) backend_->Free(ptr);
  for (auto& [id, pool] : capture_pools_) {
    for (auto& [bytes, blocks] : pool->cache) {
      for (void* ptr : blocks) backend_->Free(ptr);
    }
  }
}

std::string StagingAllocator::name() const { return absl::StrCat(backend_->name(), " staging"); }

int64_t StagingAllocator::pending_frees() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(pending_.size());
}

int64_t StagingAllocator::backend_blocks() const {
  absl::MutexLock lock(&mu_);
  return backend_blocks_;
}

void StagingAllocator::Reap() {
  auto done = std::stable_partition(pending_.begin(), pending_.end(),
                                    [&](const Pending& p) { return !backend_->EventDone(p.event); });
  for (auto it = done; it != pending_.end(); ++it) {
    backend_->DestroyEvent(it->event);
    cache_[it->bytes].push_back(it->ptr);
  }
  pending_.erase(done, pending_.end());
}

void* StagingAllocator::RawAllocate(size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (capture_pool_ != 0) {
    // The pool's own blocks or the backend's; no event queried, and on a
    // failed Malloc no cache freed (cudaFreeHost would synchronize).
    CapturePool& pool = *capture_pools_.at(capture_pool_);
    auto it = pool.cache.find(bytes);
    if (it != pool.cache.end() && !it->second.empty()) {
      void* ptr = it->second.back();
      it->second.pop_back();
      return ptr;
    }
    void* ptr = backend_->Malloc(std::max<size_t>(bytes, 1));
    if (ptr == nullptr) return nullptr;
    ++backend_blocks_;
    ++pool.blocks;
    pool_of_[ptr] = capture_pool_;
    return ptr;
  }
  Reap();
  auto it = cache_.find(bytes);
  if (it != cache_.end() && !it->second.empty()) {
    void* ptr = it->second.back();
    it->second.pop_back();
    return ptr;
  }
  void* ptr = backend_->Malloc(std::max<size_t>(bytes, 1));
  if (ptr == nullptr) {
    // Out of page-locked memory: give the cache back and try once more.
    for (auto& [size, blocks] : cache_) {
      for (void* block : blocks) backend_->Free(block);
      backend_blocks_ -= static_cast<int64_t>(blocks.size());
    }
    cache_.clear();
    ptr = backend_->Malloc(std::max<size_t>(bytes, 1));
    if (ptr == nullptr) return nullptr;
  }
  ++backend_blocks_;
  return ptr;
}

void StagingAllocator::RawFree(void* ptr, size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (auto it = pool_of_.find(ptr); it != pool_of_.end()) {
    auto pool_it = capture_pools_.find(it->second);
    CapturePool& pool = *pool_it->second;
    if (pool.released && capture_pool_ == 0) {
      backend_->Free(ptr);
      --backend_blocks_;
      pool_of_.erase(it);
      if (--pool.blocks == 0) capture_pools_.erase(pool_it);
      return;
    }
    // No event: the pool's next user is a capture into it, after this one.
    pool.cache[bytes].push_back(ptr);
    return;
  }
  if (capture_pool_ != 0) {
    // Recording an event now would break the capture.
    capture_deferred_frees_.emplace_back(ptr, bytes);
    return;
  }
  FreeToGeneralCache(ptr, bytes);
}

void StagingAllocator::FreeToGeneralCache(void* ptr, size_t bytes) {
  void* event = backend_->RecordEvent(stream_);
  if (event == nullptr) {
    // No event to wait for: wait for everything instead.
    backend_->Synchronize();
    cache_[bytes].push_back(ptr);
    return;
  }
  pending_.push_back(Pending{event, ptr, bytes});
}

void StagingAllocator::SweepReleasedPools() {
  for (auto pool_it = capture_pools_.begin(); pool_it != capture_pools_.end();) {
    CapturePool& pool = *pool_it->second;
    if (!pool.released) {
      ++pool_it;
      continue;
    }
    for (auto& [bytes, blocks] : pool.cache) {
      for (void* ptr : blocks) {
        backend_->Free(ptr);
        pool_of_.erase(ptr);
      }
      backend_blocks_ -= static_cast<int64_t>(blocks.size());
      pool.blocks -= static_cast<int64_t>(blocks.size());
    }
    pool.cache.clear();
    if (pool.blocks == 0) {
      capture_pools_.erase(pool_it++);
    } else {
      ++pool_it;
    }
  }
}

int64_t StagingAllocator::BeginCapture(int64_t pool) {
  absl::MutexLock lock(&mu_);
  capture_pool_ = ChooseCapturePool(name(), pool, capture_pool_, capture_pools_, next_pool_id_);
  return capture_pool_;
}

void StagingAllocator::EndCapture() {
  absl::MutexLock lock(&mu_);
  if (capture_pool_ == 0) return;
  capture_pool_ = 0;
  for (const auto& [ptr, bytes] : capture_deferred_frees_) FreeToGeneralCache(ptr, bytes);
  capture_deferred_frees_.clear();
  SweepReleasedPools();
}

void StagingAllocator::ReleasePool(int64_t pool) {
  absl::MutexLock lock(&mu_);
  auto it = capture_pools_.find(pool);
  if (it == capture_pools_.end() || it->second->released) return;
  if (pool == capture_pool_) {
    std::fprintf(stderr, "warning: %s: ReleasePool(%lld) while capturing into it; the pool is kept\n", name().c_str(),
                 static_cast<long long>(pool));
    return;
  }
  it->second->released = true;
  if (capture_pool_ == 0) SweepReleasedPools();
}

bool StagingAllocator::capturing() const {
  absl::MutexLock lock(&mu_);
  return capture_pool_ != 0;
}

}  // namespace strata
