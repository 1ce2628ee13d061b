// softmax family, layer_norm(_grad), dropout and embedding(_grad); see nn.h.
// Launch shapes: kThreads threads per block, at most kMaxBlocks blocks,
// grid-stride loops and 64-bit indices throughout.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/nn.h"
#include "kernels/cuda/unary_math.h"
#include "kernels/host_device.h"
#include "kernels/work_split.h"
#include "runtime/philox.h"

namespace strata {
namespace cuda {
namespace {

using kernel_math::Exp;  // std::exp of the CPU kernels: expf for float, exp for double

constexpr int kThreads = 256;  // a power of two: the trees halve it
constexpr int64_t kMaxBlocks = 65536;

int Blocks(int64_t work, int64_t per_block = kThreads) {
  return static_cast<int>(std::max<int64_t>(1, std::min(kMaxBlocks, (work + per_block - 1) / per_block)));
}

__device__ double Infinity() { return __longlong_as_double(0x7ff0000000000000LL); }

// ---------------------------------------------------------------------------
// softmax, log_softmax, softmax_grad, log_softmax_grad: kernels/cpu/softmax.cc's
// Lane, one block per lane (m, n) of [M, K, N]; element k at m * K * N + k * N + n.

template <typename T, SoftmaxMode kMode>
__global__ void SoftmaxKernel(T* out, const T* a, const T* b, int64_t M, int64_t K, int64_t N) {
  __shared__ double shared[kThreads];
  const int64_t lanes = M * N;
  for (int64_t lane = blockIdx.x; lane < lanes; lane += gridDim.x) {
    const int64_t base = (lane / N) * K * N + lane % N;
    if constexpr (kMode == SoftmaxMode::kSoftmax || kMode == SoftmaxMode::kLogSoftmax) {
      T max = static_cast<T>(-Infinity());
      for (int64_t k = threadIdx.x; k < K; k += kThreads) {
        const T v = a[base + k * N];
        max = max < v ? v : max;
      }
      max =
          static_cast<T>(BlockReduce<kThreads>(static_cast<double>(max), shared, MaxOp()));  // exact: T -> double -> T
      double sum = 0;
      for (int64_t k = threadIdx.x; k < K; k += kThreads) {
        const T e = Exp(static_cast<T>(a[base + k * N] - max));
        if constexpr (kMode == SoftmaxMode::kSoftmax) out[base + k * N] = e;
        sum += e;
      }
      sum = BlockReduce<kThreads>(sum, shared, SumOp());
      if constexpr (kMode == SoftmaxMode::kSoftmax) {
        const T inv = static_cast<T>(1.0 / sum);
        for (int64_t k = threadIdx.x; k < K; k += kThreads) out[base + k * N] *= inv;  // this thread's own e
      } else {
        const T log_sum = static_cast<T>(log(sum));
        for (int64_t k = threadIdx.x; k < K; k += kThreads) {
          const int64_t i = base + k * N;
          out[i] = static_cast<T>(a[i] - max) - log_sum;
        }
      }
    } else {
      // softmax_grad: a = y, b = dy, sum of y * dy; log_softmax_grad: sum of dy.
      double acc = 0;
      for (int64_t k = threadIdx.x; k < K; k += kThreads) {
        const int64_t i = base + k * N;
        if constexpr (kMode == SoftmaxMode::kSoftmaxGrad) {
          acc += static_cast<double>(a[i]) * b[i];
        } else {
          acc += b[i];
        }
      }
      const T s = static_cast<T>(BlockReduce<kThreads>(acc, shared, SumOp()));
      for (int64_t k = threadIdx.x; k < K; k += kThreads) {
        const int64_t i = base + k * N;
        if constexpr (kMode == SoftmaxMode::kSoftmaxGrad) {
          out[i] = a[i] * static_cast<T>(b[i] - s);
        } else {
          out[i] = b[i] - static_cast<T>(Exp(a[i]) * s);
        }
      }
    }
  }
}

template <typename T>
cudaError_t Softmax(SoftmaxMode mode, T* out, const T* a, const T* b, int64_t M, int64_t K, int64_t N,
                    cudaStream_t stream) {
  if (M * K * N == 0) return cudaSuccess;
  const int blocks = static_cast<int>(std::min(kMaxBlocks, M * N));
  switch (mode) {
    case SoftmaxMode::kSoftmax:
      SoftmaxKernel<T, SoftmaxMode::kSoftmax><<<blocks, kThreads, 0, stream>>>(out, a, b, M, K, N);
      break;
    case SoftmaxMode::kLogSoftmax:
      SoftmaxKernel<T, SoftmaxMode::kLogSoftmax><<<blocks, kThreads, 0, stream>>>(out, a, b, M, K, N);
      break;
    case SoftmaxMode::kSoftmaxGrad:
      SoftmaxKernel<T, SoftmaxMode::kSoftmaxGrad><<<blocks, kThreads, 0, stream>>>(out, a, b, M, K, N);
      break;
    case SoftmaxMode::kLogSoftmaxGrad:
      SoftmaxKernel<T, SoftmaxMode::kLogSoftmaxGrad><<<blocks, kThreads, 0, stream>>>(out, a, b, M, K, N);
      break;
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------
// layer_norm and layer_norm_grad: eight threads per row (a row group); thread
// k of a group adds the CPU's lane k of LaneSum (kernels/cpu/layer_norm.cc).
//
// Speed without a changed bit: every serial sum takes its terms kBatch at a
// time, loaded and computed into registers ahead of the adds, which then
// run in the original order (the same doubles, the same order: the same
// bits); the outputs go kOutBatch at a time, their loads first. Blocks of
// kRowsPerBlock rows, at most 128 registers a thread, so eight blocks fit
// an SM: GPT-2's 8192 rows in one wave on 132 SMs. (Staging the rows in
// shared memory, timed on an H200, was slower: an SM's shared memory holds
// fewer rows than one wave needs. ncu finds the rows kernel waiting on its
// 4-byte L1 loads: wider loads are the next step.)

constexpr int kLanes = 8;
constexpr int kRowsPerBlock = 8;
constexpr int kRowThreads = kLanes * kRowsPerBlock;
constexpr int kRowBlocksPerSm = 8;  // __launch_bounds__: 65536 / (64 * 8) = 128 registers
constexpr int kBatch = 12;          // terms of a lane sum in flight
constexpr int kOutBatch = 12;       // outputs of a row group's thread in flight

// Lane k's sum of f(k), f(k + 8), ... below `full`, in that order: the terms
// of kBatch steps evaluated first (independent loads), then added in order.
template <typename F>
__device__ double LaneChain(int64_t full, const F& f) {
  const int k = threadIdx.x % kLanes;
  double lane = 0;
  int64_t j = k;
  for (; j + kLanes * (kBatch - 1) < full; j += kLanes * kBatch) {
    double v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = f(j + kLanes * u);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) lane += v[u];
  }
  for (; j < full; j += kLanes) lane += f(j);
  return lane;
}

// The eight lanes of a row group (and lane 0's tail) combined in the CPU's fixed order.
__device__ double CombineLanes(double lane, double tail) {
  double l[kLanes];
#pragma unroll
  for (int q = 0; q < kLanes; ++q) l[q] = __shfl_sync(0xffffffffu, lane, q, kLanes);
  tail = __shfl_sync(0xffffffffu, tail, 0, kLanes);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])) + tail;
}

// LaneSum(d, f) of the CPU, by the eight threads of a row group: lane k sums
// f(k), f(k + 8), ... over the full groups of eight; lane 0 the tail; the
// lanes combine in the CPU's fixed order. Every thread of the warp must call
// it (shuffles); threads of a group past the last row pass d = 0.
template <typename F>
__device__ double LaneSum(int64_t d, const F& f) {
  const int64_t full = d - d % kLanes;
  const double lane = LaneChain(full, f);
  double tail = 0;
  if (threadIdx.x % kLanes == 0) {
    for (int64_t j = full; j < d; ++j) tail += f(j);
  }
  return CombineLanes(lane, tail);
}

// Two LaneSums at once (two independent chains, each in its own order).
template <typename F, typename G>
__device__ void LaneSum2(int64_t d, const F& f, const G& g, double* sum_f, double* sum_g) {
  const int k = threadIdx.x % kLanes;
  const int64_t full = d - d % kLanes;
  double lane_f = 0, lane_g = 0;
  int64_t j = k;
  for (; j + kLanes * (kBatch - 1) < full; j += kLanes * kBatch) {
    double vf[kBatch], vg[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      vf[u] = f(j + kLanes * u);
      vg[u] = g(j + kLanes * u);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      lane_f += vf[u];
      lane_g += vg[u];
    }
  }
  for (; j < full; j += kLanes) {
    lane_f += f(j);
    lane_g += g(j);
  }
  double tail_f = 0, tail_g = 0;
  if (k == 0) {
    for (int64_t t = full; t < d; ++t) {
      tail_f += f(t);
      tail_g += g(t);
    }
  }
  *sum_f = CombineLanes(lane_f, tail_f);
  *sum_g = CombineLanes(lane_g, tail_g);
}

// The CPU's RowMoments: mean and 1 / sqrt(biased variance + epsilon), in double.
template <typename T>
__device__ void RowMoments(const T* x, int64_t d, int64_t D, double epsilon, double* mean, double* rstd) {
  const double m = LaneSum(d, [x](int64_t j) { return static_cast<double>(x[j]); }) / D;
  const double sq = LaneSum(d, [x, m](int64_t j) {
    const double c = x[j] - m;
    return c * c;
  });
  *mean = m;
  *rstd = 1.0 / sqrt(sq / D + epsilon);
}

// y stored as Y: T, or BF16 / F16 for an F32 x (each value the float one
// rounded by the cast kernel's conversion: passes/fold_casts).
template <typename T, typename Y>
__global__ void __launch_bounds__(kRowThreads, kRowBlocksPerSm)
    LayerNormKernel(Y* y, const T* x, const T* gamma, const T* beta, int64_t R, int64_t D, double epsilon) {
  const int k = threadIdx.x % kLanes;
  for (int64_t first = blockIdx.x * int64_t{kRowsPerBlock}; first < R; first += gridDim.x * int64_t{kRowsPerBlock}) {
    const int64_t r = first + threadIdx.x / kLanes;
    const bool valid = r < R;
    const T* xr = x + (valid ? r : 0) * D;
    double mean, rstd;
    RowMoments(xr, valid ? D : 0, D, epsilon, &mean, &rstd);
    if (!valid) continue;
    const T m = static_cast<T>(mean), rs = static_cast<T>(rstd);
    Y* yr = y + r * D;
    int64_t j = k;
    for (; j + kLanes * (kOutBatch - 1) < D; j += kLanes * kOutBatch) {
      Y v[kOutBatch];
#pragma unroll
      for (int u = 0; u < kOutBatch; ++u) {
        const int64_t i = j + kLanes * u;
        v[u] = Convert<Y>((xr[i] - m) * rs * gamma[i] + beta[i]);
      }
#pragma unroll
      for (int u = 0; u < kOutBatch; ++u) yr[j + kLanes * u] = v[u];
    }
    for (; j < D; j += kLanes) yr[j] = Convert<Y>((xr[j] - m) * rs * gamma[j] + beta[j]);
  }
}

// dy stored as DY (T, or BF16 / F16 for an F32 x), read widened to T (exact).
template <typename T, typename DY>
__device__ double WideDy(const DY* dy, int64_t i) {
  return static_cast<double>(Convert<T>(dy[i]));
}

// dx per row (the CPU's formula), and each row's mean and rstd for the sums
// below. Each residual element is read just before its dx element is
// written, by the same thread. dx_low (L, BF16 / F16; null, and L = T, for
// none): each dx element also stored rounded as the cast kernel rounds it.
template <typename T, typename DY, typename L>
__global__ void __launch_bounds__(kRowThreads, kRowBlocksPerSm)
    LayerNormGradRowsKernel(T* dx, L* dx_low, double* row_mean, double* row_rstd, const T* x, const T* gamma,
                            const DY* dy, const T* residual, int64_t R, int64_t D, double epsilon) {
  const int k = threadIdx.x % kLanes;
  for (int64_t first = blockIdx.x * int64_t{kRowsPerBlock}; first < R; first += gridDim.x * int64_t{kRowsPerBlock}) {
    const int64_t r = first + threadIdx.x / kLanes;
    const bool valid = r < R;
    const int64_t d = valid ? D : 0;
    const T* xr = x + (valid ? r : 0) * D;
    const DY* dyr = dy + (valid ? r : 0) * D;
    double mean, rstd;
    RowMoments(xr, d, D, epsilon, &mean, &rstd);
    double sum_g, sum_gx;
    LaneSum2(
        d, [&](int64_t j) { return WideDy<T>(dyr, j) * gamma[j]; },
        [&](int64_t j) { return WideDy<T>(dyr, j) * gamma[j] * ((xr[j] - mean) * rstd); }, &sum_g, &sum_gx);
    const double mean_g = sum_g / D, mean_gx = sum_gx / D;
    if (!valid) continue;
    if (k == 0) {
      row_mean[r] = mean;
      row_rstd[r] = rstd;
    }
    T* dxr = dx + r * D;
    L* dxlr = dx_low != nullptr ? dx_low + r * D : nullptr;
    const T* res = residual != nullptr ? residual + r * D : nullptr;
    const auto dx_at = [&](int64_t j) {
      const double xhat = (xr[j] - mean) * rstd, g = WideDy<T>(dyr, j) * gamma[j];
      return static_cast<T>(rstd * (g - mean_g - xhat * mean_gx));
    };
    int64_t j = k;
    for (; j + kLanes * (kOutBatch - 1) < D; j += kLanes * kOutBatch) {
      T v[kOutBatch];
#pragma unroll
      for (int u = 0; u < kOutBatch; ++u) v[u] = dx_at(j + kLanes * u);
      if (res != nullptr) {
#pragma unroll
        for (int u = 0; u < kOutBatch; ++u) v[u] = res[j + kLanes * u] + v[u];  // add_n's sum, in T
      }
#pragma unroll
      for (int u = 0; u < kOutBatch; ++u) dxr[j + kLanes * u] = v[u];
      if (dxlr != nullptr) {
#pragma unroll
        for (int u = 0; u < kOutBatch; ++u) dxlr[j + kLanes * u] = Convert<L>(v[u]);
      }
    }
    for (; j < D; j += kLanes) {
      const T v = dx_at(j);
      const T sum = res != nullptr ? res[j] + v : v;
      dxr[j] = sum;
      if (dxlr != nullptr) dxlr[j] = Convert<L>(sum);
    }
  }
}

// ---------------------------------------------------------------------------
// The rows kept in registers (float x, D <= kLanes * kRegU): a lane loads its
// terms x[k], x[k + 8], ... (and the gradient's dy terms) once, every load
// in flight together, and the lane sums, the outputs and dx read them from
// registers, where the kernels above read the row again for each sum (ncu on
// an H200: 63% of the rows kernel's stalls on its 4-byte loads, the
// repeated passes over a row that an SM's L1 cannot hold for all its rows
// read from L2). The same terms in the same order, so the same bits; the
// tail (D % 8 terms, lane 0's) is read from memory as above. Blocks an SM:
// as many as the registers a lane's terms take allow (ptxas, sm_90 and
// sm_80, no spills: the forward 155-159 a thread, 6 blocks; the gradient
// 246-252, 4 blocks, its two dy sums in one loop so that each gamma is read
// once). Behind LayerNormRowsInRegisters() (off) until a GPU has timed them.
constexpr int kRegU = 96;  // a lane's terms: D <= 768 (GPT-2 124M's d_model)
constexpr int kRegRowBlocks = 6;      // the forward: 155-159 registers
constexpr int kRegGradRowBlocks = 4;  // the gradient: 246-252

// Whether LayerNorm / LayerNormGrad keep float rows in registers
// (LayerNormRowsInRegisters()).
bool RowsInRegisters(int64_t D) { return D <= kLanes * kRegU && LayerNormRowsInRegisters().load(); }

// x itself, through a register move the compiler may not merge with
// another: a term widened to double in one sum and again in the next is
// then converted twice rather than kept as a double between them (which
// doubled the registers the terms take).
__device__ __forceinline__ float Fresh(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm volatile("mov.b32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return x;
#endif
}

// A lane's dy terms in registers, widened to float (exactly) as read: a
// 16-bit dy's kept as pairs of bits in 32-bit registers (half the registers
// of floats), an F32 dy's as floats.
template <typename DY>
struct LaneDy {
  uint32_t w[kRegU / 2];
  __device__ __forceinline__ void Load(const DY* lane0, int n) {
#pragma unroll
    for (int u = 0; u < kRegU; u += 2) {
      const uint32_t lo = u < n ? lane0[kLanes * u].bits : 0u;
      const uint32_t hi = u + 1 < n ? lane0[kLanes * (u + 1)].bits : 0u;
      w[u / 2] = lo | (hi << 16);
    }
  }
  __device__ __forceinline__ float operator()(int u) const {
    DY t;
    t.bits = static_cast<uint16_t>(w[u / 2] >> (16 * (u % 2)));
    return Fresh(Convert<float>(t));
  }
};
template <>
struct LaneDy<float> {
  float v[kRegU];
  __device__ __forceinline__ void Load(const float* lane0, int n);
  __device__ __forceinline__ float operator()(int u) const { return Fresh(v[u]); }
};

// How many of the lane's terms k, k + 8, ... lie below `end` (D <= 768:
// 32-bit offsets, and the unrolled loops below index from the lane's first
// term with constant offsets).
__device__ __forceinline__ int LaneTerms(int64_t end) {
  const int k = threadIdx.x % kLanes;
  return end > k ? static_cast<int>((end - k + kLanes - 1) / kLanes) : 0;
}

// The lane's first `n` terms of a row from its first one (`lane0`: the
// row's element k), zeros after.
template <typename T, typename S>
__device__ __forceinline__ void LoadLane(T (&v)[kRegU], const S* lane0, int n) {
#pragma unroll
  for (int u = 0; u < kRegU; ++u) v[u] = u < n ? Convert<T>(lane0[kLanes * u]) : T(0);
}

// LaneSum(d, f) with the lane's terms term(u) (f of its u-th element) below
// the full groups of eight, lane 0 adding tail(j) over the tail (from
// memory), combined as the CPU combines its lanes.
template <typename F, typename G>
__device__ __forceinline__ double RegisterLaneSum(int64_t d, const F& term, const G& tail) {
  const int64_t full = d - d % kLanes;
  const int n = LaneTerms(full);
  double lane = 0;
#pragma unroll
  for (int u = 0; u < kRegU; ++u) {
    if (u < n) lane += term(u);
  }
  double rest = 0;
  if (threadIdx.x % kLanes == 0) {
    for (int64_t j = full; j < d; ++j) rest += tail(j);
  }
  return CombineLanes(lane, rest);
}

__device__ __forceinline__ void LaneDy<float>::Load(const float* lane0, int n) { LoadLane(v, lane0, n); }

// RowMoments over the lane's registers.
__device__ __forceinline__ void RegisterRowMoments(const float (&v)[kRegU], const float* xr, int64_t d, int64_t D,
                                                   double epsilon, double* mean, double* rstd) {
  const double m = RegisterLaneSum(
                       d, [&](int u) { return static_cast<double>(Fresh(v[u])); },
                       [&](int64_t j) { return static_cast<double>(xr[j]); }) /
                   D;
  const double sq = RegisterLaneSum(
      d,
      [&](int u) {
        const double c = Fresh(v[u]) - m;
        return c * c;
      },
      [&](int64_t j) {
        const double c = xr[j] - m;
        return c * c;
      });
  *mean = m;
  *rstd = 1.0 / sqrt(sq / D + epsilon);
}

// LayerNormKernel with the row in registers.
template <typename Y>
__global__ void __launch_bounds__(kRowThreads, kRegRowBlocks)
    LayerNormRegisterKernel(Y* y, const float* x, const float* gamma, const float* beta, int64_t R, int64_t D,
                            double epsilon) {
  const int k = threadIdx.x % kLanes;
  for (int64_t first = blockIdx.x * int64_t{kRowsPerBlock}; first < R; first += gridDim.x * int64_t{kRowsPerBlock}) {
    const int64_t r = first + threadIdx.x / kLanes;
    const bool valid = r < R;
    const int64_t d = valid ? D : 0;
    const float* xr = x + (valid ? r : 0) * D;
    const int n = LaneTerms(d);
    float v[kRegU];
    LoadLane(v, xr + k, n);
    double mean, rstd;
    RegisterRowMoments(v, xr, d, D, epsilon, &mean, &rstd);
    if (!valid) continue;
    const float m = static_cast<float>(mean), rs = static_cast<float>(rstd);
    Y* yk = y + r * D + k;
    const float* gk = gamma + k;
    const float* bk = beta + k;
#pragma unroll
    for (int u = 0; u < kRegU; ++u) {
      if (u < n) yk[kLanes * u] = Convert<Y>((Fresh(v[u]) - m) * rs * gk[kLanes * u] + bk[kLanes * u]);
    }
  }
}

// LayerNormGradRowsKernel with x and dy in registers (LaneDy).
template <typename DY, typename L>
__global__ void __launch_bounds__(kRowThreads, kRegGradRowBlocks)
    LayerNormGradRegisterKernel(float* dx, L* dx_low, double* row_mean, double* row_rstd, const float* x,
                                const float* gamma, const DY* dy, const float* residual, int64_t R, int64_t D,
                                double epsilon) {
  const int k = threadIdx.x % kLanes;
  const float* gk = gamma + k;
  for (int64_t first = blockIdx.x * int64_t{kRowsPerBlock}; first < R; first += gridDim.x * int64_t{kRowsPerBlock}) {
    const int64_t r = first + threadIdx.x / kLanes;
    const bool valid = r < R;
    const int64_t d = valid ? D : 0;
    const float* xr = x + (valid ? r : 0) * D;
    const DY* dyr = dy + (valid ? r : 0) * D;
    const int n = LaneTerms(d);
    float xv[kRegU];
    LaneDy<DY> dyv;
    LoadLane(xv, xr + k, n);
    dyv.Load(dyr + k, n);
    double mean, rstd;
    RegisterRowMoments(xv, xr, d, D, epsilon, &mean, &rstd);
    // LaneSum2's two chains in one loop (each term's gamma read once), each
    // chain in its own order, the terms as the kernel above computes them.
    const int64_t full = d - d % kLanes;
    const int n_full = LaneTerms(full);
    double lane_g = 0, lane_gx = 0;
#pragma unroll
    for (int u = 0; u < kRegU; ++u) {
      if (u >= n_full) continue;
      const double g = static_cast<double>(dyv(u)) * gk[kLanes * u];
      lane_g += g;
      lane_gx += g * ((Fresh(xv[u]) - mean) * rstd);
    }
    double tail_g = 0, tail_gx = 0;
    if (k == 0) {
      for (int64_t j = full; j < d; ++j) {
        tail_g += WideDy<float>(dyr, j) * gamma[j];
        tail_gx += WideDy<float>(dyr, j) * gamma[j] * ((xr[j] - mean) * rstd);
      }
    }
    const double mean_g = CombineLanes(lane_g, tail_g) / D, mean_gx = CombineLanes(lane_gx, tail_gx) / D;
    if (!valid) continue;
    if (k == 0) {
      row_mean[r] = mean;
      row_rstd[r] = rstd;
    }
    float* dxk = dx + r * D + k;
    L* dxlk = dx_low != nullptr ? dx_low + r * D + k : nullptr;
    const float* resk = residual != nullptr ? residual + r * D + k : nullptr;
#pragma unroll
    for (int u = 0; u < kRegU; ++u) {
      if (u >= n) continue;
      const double xhat = (Fresh(xv[u]) - mean) * rstd, g = static_cast<double>(dyv(u)) * gk[kLanes * u];
      float value = static_cast<float>(rstd * (g - mean_g - xhat * mean_gx));
      if (resk != nullptr) value = resk[kLanes * u] + value;  // add_n's sum, in T
      dxk[kLanes * u] = value;
      if (dxlk != nullptr) dxlk[kLanes * u] = Convert<L>(value);
    }
  }
}

// partial[b * 2D + j] (dgamma) and partial[b * 2D + D + j] (dbeta): block b's
// rows added in row order, one thread per (b, j); kBatch2 rows' terms loaded
// and computed ahead of their adds.
constexpr int kBatch2 = 32;
constexpr int kPartialThreads = 128;  // registers for kBatch2 rows: one wave of blocks

template <typename T, typename DY>
__global__ void LayerNormGradPartialKernel(double* partial, const double* row_mean, const double* row_rstd, const T* x,
                                           const DY* dy, int64_t R, int64_t D, int64_t rows_per_block, int64_t blocks) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < blocks * D;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = e / D, j = e % D;
    const int64_t r_end = (b + 1) * rows_per_block < R ? (b + 1) * rows_per_block : R;
    double dg = 0, db = 0;
    int64_t r = b * rows_per_block;
    for (; r + kBatch2 <= r_end; r += kBatch2) {
      double w[kBatch2], xhat[kBatch2];
#pragma unroll
      for (int u = 0; u < kBatch2; ++u) {
        const int64_t i = (r + u) * D + j;
        w[u] = WideDy<T>(dy, i);
        xhat[u] = (x[i] - row_mean[r + u]) * row_rstd[r + u];
      }
#pragma unroll
      for (int u = 0; u < kBatch2; ++u) {
        dg += w[u] * xhat[u];
        db += w[u];
      }
    }
    for (; r < r_end; ++r) {
      const double xhat = (x[r * D + j] - row_mean[r]) * row_rstd[r];
      dg += WideDy<T>(dy, r * D + j) * xhat;
      db += WideDy<T>(dy, r * D + j);
    }
    partial[b * 2 * D + j] = dg;
    partial[b * 2 * D + D + j] = db;
  }
}

