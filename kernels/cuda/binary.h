#ifndef STRATA_KERNELS_CUDA_BINARY_H_
#define STRATA_KERNELS_CUDA_BINARY_H_

// z = f(x, y) for add, sub, mul and div on the GPU, with numpy broadcasting
// (the loop plan of kernels/broadcast_plan.h, flattened into dims and
// strides). Plain C++ API over device pointers; asynchronous on `stream`;
// returns the launch error (cudaSuccess and no launch when n == 0).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata {
namespace cuda {

enum class BinaryOp { kAdd, kSub, kMul, kDiv };

// Dims of the output after merging (outermost first) and each input's
// element stride along them, 0 where it is broadcast. Passed by value.
inline constexpr int kMaxBroadcastDims = 8;
struct BroadcastStrides {
  int rank = 0;
  int64_t dims[kMaxBroadcastDims] = {};
  int64_t x_strides[kMaxBroadcastDims] = {};
  int64_t y_strides[kMaxBroadcastDims] = {};
};

// z[n] = f(x[n], y[n]): same shapes. z may alias x or y.
cudaError_t LaunchBinarySameShape(BinaryOp op, float* z, const float* x, const float* y, int64_t n,
                                  cudaStream_t stream);
cudaError_t LaunchBinarySameShape(BinaryOp op, double* z, const double* x, const double* y, int64_t n,
                                  cudaStream_t stream);
cudaError_t LaunchBinarySameShape(BinaryOp op, int64_t* z, const int64_t* x, const int64_t* y, int64_t n,
                                  cudaStream_t stream);

// z[n] = f(x at its strides, y at its strides), n the product of s.dims.
cudaError_t LaunchBinaryBroadcast(BinaryOp op, float* z, const float* x, const float* y, int64_t n,
                                  const BroadcastStrides& s, cudaStream_t stream);
cudaError_t LaunchBinaryBroadcast(BinaryOp op, double* z, const double* x, const double* y, int64_t n,
                                  const BroadcastStrides& s, cudaStream_t stream);
cudaError_t LaunchBinaryBroadcast(BinaryOp op, int64_t* z, const int64_t* x, const int64_t* y, int64_t n,
                                  const BroadcastStrides& s, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_BINARY_H_
