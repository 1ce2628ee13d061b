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
//
// For whole .cu files with their launchers (testing/emulate_launches.pl
// rewrites `Kernel<<<grid, block, shared, stream>>>(args)` into
// `::cuda_stand_in::Launch(grid, block, shared, stream)(Kernel, args)`):
// dim3, blockDim and gridDim, __shfl_sync with a width, cudaGetLastError
// (a launch whose configuration CUDA would refuse sets
// cudaErrorInvalidConfiguration and runs nothing), cudaMemsetAsync (at once)
// and the bit casts. Launch runs the blocks one after another, each block's
// CUDA threads as fibers on the calling thread (ucontext: resumed in turn,
// a barrier yields until all have arrived; a deadlock aborts), or with
// CUDA_STAND_IN_OS_THREADS set in the environment a std::thread each (for
// ThreadSanitizer, which does not follow fibers).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <ucontext.h>
#include <vector>

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
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
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

// CUDA's integer min and max (device functions in the global namespace,
// which pool.cu's window bounds call on int64_t).
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a < b ? b : a; }

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

// The CUDA threads of a block as fibers (ucontext) on the calling thread,
// resumed in turn; a barrier yields until its generation changes. Set while
// Launch runs a block so.
struct Fibers {
  ucontext_t main;
  std::vector<ucontext_t> context;
  std::vector<char> done;
  unsigned current = 0;
  const std::function<void(unsigned)>* body = nullptr;
  uint64_t progress = 0;  // barrier arrivals and finished fibers
};
inline thread_local Fibers* fibers = nullptr;

inline void FiberEntry() {
  Fibers* f = fibers;
  (*f->body)(f->current);
  f->done[f->current] = 1;
  ++f->progress;
}
inline void FiberYield() { swapcontext(&fibers->context[fibers->current], &fibers->main); }

class Barrier {
 public:
  Barrier() = default;
  explicit Barrier(int n) : n_(n) {}
  void SetCount(int n) { n_ = n; }
  void Wait() {
    if (fibers != nullptr) {
      const uint64_t gen = gen_;
      ++fibers->progress;
      if (++count_ == n_) {
        count_ = 0;
        ++gen_;
      } else {
        while (gen_ == gen) FiberYield();
      }
      return;
    }
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
  int n_ = 0, count_ = 0;
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
  uint64_t* wide_shuffle = nullptr;  // 32 per warp, for __shfl_sync
};
inline Block current;
inline std::atomic<int> errors{0};

inline void Fail(const char* what, const void* p, unsigned ldm) {
  if (errors.fetch_add(1) < 20) std::fprintf(stderr, "stand-in WMMA: %s (pointer %p, ldm %u)\n", what, p, ldm);
}

}  // namespace cuda_stand_in

inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

namespace cuda_stand_in {
// The thread's index in its block (x fastest), which fixes its warp and lane.
inline unsigned LinearThread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
}  // namespace cuda_stand_in

inline void __syncthreads() { cuda_stand_in::current.block->Wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  cuda_stand_in::current.warps[cuda_stand_in::LinearThread() / 32].Wait();
}
// v of lane ^ mask, for every type CUDA overloads it for (int, float,
// double, 64-bit integers: no value narrowed on the way).
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask) {
  static_assert(std::is_arithmetic<T>::value && sizeof(T) <= 8, "an arithmetic value of at most 8 bytes");
  const unsigned lane = cuda_stand_in::LinearThread() % 32;
  if constexpr (std::is_same<T, float>::value) {
    float* slots = cuda_stand_in::current.shuffle + cuda_stand_in::LinearThread() / 32 * 32;
    slots[lane] = v;
    __syncwarp();
    const float got = slots[lane ^ static_cast<unsigned>(mask)];
    __syncwarp();
    return got;
  } else {
    uint64_t* slots = cuda_stand_in::current.wide_shuffle + cuda_stand_in::LinearThread() / 32 * 32;
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    slots[lane] = bits;
    __syncwarp();
    T got;
    std::memcpy(&got, &slots[lane ^ static_cast<unsigned>(mask)], sizeof(T));
    __syncwarp();
    return got;
  }
}

// v of lane (lane / width) * width + src % width: every lane of the warp
// must call it (the warp's barrier waits for all of them).
template <typename T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a value of at most 8 bytes");
  const unsigned t = cuda_stand_in::LinearThread(), lane = t % 32;
  uint64_t* slots = cuda_stand_in::current.wide_shuffle + t / 32 * 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  slots[lane] = bits;
  __syncwarp();
  const unsigned w = static_cast<unsigned>(width);
  T got;
  std::memcpy(&got, &slots[lane / w * w + static_cast<unsigned>(src) % w], sizeof(T));
  __syncwarp();
  return got;
}

