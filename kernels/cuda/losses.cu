// softmax_cross_entropy(_grad) and accuracy.
// Blocks: one block of kThreads threads per row (grid-stride over rows);
// thread t visits the row's columns t, t + kThreads, ... in order; the row's
// max (order-free), sum of exp (double) or count is then combined by a fixed
// shared-memory tree. The batch mean is one block of kThreads threads over
// the R row values, the same way. Nothing depends on timing, so two runs give
// the same bits.
//
// The cross-entropy kernels are templates on the logits' storage type T.
// F32 / F64 logits: the math in double as above (kThreads a block). BF16 /
// F16 logits (mixed precision) take their own kernels below (HalfRowLoss-
// Kernel, HalfGradKernel): float math where the cost is, 16-byte loads into
// registers, one read of the row for the loss and a read and a write for
// the gradient; losses.h states their bounds against the CPU's kernels.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/losses.h"
#include "runtime/float16.h"

namespace strata {
namespace cuda {
namespace {

constexpr int kThreads = 256;  // a power of two: the trees halve it
constexpr int64_t kMaxBlocks = 65536;

template <typename T>
inline constexpr bool kHalf = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// A logit as double: 16-bit ones through float (both exact).
template <typename T>
__device__ double Wide(T x) {
  if constexpr (kHalf<T>) {
    return static_cast<double>(ToFloat(x));
  } else {
    return static_cast<double>(x);
  }
}

// A dlogits value as T: 16-bit ones as the float kernel's float rounded to
// nearest even (the float kernel's result, then the cast's rounding): the
// widened path of 16-bit logits, the default until the kernels below
// (HalfRowLossKernel, HalfGradKernel) have run on a GPU.
template <typename T>
__device__ T Narrow(double v) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return ToBfloat16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, float16>) {
    return ToFloat16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// max and log(sum(exp(x - max))) of row xr [C], as RowLogSumExp on the CPU.
template <typename T>
__device__ void RowLogSumExp(const T* xr, int64_t C, double* shared, double* max, double* log_sum) {
  double m = -__longlong_as_double(0x7ff0000000000000LL);  // -inf
  for (int64_t j = threadIdx.x; j < C; j += kThreads) m = MaxOp()(m, Wide(xr[j]));
  m = BlockReduce<kThreads>(m, shared, MaxOp());
  double s = 0;
  for (int64_t j = threadIdx.x; j < C; j += kThreads) s += exp(Wide(xr[j]) - m);
  s = BlockReduce<kThreads>(s, shared, SumOp());
  *max = m;
  *log_sum = log(s);
}

// Rows C apart, of which the first V columns are the classes (V < C: the
// padding columns of a row-aligned LM head, never read).
template <typename T>
__global__ void RowLossKernel(double* row_loss, const T* logits, const int64_t* label, int64_t R, int64_t C,
                              int64_t V) {
  __shared__ double shared[kThreads];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = logits + r * C;
    double max, log_sum;
    RowLogSumExp(xr, V, shared, &max, &log_sum);
    if (threadIdx.x == 0) {
      const int64_t l = label[r];
      row_loss[r] = l < 0 || l >= V ? QuietNaN() : max + log_sum - Wide(xr[l]);
    }
  }
}

// out[0] = T(sum of values[R] / R): one block.
template <typename T>
__global__ void MeanKernel(T* out, const double* values, int64_t R) {
  __shared__ double shared[kThreads];
  double s = 0;
  for (int64_t r = threadIdx.x; r < R; r += kThreads) s += values[r];
  s = BlockReduce<kThreads>(s, shared, SumOp());
  if (threadIdx.x == 0) out[0] = static_cast<T>(s / static_cast<double>(R));
}

// L: dloss's type (F32 for 16-bit logits, else T).
// The padding columns (j >= V) get zeros.
template <typename T, typename L>
__global__ void GradKernel(T* dlogits, const T* logits, const int64_t* label, const L* dloss, int64_t R, int64_t C,
                           int64_t V) {
  __shared__ double shared[kThreads];
  const double scale = static_cast<double>(dloss[0]) / static_cast<double>(R);
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = logits + r * C;
    T* dr = dlogits + r * C;
    double max, log_sum;
    RowLogSumExp(xr, V, shared, &max, &log_sum);
    const double lse = max + log_sum;
    const int64_t l = label[r];
    const bool bad = l < 0 || l >= V;
    for (int64_t j = threadIdx.x; j < V; j += kThreads) {
      const double p = exp(Wide(xr[j]) - lse);
      dr[j] = Narrow<T>(bad ? QuietNaN() : (j == l ? (p - 1.0) * scale : p * scale));
    }
    for (int64_t j = V + threadIdx.x; j < C; j += kThreads) dr[j] = Narrow<T>(0.0);
  }
}

// row_correct[r] = 1 if fewer than k logits of row r lie strictly above the
// label's, else 0 (NaN for a label outside [0, C)).
template <typename T>
__global__ void RowCorrectKernel(double* row_correct, const T* logits, const int64_t* label, int64_t R, int64_t C,
                                 int64_t k) {
  __shared__ double shared[kThreads];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = logits + r * C;
    const int64_t l = label[r];
    const bool bad = l < 0 || l >= C;
    const T target = bad ? T(0) : xr[l];
    double above = 0;  // counts are exact in double up to 2^53
    for (int64_t j = threadIdx.x; j < C; j += kThreads) above += xr[j] > target ? 1.0 : 0.0;
    above = BlockReduce<kThreads>(above, shared, SumOp());
    if (threadIdx.x == 0) row_correct[r] = bad ? QuietNaN() : (above < static_cast<double>(k) ? 1.0 : 0.0);
  }
}

