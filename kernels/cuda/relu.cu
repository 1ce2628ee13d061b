// relu forward and backward.
// Blocks: a grid-stride loop, 256 threads a block, at most kMaxBlocks blocks
// (enough to fill an H100 several times over); each thread handles every
// (grid size)-th element, so any n, including n > 2^31, is covered.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/relu.h"

namespace strata {
namespace cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 65536;

int64_t NumBlocks(int64_t n) { return std::min(kMaxBlocks, (n + kThreadsPerBlock - 1) / kThreadsPerBlock); }

template <typename T>
__global__ void ReluKernel(T* y, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const T v = x[i];
    // Written as the CPU's std::max(v, 0) so nan and -0 pass through unchanged.
    y[i] = v < T(0) ? T(0) : v;
  }
}

template <typename T>
__global__ void ReluGradKernel(T* dx, const T* y, const T* dy, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dx[i] = y[i] > T(0) ? dy[i] : T(0);
  }
}

// No __restrict__: callers may run in place (y == x, dx == dy); each element
// is read and then written by one thread only.
template <typename T>
cudaError_t Relu(T* y, const T* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ReluKernel<T><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(y, x, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t ReluGrad(T* dx, const T* y, const T* dy, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ReluGradKernel<T><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(dx, y, dy, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchRelu(float* y, const float* x, int64_t n, cudaStream_t stream) { return Relu(y, x, n, stream); }
cudaError_t LaunchRelu(double* y, const double* x, int64_t n, cudaStream_t stream) { return Relu(y, x, n, stream); }

cudaError_t LaunchReluGrad(float* dx, const float* y, const float* dy, int64_t n, cudaStream_t stream) {
  return ReluGrad(dx, y, dy, n, stream);
}
cudaError_t LaunchReluGrad(double* dx, const double* y, const double* dy, int64_t n, cudaStream_t stream) {
  return ReluGrad(dx, y, dy, n, stream);
}

}  // namespace cuda
}  // namespace strata
