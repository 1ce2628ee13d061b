#include "runtime/allocator.h"

#include <cstdlib>

namespace strata {

void* Allocator::Allocate(size_t bytes) {
  void* ptr = RawAllocate(bytes == 0 ? 1 : bytes);
  if (ptr == nullptr) return nullptr;
  allocations_.fetch_add(1, std::memory_order_relaxed);
  int64_t live = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  return ptr;
}

void Allocator::Free(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  RawFree(ptr, bytes == 0 ? 1 : bytes);
  live_.fetch_sub(bytes, std::memory_order_relaxed);
}

namespace {
size_t Rounded(size_t bytes) { return (bytes + 63) / 64 * 64; }
}  // namespace

CpuAllocator::~CpuAllocator() { EmptyCache(); }

void* CpuAllocator::RawAllocate(size_t bytes) {
  const size_t rounded = Rounded(bytes);
  if (rounded >= kMinCachedBytes) {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(rounded);
    if (it != cache_.end() && !it->second.empty()) {
      void* ptr = it->second.back();
      it->second.pop_back();
      cached_ -= rounded;
      return ptr;
    }
  }
  void* ptr = std::aligned_alloc(64, rounded);
  if (ptr == nullptr && cached_bytes() > 0) {
    EmptyCache();  // the system may serve the request once the cache is back
    ptr = std::aligned_alloc(64, rounded);
  }
  return ptr;
}

void CpuAllocator::RawFree(void* ptr, size_t bytes) {
  const size_t rounded = Rounded(bytes);
  if (rounded >= kMinCachedBytes) {
    absl::MutexLock lock(&mu_);
    if (cached_ + rounded <= kMaxCachedBytes) {
      cache_[rounded].push_back(ptr);
      cached_ += rounded;
      return;
    }
  }
  std::free(ptr);
}

void CpuAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  for (auto& [size, blocks] : cache_) {
    for (void* p : blocks) std::free(p);
  }
  cache_.clear();
  cached_ = 0;
}

int64_t CpuAllocator::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(cached_);
}

Allocator* GetCpuAllocator() {
  static CpuAllocator* allocator = new CpuAllocator();
  return allocator;
}

}  // namespace strata