// dgamma (e < D) and dbeta (e >= D): one thread each, the blocks' partials in
// block order, kBatch2 loads ahead.
template <typename T>
__global__ void LayerNormGradSumKernel(T* dgamma, T* dbeta, const double* partial, int64_t D, int64_t blocks) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < 2 * D; e += int64_t{gridDim.x} * blockDim.x) {
    double s = 0;
    int64_t b = 0;
    for (; b + kBatch2 <= blocks; b += kBatch2) {
      double v[kBatch2];
#pragma unroll
      for (int u = 0; u < kBatch2; ++u) v[u] = partial[(b + u) * 2 * D + e];
#pragma unroll
      for (int u = 0; u < kBatch2; ++u) s += v[u];
    }
    for (; b < blocks; ++b) s += partial[b * 2 * D + e];
    if (e < D) {
      dgamma[e] = static_cast<T>(s);
    } else {
      dbeta[e - D] = static_cast<T>(s);
    }
  }
}

template <typename T, typename Y>
cudaError_t LayerNorm(Y* y, const T* x, const T* gamma, const T* beta, int64_t R, int64_t D, double epsilon,
                      cudaStream_t stream) {
  if (R == 0 || D == 0) return cudaSuccess;
  if constexpr (std::is_same_v<T, float>) {
    if (RowsInRegisters(D)) {
      LayerNormRegisterKernel<Y>
          <<<Blocks(R, kRowsPerBlock), kRowThreads, 0, stream>>>(y, x, gamma, beta, R, D, epsilon);
      return cudaGetLastError();
    }
  }
  LayerNormKernel<T, Y><<<Blocks(R, kRowsPerBlock), kRowThreads, 0, stream>>>(y, x, gamma, beta, R, D, epsilon);
  return cudaGetLastError();
}

