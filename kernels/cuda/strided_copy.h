#ifndef STRATA_KERNELS_CUDA_STRIDED_COPY_H_
#define STRATA_KERNELS_CUDA_STRIDED_COPY_H_

// Element copies between two strided layouts on the GPU: transpose, concat,
// split, slice and their gradients (a box of one tensor to a box of another),
// and broadcast_like (a copy that reads the source with stride 0 along the
// repeated dims, times a factor). Copies move raw 4- or 8-byte elements, so
// they are bit for bit. Plain C++ API; asynchronous on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata {
namespace cuda {

// The dims of the copied box (outermost first) and each side's element
// stride along them, dims contiguous in both sides merged, size-1 dims
// dropped. Passed by value.
inline constexpr int kMaxCopyDims = 8;
struct CopyPlan {
  int rank = 0;
  int64_t dims[kMaxCopyDims] = {};
  int64_t dst_strides[kMaxCopyDims] = {};
  int64_t src_strides[kMaxCopyDims] = {};
  int64_t count = 1;  // product of dims: 0 for an empty box
};

// The plan of a box of dims box[rank] at element strides dst_strides and
// src_strides. False when more than kMaxCopyDims dims are left after merging.
bool MakeCopyPlan(int rank, const int64_t* box, const int64_t* dst_strides, const int64_t* src_strides, CopyPlan* plan);

// dst at the plan's dst strides = src at its src strides, element_size (4 or
// 8) bytes an element; cudaErrorInvalidValue for another size. dst and src
// must not overlap.
cudaError_t LaunchStridedCopy(void* dst, const void* src, int element_size, const CopyPlan& plan, cudaStream_t stream);

// broadcast_like: y at the dst strides = x at the src strides * factor.
cudaError_t LaunchStridedScale(float* y, const float* x, float factor, const CopyPlan& plan, cudaStream_t stream);
cudaError_t LaunchStridedScale(double* y, const double* x, double factor, const CopyPlan& plan, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_STRIDED_COPY_H_
