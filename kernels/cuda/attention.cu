// Flash-style attention: see attention.h. Every kernel is templated on the
// element type and on kD, the head size rounded up to 64 or 128, so each
// thread's accumulators are registers (loops over kD unroll; d < D guards).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/block_reduce.cuh"

namespace strata {
namespace cuda {
namespace {

constexpr int kRows = 64;  // query (forward, dq) or key (dk, dv) rows per block, a thread each
constexpr int kCols = 32;  // keys (forward, dq) or queries (dk, dv) per shared-memory tile

__device__ inline float Exp(float x) { return expf(x); }
__device__ inline double Exp(double x) { return exp(x); }
__device__ inline float Log(float x) { return logf(x); }
__device__ inline double Log(double x) { return log(x); }
__device__ inline int64_t MinI64(int64_t a, int64_t b) { return a < b ? a : b; }
template <typename T>
__device__ inline T NegInf() {
  return -static_cast<T>(INFINITY);
}

__device__ inline double ToDouble(float x) { return x; }
__device__ inline double ToDouble(double x) { return x; }
__device__ inline double ToDouble(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline double ToDouble(__half x) { return __half2float(x); }

// x in the storage type P: itself where P is x's type, else rounded to
// nearest even from float.
template <typename P, typename T>
__device__ inline P Store(T x) {
  if constexpr (std::is_same_v<P, T>) {
    return x;
  } else if constexpr (std::is_same_v<P, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(x));
  } else {
    return __float2half_rn(static_cast<float>(x));
  }
}

// a . b over D elements, in index order (a: the thread's row, b: shared).
template <typename T, int kD>
__device__ inline T Dot(const T* a, const T* b, int D) {
  T s = 0;
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    if (d < D) s += a[d] * b[d];
  }
  return s;
}

// rows [row0, row0 + n) of a [T, D] matrix into shared `dst` with row stride
// `ld` (>= D), zeros past T; by the whole block.
template <typename T>
__device__ inline void LoadTile(T* dst, int ld, const T* src, int64_t row0, int n, int64_t T_, int D) {
  for (int idx = threadIdx.x; idx < n * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    dst[r * ld + d] = row0 + r < T_ ? src[(row0 + r) * D + d] : T(0);
  }
}

// grid (row blocks, heads), kRows threads. Shared: q [kRows][D + 1] (padded,
// each thread reads its own row), k and v tiles [kCols][D] (every thread
// reads the same element: a broadcast).
template <typename T, int kD>
__global__ void AttentionForward(T* y, T* lse, const T* q, const T* k, const T* v, int64_t T_, int D, T scale,
                                 bool causal) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kRows * (D + 1);
  T* vs = ks + kCols * D;
  const int64_t off = static_cast<int64_t>(blockIdx.y) * T_ * D;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t r = row0 + threadIdx.x;
  const bool active = r < T_;
  LoadTile(qs, D + 1, q + off, row0, kRows, T_, D);
  const T* qr = qs + threadIdx.x * (D + 1);
  const int64_t end = causal ? MinI64(T_, row0 + kRows) : T_;  // keys the block's rows see
  const int64_t n_row = causal ? r + 1 : T_;                              // keys this row sees
  T acc[kD];
#pragma unroll
  for (int d = 0; d < kD; ++d) acc[d] = 0;
  T m = NegInf<T>(), l = 0;
  for (int64_t c0 = 0; c0 < end; c0 += kCols) {
    __syncthreads();  // the previous tile is read by every thread
    LoadTile(ks, D, k + off, c0, kCols, T_, D);
    LoadTile(vs, D, v + off, c0, kCols, T_, D);
    __syncthreads();
    const int n = active ? static_cast<int>(MinI64(kCols, n_row - c0)) : 0;
    if (n <= 0) continue;
    T s[kCols];
    T tile_max = NegInf<T>();
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      if (j < n) {
        s[j] = scale * Dot<T, kD>(qr, ks + j * D, D);
        tile_max = max(tile_max, s[j]);
      }
    }
    const T new_m = max(m, tile_max);
    const T correction = Exp(m - new_m);  // 0 for the first tile (m = -inf)
    l *= correction;
#pragma unroll
    for (int d = 0; d < kD; ++d) acc[d] *= correction;
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      if (j < n) {
        const T p = Exp(s[j] - new_m);
        l += p;
        const T* vj = vs + j * D;
#pragma unroll
        for (int d = 0; d < kD; ++d) {
          if (d < D) acc[d] += p * vj[d];
        }
      }
    }
    m = new_m;
  }
  if (!active) return;
  const T inv = T(1) / l;
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    if (d < D) y[off + r * D + d] = acc[d] * inv;
  }
  lse[static_cast<int64_t>(blockIdx.y) * T_ + r] = m + Log(l);
}