// ---------------------------------------------------------------------------
// BF16 / F16 logits (mixed precision): float math where the cost is.
//
// One block of kHalfThreads threads per row. A row's classes are taken as
// groups of 8 (the last group short when 8 does not divide V): thread t
// takes the groups t, t + kHalfThreads, ... in order. When the row start is
// 16-byte aligned, C a multiple of 8 and the classes fit kHalfVecs groups a
// thread, each group is one 16-byte load into registers, read from memory
// once for the loss and once for the gradient (which stores its 16-byte
// groups over the same places); otherwise the same groups are read as
// scalars from memory in each pass. Both give the same bits: the numbers
// depend on the classes' values only, not on C, the alignment or the path.
//
// The math, element by element:
//   M = the row's max (float: exact);
//   S = the sum of expf(x - M) (x - M in float: exact unless x is tiny
//       beside M; the max's terms exactly 1): a group's 8 terms added
//       pairwise in float, or in double when the group holds a max (which
//       then absorbs none of the others' digits), the groups' sums in
//       double in order in each thread, then the threads' doubles by a
//       fixed tree;
//   row loss = (M - x_l) + log(S) in double (M - x_l exact, so a dominant
//       label's small loss keeps its digits);
//   dlogits_j = T(expf(x_j - M) * float(scale / S)) for j != l, and
//   dlogits_l = T(float(expm1((x_l - M) - log(S)) * scale)) in double, so
//       p_l - 1 keeps its digits when the label's logit dominates.
// No atomics, a fixed assignment of elements to threads and fixed trees:
// two runs give the same bits. losses.h states the bounds against the CPU's
// kernels (double math).

constexpr int kHalfThreads = 1024;  // a multiple of 32
constexpr int kHalfWarps = kHalfThreads / 32;
constexpr int kHalfVecs = 8;  // cached groups a thread: rows of up to 65536 classes
constexpr int64_t kHalfCached = int64_t{kHalfVecs} * 8 * kHalfThreads;

// A 16-bit value as float (exact) and a float rounded to nearest even to
// the 16-bit type: runtime/float16.h's conversions, but for F16 on the GPU
// its conversion instructions (the same values, one instruction instead of
// a dozen; NaNs stay NaNs, their payloads aside). The emulation runs
// runtime/float16.h's.
__device__ __forceinline__ float Widen(bfloat16 h) { return ToFloat(h); }
__device__ __forceinline__ float Widen(float16 h) {
#ifdef __CUDA_ARCH__
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
#else
  return ToFloat(h);
#endif
}

template <typename T>
__device__ __forceinline__ T Narrow16(float v) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return ToBfloat16(v);
  } else {
#ifdef __CUDA_ARCH__
    float16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
#else
    return ToFloat16(v);
#endif
  }
}