template <typename T, typename DY, typename L = T>
cudaError_t LayerNormGrad(T* dx, T* dgamma, T* dbeta, const T* x, const T* gamma, const DY* dy, const T* residual,
                          int64_t R, int64_t D, double epsilon, double* scratch, cudaStream_t stream,
                          L* dx_low = nullptr) {
  if (D == 0) return cudaSuccess;
  if (R == 0) {  // no rows: dgamma = dbeta = 0, as the CPU's empty sums
    if (cudaError_t e = cudaMemsetAsync(dgamma, 0, D * sizeof(T), stream); e != cudaSuccess) return e;
    return cudaMemsetAsync(dbeta, 0, D * sizeof(T), stream);
  }
  const int64_t rows_per_block = nn_kernels::LayerNormGradRowsPerBlock(R, D);
  const int64_t blocks = nn_kernels::LayerNormGradBlocks(R, D);
  double* row_mean = scratch;
  double* row_rstd = row_mean + R;
  double* partial = row_rstd + R;
  bool registers = false;
  if constexpr (std::is_same_v<T, float>) {
    if (RowsInRegisters(D)) {
      registers = true;
      LayerNormGradRegisterKernel<DY, L><<<Blocks(R, kRowsPerBlock), kRowThreads, 0, stream>>>(
          dx, dx_low, row_mean, row_rstd, x, gamma, dy, residual, R, D, epsilon);
    }
  }
  if (!registers) {
    LayerNormGradRowsKernel<T, DY, L><<<Blocks(R, kRowsPerBlock), kRowThreads, 0, stream>>>(
        dx, dx_low, row_mean, row_rstd, x, gamma, dy, residual, R, D, epsilon);
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  LayerNormGradPartialKernel<T, DY><<<Blocks(blocks * D, kPartialThreads), kPartialThreads, 0, stream>>>(
      partial, row_mean, row_rstd, x, dy, R, D, rows_per_block, blocks);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  LayerNormGradSumKernel<T><<<Blocks(2 * D), kThreads, 0, stream>>>(dgamma, dbeta, partial, D, blocks);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------
// dropout: one thread per Philox block (four linear indices), as the CPU's ApplyMask.

template <typename T>
__global__ void DropoutKernel(T* out, const T* in, int64_t n, uint64_t key, const int64_t* counters, uint64_t step,
                              uint64_t base, uint64_t per_sample, double p, T scale) {
  if (counters != nullptr) {
    step = static_cast<uint64_t>(counters[0]);
    base = static_cast<uint64_t>(counters[1]) * per_sample;
  }
  const uint64_t first_group = base / 4, groups = (base + n - 1) / 4 - first_group + 1;
  for (uint64_t g = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; g < groups;
       g += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t group = first_group + g;
    const PhiloxWords bits = PhiloxUniformBits(key, step, group);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t linear = group * 4 + lane;
      if (linear < base || linear >= base + n) continue;
      const int64_t i = static_cast<int64_t>(linear - base);
      out[i] = PhiloxUniform(bits.w[lane]) >= p ? in[i] * scale : T(0);
    }
  }
}

template <typename T>
cudaError_t Dropout(T* out, const T* in, int64_t n, uint64_t key, const DropoutCounters& c, double p, T scale,
                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // The grid depends on n alone, so a graph replayed with other counters covers the same groups.
  DropoutKernel<T>
      <<<Blocks(n / 4 + 2), kThreads, 0, stream>>>(out, in, n, key, c.device, c.step, c.base, c.per_sample, p, scale);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------
// embedding and embedding_grad.

template <typename T>
__global__ void EmbeddingKernel(T* y, const T* table, const int64_t* ids, int64_t n, int64_t V, int64_t D) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n * D; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t id = ids[e / D];
    y[e] = id < 0 || id >= V ? static_cast<T>(QuietNaN()) : table[id * D + e % D];
  }
}