// di = rowsum(dy * y) - dlse, a thread per (head, row), in double as the CPU.
// (y and dy may be 16-bit, di and dlse then float.)
// `layout`: where row i of y and dy lies ([B, T, H, D] for "bthd"; di and
// dlse are [heads, T] always).
template <typename T, typename A>
__global__ void AttentionDi(A* di, const T* y, const T* dy, const A* dlse, int64_t rows, int D, int64_t T_,
                            HeadLayout layout) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  const int64_t at = layout.Row(i, T_) * D;
  double dot = 0;
  for (int d = 0; d < D; ++d) dot += ToDouble(dy[at + d]) * ToDouble(y[at + d]);
  if (dlse != nullptr) dot -= dlse[i];
  di[i] = static_cast<A>(dot);
}

// grid (key blocks, heads), kRows threads, a key row each. Shared: k and v
// [kRows][D + 1] (each thread its own row), q and dy tiles [kCols][D], and
// the tile's lse and di.
template <typename T, int kD>
__global__ void AttentionGradKV(T* dk, T* dv, const T* q, const T* k, const T* v, const T* lse, const T* dy,
                                const T* di, int64_t T_, int D, T scale, bool causal) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kRows * (D + 1);
  T* qs = vs + kRows * (D + 1);
  T* dys = qs + kCols * D;
  T* lses = dys + kCols * D;
  T* dis = lses + kCols;
  const int64_t head = blockIdx.y;
  const int64_t off = head * T_ * D;
  const int64_t key0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t j = key0 + threadIdx.x;
  const bool active = j < T_;
  LoadTile(ks, D + 1, k + off, key0, kRows, T_, D);
  LoadTile(vs, D + 1, v + off, key0, kRows, T_, D);
  const T* kj = ks + threadIdx.x * (D + 1);
  const T* vj = vs + threadIdx.x * (D + 1);
  T dk_acc[kD], dv_acc[kD];