// Value e (0..7) of a 16-byte vector of 16-bit values, as float (exact).
template <typename T>
__device__ __forceinline__ float Lane(const uint4& v, int e) {
  const unsigned w = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
  T h;
  h.bits = static_cast<uint16_t>((e & 1) ? w >> 16 : w & 0xffffu);
  return Widen(h);
}

// The block's values of v combined by a fixed tree: lane i of warp 0
// combines the values of threads i, i + 32, ... in order, then a butterfly
// over its 32 lanes; every thread gets lane 0's result. Three barriers and
// shuffles in one warp only (cheap on the GPU; the emulation's fibers pay
// per barrier and shuffle). Ends with a barrier, so `shared` may be reused
// at once.
template <typename V>
struct HalfReduceShared {
  V value[kHalfThreads];
  V result;
};
template <typename V, typename F>
__device__ __forceinline__ V HalfBlockReduce(V v, HalfReduceShared<V>* shared, F f) {
  const int tid = threadIdx.x;
  shared->value[tid] = v;
  __syncthreads();
  if (tid < 32) {
    v = shared->value[tid];
    for (int k = 1; k < kHalfWarps; ++k) v = f(v, shared->value[tid + 32 * k]);
    for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_sync(0xffffffffu, v, tid ^ o));
    if (tid == 0) shared->result = v;
  }
  __syncthreads();
  v = shared->result;
  __syncthreads();
  return v;
}

union HalfShared {
  HalfReduceShared<float> max;
  HalfReduceShared<double> sum;
};

__device__ __forceinline__ float NegInf() { return __uint_as_float(0xff800000u); }

struct FloatMax {
  __device__ float operator()(float a, float b) const { return a < b ? b : a; }  // NaNs never win
};

// One group of n (1..8) classes, as float: x[e] for e >= n is not used.
struct Group {
  float x[8];
  int n;
};

// Group g of row xr (V classes): from the cache's 16-byte vector, or read.
template <typename T>
__device__ __forceinline__ Group FromVector(const uint4& v, int64_t g, int64_t V) {
  Group group;
  group.n = static_cast<int>(V - g * 8 < 8 ? V - g * 8 : 8);
#pragma unroll
  for (int e = 0; e < 8; ++e) group.x[e] = Lane<T>(v, e);
  return group;
}
template <typename T>
__device__ __forceinline__ Group Read(const T* xr, int64_t g, int64_t V) {
  Group group;
  group.n = static_cast<int>(V - g * 8 < 8 ? V - g * 8 : 8);
#pragma unroll
  for (int e = 0; e < 8; ++e) group.x[e] = e < group.n ? Widen(xr[g * 8 + e]) : 0.0f;
  return group;
}

__device__ __forceinline__ void GroupMax(const Group& group, float* m) {
  if (group.n == 8) {
#pragma unroll
    for (int e = 0; e < 8; ++e) *m = group.x[e] > *m ? group.x[e] : *m;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) *m = e < group.n && group.x[e] > *m ? group.x[e] : *m;
  }
}

// Adds the group's share of S: its terms added pairwise in float, or, when
// the group holds a max (its term exactly 1), in order in double, so that
// term absorbs none of the others and S's error is relative to theirs.
__device__ __forceinline__ void GroupSum(const Group& group, float m, double* s) {
  float t[8];
  bool holds_max = false;
  if (group.n == 8) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      t[e] = expf(group.x[e] - m);
      holds_max = holds_max || group.x[e] == m;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      t[e] = e < group.n ? expf(group.x[e] - m) : 0.0f;
      holds_max = holds_max || (e < group.n && group.x[e] == m);
    }
  }
  if (holds_max) {
    double d = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) d += static_cast<double>(t[e]);
    *s += d;
  } else {
    *s += static_cast<double>(((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7])));
  }
}

// Whether rows are read as 16-byte vectors into registers.
template <typename T>
bool HalfCached(const T* logits, int64_t C, int64_t V) {
  return reinterpret_cast<uintptr_t>(logits) % 16 == 0 && C % 8 == 0 && V <= kHalfCached;
}

