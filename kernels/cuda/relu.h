#ifndef STRATA_KERNELS_CUDA_RELU_H_
#define STRATA_KERNELS_CUDA_RELU_H_

// relu and its backward on the GPU, for float and double. Plain C++ API over
// device pointers; every launcher is asynchronous on `stream` and returns the
// launch error (cudaSuccess when n == 0: nothing is launched).
// Same numbers as kernels/cpu/activations.cc: y = max(x, 0) keeping nan (and
// -0), dx = dy where y > 0, else 0.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata {
namespace cuda {

// y[n] = max(x[n], 0). y may alias x.
cudaError_t LaunchRelu(float* y, const float* x, int64_t n, cudaStream_t stream);
cudaError_t LaunchRelu(double* y, const double* x, int64_t n, cudaStream_t stream);

// dx[n] = y[n] > 0 ? dy[n] : 0, y being relu's output. dx may alias dy.
cudaError_t LaunchReluGrad(float* dx, const float* y, const float* dy, int64_t n, cudaStream_t stream);
cudaError_t LaunchReluGrad(double* dx, const double* y, const double* dy, int64_t n, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_RELU_H_
