#ifndef STRATA_RUNTIME_ALLOCATOR_H_
#define STRATA_RUNTIME_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace strata {

// An opaque stream (a cudaStream_t on a GPU); null on the CPU, where work
// runs inline.
using StreamHandle = void*;

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
  // `bytes` is what RawAllocate was asked for.
  virtual void RawFree(void* ptr, size_t bytes) = 0;

 private:
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
};

// 64-byte aligned host memory. Freed blocks of 16 KiB and more are kept,
// keyed by size, and handed out again (the caching of PyTorch's CUDA
// allocator and TensorFlow's BFC allocator): a training step allocates the
// same sizes every step, and fresh pages from the system cost a page fault
// each on first touch. The byte counters see only what is live.
class CpuAllocator : public Allocator {
 public:
  CpuAllocator() = default;
  ~CpuAllocator() override;
  std::string name() const override { return "cpu"; }
  // Returns every cached block to the system.
  void EmptyCache();
  int64_t cached_bytes() const;

 protected:
  void* RawAllocate(size_t bytes) override;
  void RawFree(void* ptr, size_t bytes) override;

 private:
  static constexpr size_t kMinCachedBytes = size_t{16} << 10;
  static constexpr size_t kMaxCachedBytes = size_t{2} << 30;  // beyond this, frees go to the system
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<void*>> cache_ ABSL_GUARDED_BY(mu_);
  size_t cached_ ABSL_GUARDED_BY(mu_) = 0;
};

// The process-wide host allocator.
Allocator* GetCpuAllocator();

}  // namespace strata

#endif  // STRATA_RUNTIME_ALLOCATOR_H_