// The row's max M and S over its first V values, from memory into the cache
// (cached) or read as scalars. Every read of the row is before its last
// barrier.
template <bool kCached, typename T>
__device__ __forceinline__ void HalfRowStats(const T* xr, int64_t V, uint4 (&cache)[kHalfVecs],
                                             HalfShared* shared, float* max, double* sum) {
  const int64_t groups = (V + 7) / 8;
  float m = NegInf();
  double s = 0;
  if constexpr (kCached) {
    const uint4* xv = reinterpret_cast<const uint4*>(xr);
#pragma unroll
    for (int k = 0; k < kHalfVecs; ++k) {
      const int64_t g = threadIdx.x + int64_t{k} * kHalfThreads;
      if (g < groups) cache[k] = xv[g];
    }
#pragma unroll
    for (int k = 0; k < kHalfVecs; ++k) {
      const int64_t g = threadIdx.x + int64_t{k} * kHalfThreads;
      if (g < groups) GroupMax(FromVector<T>(cache[k], g, V), &m);
    }
    m = HalfBlockReduce(m, &shared->max, FloatMax());
#pragma unroll
    for (int k = 0; k < kHalfVecs; ++k) {
      const int64_t g = threadIdx.x + int64_t{k} * kHalfThreads;
      if (g < groups) GroupSum(FromVector<T>(cache[k], g, V), m, &s);
    }
  } else {
    for (int64_t g = threadIdx.x; g < groups; g += kHalfThreads) GroupMax(Read(xr, g, V), &m);
    m = HalfBlockReduce(m, &shared->max, FloatMax());
    for (int64_t g = threadIdx.x; g < groups; g += kHalfThreads) GroupSum(Read(xr, g, V), m, &s);
  }
  *max = m;
  *sum = HalfBlockReduce(s, &shared->sum, SumOp());
}

template <typename T, bool kCached>
__global__ void __launch_bounds__(kHalfThreads)
    HalfRowLossKernel(double* row_loss, const T* logits, const int64_t* label, int64_t R, int64_t C, int64_t V) {
  __shared__ HalfShared shared;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = logits + r * C;
    // Thread 0's label and its logit, read along with the row.
    int64_t l = 0;
    float x_label = 0;
    if (threadIdx.x == 0) {
      l = label[r];
      if (l >= 0 && l < V) x_label = Widen(xr[l]);
    }
    uint4 cache[kHalfVecs];
    float m;
    double s;
    HalfRowStats<kCached>(xr, V, cache, &shared, &m, &s);
    if (threadIdx.x == 0) {
      row_loss[r] = l < 0 || l >= V ? QuietNaN() : (static_cast<double>(m) - static_cast<double>(x_label)) + log(s);
    }
  }
}

// dlogits of a class j != l with logit x, in bits: NaN for a bad row, else
// expf(x - M) * float(scale / S) rounded once.
template <typename T>
__device__ __forceinline__ uint16_t HalfGrad(float x, float m, float c, bool bad) {
  return Narrow16<T>(bad ? __uint_as_float(0x7fc00000u) : expf(x - m) * c).bits;
}

