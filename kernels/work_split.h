#ifndef STRATA_KERNELS_WORK_SPLIT_H_
#define STRATA_KERNELS_WORK_SPLIT_H_

// How the nn kernels split their work where the split decides the order of a
// sum: shared by the CPU kernels and the CUDA kernels that add in the CPU's
// order (layer_norm_grad's dgamma and dbeta), so both get the same bits.

#include <algorithm>
#include <cstdint>

namespace strata {
namespace nn_kernels {

// Element operations per ParallelFor chunk below which splitting costs more
// than it saves, so tiny tensors run inline on the caller.
constexpr int64_t kParallelGrain = 1 << 14;

// Items per chunk for a loop whose items cost about `cost_per_item` element
// operations each.
inline int64_t MinChunk(int64_t cost_per_item) {
  return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cost_per_item, 1));
}

// layer_norm_grad sums dgamma and dbeta per block of this many rows (in row
// order), then over the blocks in order; at most kLayerNormGradMaxBlocks
// blocks, set by the shape only, so the order is the same on any thread count
// and on the GPU.
constexpr int64_t kLayerNormGradMaxBlocks = 64;
inline int64_t LayerNormGradRowsPerBlock(int64_t rows, int64_t d) {
  return std::max(MinChunk(8 * d), (rows + kLayerNormGradMaxBlocks - 1) / kLayerNormGradMaxBlocks);
}
inline int64_t LayerNormGradBlocks(int64_t rows, int64_t d) {
  const int64_t per_block = LayerNormGradRowsPerBlock(rows, d);
  return (rows + per_block - 1) / per_block;
}

}  // namespace nn_kernels
}  // namespace strata

#endif  // STRATA_KERNELS_WORK_SPLIT_H_