// keys[s] = ids[s] * n + s for s < n (an id outside [0, V) counts as V, so it
// sorts after every good one); the padding up to P sorts last.
__global__ void MakeKeysKernel(int64_t* keys, const int64_t* ids, int64_t n, int64_t V, int64_t P) {
  for (int64_t s = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; s < P; s += int64_t{gridDim.x} * blockDim.x) {
    if (s < n) {
      const int64_t id = ids[s];
      keys[s] = (id < 0 || id >= V ? V : id) * n + s;
    } else {
      keys[s] = INT64_MAX;
    }
  }
}

// Bitonic sort of P (a power of two) keys; the keys are distinct, so the
// sorted order is unique. A tile of kSortTile keys sorts in shared memory.
constexpr int64_t kSortTile = 2048;

__device__ void CompareSwap(int64_t* v, int64_t i, int64_t l, bool ascending) {
  const int64_t a = v[i], b = v[l];
  if ((a > b) == ascending) {
    v[i] = b;
    v[l] = a;
  }
}

// Pair t of the stage with distance j: (i, i + j).
__device__ int64_t PairLow(int64_t t, int64_t j) { return (t / j) * 2 * j + t % j; }

// The stages (k, j) with j < tile on each tile of `tile` keys: every k from 2
// to tile (k_max = 0), or only the merge of stage k = k_max.
__global__ void TileSortKernel(int64_t* keys, int64_t tile, int64_t k_max) {
  extern __shared__ int64_t tile_keys[];
  const int64_t offset = blockIdx.x * tile;
  for (int64_t t = threadIdx.x; t < tile; t += blockDim.x) tile_keys[t] = keys[offset + t];
  __syncthreads();
  for (int64_t k = k_max == 0 ? 2 : k_max; k <= (k_max == 0 ? tile : k_max); k <<= 1) {
    for (int64_t j = (k < tile ? k : tile) >> 1; j > 0; j >>= 1) {
      for (int64_t t = threadIdx.x; t < tile / 2; t += blockDim.x) {
        const int64_t i = PairLow(t, j);
        CompareSwap(tile_keys, i, i + j, ((offset + i) & k) == 0);
      }
      __syncthreads();
    }
  }
  for (int64_t t = threadIdx.x; t < tile; t += blockDim.x) keys[offset + t] = tile_keys[t];
}

