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
  RawFree(ptr);
  live_.fetch_sub(bytes, std::memory_order_relaxed);
}

void* CpuAllocator::RawAllocate(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded);
}

void CpuAllocator::RawFree(void* ptr) { std::free(ptr); }

Allocator* GetCpuAllocator() {
  static CpuAllocator* allocator = new CpuAllocator();
  return allocator;
}

}  // namespace strata