inline double __longlong_as_double(long long x) {
  double d;
  std::memcpy(&d, &x, 8);
  return d;
}
inline long long __double_as_longlong(double d) {
  long long x;
  std::memcpy(&x, &d, 8);
  return x;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// kernels/cuda/mma_m16n8k16.h calls the stand-in below where it is compiled
// against these headers.
#define CUDA_STAND_IN 1

namespace cuda_stand_in {

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 of a warp:
// d += A B, every lane passing its registers in the PTX ISA's fragment
// layouts ("Matrix Fragments for mma.m16n8k16"; lane = 4 g + t, the lower 16
// bits of a word the even column or row):
//   A [16][16] (row major): a[0] (g, 2t..2t+1), a[1] (g + 8, 2t..),
//                           a[2] (g, 2t + 8..), a[3] (g + 8, 2t + 8..);
//   B [16][8] (col major):  b[0] (k 2t..2t+1, n g), b[1] (k 2t + 8.., n g);
//   C, D [16][8]:           d[0], d[1] (g, 2t, 2t + 1), d[2], d[3] (g + 8, ...).
// The lanes meet in per-warp slots (blocks run one at a time); each sums its
// own four outputs in float in k order (the hardware's order and rounding
// differ: tests compare within bounds).
inline uint32_t mma_slots[32][32][6];  // [warp][lane][a0..a3, b0, b1]
template <typename G>
void Mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const unsigned thread = LinearThread(), warp = thread / 32, lane = thread % 32;
  uint32_t* mine = mma_slots[warp][lane];
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b[0];
  mine[5] = b[1];
  __syncwarp();
  const auto element = [](uint32_t word, int index) {
    G x;
    x.bits = static_cast<uint16_t>(index % 2 != 0 ? word >> 16 : word & 0xffffu);
    return StandInToFloat(x);
  };
  const auto at_a = [&](int row, int k) {
    return element(mma_slots[warp][(row % 8) * 4 + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k);
  };
  const auto at_b = [&](int k, int n) { return element(mma_slots[warp][n * 4 + (k % 8) / 2][k >= 8 ? 5 : 4], k); };
  const int g = static_cast<int>(lane) / 4, t = static_cast<int>(lane) % 4;
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + i % 2;
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum += at_a(row, k) * at_b(k, col);
    out[i] = sum;
  }
  __syncwarp();
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// Whether [p, p + bytes) is a `bytes`-aligned span of the running block's
// dynamic shared memory; reports what is wrong otherwise.
inline bool SharedRow(const void* p, const char* what, size_t bytes = 16) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
    if (errors.fetch_add(1) < 20) std::fprintf(stderr, "stand-in %s: address %p not %zu-byte aligned\n", what, p, bytes);
    return false;
  }
  if (current.shared == nullptr || c < current.shared || c + bytes > current.shared + current.shared_bytes) {
    if (errors.fetch_add(1) < 20) {
      std::fprintf(stderr, "stand-in %s: address %p outside the launch's %zu dynamic shared bytes\n", what, p,
                   current.shared_bytes);
    }
    return false;
  }
  return true;
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 of a warp: lane l passes
// the address of row l % 8 of matrix l / 8 (16 bytes of 8 elements); r[i]
// receives matrix i's (row l / 4, columns 2 (l % 4), + 1), or with trans
// (rows 2 (l % 4), + 1 of column l / 4), the lower half the first. The PTX
// ISA's "Warp-level matrix load instruction: ldmatrix".
inline const unsigned char* ldmatrix_slots[32][32];  // [warp][lane]: the row each lane passed
inline void LdMatrixX4(uint32_t (&r)[4], const void* row, bool trans) {
  const unsigned thread = LinearThread(), warp = thread / 32, lane = thread % 32;
  SharedRow(row, "ldmatrix");
  ldmatrix_slots[warp][lane] = static_cast<const unsigned char*>(row);
  __syncwarp();
  const auto element = [&](int matrix, int r_, int c) {
    uint16_t e = 0;
    const unsigned char* base = ldmatrix_slots[warp][matrix * 8 + r_];
    if (SharedRow(base, "ldmatrix")) std::memcpy(&e, base + 2 * c, 2);
    return static_cast<uint32_t>(e);
  };
  uint32_t out[4];
  for (int i = 0; i < 4; ++i) {
    const int a = static_cast<int>(lane) / 4, b = 2 * (static_cast<int>(lane) % 4);
    out[i] = trans ? element(i, b, a) | element(i, b + 1, a) << 16 : element(i, a, b) | element(i, a, b + 1) << 16;
  }
  __syncwarp();
  for (int i = 0; i < 4; ++i) r[i] = out[i];
}

// cp.async (16 or 4 bytes): the destination poisoned (NaN bytes) at once, the
// copy queued per CUDA thread and performed only at the thread's CpAsyncWait
// that covers its group, so a kernel that reads a tile before waiting for it
// (or before the __syncthreads after the waits), or issues the next tile
// into a stage another warp still reads, reads NaNs. DropPendingCopies, after each block, counts (and
// discards) copies a block never waited for.
struct PendingCopy {
  void* dst;
  const void* src;
  bool valid;
  size_t bytes;
};
struct ThreadCopies {
  std::vector<std::vector<PendingCopy>> groups;  // committed, oldest first
  std::vector<PendingCopy> open;                 // since the last commit
};
inline ThreadCopies async_copies[1024];
// cp.async of `bytes` (16: .cg, 4: .ca), both addresses `bytes`-aligned.
inline void CpAsync(void* dst, const void* src, bool valid, size_t bytes) {
  SharedRow(dst, "cp.async", bytes);
  if (valid && reinterpret_cast<uintptr_t>(src) % bytes != 0 && errors.fetch_add(1) < 20) {
    std::fprintf(stderr, "stand-in cp.async: source %p not %zu-byte aligned\n", src, bytes);
  }
  // The destination reads as NaN bytes until the copy lands: a tile read
  // before its wait, or overwritten while another warp still reads it (a
  // missing barrier before the next tile's copies), shows.
  std::memset(dst, 0xff, bytes);
  async_copies[LinearThread()].open.push_back({dst, src, valid, bytes});
}
inline void CpAsyncCommit() {
  ThreadCopies& c = async_copies[LinearThread()];
  c.groups.push_back(std::move(c.open));
  c.open.clear();
}
inline void CpAsyncWait(int pending) {
  ThreadCopies& c = async_copies[LinearThread()];
  while (static_cast<int>(c.groups.size()) > pending) {
    for (const PendingCopy& p : c.groups.front()) {
      if (p.valid) {
        std::memcpy(p.dst, p.src, p.bytes);
      } else {
        std::memset(p.dst, 0, p.bytes);
      }
    }
    c.groups.erase(c.groups.begin());
  }
}
inline int DropPendingCopies() {
  int dropped = 0;
  for (ThreadCopies& c : async_copies) {
    dropped += static_cast<int>(c.open.size());
    for (const auto& g : c.groups) dropped += static_cast<int>(g.size());
    c.groups.clear();
    c.open.clear();
  }
  return dropped;
}

inline cudaError_t last_error = cudaSuccess;
inline int64_t launches = 0;  // launches run so far
inline size_t largest_dynamic_shared = 0;

// The running block's dynamic shared memory (`extern __shared__ T name[]`,
// rewritten by emulate_launches.pl).
inline unsigned char* DynamicShared() { return const_cast<unsigned char*>(current.shared); }

// Runs body(t) for t < n as fibers, enter(t) setting the thread's
// variables before each resumption; false on a deadlock (a full round with no
// barrier arrival and no fiber finished: a barrier some threads never reach).
// Each round resumes the fibers in order, or with `reverse` from the last:
// a GPU runs its warps in any order, so a read one warp makes before another
// overwrites the same shared memory with no barrier between them shows in
// one order or the other (launches reverse every other block).
inline bool RunFibers(unsigned n, const std::function<void(unsigned)>& enter,
                      const std::function<void(unsigned)>& body, bool reverse = false) {
  constexpr size_t kStack = 256 * 1024;
  static thread_local std::vector<std::unique_ptr<char[]>> stacks;
  while (stacks.size() < n) stacks.emplace_back(new char[kStack]);
  Fibers f;
  f.context.resize(n);
  f.done.assign(n, 0);
  f.body = &body;
  for (unsigned t = 0; t < n; ++t) {
    getcontext(&f.context[t]);
    f.context[t].uc_stack.ss_sp = stacks[t].get();
    f.context[t].uc_stack.ss_size = kStack;
    f.context[t].uc_link = &f.main;
    makecontext(&f.context[t], FiberEntry, 0);
  }
  fibers = &f;
  unsigned left = n;
  while (left > 0) {
    const uint64_t before = f.progress;
    for (unsigned i = 0; i < n; ++i) {
      const unsigned t = reverse ? n - 1 - i : i;
      if (f.done[t]) continue;
      f.current = t;
      enter(t);
      swapcontext(&f.main, &f.context[t]);
      if (f.done[t]) --left;
    }
    if (left > 0 && f.progress == before) break;
  }
  fibers = nullptr;
  return left == 0;
}

// Launch(grid, block, shared, stream)(kernel, args...): the kernel's
// parameters are initialized from args (converted as CUDA converts them),
// then every block runs, one after another, its CUDA threads as fibers (or
// std::threads, CUDA_STAND_IN_OS_THREADS), its dynamic shared memory filled
// with 0xff bytes first and checked for writes past its end afterwards.
class Launcher {
 public:
  Launcher(dim3 grid, dim3 block, size_t shared)
      : grid_(grid), block_(block), shared_(shared) {}

  template <typename... P, typename... A>
  void operator()(void (*kernel)(P...), A&&... args) const {
    static_assert(sizeof...(P) == sizeof...(A), "a kernel's arguments, one for each parameter");
    const uint64_t threads = uint64_t{block_.x} * block_.y * block_.z;
    if (threads == 0 || threads > 1024 || block_.x > 1024 || block_.y > 1024 || block_.z > 64 || grid_.x == 0 ||
        grid_.y == 0 || grid_.z == 0 || grid_.x > 0x7fffffffu || grid_.y > 65535 || grid_.z > 65535 ||
        shared_ > 48 * 1024) {
      if (errors.fetch_add(1) < 20) {
        std::fprintf(stderr, "stand-in launch refused: grid (%u, %u, %u), block (%u, %u, %u), %zu shared bytes\n",
                     grid_.x, grid_.y, grid_.z, block_.x, block_.y, block_.z, shared_);
      }
      last_error = cudaErrorInvalidConfiguration;
      return;
    }
    ++launches;
    if (shared_ > largest_dynamic_shared) largest_dynamic_shared = shared_;
    const auto params = std::tuple<std::decay_t<P>...>(std::forward<A>(args)...);
    const unsigned n = static_cast<unsigned>(threads), warps = (n + 31) / 32;
    const bool os_threads = std::getenv("CUDA_STAND_IN_OS_THREADS") != nullptr;
    std::vector<unsigned char> shared(shared_ + 16, 0xff);
    for (unsigned bz = 0; bz < grid_.z; ++bz) {
      for (unsigned by = 0; by < grid_.y; ++by) {
        for (unsigned bx = 0; bx < grid_.x; ++bx) {
          std::fill(shared.begin(), shared.end(), 0xff);
          Barrier block(static_cast<int>(n));
          std::unique_ptr<Barrier[]> warp(new Barrier[warps]);
          for (unsigned w = 0; w < warps; ++w) warp[w].SetCount(static_cast<int>(std::min(32u, n - 32 * w)));
          std::vector<float> shuffle(32 * warps);
          std::vector<uint64_t> wide(32 * warps);
          current = {&block, warp.get(), shuffle.data(), shared.data(), shared_, wide.data()};
          const std::function<void(unsigned)> enter = [&](unsigned t) {
            blockDim = block_;
            gridDim = grid_;
            threadIdx = {t % block_.x, t / block_.x % block_.y, t / block_.x / block_.y};
            blockIdx = {bx, by, bz};
          };
          const std::function<void(unsigned)> body = [&](unsigned) {
            std::apply([&](const auto&... p) { kernel(p...); }, params);
          };
          if (os_threads) {
            std::vector<std::thread> team;
            team.reserve(n);
            for (unsigned t = 0; t < n; ++t) {
              team.emplace_back([&, t] {
                enter(t);
                body(t);
              });
            }
            for (std::thread& t : team) t.join();
          } else if (!RunFibers(n, enter, body, /*reverse=*/(bx + by + bz) % 2 == 1)) {
            if (errors.fetch_add(1) < 20) {
              std::fprintf(stderr, "stand-in launch: block (%u, %u, %u) deadlocked at a barrier\n", bx, by, bz);
            }
            std::fflush(stderr);
            std::abort();  // the deadlocked fibers' frames cannot be unwound
          }
          current = {};
          if (const int dropped = DropPendingCopies(); dropped > 0 && errors.fetch_add(1) < 20) {
            std::fprintf(stderr, "stand-in launch: block (%u, %u, %u) ended with %d cp.async copies never waited for\n",
                         bx, by, bz, dropped);
          }
          for (size_t b = shared_; b < shared.size(); ++b) {
            if (shared[b] != 0xff && errors.fetch_add(1) < 20) {
              std::fprintf(stderr, "stand-in launch: a block wrote past its %zu dynamic shared bytes\n", shared_);
              break;
            }
          }
        }
      }
    }
  }

 private:
  dim3 grid_, block_;
  size_t shared_;
};
inline Launcher Launch(dim3 grid, dim3 block, size_t shared = 0, cudaStream_t = nullptr) {
  return Launcher(grid, block, shared);
}
}  // namespace cuda_stand_in

inline cudaError_t cudaGetLastError() {
  const cudaError_t e = cuda_stand_in::last_error;
  cuda_stand_in::last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t = nullptr) {
  std::memset(p, value, bytes);
  return cudaSuccess;
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
