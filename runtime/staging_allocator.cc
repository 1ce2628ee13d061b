#include "runtime/staging_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

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
  void* event = backend_->RecordEvent(stream_);
  if (event == nullptr) {
    // No event to wait for: wait for everything instead.
    backend_->Synchronize();
    cache_[bytes].push_back(ptr);
    return;
  }
  pending_.push_back(Pending{event, ptr, bytes});
}

}  // namespace strata
