#ifndef STRATA_KERNELS_MULTI_TENSOR_TABLE_H_
#define STRATA_KERNELS_MULTI_TENSOR_TABLE_H_

// apex's multi_tensor_apply, the bookkeeping: tensors packed into tables
// small enough to pass by value as a kernel parameter (under the 4 KiB
// every CUDA device takes), each block of a launch one chunk of
// kMultiTensorChunk elements of one tensor. Plain C++ with
// STRATA_HOST_DEVICE, so nvcc compiles it into the multi-tensor optimizer
// kernels (kernels/cuda/optimizers.cu) and g++ into its test, which walks
// every block of every table on the CPU.

#include <cstdint>

#include "kernels/host_device.h"

namespace strata {

inline constexpr int kMultiTensorMax = 64;
inline constexpr int64_t kMultiTensorChunk = 16384;
// The most blocks one launch takes (CUDA's grid x limit).
inline constexpr int64_t kMultiTensorMaxBlocks = 0x7fffffff;

// Up to kMultiTensorMax tensors: ptr[d][k] is tensor k's pointer d (the
// optimizers: param, grad, then the states, and with attr copy_dtype the
// 16-bit copies last, stored as T*), n[k] its elements, block_start[k] its
// first block. About 3 KiB at kDepth 4, 3.5 KiB at 5 (8-byte T*).
template <typename T, int kDepth>
struct TensorTable {
  T* ptr[kDepth][kMultiTensorMax];
  int64_t n[kMultiTensorMax];
  int64_t block_start[kMultiTensorMax + 1];
  int count;
};

// The tensor block `b` of the table's launch works on (a linear scan: the
// table is small).
template <typename T, int kDepth>
STRATA_HOST_DEVICE inline int TensorOfBlock(const TensorTable<T, kDepth>& t, int64_t b) {
  int k = 0;
  while (k + 1 < t.count && t.block_start[k + 1] <= b) ++k;
  return k;
}

// The elements [lo, hi) of tensor k that block b updates.
template <typename T, int kDepth>
STRATA_HOST_DEVICE inline void ChunkOfBlock(const TensorTable<T, kDepth>& t, int k, int64_t b, int64_t* lo,
                                            int64_t* hi) {
  *lo = (b - t.block_start[k]) * kMultiTensorChunk;
  *hi = *lo + kMultiTensorChunk < t.n[k] ? *lo + kMultiTensorChunk : t.n[k];
}

// Packs `count` tensors (lists[d][i]: tensor i's pointer d, n[i] its
// elements) into tables in order and calls launch(table, blocks) for each
// full table and the last: a new table when kMultiTensorMax tensors or
// kMultiTensorMaxBlocks blocks are reached. Empty tensors take no block.
// Returns the first launch result that is not R{} (cudaSuccess), else R{}.
template <typename T, int kDepth, typename Launch>
auto ForEachTensorTable(const T* const* const (&lists)[kDepth], const int64_t* n, int count, Launch launch)
    -> decltype(launch(TensorTable<T, kDepth>(), int64_t{0})) {
  using R = decltype(launch(TensorTable<T, kDepth>(), int64_t{0}));
  TensorTable<T, kDepth> table;
  table.count = 0;
  table.block_start[0] = 0;
  const auto flush = [&]() -> R {
    if (table.count == 0) return R{};
    const R r = launch(table, table.block_start[table.count]);
    table.count = 0;
    return r;
  };
  for (int i = 0; i < count; ++i) {
    if (n[i] <= 0) continue;
    const int64_t blocks = (n[i] + kMultiTensorChunk - 1) / kMultiTensorChunk;
    if (table.block_start[table.count] + blocks > kMultiTensorMaxBlocks) {
      if (const R r = flush(); r != R{}) return r;
    }
    const int k = table.count;
    for (int d = 0; d < kDepth; ++d) table.ptr[d][k] = const_cast<T*>(lists[d][i]);
    table.n[k] = n[i];
    table.block_start[k + 1] = table.block_start[k] + blocks;
    ++table.count;
    if (table.count == kMultiTensorMax) {
      if (const R r = flush(); r != R{}) return r;
    }
  }
  return flush();
}

}  // namespace strata

#endif  // STRATA_KERNELS_MULTI_TENSOR_TABLE_H_