__global__ void GlobalStageKernel(int64_t* keys, int64_t P, int64_t k, int64_t j) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < P / 2; t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = PairLow(t, j);
    CompareSwap(keys, i, i + j, (i & k) == 0);
  }
}

cudaError_t SortKeys(int64_t* keys, int64_t P, cudaStream_t stream) {
  const int64_t tile = std::min(P, kSortTile);
  const int tiles = static_cast<int>(P / tile);
  const int threads = static_cast<int>(std::min<int64_t>(tile / 2, 1024));
  const size_t shared = tile * sizeof(int64_t);
  TileSortKernel<<<tiles, threads, shared, stream>>>(keys, tile, 0);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  for (int64_t k = 2 * tile; k <= P; k <<= 1) {
    for (int64_t j = k >> 1; j >= tile; j >>= 1) {
      GlobalStageKernel<<<Blocks(P / 2), kThreads, 0, stream>>>(keys, P, k, j);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    TileSortKernel<<<tiles, threads, shared, stream>>>(keys, tile, k);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// dtable = 0, or all NaN when an id was outside [0, V) (the largest real key,
// keys[n - 1] once sorted, is then >= V * n).
template <typename T>
__global__ void FillTableKernel(T* dtable, int64_t size, const int64_t* keys, int64_t n, int64_t V) {
  const bool bad = n > 0 && keys[n - 1] >= V * n;
  const T value = bad ? static_cast<T>(QuietNaN()) : T(0);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < size; e += int64_t{gridDim.x} * blockDim.x) {
    dtable[e] = value;
  }
}

// One block per run of equal ids in the sorted keys: dtable[id] = the sum, in
// T and in position order from 0 (the CPU's zeroed row += dy[i]), of its rows.
template <typename T>
__global__ void SegmentSumKernel(T* dtable, const T* dy, const int64_t* keys, int64_t n, int64_t V, int64_t D) {
  if (keys[n - 1] >= V * n) return;  // a bad id: dtable stays NaN
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    const int64_t id = keys[s] / n;
    if (s > 0 && keys[s - 1] / n == id) continue;  // not the first of its run
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      T acc = T(0);
      for (int64_t q = s; q < n && keys[q] / n == id; ++q) acc += dy[(keys[q] % n) * D + j];
      dtable[id * D + j] = acc;
    }
  }
}

