#ifndef STRATA_KERNELS_CUDA_KEPT_BLOCK_ALLOCATOR_H_
#define STRATA_KERNELS_CUDA_KEPT_BLOCK_ALLOCATOR_H_

// Device memory for LtGemm's staging scratch (kernels/gemm_staging.h) where
// there is no CudaDevice, as the device's caching allocator serves it in a
// training step's steady state: one block, kept and handed out again (the
// GEMMs run on one stream, so reuse is in stream order, with no
// synchronisation at the free), grown with cudaFree/cudaMalloc when a larger
// one is asked for. For gemm_bench and the GEMM tests.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "runtime/allocator.h"

namespace strata {
namespace cuda {

class KeptBlockAllocator : public Allocator {
 public:
  ~KeptBlockAllocator() override {
    if (block_ != nullptr) cudaFree(block_);
  }
  std::string name() const override { return "kept block"; }

 protected:
  void* RawAllocate(size_t bytes) override {
    if (bytes > size_) {
      if (block_ != nullptr) cudaFree(block_);
      block_ = nullptr;
      size_ = 0;
      if (cudaMalloc(&block_, bytes) != cudaSuccess) return nullptr;
      size_ = bytes;
    }
    return block_;
  }
  void RawFree(void*, size_t) override {}

 private:
  void* block_ = nullptr;
  size_t size_ = 0;
};

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_KEPT_BLOCK_ALLOCATOR_H_