#pragma unroll
  for (int d = 0; d < kD; ++d) dk_acc[d] = dv_acc[d] = 0;
  // Causal: only queries at or after the block's first key see any of its keys.
  const int64_t first = causal ? key0 - key0 % kCols : 0;
  for (int64_t i0 = first; i0 < T_; i0 += kCols) {
    __syncthreads();
    LoadTile(qs, D, q + off, i0, kCols, T_, D);
    LoadTile(dys, D, dy + off, i0, kCols, T_, D);
    for (int t = threadIdx.x; t < kCols; t += blockDim.x) {
      lses[t] = i0 + t < T_ ? lse[head * T_ + i0 + t] : T(0);
      dis[t] = i0 + t < T_ ? di[head * T_ + i0 + t] : T(0);
    }
    __syncthreads();
    if (!active) continue;
    for (int t = 0; t < kCols; ++t) {
      const int64_t i = i0 + t;
      if (i >= T_) break;
      if (causal && i < j) continue;
      const T* qi = qs + t * D;
      const T* dyi = dys + t * D;
      const T p = Exp(scale * Dot<T, kD>(qi, kj, D) - lses[t]);
      const T ds = p * (Dot<T, kD>(dyi, vj, D) - dis[t]);
#pragma unroll
      for (int d = 0; d < kD; ++d) {
        if (d < D) {
          dv_acc[d] += p * dyi[d];
          dk_acc[d] += ds * qi[d];
        }
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    if (d < D) {
      dk[off + j * D + d] = scale * dk_acc[d];
      dv[off + j * D + d] = dv_acc[d];
    }
  }
}

// grid (query blocks, heads), kRows threads, a query row each. Shared: q and
// dy [kRows][D + 1], k and v tiles [kCols][D].
template <typename T, int kD>
__global__ void AttentionGradQ(T* dq, const T* q, const T* k, const T* v, const T* lse, const T* dy, const T* di,
                               int64_t T_, int D, T scale, bool causal) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* dys = qs + kRows * (D + 1);
  T* ks = dys + kRows * (D + 1);
  T* vs = ks + kCols * D;
  const int64_t head = blockIdx.y;
  const int64_t off = head * T_ * D;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t i = row0 + threadIdx.x;
  const bool active = i < T_;
  LoadTile(qs, D + 1, q + off, row0, kRows, T_, D);
  LoadTile(dys, D + 1, dy + off, row0, kRows, T_, D);
  const T* qi = qs + threadIdx.x * (D + 1);
  const T* dyi = dys + threadIdx.x * (D + 1);
  const T row_lse = active ? lse[head * T_ + i] : T(0);
  const T row_di = active ? di[head * T_ + i] : T(0);
  T dq_acc[kD];
#pragma unroll
  for (int d = 0; d < kD; ++d) dq_acc[d] = 0;
  const int64_t end = causal ? MinI64(T_, row0 + kRows) : T_;
  const int64_t n_row = causal ? i + 1 : T_;
  for (int64_t c0 = 0; c0 < end; c0 += kCols) {
    __syncthreads();
    LoadTile(ks, D, k + off, c0, kCols, T_, D);
    LoadTile(vs, D, v + off, c0, kCols, T_, D);
    __syncthreads();
    const int n = active ? static_cast<int>(MinI64(kCols, n_row - c0)) : 0;
    for (int t = 0; t < n; ++t) {
      const T* kj = ks + t * D;
      const T p = Exp(scale * Dot<T, kD>(qi, kj, D) - row_lse);
      const T ds = p * (Dot<T, kD>(dyi, vs + t * D, D) - row_di);
#pragma unroll
      for (int d = 0; d < kD; ++d) {
        if (d < D) dq_acc[d] += ds * kj[d];
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int d = 0; d < kD; ++d) {
    if (d < D) dq[off + i * D + d] = scale * dq_acc[d];
  }
}

// Launches `kernel` on grid (blocks, heads) with `shared` bytes, opting into
// more than the default 48 KiB where it needs it.
template <typename Kernel, typename... Args>
cudaError_t Launch(Kernel kernel, int64_t blocks, int64_t heads, size_t shared, cudaStream_t stream, Args... args) {
  if (blocks == 0 || heads == 0) return cudaSuccess;
  if (heads > 65535) return cudaErrorInvalidConfiguration;
  if (shared > 48 * 1024) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(shared));
        e != cudaSuccess) {
      return e;
    }
  }
  kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(heads)), kRows, shared, stream>>>(args...);
  return cudaGetLastError();
}

int64_t Blocks(int64_t T) { return (T + kRows - 1) / kRows; }

template <typename T, int kD>
cudaError_t ForwardD(T* y, T* lse, const T* q, const T* k, const T* v, int64_t heads, int64_t T_, int D, T scale,
                     bool causal, cudaStream_t stream) {
  const size_t shared = sizeof(T) * (kRows * (D + 1) + 2 * kCols * D);
  return Launch(AttentionForward<T, kD>, Blocks(T_), heads, shared, stream, y, lse, q, k, v, T_, D, scale, causal);
}

template <typename T>
cudaError_t Forward(T* y, T* lse, const T* q, const T* k, const T* v, int64_t heads, int64_t T_, int64_t D,
                    double scale, bool causal, cudaStream_t stream) {
  if (D <= 0 || D > kMaxHeadDim) return cudaErrorInvalidValue;
  const T s = static_cast<T>(scale);
  return D <= 64 ? ForwardD<T, 64>(y, lse, q, k, v, heads, T_, static_cast<int>(D), s, causal, stream)
                 : ForwardD<T, 128>(y, lse, q, k, v, heads, T_, static_cast<int>(D), s, causal, stream);
}