template <typename T, bool kCached>
__global__ void __launch_bounds__(kHalfThreads)
    HalfGradKernel(T* dlogits, const T* logits, const int64_t* label, const float* dloss, int64_t R, int64_t C,
                   int64_t V) {
  __shared__ HalfShared shared;
  const int64_t groups = (V + 7) / 8;
  const double scale = static_cast<double>(dloss[0]) / static_cast<double>(R);
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const T* xr = logits + r * C;
    T* dr = dlogits + r * C;
    const int64_t l = label[r];
    const bool bad = l < 0 || l >= V;
    // The label's class belongs to the thread that takes its group: that
    // thread reads its logit (before any write) and writes its dlogits.
    const bool owner = !bad && (l / 8) % kHalfThreads == threadIdx.x;
    const float x_label = owner ? Widen(xr[l]) : 0.0f;
    uint4 cache[kHalfVecs];
    float m;
    double s;
    // Every read of the row is before HalfRowStats' last barrier and every
    // write after it, but the scalar path's, which reads each value itself
    // before writing it: dlogits may be the logits.
    HalfRowStats<kCached>(xr, V, cache, &shared, &m, &s);
    const float c = static_cast<float>(scale / s);
    // p_l - 1 = expm1((x_l - M) - log(S)), in double: its digits survive a
    // dominant label (p_l near 1).
    const uint16_t d_label =
        owner ? Narrow16<T>(static_cast<float>(
                    expm1((static_cast<double>(x_label) - static_cast<double>(m)) - log(s)) * scale)).bits
              : 0;
    if constexpr (kCached) {
      uint4* dv = reinterpret_cast<uint4*>(dr);
#pragma unroll
      for (int k = 0; k < kHalfVecs; ++k) {
        const int64_t g = threadIdx.x + int64_t{k} * kHalfThreads;
        if (g < groups) {
          const int n = static_cast<int>(V - g * 8 < 8 ? V - g * 8 : 8);
          // The label's place in the group, or -1.
          const int at = l >= g * 8 && l < g * 8 + 8 ? static_cast<int>(l - g * 8) : -1;
          unsigned w[4];
          if (n == 8 && at < 0) {  // most groups: 8 classes, none the label's
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
              w[e / 2] = static_cast<unsigned>(HalfGrad<T>(Lane<T>(cache[k], e), m, c, bad)) |
                         (static_cast<unsigned>(HalfGrad<T>(Lane<T>(cache[k], e + 1), m, c, bad)) << 16);
            }
          } else {
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
              // The padding past the classes: +0.
              const unsigned lo = e < n ? (at == e ? d_label : HalfGrad<T>(Lane<T>(cache[k], e), m, c, bad)) : 0u;
              const unsigned hi =
                  e + 1 < n ? (at == e + 1 ? d_label : HalfGrad<T>(Lane<T>(cache[k], e + 1), m, c, bad)) : 0u;
              w[e / 2] = lo | (hi << 16);
            }
          }
          dv[g] = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
      for (int64_t g = groups + threadIdx.x; g < C / 8; g += kHalfThreads) dv[g] = make_uint4(0, 0, 0, 0);
    } else {
      for (int64_t g = threadIdx.x; g < groups; g += kHalfThreads) {
        const Group group = Read(xr, g, V);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int64_t j = g * 8 + e;
          if (e < group.n) dr[j].bits = j == l && !bad ? d_label : HalfGrad<T>(group.x[e], m, c, bad);
        }
      }
      for (int64_t j = V + threadIdx.x; j < C; j += kHalfThreads) dr[j] = Narrow16<T>(0.0f);
    }
  }
}

int64_t RowBlocks(int64_t R) { return std::min(kMaxBlocks, R); }

