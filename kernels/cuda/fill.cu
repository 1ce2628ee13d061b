// fill_like's fill. Blocks: a grid-stride loop, 256 threads a block, at most
// kMaxBlocks blocks.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/fill.h"

namespace strata {
namespace cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 65536;

template <typename U>
__global__ void FillKernel(U* y, U value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = value;
  }
}

template <typename U>
cudaError_t Fill(void* y, uint64_t bits, int64_t n, cudaStream_t stream) {
  const int64_t blocks = std::min(kMaxBlocks, (n + kThreadsPerBlock - 1) / kThreadsPerBlock);
  FillKernel<U><<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<U*>(y), static_cast<U>(bits), n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchFill(void* y, int element_size, uint64_t bits, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (element_size) {
    case 1: return Fill<uint8_t>(y, bits, n, stream);
    case 2: return Fill<uint16_t>(y, bits, n, stream);
    case 4: return Fill<uint32_t>(y, bits, n, stream);
    case 8: return Fill<uint64_t>(y, bits, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace strata
