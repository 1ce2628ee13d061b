// Strided copies.
// Blocks: the general kernel is a grid-stride loop over the box's elements
// in dst's row-major order (256 threads a block, at most kMaxBlocks blocks),
// each thread turning its index into the two offsets, in 32-bit arithmetic
// where every offset fits (kernels/copy_plan.h's CopyPlanFitsInt32) and
// 64-bit otherwise. A run contiguous in both sides moves in chunks of up to
// 16 bytes (CopyChunkBytes, WidenCopyPlan), so a bf16 transpose that keeps
// the last dim (q, k, v between [B, T, H, D] and [B, H, T, D]) copies 8
// elements a thread. When
// the innermost dim is contiguous in dst but the next one out is the
// contiguous one in src (a transpose of the last two dims, after merging),
// 32 x 32 tiles go through shared memory instead, so reads and writes are
// both coalesced: one block of 32 x 8 threads a tile, grid-stride over tiles.

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/strided_copy.h"

namespace strata {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;
constexpr int kTile = 32;
constexpr int kTileRows = 8;  // threads along a tile's second dim

int64_t NumBlocks(int64_t n) { return std::min(kMaxBlocks, (n + kThreads - 1) / kThreads); }

// Offsets in dst and src of the box element with row-major index i, in
// index type I (int32_t where CopyPlanFitsInt32, else int64_t).
template <typename I>
__device__ void Offsets(const CopyPlan& p, I i, I* dst, I* src) {
  I d = 0, s = 0;
  for (int k = p.rank - 1; k >= 0; --k) {
    const I dim = static_cast<I>(p.dims[k]);
    const I index = i % dim;
    i /= dim;
    d += index * static_cast<I>(p.dst_strides[k]);
    s += index * static_cast<I>(p.src_strides[k]);
  }
  *dst = d;
  *src = s;
}

template <typename E, typename I>
__global__ void StridedCopyKernel(E* dst, const E* src, CopyPlan p) {
  const I count = static_cast<I>(p.count);
  for (I i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    I d, s;
    Offsets<I>(p, i, &d, &s);
    dst[d] = src[s];
  }
}

template <typename T>
__global__ void StridedScaleKernel(T* y, const T* x, T factor, CopyPlan p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.count; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t d, s;
    Offsets<int64_t>(p, i, &d, &s);
    y[d] = x[s] * factor;  // the CPU's BroadcastBinary(a * b)
  }
}

// Dims a = rank - 2 (stride 1 in src) and b = rank - 1 (stride 1 in dst);
// the dims before them index whole tiles.
template <typename E>
__global__ void TiledTransposeKernel(E* dst, const E* src, CopyPlan p, int64_t tiles_a, int64_t tiles_b,
                                     int64_t tiles) {
  __shared__ E tile[kTile][kTile + 1];  // +1: no bank conflicts down a column
  const int r = p.rank;
  const int64_t A = p.dims[r - 2], B = p.dims[r - 1];
  const int64_t src_b = p.src_strides[r - 1], dst_a = p.dst_strides[r - 2];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t b0 = (t % tiles_b) * kTile;
    const int64_t a0 = (t / tiles_b % tiles_a) * kTile;
    int64_t outer = t / tiles_b / tiles_a, d_base = 0, s_base = 0;
    for (int k = r - 3; k >= 0; --k) {
      const int64_t index = outer % p.dims[k];
      outer /= p.dims[k];
      d_base += index * p.dst_strides[k];
      s_base += index * p.src_strides[k];
    }
    // tile[j][i] = element (a0 + i, b0 + j): threadIdx.x walks a, src's contiguous dim.
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t a = a0 + threadIdx.x, b = b0 + j;
      if (a < A && b < B) tile[j][threadIdx.x] = src[s_base + a + b * src_b];
    }
    __syncthreads();
    // threadIdx.x walks b, dst's contiguous dim.
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t a = a0 + j, b = b0 + threadIdx.x;
      if (a < A && b < B) dst[d_base + a * dst_a + b] = tile[threadIdx.x][j];
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }
}

template <typename E>
cudaError_t Copy(E* dst, const E* src, const CopyPlan& p, cudaStream_t stream) {
  const int r = p.rank;
  if (r >= 2 && p.dst_strides[r - 1] == 1 && p.src_strides[r - 2] == 1) {
    const int64_t tiles_a = (p.dims[r - 2] + kTile - 1) / kTile, tiles_b = (p.dims[r - 1] + kTile - 1) / kTile;
    const int64_t tiles = p.count / (p.dims[r - 2] * p.dims[r - 1]) * tiles_a * tiles_b;
    TiledTransposeKernel<E>
        <<<std::min(kMaxBlocks, tiles), dim3(kTile, kTileRows), 0, stream>>>(dst, src, p, tiles_a, tiles_b, tiles);
  } else if (CopyPlanFitsInt32(p)) {
    StridedCopyKernel<E, int32_t><<<NumBlocks(p.count), kThreads, 0, stream>>>(dst, src, p);
  } else {
    StridedCopyKernel<E, int64_t><<<NumBlocks(p.count), kThreads, 0, stream>>>(dst, src, p);
  }
  return cudaGetLastError();
}

// The copy in chunks of chunk_bytes (CopyChunkBytes of the plan).
cudaError_t CopyInChunks(void* dst, const void* src, int chunk_bytes, const CopyPlan& p, cudaStream_t stream) {
  switch (chunk_bytes) {
    case 1: return Copy(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), p, stream);
    case 2: return Copy(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), p, stream);
    case 4: return Copy(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), p, stream);
    case 8: return Copy(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), p, stream);
    case 16: return Copy(static_cast<uint4*>(dst), static_cast<const uint4*>(src), p, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t Scale(T* y, const T* x, T factor, const CopyPlan& p, cudaStream_t stream) {
  if (p.count <= 0) return cudaSuccess;
  if (p.rank < 0 || p.rank > kMaxCopyDims) return cudaErrorInvalidValue;
  StridedScaleKernel<T><<<NumBlocks(p.count), kThreads, 0, stream>>>(y, x, factor, p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchStridedCopy(void* dst, const void* src, int element_size, const CopyPlan& plan, cudaStream_t stream) {
  if (plan.rank < 0 || plan.rank > kMaxCopyDims) return cudaErrorInvalidValue;
  if (element_size != 1 && element_size != 2 && element_size != 4 && element_size != 8) return cudaErrorInvalidValue;
  if (plan.count <= 0) return cudaSuccess;
  const int chunk = CopyChunkBytes(plan, element_size, reinterpret_cast<uintptr_t>(dst),
                                   reinterpret_cast<uintptr_t>(src));
  return CopyInChunks(dst, src, chunk, WidenCopyPlan(plan, element_size, chunk), stream);
}

cudaError_t LaunchStridedScale(float* y, const float* x, float factor, const CopyPlan& plan, cudaStream_t stream) {
  return Scale(y, x, factor, plan, stream);
}
cudaError_t LaunchStridedScale(double* y, const double* x, double factor, const CopyPlan& plan, cudaStream_t stream) {
  return Scale(y, x, factor, plan, stream);
}

}  // namespace cuda
}  // namespace strata
