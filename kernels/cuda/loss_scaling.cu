// A grid-stride loop for the unscale and check (a block-local flag, then one
// store per block that met an inf or nan), one thread for the scalars.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/loss_scaling.h"
#include "kernels/loss_scaling_math.h"

namespace strata {
namespace cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 65536;

int64_t NumBlocks(int64_t n) { return std::min(kMaxBlocks, (n + kThreadsPerBlock - 1) / kThreadsPerBlock); }

__global__ void ClearFlagKernel(int* flag) { *flag = 0; }

template <typename T>
__global__ void UnscaleKernel(T* y, const T* x, int64_t n, const float* scale, int* flag) {
  __shared__ int block_found;
  if (threadIdx.x == 0) block_found = 0;
  __syncthreads();
  const T inv = static_cast<T>(kernel_math::InverseLossScale(scale[0]));
  bool found = false;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = kernel_math::UnscaleElement(x[i], inv, &found);
  }
  if (found) block_found = 1;
  __syncthreads();
  if (threadIdx.x == 0 && block_found) *flag = 1;
}

__global__ void FlagToFoundInfKernel(float* found_inf, const int* flag) { found_inf[0] = *flag != 0 ? 1.0f : 0.0f; }

__global__ void UpdateLossScalingKernel(const float* found_inf, float* scale, int64_t* good_steps,
                                        int64_t* skipped_updates, kernel_math::LossScalingAttrs attrs) {
  kernel_math::UpdateLossScale(attrs, kernel_math::SkipsUpdate(found_inf[0]), scale, good_steps, skipped_updates);
}

template <typename T>
cudaError_t Unscale(T* y, const T* x, int64_t n, const float* scale, int* flag, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  UnscaleKernel<T><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(y, x, n, scale, flag);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchClearFlag(int* flag, cudaStream_t stream) {
  ClearFlagKernel<<<1, 1, 0, stream>>>(flag);
  return cudaGetLastError();
}

cudaError_t LaunchUnscaleAndCheck(float* y, const float* x, int64_t n, const float* scale, int* flag,
                                  cudaStream_t stream) {
  return Unscale(y, x, n, scale, flag, stream);
}

cudaError_t LaunchUnscaleAndCheck(double* y, const double* x, int64_t n, const float* scale, int* flag,
                                  cudaStream_t stream) {
  return Unscale(y, x, n, scale, flag, stream);
}

cudaError_t LaunchFlagToFoundInf(float* found_inf, const int* flag, cudaStream_t stream) {
  FlagToFoundInfKernel<<<1, 1, 0, stream>>>(found_inf, flag);
  return cudaGetLastError();
}

cudaError_t LaunchUpdateLossScaling(const float* found_inf, float* scale, int64_t* good_steps,
                                    int64_t* skipped_updates, const kernel_math::LossScalingAttrs& attrs,
                                    cudaStream_t stream) {
  UpdateLossScalingKernel<<<1, 1, 0, stream>>>(found_inf, scale, good_steps, skipped_updates, attrs);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace strata