template <typename T, int kD>
cudaError_t GradD(T* dq, T* dk, T* dv, const T* q, const T* k, const T* v, const T* lse, const T* dy, const T* di,
                  int64_t heads, int64_t T_, int D, T scale, bool causal, cudaStream_t stream) {
  const size_t kv_shared = sizeof(T) * (2 * kRows * (D + 1) + 2 * kCols * D + 2 * kCols);
  if (cudaError_t e = Launch(AttentionGradKV<T, kD>, Blocks(T_), heads, kv_shared, stream, dk, dv, q, k, v, lse, dy,
                             di, T_, D, scale, causal);
      e != cudaSuccess) {
    return e;
  }
  const size_t q_shared = sizeof(T) * (2 * kRows * (D + 1) + 2 * kCols * D);
  return Launch(AttentionGradQ<T, kD>, Blocks(T_), heads, q_shared, stream, dq, q, k, v, lse, dy, di, T_, D, scale,
                causal);
}

template <typename T, typename A>
cudaError_t RowDots(A* di, const T* y, const T* dy, const A* dlse, int64_t rows, int64_t D, cudaStream_t stream,
                    int64_t T_ = 1, HeadLayout layout = {}) {
  if (rows == 0) return cudaSuccess;
  if (layout.bthd && (T_ <= 0 || layout.H <= 0)) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  AttentionDi<T, A><<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      di, y, dy, dlse, rows, static_cast<int>(D), T_, layout);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Grad(T* dq, T* dk, T* dv, const T* q, const T* k, const T* v, const T* y, const T* lse, const T* dy,
                 const T* dlse, T* di, int64_t heads, int64_t T_, int64_t D, double scale, bool causal,
                 cudaStream_t stream) {
  if (D <= 0 || D > kMaxHeadDim) return cudaErrorInvalidValue;
  const int64_t rows = heads * T_;
  if (rows == 0) return cudaSuccess;
  if (cudaError_t e = RowDots(di, y, dy, dlse, rows, D, stream); e != cudaSuccess) return e;
  const T s = static_cast<T>(scale);
  const int d = static_cast<int>(D);
  return D <= 64 ? GradD<T, 64>(dq, dk, dv, q, k, v, lse, dy, di, heads, T_, d, s, causal, stream)
                 : GradD<T, 128>(dq, dk, dv, q, k, v, lse, dy, di, heads, T_, d, s, causal, stream);
}

// The GEMM path's row-wise kernels (see attention.h).

constexpr int kSoftmaxThreads = 256;

// A block per score row (grid: heads * T), in the row's element type; the
// max and the sum of exponentials combined in double by a fixed tree, so
// runs repeat bit for bit.
template <typename T, typename P>
__global__ void AttentionSoftmax(const T* scores, P* probs, T* lse, int64_t T_, bool causal) {
  __shared__ double shared[kSoftmaxThreads];
  const int64_t row = blockIdx.x;
  const int64_t n = causal ? row % T_ + 1 : T_;
  const T* s = scores + row * T_;
  P* p = probs + row * T_;  // may be s itself: each thread writes only what it read
  double m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += kSoftmaxThreads) m = MaxOp()(m, static_cast<double>(s[j]));
  m = BlockReduce<kSoftmaxThreads>(m, shared, MaxOp());
  const T row_max = static_cast<T>(m);
  double l = 0;
  for (int64_t j = threadIdx.x; j < n; j += kSoftmaxThreads) l += Exp(s[j] - row_max);
  l = BlockReduce<kSoftmaxThreads>(l, shared, SumOp());
  const T row_lse = static_cast<T>(m + log(l));
  for (int64_t j = threadIdx.x; j < T_; j += kSoftmaxThreads) p[j] = Store<P>(j < n ? Exp(s[j] - row_lse) : T(0));
  if (threadIdx.x == 0) lse[row] = row_lse;
}

