#ifndef STRATA_KERNELS_CUDA_MMA_M16N8K16_H_
#define STRATA_KERNELS_CUDA_MMA_M16N8K16_H_

// Warp-wide 16 x 8 x 16 tensor-core products with float accumulators through
// PTX's mma.sync (sm_80 and later), whose register fragments the PTX ISA
// documents ("Matrix Fragments for mma.m16n8k16"; lane = 4 g + t):
//   A [16][16], row major, 16-bit pairs: a[0] row g, columns 2t and 2t + 1;
//     a[1] row g + 8, the same columns; a[2] row g, columns 2t + 8, 2t + 9;
//     a[3] row g + 8, those columns;
//   B [16][8], column major: b[0] rows (k) 2t, 2t + 1 of column g; b[1]
//     rows 2t + 8, 2t + 9 of it;
//   C and D [16][8] floats: d[0], d[1] row g, columns 2t, 2t + 1; d[2], d[3]
//     row g + 8.
// A pair's lower 16 bits hold the even column (or row), as two consecutive
// elements in memory read as one 32-bit word. So a warp's scores, softmax
// and output rows stay in registers, where WMMA's fragments are opaque and
// must pass through shared memory (flash_attention.cu). Compiled against
// testing/cuda_stand_in/ (g++, CUDA_STAND_IN) the product is the stand-in's
// warp-level emulation of the same layouts.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace strata {
namespace cuda {
namespace mma {

// d += a b of the warp: every lane of the warp calls it.
template <typename G>
__device__ inline void Mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ inline void Mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(CUDA_STAND_IN)
  ::cuda_stand_in::Mma16816<__nv_bfloat16>(d, a, b);
#endif
}

template <>
__device__ inline void Mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(CUDA_STAND_IN)
  ::cuda_stand_in::Mma16816<__half>(d, a, b);
#endif
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 of a warp: four 8 x 8
// matrices of 16-bit elements from shared memory, every lane of the warp
// calling it. Lane l passes the address of row l % 8 of matrix l / 8 (16
// bytes, 16-byte aligned). r[i] receives matrix i's elements (row l / 4,
// columns 2 (l % 4) and + 1) as one word, the even column in the low half:
// an A fragment (mma_m16n8k16's a[i], rows g, columns 2t..) or, from rows
// that are the product's columns, a B fragment (b[0] of column g). With
// kTrans the matrix comes transposed: r[i] holds (rows 2 (l % 4) and + 1,
// column l / 4), a B fragment (k 2t.., column g) of a row-major [k][n] tile,
// so a tile whose rows run along a product's k needs no transposed copy.
// The PTX ISA's "Warp-level matrix load instruction: ldmatrix";
// CUTLASS's SM75_U32x4_LDSM_N and SM75_U16x8_LDSM_T.
template <bool kTrans>
__device__ inline void LdMatrixX4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__)
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
#elif defined(CUDA_STAND_IN)
  ::cuda_stand_in::LdMatrixX4(r, row, kTrans);
#endif
}

// movmatrix.sync.aligned.m8n8.trans.b16 of a warp (sm_75 and later): an
// 8 x 8 matrix of 16-bit elements held as ldmatrix's fragments (lane l: its
// row l / 4, columns 2 (l % 4) and + 1 as one word, the even column in the
// low half) comes back transposed in the same layout: lane l receives
// column l / 4, rows 2 (l % 4) and + 1. So the A fragments of a product's
// transpose need no trip through shared memory: a 16 x 16 A fragment's four
// words, each transposed, are the transpose's A fragment as (a[0], a[2],
// a[1], a[3]). The PTX ISA's "Warp-level matrix transpose: movmatrix".
// Every lane of the warp calls it.
__device__ inline uint32_t MovMatrixTrans(uint32_t w) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(w));
  return r;
