// add, sub, mul, div with broadcasting.
// Blocks: a grid-stride loop over the output, 256 threads a block, at most
// kMaxBlocks blocks; a thread finds its inputs' elements by splitting its
// output index over the dims (outermost first) and summing index * stride.
// The same-shape path skips the index arithmetic and moves 16-byte packs
// where its operands are aligned (elementwise.cuh).

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/binary.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/kernel_math.h"

namespace strata {
namespace cuda {
namespace {

using elementwise::kThreadsPerBlock;
using elementwise::NumBlocks;

template <typename T, typename F>
__global__ void BroadcastKernel(T* z, const T* x, const T* y, int64_t n, BroadcastStrides s, F f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, ox = 0, oy = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      const int64_t index = rest % s.dims[d];
      rest /= s.dims[d];
      ox += index * s.x_strides[d];
      oy += index * s.y_strides[d];
    }
    z[i] = f(x[ox], y[oy]);
  }
}

// z[i] = f(x[i], y[i]): packs of 16 bytes where aligned (elementwise.cuh), the rest one by one.
template <typename T, typename F>
cudaError_t SameShape(F f, T* z, const T* x, const T* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int N = elementwise::PackWidth<T>();
  int64_t done = 0;
  if (N > 1 && elementwise::PacksAligned<N>(x, y, static_cast<const T*>(z))) {
    const int64_t packs = n / N;
    if (packs > 0) {
      elementwise::Map2PackKernel<N, T, T, T, F><<<NumBlocks(packs), kThreadsPerBlock, 0, stream>>>(z, x, y, packs,
                                                                                                   f);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    done = packs * N;
  }
  if (done == n) return cudaSuccess;
  elementwise::Map2Kernel<T, T, T, F><<<NumBlocks(n - done), kThreadsPerBlock, 0, stream>>>(
      z + done, x + done, y + done, n - done, f);
  return cudaGetLastError();
}

template <typename T, typename F>
cudaError_t Broadcast(F f, T* z, const T* x, const T* y, int64_t n, const BroadcastStrides& s, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (s.rank < 0 || s.rank > kMaxBroadcastDims) return cudaErrorInvalidValue;
  BroadcastKernel<T, F><<<NumBlocks(n), kThreadsPerBlock, 0, stream>>>(z, x, y, n, s, f);
  return cudaGetLastError();
}

template <typename T>
cudaError_t DispatchSameShape(BinaryOp op, T* z, const T* x, const T* y, int64_t n, cudaStream_t stream) {
  switch (op) {
    case BinaryOp::kAdd: return SameShape(AddFn(), z, x, y, n, stream);
    case BinaryOp::kSub: return SameShape(SubFn(), z, x, y, n, stream);
    case BinaryOp::kMul: return SameShape(MulFn(), z, x, y, n, stream);
    case BinaryOp::kDiv: return SameShape(DivFn(), z, x, y, n, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t DispatchBroadcast(BinaryOp op, T* z, const T* x, const T* y, int64_t n, const BroadcastStrides& s,
                              cudaStream_t stream) {
  switch (op) {
    case BinaryOp::kAdd: return Broadcast(AddFn(), z, x, y, n, s, stream);
    case BinaryOp::kSub: return Broadcast(SubFn(), z, x, y, n, s, stream);
    case BinaryOp::kMul: return Broadcast(MulFn(), z, x, y, n, s, stream);
    case BinaryOp::kDiv: return Broadcast(DivFn(), z, x, y, n, s, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LaunchBinarySameShape(BinaryOp op, float* z, const float* x, const float* y, int64_t n,
                                  cudaStream_t stream) {
  return DispatchSameShape(op, z, x, y, n, stream);
}
cudaError_t LaunchBinarySameShape(BinaryOp op, double* z, const double* x, const double* y, int64_t n,
                                  cudaStream_t stream) {
  return DispatchSameShape(op, z, x, y, n, stream);
}
cudaError_t LaunchBinarySameShape(BinaryOp op, int64_t* z, const int64_t* x, const int64_t* y, int64_t n,
                                  cudaStream_t stream) {
  if (op == BinaryOp::kDiv) return cudaErrorInvalidValue;  // as the CPU: no integer division
  return DispatchSameShape(op, z, x, y, n, stream);
}

cudaError_t LaunchBinaryBroadcast(BinaryOp op, float* z, const float* x, const float* y, int64_t n,
                                  const BroadcastStrides& s, cudaStream_t stream) {
  return DispatchBroadcast(op, z, x, y, n, s, stream);
}
cudaError_t LaunchBinaryBroadcast(BinaryOp op, double* z, const double* x, const double* y, int64_t n,
                                  const BroadcastStrides& s, cudaStream_t stream) {
  return DispatchBroadcast(op, z, x, y, n, s, stream);
}
cudaError_t LaunchBinaryBroadcast(BinaryOp op, int64_t* z, const int64_t* x, const int64_t* y, int64_t n,
                                  const BroadcastStrides& s, cudaStream_t stream) {
  if (op == BinaryOp::kDiv) return cudaErrorInvalidValue;
  return DispatchBroadcast(op, z, x, y, n, s, stream);
}

}  // namespace cuda
}  // namespace strata