int64_t ElementwiseBlocks(int64_t total) {
  return std::min<int64_t>((total + kSoftmaxThreads - 1) / kSoftmaxThreads, int64_t{1} << 16);
}

// p in place, and into `copy` (null: none) in its storage type.
template <typename T, typename H>
__global__ void AttentionProbs(T* p, H* copy, const T* lse, int64_t T_, int64_t total, bool causal) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / T_;
    const T v = causal && idx % T_ > row % T_ ? T(0) : Exp(p[idx] - lse[row]);
    p[idx] = v;
    if (copy != nullptr) copy[idx] = Store<H>(v);
  }
}

// ds = p * (dp - di) in ds's storage type (ds may be dp itself).
template <typename T, typename O>
__global__ void AttentionScoreGrad(O* ds, const T* dp, const T* p, const T* di, int64_t T_, int64_t total) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    ds[idx] = Store<O>(p[idx] * (dp[idx] - di[idx / T_]));
  }
}

template <typename T, typename P>
cudaError_t Softmax(const T* s, P* p, T* lse, int64_t heads, int64_t T_, bool causal, cudaStream_t stream) {
  const int64_t rows = heads * T_;
  if (rows == 0) return cudaSuccess;
  if (rows > INT32_MAX) return cudaErrorInvalidConfiguration;
  AttentionSoftmax<T, P><<<static_cast<unsigned>(rows), kSoftmaxThreads, 0, stream>>>(s, p, lse, T_, causal);
  return cudaGetLastError();
}

template <typename T, typename H>
cudaError_t Probs(T* p, H* copy, const T* lse, int64_t heads, int64_t T_, bool causal, cudaStream_t stream) {
  const int64_t total = heads * T_ * T_;
  if (total == 0) return cudaSuccess;
  AttentionProbs<T, H><<<static_cast<unsigned>(ElementwiseBlocks(total)), kSoftmaxThreads, 0, stream>>>(
      p, copy, lse, T_, total, causal);
  return cudaGetLastError();
}

template <typename T, typename O>
cudaError_t ScoreGrad(O* ds, const T* dp, const T* p, const T* di, int64_t heads, int64_t T_, cudaStream_t stream) {
  const int64_t total = heads * T_ * T_;
  if (total == 0) return cudaSuccess;
  AttentionScoreGrad<T, O><<<static_cast<unsigned>(ElementwiseBlocks(total)), kSoftmaxThreads, 0, stream>>>(
      ds, dp, p, di, T_, total);
  return cudaGetLastError();
}


}  // namespace