int64_t PowerOfTwoAtLeast(int64_t n) {
  int64_t p = 2;
  while (p < n) p <<= 1;
  return p;
}

template <typename T>
cudaError_t EmbeddingGrad(T* dtable, const T* dy, const int64_t* ids, int64_t n, int64_t V, int64_t D, int64_t* keys,
                          cudaStream_t stream) {
  if (V * D == 0) return cudaSuccess;
  if (n == 0) return cudaMemsetAsync(dtable, 0, V * D * sizeof(T), stream);
  if (V >= INT64_MAX / n - 1) return cudaErrorInvalidValue;  // keys (V + 1) * n must fit
  const int64_t P = PowerOfTwoAtLeast(n);
  MakeKeysKernel<<<Blocks(P), kThreads, 0, stream>>>(keys, ids, n, V, P);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (cudaError_t e = SortKeys(keys, P, stream); e != cudaSuccess) return e;
  FillTableKernel<T><<<Blocks(V * D), kThreads, 0, stream>>>(dtable, V * D, keys, n, V);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  SegmentSumKernel<T><<<static_cast<int>(std::min(kMaxBlocks, n)), kThreads, 0, stream>>>(dtable, dy, keys, n, V, D);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSoftmax(SoftmaxMode mode, float* out, const float* a, const float* b, int64_t M, int64_t K, int64_t N,
                          cudaStream_t stream) {
  return Softmax(mode, out, a, b, M, K, N, stream);
}
cudaError_t LaunchSoftmax(SoftmaxMode mode, double* out, const double* a, const double* b, int64_t M, int64_t K,
                          int64_t N, cudaStream_t stream) {
  return Softmax(mode, out, a, b, M, K, N, stream);
}

cudaError_t LaunchLayerNorm(float* y, const float* x, const float* gamma, const float* beta, int64_t R, int64_t D,
                            double epsilon, cudaStream_t stream) {
  return LayerNorm(y, x, gamma, beta, R, D, epsilon, stream);
}
cudaError_t LaunchLayerNorm(double* y, const double* x, const double* gamma, const double* beta, int64_t R, int64_t D,
                            double epsilon, cudaStream_t stream) {
  return LayerNorm(y, x, gamma, beta, R, D, epsilon, stream);
}
cudaError_t LaunchLayerNorm(bfloat16* y, const float* x, const float* gamma, const float* beta, int64_t R, int64_t D,
                            double epsilon, cudaStream_t stream) {
  return LayerNorm(y, x, gamma, beta, R, D, epsilon, stream);
}
cudaError_t LaunchLayerNorm(float16* y, const float* x, const float* gamma, const float* beta, int64_t R, int64_t D,
                            double epsilon, cudaStream_t stream) {
  return LayerNorm(y, x, gamma, beta, R, D, epsilon, stream);
}

int64_t LayerNormGradScratchDoubles(int64_t R, int64_t D) {
  if (R == 0 || D == 0) return 0;
  return 2 * R + nn_kernels::LayerNormGradBlocks(R, D) * 2 * D;
}
cudaError_t LaunchLayerNormGrad(float* dx, float* dgamma, float* dbeta, const float* x, const float* gamma,
                                const float* dy, const float* residual, int64_t R, int64_t D, double epsilon,
                                double* scratch, cudaStream_t stream) {
  return LayerNormGrad(dx, dgamma, dbeta, x, gamma, dy, residual, R, D, epsilon, scratch, stream);
}
cudaError_t LaunchLayerNormGrad(double* dx, double* dgamma, double* dbeta, const double* x, const double* gamma,
                                const double* dy, const double* residual, int64_t R, int64_t D, double epsilon,
                                double* scratch, cudaStream_t stream) {
  return LayerNormGrad(dx, dgamma, dbeta, x, gamma, dy, residual, R, D, epsilon, scratch, stream);
}
cudaError_t LaunchLayerNormGrad(float* dx, float* dgamma, float* dbeta, const float* x, const float* gamma,
                                const bfloat16* dy, const float* residual, int64_t R, int64_t D, double epsilon,
                                double* scratch, cudaStream_t stream) {
  return LayerNormGrad(dx, dgamma, dbeta, x, gamma, dy, residual, R, D, epsilon, scratch, stream);
}
cudaError_t LaunchLayerNormGrad(float* dx, float* dgamma, float* dbeta, const float* x, const float* gamma,
                                const float16* dy, const float* residual, int64_t R, int64_t D, double epsilon,
                                double* scratch, cudaStream_t stream) {
  return LayerNormGrad(dx, dgamma, dbeta, x, gamma, dy, residual, R, D, epsilon, scratch, stream);
}
#define STRATA_LAYER_NORM_GRAD_LOW(DY, L)                                                                              \
  cudaError_t LaunchLayerNormGrad(float* dx, L* dx_low, float* dgamma, float* dbeta, const float* x,                  \
                                  const float* gamma, const DY* dy, const float* residual, int64_t R, int64_t D,      \
                                  double epsilon, double* scratch, cudaStream_t stream) {                             \
    return LayerNormGrad(dx, dgamma, dbeta, x, gamma, dy, residual, R, D, epsilon, scratch, stream, dx_low);          \
  }
STRATA_LAYER_NORM_GRAD_LOW(float, bfloat16)
STRATA_LAYER_NORM_GRAD_LOW(bfloat16, bfloat16)
STRATA_LAYER_NORM_GRAD_LOW(float16, bfloat16)
STRATA_LAYER_NORM_GRAD_LOW(float, float16)
STRATA_LAYER_NORM_GRAD_LOW(bfloat16, float16)
STRATA_LAYER_NORM_GRAD_LOW(float16, float16)
#undef STRATA_LAYER_NORM_GRAD_LOW

cudaError_t LaunchDropout(float* out, const float* in, int64_t n, uint64_t key, const DropoutCounters& counters,
                          double p, float scale, cudaStream_t stream) {
  return Dropout(out, in, n, key, counters, p, scale, stream);
}
cudaError_t LaunchDropout(double* out, const double* in, int64_t n, uint64_t key, const DropoutCounters& counters,
                          double p, double scale, cudaStream_t stream) {
  return Dropout(out, in, n, key, counters, p, scale, stream);
}

cudaError_t LaunchEmbedding(float* y, const float* table, const int64_t* ids, int64_t n, int64_t V, int64_t D,
                            cudaStream_t stream) {
  if (n * D == 0) return cudaSuccess;
  EmbeddingKernel<float><<<Blocks(n * D), kThreads, 0, stream>>>(y, table, ids, n, V, D);
  return cudaGetLastError();
}
cudaError_t LaunchEmbedding(double* y, const double* table, const int64_t* ids, int64_t n, int64_t V, int64_t D,
                            cudaStream_t stream) {
  if (n * D == 0) return cudaSuccess;
  EmbeddingKernel<double><<<Blocks(n * D), kThreads, 0, stream>>>(y, table, ids, n, V, D);
  return cudaGetLastError();
}

int64_t EmbeddingGradScratchKeys(int64_t n) { return n == 0 ? 0 : PowerOfTwoAtLeast(n); }
cudaError_t LaunchEmbeddingGrad(float* dtable, const float* dy, const int64_t* ids, int64_t n, int64_t V, int64_t D,
                                int64_t* scratch, cudaStream_t stream) {
  return EmbeddingGrad(dtable, dy, ids, n, V, D, scratch, stream);
}
cudaError_t LaunchEmbeddingGrad(double* dtable, const double* dy, const int64_t* ids, int64_t n, int64_t V, int64_t D,
                                int64_t* scratch, cudaStream_t stream) {
  return EmbeddingGrad(dtable, dy, ids, n, V, D, scratch, stream);
}

}  // namespace cuda
}  // namespace strata
