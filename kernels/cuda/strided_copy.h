#ifndef STRATA_KERNELS_CUDA_STRIDED_COPY_H_
#define STRATA_KERNELS_CUDA_STRIDED_COPY_H_

// Element copies between two strided layouts on the GPU: transpose, concat,
// split, slice and their gradients (a box of one tensor to a box of another),
// and broadcast_like (a copy that reads the source with stride 0 along the
// repeated dims, times a factor). Copies move raw bytes, so they are bit for
// bit. Plain C++ API; asynchronous on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/copy_plan.h"

namespace strata {
namespace cuda {

// The plan of a copy (kernels/copy_plan.h: dims merged, size-1 dims
// dropped; CPU-tested).
using ::strata::CopyPlan;
using ::strata::kMaxCopyDims;
using ::strata::MakeCopyPlan;

// dst at the plan's dst strides = src at its src strides, element_size (1,
// 2, 4 or 8) bytes an element; cudaErrorInvalidValue for another size. A
// run contiguous in both sides moves in chunks of up to 16 bytes
// (CopyChunkBytes). dst and src must not overlap.
cudaError_t LaunchStridedCopy(void* dst, const void* src, int element_size, const CopyPlan& plan, cudaStream_t stream);

// broadcast_like: y at the dst strides = x at the src strides * factor.
cudaError_t LaunchStridedScale(float* y, const float* x, float factor, const CopyPlan& plan, cudaStream_t stream);
cudaError_t LaunchStridedScale(double* y, const double* x, double factor, const CopyPlan& plan, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_STRIDED_COPY_H_