#elif defined(CUDA_STAND_IN)
  // Element (row, column) lies in lane 4 row + column / 2, half column % 2.
  const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  const uint32_t lo = __shfl_sync(0xffffffffu, w, 4 * (2 * t) + g / 2);
  const uint32_t hi = __shfl_sync(0xffffffffu, w, 4 * (2 * t + 1) + g / 2);
  const int shift = 16 * (g % 2);
  return ((lo >> shift) & 0xffffu) | (((hi >> shift) & 0xffffu) << 16);
#else
  return w;
#endif
}

// cp.async.cg.shared.global of 16 bytes (sm_80 and later): src to shared dst
// without passing through registers, both 16-byte aligned, L2 fetching the
// 128-byte line around it (.L2::128B, as CUTLASS's SM80 copies); with !valid the
// 16 bytes are zeros and nothing is read (src must still be a valid
// address). Lands after the thread's CpAsyncWait that covers its group,
// and is visible to the block after a __syncthreads that follows that wait.
__device__ inline void CpAsync16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__)
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#elif defined(CUDA_STAND_IN)
  ::cuda_stand_in::CpAsync(dst, src, valid, 16);
#endif
}

// cp.async.ca.shared.global of 4 bytes (one float): as CpAsync16, both
// addresses 4-byte aligned.
__device__ inline void CpAsync4(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__)
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
#elif defined(CUDA_STAND_IN)
  ::cuda_stand_in::CpAsync(dst, src, valid, 4);
#endif
}

// cp.async.commit_group: the thread's copies since the last commit become
// one group (an empty one if there were none).
__device__ inline void CpAsyncCommit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(CUDA_STAND_IN)
  ::cuda_stand_in::CpAsyncCommit();
#endif
}

// cp.async.wait_group kPending: waits until at most the kPending newest of
// the thread's groups are still in flight.
template <int kPending>
__device__ inline void CpAsyncWait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#elif defined(CUDA_STAND_IN)
  ::cuda_stand_in::CpAsyncWait(kPending);
#endif
}

// The 32-bit word of elements p[0] (low half) and p[1]; p 4-byte aligned.
template <typename G>
__device__ inline uint32_t Word(const G* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
#endif
}

// The word's two 16-bit elements (the lower half first) to p[0] and p[1]:
// one 32-bit store where p is 4-byte aligned, else two.
// (Two explicit 16-bit stores, not a memcpy: nvcc 13 merged a memcpy
// fallback with the aligned store into one unconditional access, a review
// found, byte stores in one kernel and an unchecked 32-bit store in another.)
template <typename G>
__device__ inline void StorePair(G* p, uint32_t w) {
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) {
    *reinterpret_cast<uint32_t*>(p) = w;
  } else {
    reinterpret_cast<uint16_t*>(p)[0] = static_cast<uint16_t>(w & 0xffffu);
    reinterpret_cast<uint16_t*>(p)[1] = static_cast<uint16_t>(w >> 16);
  }
#else
  std::memcpy(p, &w, sizeof(w));
#endif
}

// The word of lo and hi rounded to G (round to nearest even), lo in the low
// half: one cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32 on the GPU.
template <typename G>
__device__ inline uint32_t RoundPair(float lo, float hi);

// The word of lo (low half) and hi.
template <typename G>
__device__ inline uint32_t Pair(G lo, G hi) {
  uint16_t a, b;
  std::memcpy(&a, &lo, sizeof(a));
  std::memcpy(&b, &hi, sizeof(b));
  return static_cast<uint32_t>(a) | (static_cast<uint32_t>(b) << 16);
}

template <>
__device__ inline uint32_t RoundPair<__nv_bfloat16>(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo the low half (cvt.rn.bf16x2.f32 d, hi, lo)
  uint32_t w;
  std::memcpy(&w, &v, sizeof(w));
  return w;
#else
  return Pair(__float2bfloat16_rn(lo), __float2bfloat16_rn(hi));
#endif
}
template <>
__device__ inline uint32_t RoundPair<__half>(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t w;
  std::memcpy(&w, &v, sizeof(w));
  return w;
#else
  return Pair(__float2half_rn(lo), __float2half_rn(hi));
#endif
}

}  // namespace mma
}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_MMA_M16N8K16_H_
