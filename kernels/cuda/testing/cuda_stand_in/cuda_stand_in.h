#ifndef STRATA_KERNELS_CUDA_TESTING_CUDA_STAND_IN_CUDA_STAND_IN_H_
#define STRATA_KERNELS_CUDA_TESTING_CUDA_STAND_IN_CUDA_STAND_IN_H_

// Plain C++ stand-ins for the CUDA headers flash_attention.cu's kernels use
// (cuda_bf16.h, cuda_fp16.h, cuda_runtime.h, mma.h), so that
// flash_attention_emulation_test.cc can compile those kernels with g++ and
// run them on the CPU: each CUDA thread of a block is a std::thread,
// __syncthreads and __syncwarp are barriers, a WMMA fragment is a whole
// 16 x 16 float matrix in every lane (loads and products computed per lane,
// stores split among the lanes). Loads and stores check what the hardware
// requires: 256-bit aligned pointers and 16-byte strides, inside the
// launch's dynamic shared memory when they address it.

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n)

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
struct CUstream_st;
using cudaStream_t = CUstream_st*;

struct uint3 {
  unsigned x, y, z;
};
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};

inline float StandInToFloat(__nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float StandInToFloat(__half h) {
  const int sign = h.bits >> 15, e = (h.bits >> 10) & 31, m = h.bits & 1023;
  float mag;
  if (e == 31) {
    mag = m != 0 ? NAN : INFINITY;
  } else if (e == 0) {
    mag = std::ldexp(static_cast<float>(m), -24);
  } else {
    mag = std::ldexp(static_cast<float>(m + 1024), e - 25);
  }
  return sign ? -mag : mag;
}
inline float StandInToFloat(float x) { return x; }

// Round to nearest even, as __float2bfloat16_rn and __float2half_rn.
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return __nv_bfloat16{0x7fc0};
  u += 0x7fff + ((u >> 16) & 1);
  return __nv_bfloat16{static_cast<uint16_t>(u >> 16)};
}
inline __half __float2half_rn(float f) {
  if (std::isnan(f)) return __half{0x7e00};
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a < std::ldexp(1.0, -14)) {  // subnormal (or rounds up to the least normal)
    return __half{static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * std::ldexp(1.0, 24))))};
  }
  int e;
  const double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  int exponent = e - 1 + 15;
  double q = std::nearbyint((2 * m - 1) * 1024);
  if (q == 1024) {
    q = 0;
    ++exponent;
  }
  if (exponent >= 31) return __half{static_cast<uint16_t>(sign | 0x7c00)};
  return __half{static_cast<uint16_t>(sign | (exponent << 10) | static_cast<uint16_t>(q))};
}

namespace cuda_stand_in {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  uint64_t gen_ = 0;
};

// The block being run: its barriers, the warps' shuffle slots and the
// dynamic shared memory [shared, shared + shared_bytes).
struct Block {
  Barrier* block = nullptr;
  Barrier* warps = nullptr;  // one per warp
  float* shuffle = nullptr;  // 32 per warp
  const unsigned char* shared = nullptr;
  size_t shared_bytes = 0;
};
inline Block current;
inline std::atomic<int> errors{0};

inline void Fail(const char* what, const void* p, unsigned ldm) {
  if (errors.fetch_add(1) < 20) std::fprintf(stderr, "stand-in WMMA: %s (pointer %p, ldm %u)\n", what, p, ldm);
}

}  // namespace cuda_stand_in

inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};

inline void __syncthreads() { cuda_stand_in::current.block->Wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { cuda_stand_in::current.warps[threadIdx.x / 32].Wait(); }
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  float* slots = cuda_stand_in::current.shuffle + threadIdx.x / 32 * 32;
  const unsigned lane = threadIdx.x % 32;
  slots[lane] = v;
  __syncwarp();
  const float got = slots[lane ^ static_cast<unsigned>(mask)];
  __syncwarp();
  return got;
}

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the stand-in has 16x16x16 only");
  float x[16][16];
};

// Checks a 16 x 16 access of `elem`-byte elements at p with stride ldm.
inline void CheckAccess(const void* p, unsigned ldm, size_t elem) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % 32 != 0) cuda_stand_in::Fail("pointer not 256-bit aligned", p, ldm);
  if (ldm * elem % 16 != 0) cuda_stand_in::Fail("ldm not a multiple of 16 bytes", p, ldm);
  const auto* begin = cuda_stand_in::current.shared;
  const auto* c = static_cast<const unsigned char*>(p);
  const uintptr_t span = (15 * static_cast<uintptr_t>(ldm) + 16) * elem;
  const uintptr_t shared_window = 256 * 1024;
  if (begin != nullptr && c >= begin && c < begin + shared_window &&
      c + span > begin + cuda_stand_in::current.shared_bytes) {
    cuda_stand_in::Fail("access past the launch's dynamic shared memory", p, ldm);
  }
}

template <typename T>
void fill_fragment(fragment<accumulator, 16, 16, 16, T>& f, float v) {
  for (auto& row : f.x) {
    for (float& e : row) e = v;
  }
}

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  CheckAccess(p, ldm, sizeof(T));
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      f.x[r][c] = StandInToFloat(std::is_same<Layout, row_major>::value ? p[r * ldm + c] : p[c * ldm + r]);
    }
  }
}

template <typename TA, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
              const fragment<matrix_b, 16, 16, 16, TA, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[16][16];
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      float s = c.x[i][j];
      for (int k = 0; k < 16; ++k) s += a.x[i][k] * b.x[k][j];
      out[i][j] = s;
    }
  }
  std::memcpy(d.x, out, sizeof(out));
}

// Each lane stores its share (every 32nd element): the others see them after
// a __syncwarp, as on the GPU.
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  CheckAccess(p, ldm, sizeof(float));
  const unsigned lane = threadIdx.x % 32;
  for (unsigned e = lane; e < 256; e += 32) {
    const unsigned r = e / 16, c = e % 16;
    p[layout == mem_row_major ? r * ldm + c : c * ldm + r] = f.x[r][c];
  }
}

}  // namespace wmma
}  // namespace nvcuda

#endif  // STRATA_KERNELS_CUDA_TESTING_CUDA_STAND_IN_CUDA_STAND_IN_H_