cudaError_t LaunchAttentionSoftmax(float* p, float* lse, int64_t heads, int64_t T, bool causal, cudaStream_t stream) {
  return Softmax(p, p, lse, heads, T, causal, stream);
}
cudaError_t LaunchAttentionSoftmax(double* p, double* lse, int64_t heads, int64_t T, bool causal,
                                   cudaStream_t stream) {
  return Softmax(p, p, lse, heads, T, causal, stream);
}
cudaError_t LaunchAttentionSoftmax(const float* s, __nv_bfloat16* p, float* lse, int64_t heads, int64_t T, bool causal,
                                   cudaStream_t stream) {
  return Softmax(s, p, lse, heads, T, causal, stream);
}
cudaError_t LaunchAttentionSoftmax(const float* s, __half* p, float* lse, int64_t heads, int64_t T, bool causal,
                                   cudaStream_t stream) {
  return Softmax(s, p, lse, heads, T, causal, stream);
}
cudaError_t LaunchAttentionProbs(float* p, const float* lse, int64_t heads, int64_t T, bool causal,
                                 cudaStream_t stream) {
  return Probs(p, static_cast<float*>(nullptr), lse, heads, T, causal, stream);
}
cudaError_t LaunchAttentionProbs(double* p, const double* lse, int64_t heads, int64_t T, bool causal,
                                 cudaStream_t stream) {
  return Probs(p, static_cast<double*>(nullptr), lse, heads, T, causal, stream);
}
cudaError_t LaunchAttentionProbs(float* p, __nv_bfloat16* copy, const float* lse, int64_t heads, int64_t T,
                                 bool causal, cudaStream_t stream) {
  return Probs(p, copy, lse, heads, T, causal, stream);
}
cudaError_t LaunchAttentionProbs(float* p, __half* copy, const float* lse, int64_t heads, int64_t T, bool causal,
                                 cudaStream_t stream) {
  return Probs(p, copy, lse, heads, T, causal, stream);
}
cudaError_t LaunchAttentionRowDots(float* di, const float* y, const float* dy, const float* dlse, int64_t rows,
                                   int64_t D, cudaStream_t stream) {
  return RowDots(di, y, dy, dlse, rows, D, stream);
}
cudaError_t LaunchAttentionRowDots(double* di, const double* y, const double* dy, const double* dlse, int64_t rows,
                                   int64_t D, cudaStream_t stream) {
  return RowDots(di, y, dy, dlse, rows, D, stream);
}
cudaError_t LaunchAttentionRowDots(float* di, const __nv_bfloat16* y, const __nv_bfloat16* dy, const float* dlse,
                                   int64_t rows, int64_t D, cudaStream_t stream, int64_t T, HeadLayout layout) {
  return RowDots(di, y, dy, dlse, rows, D, stream, T, layout);
}
cudaError_t LaunchAttentionRowDots(float* di, const __half* y, const __half* dy, const float* dlse, int64_t rows,
                                   int64_t D, cudaStream_t stream, int64_t T, HeadLayout layout) {
  return RowDots(di, y, dy, dlse, rows, D, stream, T, layout);
}
cudaError_t LaunchAttentionScoreGrad(float* ds, const float* p, const float* di, int64_t heads, int64_t T,
                                     cudaStream_t stream) {
  return ScoreGrad(ds, ds, p, di, heads, T, stream);
}
cudaError_t LaunchAttentionScoreGrad(double* ds, const double* p, const double* di, int64_t heads, int64_t T,
                                     cudaStream_t stream) {
  return ScoreGrad(ds, ds, p, di, heads, T, stream);
}
cudaError_t LaunchAttentionScoreGrad(__nv_bfloat16* ds, const float* dp, const float* p, const float* di,
                                     int64_t heads, int64_t T, cudaStream_t stream) {
  return ScoreGrad(ds, dp, p, di, heads, T, stream);
}
cudaError_t LaunchAttentionScoreGrad(__half* ds, const float* dp, const float* p, const float* di, int64_t heads,
                                     int64_t T, cudaStream_t stream) {
  return ScoreGrad(ds, dp, p, di, heads, T, stream);
}

cudaError_t LaunchAttention(float* y, float* lse, const float* q, const float* k, const float* v, int64_t heads,
                            int64_t T, int64_t D, double scale, bool causal, cudaStream_t stream) {
  return Forward(y, lse, q, k, v, heads, T, D, scale, causal, stream);
}
cudaError_t LaunchAttention(double* y, double* lse, const double* q, const double* k, const double* v, int64_t heads,
                            int64_t T, int64_t D, double scale, bool causal, cudaStream_t stream) {
  return Forward(y, lse, q, k, v, heads, T, D, scale, causal, stream);
}

cudaError_t LaunchAttentionGrad(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v,
                                const float* y, const float* lse, const float* dy, const float* dlse, float* di,
                                int64_t heads, int64_t T, int64_t D, double scale, bool causal, cudaStream_t stream) {
  return Grad(dq, dk, dv, q, k, v, y, lse, dy, dlse, di, heads, T, D, scale, causal, stream);
}
cudaError_t LaunchAttentionGrad(double* dq, double* dk, double* dv, const double* q, const double* k, const double* v,
                                const double* y, const double* lse, const double* dy, const double* dlse, double* di,
                                int64_t heads, int64_t T, int64_t D, double scale, bool causal, cudaStream_t stream) {
  return Grad(dq, dk, dv, q, k, v, y, lse, dy, dlse, di, heads, T, D, scale, causal, stream);
}

}  // namespace cuda
}  // namespace strata
