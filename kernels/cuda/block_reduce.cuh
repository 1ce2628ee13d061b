#ifndef STRATA_KERNELS_CUDA_BLOCK_REDUCE_CUH_
#define STRATA_KERNELS_CUDA_BLOCK_REDUCE_CUH_

// Device-side pieces the row-wise kernels share (losses.cu, nn.cu): a block
// reduction by a fixed tree, so two runs give the same bits, its max and sum,
// and a quiet NaN for the values the CPU would refuse. Include only from .cu
// files.

namespace strata {
namespace cuda {

// The block's kBlock values of `v` combined by a fixed tree (kBlock a power
// of two, the block's size); every thread gets the result. Ends with a
// barrier, so `shared` (kBlock doubles) may be reused at once.
template <int kBlock, typename F>
__device__ double BlockReduce(double v, double* shared, F f) {
  static_assert((kBlock & (kBlock - 1)) == 0, "the tree halves the block");
  const int tid = threadIdx.x;
  shared[tid] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (tid < s) shared[tid] = f(shared[tid], shared[tid + s]);
    __syncthreads();
  }
  const double result = shared[0];
  __syncthreads();
  return result;
}

// std::max(a, b) as the CPU writes it: b only if a < b, so NaNs never win.
struct MaxOp {
  __device__ double operator()(double a, double b) const { return a < b ? b : a; }
};
struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};

__device__ inline double QuietNaN() { return __longlong_as_double(0x7ff8000000000000LL); }

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_BLOCK_REDUCE_CUH_