// L: the loss's type (F32 for 16-bit logits, else T).
template <typename T, typename L>
cudaError_t SoftmaxCrossEntropy(L* loss, const T* logits, const int64_t* label, int64_t R, int64_t C, int64_t V,
                                double* row_scratch, cudaStream_t stream) {
  if (C > 0 && (V < 1 || V > C)) return cudaErrorInvalidValue;
  if (R > 0) {
    if constexpr (kHalf<T>) {
      if (!FastHalfLoss().load()) {
        RowLossKernel<T><<<RowBlocks(R), kThreads, 0, stream>>>(row_scratch, logits, label, R, C, V);
      } else if (HalfCached(logits, C, V)) {
        HalfRowLossKernel<T, true><<<RowBlocks(R), kHalfThreads, 0, stream>>>(row_scratch, logits, label, R, C, V);
      } else {
        HalfRowLossKernel<T, false><<<RowBlocks(R), kHalfThreads, 0, stream>>>(row_scratch, logits, label, R, C, V);
      }
    } else {
      RowLossKernel<T><<<RowBlocks(R), kThreads, 0, stream>>>(row_scratch, logits, label, R, C, V);
    }
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  MeanKernel<L><<<1, kThreads, 0, stream>>>(loss, row_scratch, R);  // R == 0: 0 / 0, NaN as on the CPU
  return cudaGetLastError();
}

template <typename T, typename L>
cudaError_t SoftmaxCrossEntropyGrad(T* dlogits, const T* logits, const int64_t* label, const L* dloss, int64_t R,
                                    int64_t C, int64_t V, cudaStream_t stream) {
  if (R <= 0 || C <= 0) return cudaSuccess;
  if (C > 0 && (V < 1 || V > C)) return cudaErrorInvalidValue;
  if constexpr (kHalf<T>) {
    if (!FastHalfLoss().load()) {
      GradKernel<T, L><<<RowBlocks(R), kThreads, 0, stream>>>(dlogits, logits, label, dloss, R, C, V);
    } else if (HalfCached(logits, C, V) && reinterpret_cast<uintptr_t>(dlogits) % 16 == 0) {
      HalfGradKernel<T, true><<<RowBlocks(R), kHalfThreads, 0, stream>>>(dlogits, logits, label, dloss, R, C, V);
    } else {
      HalfGradKernel<T, false><<<RowBlocks(R), kHalfThreads, 0, stream>>>(dlogits, logits, label, dloss, R, C, V);
    }
  } else {
    GradKernel<T, L><<<RowBlocks(R), kThreads, 0, stream>>>(dlogits, logits, label, dloss, R, C, V);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t Accuracy(T* accuracy, const T* logits, const int64_t* label, int64_t R, int64_t C, int64_t k,
                     double* row_scratch, cudaStream_t stream) {
  if (R > 0) {
    RowCorrectKernel<T><<<RowBlocks(R), kThreads, 0, stream>>>(row_scratch, logits, label, R, C, k);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  MeanKernel<T><<<1, kThreads, 0, stream>>>(accuracy, row_scratch, R);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSoftmaxCrossEntropy(float* loss, const float* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream) {
  return SoftmaxCrossEntropy(loss, logits, label, R, C, classes, row_scratch, stream);
}
cudaError_t LaunchSoftmaxCrossEntropy(double* loss, const double* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream) {
  return SoftmaxCrossEntropy(loss, logits, label, R, C, classes, row_scratch, stream);
}

cudaError_t LaunchSoftmaxCrossEntropy(float* loss, const bfloat16* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream) {
  return SoftmaxCrossEntropy(loss, logits, label, R, C, classes, row_scratch, stream);
}
cudaError_t LaunchSoftmaxCrossEntropy(float* loss, const float16* logits, const int64_t* label, int64_t R, int64_t C,
                                      int64_t classes, double* row_scratch, cudaStream_t stream) {
  return SoftmaxCrossEntropy(loss, logits, label, R, C, classes, row_scratch, stream);
}

cudaError_t LaunchSoftmaxCrossEntropyGrad(float* dlogits, const float* logits, const int64_t* label, const float* dloss,
                                          int64_t R, int64_t C, int64_t classes, cudaStream_t stream) {
  return SoftmaxCrossEntropyGrad(dlogits, logits, label, dloss, R, C, classes, stream);
}
cudaError_t LaunchSoftmaxCrossEntropyGrad(double* dlogits, const double* logits, const int64_t* label,
                                          const double* dloss, int64_t R, int64_t C, int64_t classes,
                                          cudaStream_t stream) {
  return SoftmaxCrossEntropyGrad(dlogits, logits, label, dloss, R, C, classes, stream);
}

cudaError_t LaunchSoftmaxCrossEntropyGrad(bfloat16* dlogits, const bfloat16* logits, const int64_t* label,
                                          const float* dloss, int64_t R, int64_t C, int64_t classes,
                                          cudaStream_t stream) {
  return SoftmaxCrossEntropyGrad(dlogits, logits, label, dloss, R, C, classes, stream);
}
cudaError_t LaunchSoftmaxCrossEntropyGrad(float16* dlogits, const float16* logits, const int64_t* label,
                                          const float* dloss, int64_t R, int64_t C, int64_t classes,
                                          cudaStream_t stream) {
  return SoftmaxCrossEntropyGrad(dlogits, logits, label, dloss, R, C, classes, stream);
}

cudaError_t LaunchAccuracy(float* accuracy, const float* logits, const int64_t* label, int64_t R, int64_t C, int64_t k,
                           double* row_scratch, cudaStream_t stream) {
  return Accuracy(accuracy, logits, label, R, C, k, row_scratch, stream);
}
cudaError_t LaunchAccuracy(double* accuracy, const double* logits, const int64_t* label, int64_t R, int64_t C,
                           int64_t k, double* row_scratch, cudaStream_t stream) {
  return Accuracy(accuracy, logits, label, R, C, k, row_scratch, stream);
}

}  // namespace cuda
}  // namespace strata
