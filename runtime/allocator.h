#ifndef STRATA_RUNTIME_ALLOCATOR_H_
#define STRATA_RUNTIME_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace strata {

// Every device's allocator counts live and peak bytes, so memory claims
// (the memory plan, 1F1B against F-then-B, recompute) are measured, not guessed.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual std::string name() const = 0;
  // Returns nullptr when the request cannot be met.
  void* Allocate(size_t bytes);
  void Free(void* ptr, size_t bytes);

  int64_t live_bytes() const { return live_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  int64_t total_allocations() const { return allocations_.load(std::memory_order_relaxed); }
  // Starts a new peak measurement from the current live bytes.
  void ResetPeak() { peak_.store(live_bytes(), std::memory_order_relaxed); }

 protected:
  virtual void* RawAllocate(size_t bytes) = 0;
  virtual void RawFree(void* ptr) = 0;

 private:
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
};

// 64-byte aligned host memory.
class CpuAllocator : public Allocator {
 public:
  std::string name() const override { return "cpu"; }

 protected:
  void* RawAllocate(size_t bytes) override;
  void RawFree(void* ptr) override;
};

// The process-wide host allocator.
Allocator* GetCpuAllocator();

}  // namespace strata

#endif  // STRATA_RUNTIME_ALLOCATOR_H_
