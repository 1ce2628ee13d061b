#ifndef STRATA_KERNELS_CUDA_ELEMENTWISE_CUH_
#define STRATA_KERNELS_CUDA_ELEMENTWISE_CUH_

// Element-wise kernels shared by unary.cu and binary.cu: y[i] = f(x[i]) and
// z[i] = f(a[i], b[i]), each element read and written by one thread, so y may
// alias x (and z a or b). Where every operand starts 16-byte aligned for a
// pack of N elements (N = 16 bytes over the widest operand's element), a
// thread moves its elements as one aligned word per operand (16 bytes of the
// widest, 8 of a 2-byte operand beside a 4-byte one), so a warp's loads are
// whole 128-byte lines; the n % N elements after the last pack, and operands
// not so aligned, take the one-element loop. The same f on the same element
// either way, so the bits do not depend on the path.
// Blocks: 256 threads a block, at most kMaxBlocks blocks; each thread handles
// every (grid size)-th element or pack, so any n, including n > 2^31, is
// covered. The launches live in the .cu files (the emulation tests rewrite
// the launches of a .cu file only): `elementwise::Map` and `Map2` in unary.cu,
// binary.cu's same-shape path.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace strata {
namespace cuda {
namespace elementwise {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 65536;

inline int64_t NumBlocks(int64_t n) { return std::min(kMaxBlocks, (n + kThreadsPerBlock - 1) / kThreadsPerBlock); }

// N elements of T moved as one word.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements a pack holds: 16 bytes of the widest operand.
template <typename... Ts>
constexpr int PackWidth() {
  return static_cast<int>(16 / std::max({sizeof(Ts)...}));
}

template <int N, typename... Ts>
bool PacksAligned(const Ts*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % (N * sizeof(Ts)) == 0) && ...);
}

template <typename S, typename D, typename F>
__global__ void MapKernel(D* y, const S* x, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = f(x[i]);
  }
}

template <int N, typename S, typename D, typename F>
__global__ void MapPackKernel(D* y, const S* x, int64_t packs, F f) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < packs; p += int64_t{gridDim.x} * blockDim.x) {
    const Pack<S, N> xs = reinterpret_cast<const Pack<S, N>*>(x)[p];
    Pack<D, N> ys;
#pragma unroll
    for (int e = 0; e < N; ++e) ys.v[e] = f(xs.v[e]);
    reinterpret_cast<Pack<D, N>*>(y)[p] = ys;
  }
}

// a, b and z may be stored in different types (f converts).
template <typename A, typename B, typename Z, typename F>
__global__ void Map2Kernel(Z* z, const A* a, const B* b, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    z[i] = f(a[i], b[i]);
  }
}

template <int N, typename A, typename B, typename Z, typename F>
__global__ void Map2PackKernel(Z* z, const A* a, const B* b, int64_t packs, F f) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < packs; p += int64_t{gridDim.x} * blockDim.x) {
    const Pack<A, N> as = reinterpret_cast<const Pack<A, N>*>(a)[p];
    const Pack<B, N> bs = reinterpret_cast<const Pack<B, N>*>(b)[p];
    Pack<Z, N> zs;
#pragma unroll
    for (int e = 0; e < N; ++e) zs.v[e] = f(as.v[e], bs.v[e]);
    reinterpret_cast<Pack<Z, N>*>(z)[p] = zs;
  }
}

}  // namespace elementwise
}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_ELEMENTWISE_CUH_
