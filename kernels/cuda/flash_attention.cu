// Tensor-core flash attention for 16-bit q, k, v: see flash_attention.h.
// Every kernel exists twice:
// - on WMMA (FlashForwardWmma, FlashGradKV, FlashGradQ: the default). WMMA
//   fragments are opaque, so each warp's scores go through its own float
//   scratch in shared memory, where a lane pair owns a row (lane / 2, half
//   the columns each) for the row-wise softmax; the forward's output rows are
//   float registers in the same layout, so the per-row rescale needs no
//   fragment map. ncu on an H200: shared-memory bound.
// - on PTX mma.sync m16n8k16 (FlashForward, FlashGradKVMma, FlashGradQMma;
//   mma_m16n8k16.h), whose documented fragments keep the scores,
//   probabilities, score gradients and accumulators in registers; shared
//   memory holds only operand rows, fed by cp.async two stages deep (the
//   next tile lands while this one's products run) and read by ldmatrix,
//   transposed on the way where a product's k runs along them (P v, P^T dy,
//   dS^T q, dS k), so no tile is copied transposed; the forward's warps own
//   32 query rows at D <= 64, so that each B fragment feeds two products.
//   Written 2026-11-27 without a GPU and checked in
//   flash_attention_emulation_test (the stand-in emulates mma.sync in the
//   PTX ISA's layouts); passed cuda_ops_test on an H200 on 2026-11-29 and
//   the default since (MmaFlashAttention(), both the forward and the
//   gradient; STRATA_MMA_ATTENTION=0 runs the WMMA kernels). With
//   StoredScoreGrads() the mma.sync dk/dv kernel stores the score gradients
//   it computes (FlashGradKVMma<.., true>) and FlashGradQStored takes dq
//   from them, in place of FlashGradQMma's second pass (written 2026-11-30
//   without a GPU, checked in the emulation test bit for bit against it).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_math.h"
#include "kernels/cuda/mma_m16n8k16.h"

namespace strata {
namespace cuda {
namespace {

using namespace nvcuda;  // NOLINT: wmma's fragment names read better unqualified

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 16;              // rows a warp owns, one WMMA tile tall
constexpr int kBlock = flash::kBlockRows;  // = kWarps * kWarpRows
constexpr int kTile = flash::kTileRows;    // columns of a warp's score tile
constexpr int kTileHalf = kTile / 2;       // score columns a lane owns
constexpr int kLdP = kTile + 8;            // 16-bit P and dS tiles (padded against bank conflicts)
constexpr int kLdDp = kTile + 4;           // float dP tiles
static_assert(kBlock == kWarps * kWarpRows, "a warp owns 16 of the block's rows");

// Row strides (elements) of the [rows, kD] 16-bit tiles and of a warp's float
// scratch (scores, then output rows). WMMA wants 32-byte aligned tile starts
// and strides of 16 bytes: every offset below is a multiple of 16 rows or
// 16 columns of these.
template <int kD>
constexpr int kLd = kD + 8;
template <int kD>
constexpr int kLdF = (kD > kTile ? kD : kTile) + 4;

template <typename G>
__device__ inline G FromFloat(float x);
template <>
__device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ inline __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

template <typename G>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, G, wmma::row_major>;
template <typename G>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, G, wmma::row_major>;
// A row-major [n, kD] tile read as its transpose [kD, n].
template <typename G>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, G, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows [row0, row0 + kBlock) of a [T, kD] matrix whose rows lie `rs`
// elements apart (kD, or H * kD for "bthd") into shared `dst` (stride
// kLd<kD>), zeros past T; by the whole block. `vec`: src is 16-byte aligned,
// so rows move as 16-byte words (rs is a multiple of kD, so of 8).
// Rows [row0, row0 + kRows) as LoadRows's, element by element (any
// alignment), by the whole block.
template <typename G, int kD, int kRows>
__device__ inline void LoadRowElements(G* dst, const G* src, int64_t row0, int64_t T, int64_t rs) {
  constexpr int ld = kLd<kD>;
  for (int idx = threadIdx.x; idx < kRows * kD; idx += kThreads) {
    const int r = idx / kD, d = idx % kD;
    dst[r * ld + d] = row0 + r < T ? src[(row0 + r) * rs + d] : FromFloat<G>(0.0f);
  }
}

template <typename G, int kD>
__device__ inline void LoadRows(G* dst, const G* src, int64_t row0, int64_t T, bool vec, int64_t rs) {
  constexpr int ld = kLd<kD>;
  if (vec) {
    constexpr int kWords = kD / 8;
    for (int idx = threadIdx.x; idx < kBlock * kWords; idx += kThreads) {
      const int r = idx / kWords, w = idx % kWords;
      uint4 word = make_uint4(0, 0, 0, 0);
      if (row0 + r < T) word = *reinterpret_cast<const uint4*>(src + (row0 + r) * rs + w * 8);
      *reinterpret_cast<uint4*>(dst + r * ld + w * 8) = word;
    }
  } else {
    LoadRowElements<G, kD, kBlock>(dst, src, row0, T, rs);
  }
}

// A warp's 16 x kD float rows in `f` (stride kLdF) to rows [row0, row0 + 16)
// of a [T, kD] matrix whose rows lie `rs` apart, times `factor`, rounded
// once; rows past T dropped.
template <typename G, int kD>
__device__ inline void StoreRows(G* dst, const float* f, int64_t row0, int64_t T, float factor, int64_t rs) {
  constexpr int ldf = kLdF<kD>;
  const int lane = threadIdx.x % 32;
  for (int idx = lane; idx < kWarpRows * kD; idx += 32) {
    const int r = idx / kD, d = idx % kD;
    if (row0 + r < T) dst[(row0 + r) * rs + d] = FromFloat<G>(f[r * ldf + d] * factor);
  }
}

constexpr size_t WmmaForwardShared(int kD) {
  return sizeof(uint16_t) * (2 * kTile * (kD + 8) + kWarps * kWarpRows * kLdP) +
         sizeof(float) * kWarps * kWarpRows * ((kD > kTile ? kD : kTile) + 4);
}

// The WMMA forward, the default until FlashForward (mma.sync, below) ran on
// an H200 (2026-11-29); kept for STRATA_MMA_ATTENTION=0 (MmaFlashAttention()). grid (query blocks, heads), kThreads.
// Shared: the k and v tiles [kTile][kLd]
// (q passes through the k tile once, into each warp's fragments), a warp's P
// [16][kLdP] and float scratch [16][kLdF]. `layout`: where a head's rows lie
// in q, k, v and y (attention.h).
template <typename G, int kD>
__global__ void __launch_bounds__(kThreads)
    FlashForwardWmma(G* y, float* lse, const G* q, const G* k, const G* v, int64_t T, float scale, bool causal, bool vec,
                 HeadLayout layout) {
  constexpr int ld = kLd<kD>, ldf = kLdF<kD>;
  constexpr int kOut = kD / 2;  // output columns a lane owns
  extern __shared__ __align__(128) unsigned char smem[];
  G* ks = reinterpret_cast<G*>(smem);
  G* vs = ks + kTile * ld;
  G* ps = vs + kTile * ld;
  float* fs = reinterpret_cast<float*>(ps + kWarps * kWarpRows * kLdP);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;  // the lane's row of the warp, and which half of its columns
  G* pw = ps + warp * kWarpRows * kLdP;
  float* fw = fs + warp * kWarpRows * ldf;
  // q, k, v and their gradients: slots of a packed qkv when layout.pack > 1 (y, dy: layout.Offset, RowStride).
  const int64_t head = blockIdx.y, off = layout.QkvOffset(head, T, kD), rs = layout.QkvRowStride(kD);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBlock;
  const int64_t i = q0 + warp * kWarpRows + r;  // the lane's query row

  LoadRows<G, kD>(ks, q + off, q0, T, vec, rs);
  __syncthreads();
  FragA<G> qf[kD / 16];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) wmma::load_matrix_sync(qf[kk], ks + warp * kWarpRows * ld + kk * 16, ld);

  float o[kOut];
#pragma unroll
  for (int c = 0; c < kOut; ++c) o[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int64_t end = flash::KeyEnd(q0, T, causal);
  for (int64_t k0 = 0; k0 < end; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous tiles (and q)
    LoadRows<G, kD>(ks, k + off, k0, T, vec, rs);
    LoadRows<G, kD>(vs, v + off, k0, T, vec, rs);
    __syncthreads();
    // S = q k^T, the warp's 16 x kTile.
#pragma unroll
    for (int n = 0; n < kTile / 16; ++n) {
      FragAcc acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        FragBCol<G> kf;
        wmma::load_matrix_sync(kf, ks + n * 16 * ld + kk * 16, ld);
        wmma::mma_sync(acc, qf[kk], kf, acc);
      }
      wmma::store_matrix_sync(fw + n * 16, acc, ldf, wmma::mem_row_major);
    }
    __syncwarp();
    // Scale and mask in float, then the online softmax; the lane pair of a
    // row combines its halves with one shuffle each.
    float s[kTileHalf];
    float tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < kTileHalf; ++t) {
      const int c = half * kTileHalf + t;
      s[t] = flash::Visible(i, k0 + c, T, causal) ? scale * fw[r * ldf + c] : -INFINITY;
      tile_max = fmaxf(tile_max, s[t]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float new_m = flash::NewMax(m, tile_max);
    const float correction = flash::Rescale(m, new_m);
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < kTileHalf; ++t) {
      const float p = flash::Prob(s[t], new_m);
      sum += p;  // l sums the float probabilities, P v their 16-bit roundings (FlashAttention's)
      pw[r * kLdP + half * kTileHalf + t] = FromFloat<G>(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * correction + sum;
    m = new_m;
    __syncwarp();
    // The tile's P v, 16 x kD, into the scratch (the scores are spent).
#pragma unroll
    for (int n = 0; n < kD / 16; ++n) {
      FragAcc acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA<G> pf;
        FragBRow<G> vf;
        wmma::load_matrix_sync(pf, pw + kk * 16, kLdP);
        wmma::load_matrix_sync(vf, vs + kk * 16 * ld + n * 16, ld);
        wmma::mma_sync(acc, pf, vf, acc);
      }
      wmma::store_matrix_sync(fw + n * 16, acc, ldf, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < kOut; ++c) o[c] = o[c] * correction + fw[r * ldf + half * kOut + c];
    __syncwarp();  // the next tile's scores overwrite the scratch
  }
  if (i >= T) return;
  const float inv = 1.0f / l;
  G* const yr = y + layout.Offset(head, T, kD) + i * layout.RowStride(kD);  // y: [B, T, H, D] however q is packed
#pragma unroll
  for (int c = 0; c < kOut; ++c) yr[half * kOut + c] = FromFloat<G>(o[c] * inv);
  if (half == 0) lse[head * T + i] = flash::Lse(m, l);
}

// Rows [row0, row0 + kRows) of a [T, kD] matrix whose rows lie `rs` apart
// into shared `dst` (stride kLd<kD>), zeros past T; by the whole block. With
// `vec` (src 16-byte aligned) as cp.async copies of 16 bytes that land at the
// issuing thread's CpAsyncWait (the caller commits and waits); otherwise
// element by element at once.
template <typename G, int kD, int kRows>
__device__ inline void IssueRows(G* dst, const G* src, int64_t row0, int64_t T, bool vec, int64_t rs) {
  constexpr int ld = kLd<kD>;
  if (vec) {
    constexpr int kWords = kD / 8;
    // Not unrolled: unrolled, ptxas kept more registers live across the tile
    // loops once two operands' rows could lie different strides apart
    // (HeadLayout's pack: q and dy in FlashGradKVMma, 168 -> 208 at D = 64, a
    // block fewer an SM); so every mma.sync kernel takes at most what it took
    // before pack (ptxas -O3, sm_90, 2026-11-27).
#pragma unroll 1
    for (int idx = threadIdx.x; idx < kRows * kWords; idx += kThreads) {
      const int r = idx / kWords, w = idx % kWords;
      const bool real = row0 + r < T;
      // A row past T is zero-filled and not read: it points at row0, a real row.
      mma::CpAsync16(dst + r * ld + w * 8, src + (real ? row0 + r : row0) * rs + w * 8, real);
    }
  } else {
    LoadRowElements<G, kD, kRows>(dst, src, row0, T, rs);
  }
}

// The two-stage pipeline's turn at a tile (every thread of the block calls
// it): once every warp is done with the other stage, the next tile's rows of
// a and b (rows `next`.., if has_next; their rows a_rs and b_rs apart) are
// issued into it and `also` runs
// (the stats FlashGradKVMma loads beside them); then this tile's copies are
// waited for and the block meets, after which the tile in `stage` is whole.
template <typename G, int kD, typename Also>
__device__ inline void NextStage(G* tiles, int64_t stage, const G* a, const G* b, int64_t next, bool has_next,
                                 int64_t T, bool vec, int64_t a_rs, int64_t b_rs, const Also& also) {
  constexpr int ld = kLd<kD>;
  __syncthreads();  // every warp is done with the other stage (the last tile, or the block's own rows)
  if (has_next) {
    G* dst = tiles + (stage ^ 1) * 2 * kTile * ld;
    IssueRows<G, kD, kTile>(dst, a, next, T, vec, a_rs);
    IssueRows<G, kD, kTile>(dst + kTile * ld, b, next, T, vec, b_rs);
    also();
  }
  mma::CpAsyncCommit();  // possibly empty: the wait below then still means this tile
  mma::CpAsyncWait<1>();
  __syncthreads();  // this tile, from every thread's copies
}

// The mma.sync forward (FlashForward) at head size kD: a warp owns kMT
// 16-row tiles of queries, so that each B fragment read from shared memory
// feeds kMT products; kFwdTiles, 2 at D <= 64 (at D = 128 the output
// accumulators of two tiles would not fit in registers beside the scores),
// unless MmaWideWarps() is off. A block owns kFwdRows.
template <int kD>
constexpr int kFwdTiles = kD <= 64 ? 2 : 1;
template <int kD, int kMT = kFwdTiles<kD>>
constexpr int kFwdRows = kWarps * kWarpRows * kMT;
// Its shared memory: two stages of a key tile's k and v rows [kTile][kLd]
// each (stage s at s * 2 kTile rows: k, then v); q's kFwdRows rows pass
// through stage 1 once, before the first tile lands there. 20, 36 and 68 KiB
// at D = 32, 64, 128 (the last with the opt-in).
constexpr size_t ForwardShared(int kD) { return sizeof(uint16_t) * 4 * kTile * (kD + 8); }
static_assert(kFwdRows<64> <= 2 * kTile && kFwdRows<128> <= 2 * kTile, "q's rows fit in one stage");

// The forward's blocks along T.
template <int kD, int kMT = kFwdTiles<kD>>
int64_t ForwardBlocks(int64_t T) {
  return (T + kFwdRows<kD, kMT> - 1) / kFwdRows<kD, kMT>;
}

// grid (ForwardBlocks(T), heads), kThreads; FlashAttention-2's forward on
// mma.sync (mma_m16n8k16.h): a warp's kFwdTiles x 16 query rows keep their q
// as A fragments, and their scores, probabilities and outputs as C fragments
// in registers (lane 4 g + t holds rows g and g + 8 of each 16-row tile,
// columns 2t and 2t + 1 of each 8-column block). The scores' C fragments of
// keys 16 kk.. are P v's A fragment of key step kk once rounded, and the
// online softmax's row max and sum combine a row's four lanes (t) by
// shuffles. Shared memory holds only operand tiles, fed by cp.async two
// stages deep (the next key tile's k and v land while this one's products
// run); B fragments come by ldmatrix, k's rows as they lie (S = q k^T) and
// v's rows transposed on the way (P v), so no tile is copied transposed. A
// warp skips a tile whose keys all follow its last query (causal).
// `layout`: where a head's rows lie in q, k, v and y (attention.h).
template <typename G, int kD, int kMT = kFwdTiles<kD>>
__global__ void __launch_bounds__(kThreads)
    FlashForward(G* y, float* lse, const G* q, const G* k, const G* v, int64_t T, float scale, bool causal, bool vec,
                 HeadLayout layout) {
  constexpr int ld = kLd<kD>;
  constexpr int kWarpQueries = kMT * kWarpRows;
  constexpr int kSteps = kD / 16;        // key-dimension steps of S = q k^T
  constexpr int kKeyBlocks = kTile / 8;  // 8-key blocks of S
  constexpr int kOutBlocks = kD / 8;     // 8-column blocks of the output
  extern __shared__ __align__(128) unsigned char smem[];
  G* const tiles = reinterpret_cast<G*>(smem);  // stage s: k rows at s * 2 kTile rows, v rows kTile rows on
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // q, k, v and their gradients: slots of a packed qkv when layout.pack > 1 (y, dy: layout.Offset, RowStride).
  const int64_t head = blockIdx.y, off = layout.QkvOffset(head, T, kD), rs = layout.QkvRowStride(kD);
  // The last query blocks first: causal, they walk the most key tiles, and
  // starting them first shortens the tail of the last wave.
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kFwdRows<kD, kMT>;
  const int64_t qw0 = q0 + warp * kWarpQueries;  // the warp's first query
  const int64_t end = flash::KeyEnd(q0, T, causal, kFwdRows<kD, kMT>);
  // ldmatrix row addresses of the lane: x4 over 16 rows x 16 columns (an A
  // fragment: rows lane % 16, columns 8 (lane / 16)); over 8 rows x 32
  // columns (two key steps of k's B fragments: row lane % 8, columns
  // 8 (lane / 8)); transposed, 16 rows x 16 columns (v's B fragments of two
  // output blocks: rows lane % 16, columns 8 (lane / 16)).
  const int a_row = lane % 16, a_col = 8 * (lane / 16);
  const int kb_row = lane % 8, kb_col = 8 * (lane / 8);
  const float scale_log2 = scale * flash::kLog2e;

  // q's rows through stage 1, the first key tile into stage 0.
  IssueRows<G, kD, kFwdRows<kD, kMT>>(tiles + 2 * kTile * ld, q + off, q0, T, vec, rs);
  mma::CpAsyncCommit();
  IssueRows<G, kD, kTile>(tiles, k + off, 0, T, vec, rs);
  IssueRows<G, kD, kTile>(tiles + kTile * ld, v + off, 0, T, vec, rs);
  mma::CpAsyncCommit();
  mma::CpAsyncWait<1>();
  __syncthreads();
  uint32_t qa[kMT][kSteps][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      mma::LdMatrixX4<false>(qa[mt][kk],
                             tiles + 2 * kTile * ld + (warp * kWarpQueries + mt * 16 + a_row) * ld + kk * 16 + a_col);
    }
  }
  float o[kMT][kOutBlocks][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < kOutBlocks; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
  }
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

  for (int64_t k0 = 0, stage = 0; k0 < end; k0 += kTile, stage ^= 1) {
    NextStage<G, kD>(tiles, stage, k + off, v + off, k0 + kTile, k0 + kTile < end, T, vec, rs, rs, [] {});
    if (causal && k0 > qw0 + kWarpQueries - 1) continue;  // every key after every query of the warp
    const G* ks = tiles + stage * 2 * kTile * ld;
    const G* vs = ks + kTile * ld;
    // S = q k^T, the warp's kWarpQueries x kTile: B of key block n is k's rows n * 8 + g.
    float s[kMT][kKeyBlocks][4];
#pragma unroll
    for (int n = 0; n < kKeyBlocks; ++n) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kSteps; kk += 2) {
        uint32_t b[4];  // b[0], b[1]: key step kk; b[2], b[3]: kk + 1
        mma::LdMatrixX4<false>(b, ks + (n * 8 + kb_row) * ld + kk * 16 + kb_col);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma::Mma16816<G>(s[mt][n], qa[mt][kk], {b[0], b[1]});
          mma::Mma16816<G>(s[mt][n], qa[mt][kk + 1], {b[2], b[3]});
        }
      }
    }
    // Scale into base 2 (flash_attention_math.h's Exp2), mask only where the
    // tile needs it (a warp-uniform test: the diagonal, or keys past T; rows
    // past T run unmasked on their zero q rows and are never stored), then
    // the online softmax over each row's four lanes, and P rounded to G as
    // P v's A operand: key block n is half of key step n / 2.
    const bool masked = (causal && k0 + kTile - 1 > qw0) || k0 + kTile > T;
    const int keys_left = static_cast<int>(T - k0 < kTile ? T - k0 : kTile);
    // Key column c of the tile lies after the warp's query row r when c - r > diag.
    const int diag = static_cast<int>(qw0 - k0 < kTile ? qw0 - k0 : kTile);
    // Two bodies, so that a tile with no mask runs none of its tests (a
    // test inside one loop is if-converted into every element's work).
    const auto to_base2 = [&](auto with_mask) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int n = 0; n < kKeyBlocks; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = s[mt][n][e] * scale_log2;
            if constexpr (decltype(with_mask)::value) {
              const int c = n * 8 + 2 * t + e % 2, r = mt * 16 + g + 8 * (e / 2);
              if (c >= keys_left || (causal && c - r > diag)) x = -INFINITY;
            }
            s[mt][n][e] = x;
          }
        }
      }
    };
    if (masked) {
      to_base2(std::true_type{});
    } else {
      to_base2(std::false_type{});
    }
    uint32_t pa[kMT][kTile / 16][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kKeyBlocks; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[mt][n][e]);
      }
      float correction[2], m_use[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        const float new_m = fmaxf(m[mt][r], tile_max[r]);
        m_use[r] = flash::Base2Max(new_m);
        correction[r] = flash::Exp2(m[mt][r] - m_use[r]);  // 0 from m = -inf: o and l are 0 then
        m[mt][r] = new_m;
      }
#pragma unroll
      for (int n = 0; n < kKeyBlocks; ++n) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[e] = flash::Exp2(s[mt][n][e] - m_use[e / 2]);
          sum[e / 2] += p[e];  // l sums the float probabilities, P v their 16-bit roundings (FlashAttention's)
        }
        pa[mt][n / 2][(n % 2) * 2] = mma::RoundPair<G>(p[0], p[1]);
        pa[mt][n / 2][(n % 2) * 2 + 1] = mma::RoundPair<G>(p[2], p[3]);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
        l[mt][r] = l[mt][r] * correction[r] + sum[r];
      }
#pragma unroll
      for (int n = 0; n < kOutBlocks; ++n) {
        o[mt][n][0] *= correction[0];
        o[mt][n][1] *= correction[0];
        o[mt][n][2] *= correction[1];
        o[mt][n][3] *= correction[1];
      }
    }
    // o += P v: B of output blocks n, n + 1 at key step kk are v's rows
    // 16 kk.. (the product's k), columns 8 n.., transposed by ldmatrix.
#pragma unroll
    for (int n = 0; n < kOutBlocks; n += 2) {
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t b[4];  // b[0], b[1]: output block n; b[2], b[3]: n + 1
        mma::LdMatrixX4<true>(b, vs + (kk * 16 + a_row) * ld + n * 8 + a_col);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma::Mma16816<G>(o[mt][n], pa[mt][kk], {b[0], b[1]});
          mma::Mma16816<G>(o[mt][n + 1], pa[mt][kk], {b[2], b[3]});
        }
      }
    }
  }
  mma::CpAsyncWait<0>();  // the last (empty) group: no copy outlives the block
  const int64_t y_off = layout.Offset(head, T, kD), y_rs = layout.RowStride(kD);  // however q is packed
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = qw0 + mt * 16 + g + 8 * r;
      if (row >= T) continue;
      const float inv = 1.0f / l[mt][r];
      G* yr = y + y_off + row * y_rs + 2 * t;
#pragma unroll
      for (int n = 0; n < kOutBlocks; ++n) {
        mma::StorePair(yr + n * 8, mma::RoundPair<G>(o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv));
      }
      if (t == 0) lse[head * T + row] = flash::Lse(m[mt][r] * flash::kLn2, l[mt][r]);
    }
  }
}

// The backward's shared memory: four [kTile][kLd] 16-bit tiles, lse and di of
// a query tile (dk/dv kernel), a warp's P and dS [16][kLdP], its float
// scratch [16][kLdF] and dP [16][kLdDp].
constexpr size_t GradShared(int kD) {
  return sizeof(uint16_t) * (4 * kTile * (kD + 8) + 2 * kWarps * kWarpRows * kLdP) + sizeof(float) * 2 * kTile +
         sizeof(float) * kWarps * kWarpRows * ((kD > kTile ? kD : kTile) + 4 + kLdDp);
}

// S (in fw) and dP (in dpw) of a warp: a_rows x b_rows^T and c_rows x
// d_rows^T, 16 x kTile each, a and c the warp's 16 rows of [.][kLd] tiles, b
// and d [kTile][kLd] tiles.
template <typename G, int kD>
__device__ inline void ScoresAndScoreGrads(float* fw, float* dpw, const G* a, const G* b, const G* c, const G* d) {
  constexpr int ld = kLd<kD>, ldf = kLdF<kD>;
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragAcc s, dp;
    wmma::fill_fragment(s, 0.0f);
    wmma::fill_fragment(dp, 0.0f);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      FragA<G> af, cf;
      FragBCol<G> bf, df;
      wmma::load_matrix_sync(af, a + kk * 16, ld);
      wmma::load_matrix_sync(bf, b + n * 16 * ld + kk * 16, ld);
      wmma::mma_sync(s, af, bf, s);
      wmma::load_matrix_sync(cf, c + kk * 16, ld);
      wmma::load_matrix_sync(df, d + n * 16 * ld + kk * 16, ld);
      wmma::mma_sync(dp, cf, df, dp);
    }
    wmma::store_matrix_sync(fw + n * 16, s, ldf, wmma::mem_row_major);
    wmma::store_matrix_sync(dpw + n * 16, dp, kLdDp, wmma::mem_row_major);
  }
}

// acc[n] += a (the warp's [16][kLdP] 16-bit tile) x b ([kTile][kLd] tile), n
// over kD's 16-column blocks.
template <typename G, int kD>
__device__ inline void AccumulateProduct(FragAcc* acc, const G* a, const G* b) {
  constexpr int ld = kLd<kD>;
#pragma unroll
  for (int n = 0; n < kD / 16; ++n) {
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      FragA<G> af;
      FragBRow<G> bf;
      wmma::load_matrix_sync(af, a + kk * 16, kLdP);
      wmma::load_matrix_sync(bf, b + kk * 16 * ld + n * 16, ld);
      wmma::mma_sync(acc[n], af, bf, acc[n]);
    }
  }
}

// The warp's float accumulators through its scratch to rows [row0, row0 + 16)
// of dst, times factor.
template <typename G, int kD>
__device__ inline void StoreAccumulators(G* dst, FragAcc* acc, float* fw, int64_t row0, int64_t T, float factor,
                                         int64_t rs) {
  constexpr int ldf = kLdF<kD>;
  __syncwarp();
#pragma unroll
  for (int n = 0; n < kD / 16; ++n) wmma::store_matrix_sync(fw + n * 16, acc[n], ldf, wmma::mem_row_major);
  __syncwarp();
  StoreRows<G, kD>(dst, fw, row0, T, factor, rs);
  __syncwarp();
}

// The WMMA dk and dv (the default; FlashGradKVMma below on mma.sync):
// grid (key blocks, heads), kThreads; a warp owns 16 keys. Per query tile:
// S^T = k q^T and dP^T = v dy^T, P^T = exp(scale S^T - lse) and
// dS^T = P^T (dP^T - di) rounded to G, dv += P^T dy, dk += dS^T q.
template <typename G, int kD>
__global__ void __launch_bounds__(kThreads)
    FlashGradKV(G* dk, G* dv, const G* q, const G* k, const G* v, const float* lse, const G* dy, const float* di,
                int64_t T, float scale, bool causal, bool vec, HeadLayout layout) {
  constexpr int ld = kLd<kD>, ldf = kLdF<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  G* ks = reinterpret_cast<G*>(smem);
  G* vs = ks + kTile * ld;
  G* qs = vs + kTile * ld;
  G* dys = qs + kTile * ld;
  G* ps = dys + kTile * ld;
  G* dss = ps + kWarps * kWarpRows * kLdP;
  float* lses = reinterpret_cast<float*>(dss + kWarps * kWarpRows * kLdP);
  float* dis = lses + kTile;
  float* fs = dis + kTile;
  float* dps = fs + kWarps * kWarpRows * ldf;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;
  G* pw = ps + warp * kWarpRows * kLdP;
  G* dsw = dss + warp * kWarpRows * kLdP;
  float* fw = fs + warp * kWarpRows * ldf;
  float* dpw = dps + warp * kWarpRows * kLdDp;
  // q, k, v and their gradients: slots of a packed qkv when layout.pack > 1 (y, dy: layout.Offset, RowStride).
  const int64_t head = blockIdx.y, off = layout.QkvOffset(head, T, kD), rs = layout.QkvRowStride(kD);
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kBlock;
  const int64_t j = k0 + warp * kWarpRows + r;  // the lane's key row

  LoadRows<G, kD>(ks, k + off, k0, T, vec, rs);
  LoadRows<G, kD>(vs, v + off, k0, T, vec, rs);
  FragAcc dk_acc[kD / 16], dv_acc[kD / 16];
#pragma unroll
  for (int n = 0; n < kD / 16; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }
  for (int64_t i0 = flash::QueryBegin(k0, causal); i0 < T; i0 += kTile) {
    __syncthreads();  // every warp is done with the previous query tile
    LoadRows<G, kD>(qs, q + off, i0, T, vec, rs);
    LoadRows<G, kD>(dys, dy + layout.Offset(head, T, kD), i0, T, vec, layout.RowStride(kD));
    for (int t = threadIdx.x; t < kTile; t += kThreads) {
      lses[t] = i0 + t < T ? lse[head * T + i0 + t] : 0.0f;
      dis[t] = i0 + t < T ? di[head * T + i0 + t] : 0.0f;
    }
    __syncthreads();
    ScoresAndScoreGrads<G, kD>(fw, dpw, ks + warp * kWarpRows * ld, qs, vs + warp * kWarpRows * ld, dys);
    __syncwarp();
#pragma unroll
    for (int t = 0; t < kTileHalf; ++t) {
      const int c = half * kTileHalf + t;
      const float p =
          flash::Visible(i0 + c, j, T, causal) ? flash::BackwardProb(scale * fw[r * ldf + c], lses[c]) : 0.0f;
      pw[r * kLdP + c] = FromFloat<G>(p);
      dsw[r * kLdP + c] = FromFloat<G>(flash::ScoreGrad(p, dpw[r * kLdDp + c], dis[c]));
    }
    __syncwarp();
    AccumulateProduct<G, kD>(dv_acc, pw, dys);
    AccumulateProduct<G, kD>(dk_acc, dsw, qs);
  }
  const int64_t row0 = k0 + warp * kWarpRows;
  StoreAccumulators<G, kD>(dk + off, dk_acc, fw, row0, T, scale, rs);
  StoreAccumulators<G, kD>(dv + off, dv_acc, fw, row0, T, 1.0f, rs);
}

// The WMMA dq (the default; FlashGradQMma below on mma.sync): grid (query
// blocks, heads), kThreads; a warp owns 16 queries. Per key tile:
// S = q k^T and dP = dy v^T, dS = exp(scale S - lse) (dP - di) rounded to G,
// dq += dS k.
template <typename G, int kD>
__global__ void __launch_bounds__(kThreads)
    FlashGradQ(G* dq, const G* q, const G* k, const G* v, const float* lse, const G* dy, const float* di, int64_t T,
               float scale, bool causal, bool vec, HeadLayout layout) {
  constexpr int ld = kLd<kD>, ldf = kLdF<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  G* qs = reinterpret_cast<G*>(smem);
  G* dys = qs + kTile * ld;
  G* ks = dys + kTile * ld;
  G* vs = ks + kTile * ld;
  G* dss = vs + kTile * ld + kWarps * kWarpRows * kLdP;  // the layout of GradShared; P's tile unused here
  float* fs = reinterpret_cast<float*>(dss + kWarps * kWarpRows * kLdP) + 2 * kTile;
  float* dps = fs + kWarps * kWarpRows * ldf;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;
  G* dsw = dss + warp * kWarpRows * kLdP;
  float* fw = fs + warp * kWarpRows * ldf;
  float* dpw = dps + warp * kWarpRows * kLdDp;
  // q, k, v and their gradients: slots of a packed qkv when layout.pack > 1 (y, dy: layout.Offset, RowStride).
  const int64_t head = blockIdx.y, off = layout.QkvOffset(head, T, kD), rs = layout.QkvRowStride(kD);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBlock;
  const int64_t i = q0 + warp * kWarpRows + r;  // the lane's query row
  const float row_lse = i < T ? lse[head * T + i] : 0.0f;
  const float row_di = i < T ? di[head * T + i] : 0.0f;

  LoadRows<G, kD>(qs, q + off, q0, T, vec, rs);
  LoadRows<G, kD>(dys, dy + layout.Offset(head, T, kD), q0, T, vec, layout.RowStride(kD));  // however q is packed
  FragAcc dq_acc[kD / 16];
#pragma unroll
  for (int n = 0; n < kD / 16; ++n) wmma::fill_fragment(dq_acc[n], 0.0f);
  const int64_t end = flash::KeyEnd(q0, T, causal);
  for (int64_t k0 = 0; k0 < end; k0 += kTile) {
    __syncthreads();
    LoadRows<G, kD>(ks, k + off, k0, T, vec, rs);
    LoadRows<G, kD>(vs, v + off, k0, T, vec, rs);
    __syncthreads();
    ScoresAndScoreGrads<G, kD>(fw, dpw, qs + warp * kWarpRows * ld, ks, dys + warp * kWarpRows * ld, vs);
    __syncwarp();
#pragma unroll
    for (int t = 0; t < kTileHalf; ++t) {
      const int c = half * kTileHalf + t;
      const float p =
          flash::Visible(i, k0 + c, T, causal) ? flash::BackwardProb(scale * fw[r * ldf + c], row_lse) : 0.0f;
      dsw[r * kLdP + c] = FromFloat<G>(flash::ScoreGrad(p, dpw[r * kLdDp + c], row_di));
    }
    __syncwarp();
    AccumulateProduct<G, kD>(dq_acc, dsw, ks);
  }
  StoreAccumulators<G, kD>(dq + off, dq_acc, fw, q0 + warp * kWarpRows, T, scale, rs);
}

// From this D on, FlashGradKVMma reads v's A fragments from shared memory at
// every step rather than holding them in registers: at D = 128 k's and v's
// fragments and the dk and dv accumulators alone take 192 registers, and
// ptxas spilled (92 bytes at 255 registers; none so).
constexpr int kGradKVVInSharedFrom = 128;

// The mma.sync gradients' shared memory: two stages of a tile's two operand
// row tiles [kTile][kLd] (FlashGradKVMma: a query tile's q and dy rows;
// FlashGradQMma: a key tile's k and v rows), the first operand at
// s * 2 kTile rows, the second kTile rows on; the block's own rows pass
// through stage 1 once. FlashGradKVMma then keeps two stages of lse and di
// of the query tile (kTile floats each), and at D = 128 v's rows
// [kBlock][kLd]. 21, 37 and 86 KiB (KV), 20, 36 and 68 KiB (Q) at D = 32,
// 64, 128 (the last with the opt-in).
constexpr size_t GradStages(int kD) { return sizeof(uint16_t) * 4 * kTile * (kD + 8); }
constexpr size_t GradKVShared(int kD) {
  return GradStages(kD) + sizeof(float) * 4 * kTile +
         (kD >= kGradKVVInSharedFrom ? sizeof(uint16_t) * kBlock * (kD + 8) : 0);
}
constexpr size_t GradQShared(int kD) { return GradStages(kD); }

// The A fragments of a warp's 16 rows of a [.][kLd] tile (`rows`: its first
// row), kD / 16 steps of 16 columns, by ldmatrix (lane: row lane % 16,
// columns 8 (lane / 16) of each step).
template <typename G, int kD>
__device__ inline void LoadA(uint32_t (&a)[kD / 16][4], const G* rows, int lane) {
  constexpr int ld = kLd<kD>;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) mma::LdMatrixX4<false>(a[kk], rows + (lane % 16) * ld + kk * 16 + 8 * (lane / 16));
}

// c[mt][0], c[mt][1] = a[mt] b^T for b's rows row0.. and row0 + 8.., for
// each of the warp's kMT 16-row tiles: a[mt] a tile's A fragments (16 rows x
// kD), b a [.][kLd] tile whose rows are the product's columns; each B
// fragment, read once, feeds the kMT products. ldmatrix x4 per key step:
// b[0], b[1] of rows row0.. (lanes 0-15: rows lane % 8, columns
// 8 ((lane / 8) % 2)), then of rows row0 + 8.. (lanes 16-31).
template <typename G, int kD, int kMT>
__device__ inline void RowProducts(float (&c)[kMT][2][4], const uint32_t (&a)[kMT][kD / 16][4], const G* b, int row0,
                                   int lane) {
  constexpr int ld = kLd<kD>;
  const G* row = b + (row0 + lane % 8 + 8 * (lane / 16)) * ld + 8 * ((lane / 8) % 2);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < 2; ++n) c[mt][n][0] = c[mt][n][1] = c[mt][n][2] = c[mt][n][3] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t w[4];
    mma::LdMatrixX4<false>(w, row + kk * 16);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      mma::Mma16816<G>(c[mt][0], a[mt][kk], {w[0], w[1]});
      mma::Mma16816<G>(c[mt][1], a[mt][kk], {w[2], w[3]});
    }
  }
}

// acc[mt][n] += a[mt] x rows 16 s.. of a [.][kLd] tile (the product's k
// along its rows, its columns the output's), for each of the warp's kMT
// 16-row tiles: B of output blocks n, n + 1 by one ldmatrix x4 .trans (lane:
// row 16 s + lane % 16, columns 8 n + 8 (lane / 16)), feeding the kMT
// products.
template <typename G, int kD, int kMT>
__device__ inline void AccumulateRows(float (&acc)[kMT][kD / 8][4], const uint32_t (&a)[kMT][4], const G* b, int s,
                                      int lane) {
  constexpr int ld = kLd<kD>;
  const G* row = b + (16 * s + lane % 16) * ld + 8 * (lane / 16);
#pragma unroll
  for (int n = 0; n < kD / 8; n += 2) {
    uint32_t w[4];
    mma::LdMatrixX4<true>(w, row + n * 8);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      mma::Mma16816<G>(acc[mt][n], a[mt], {w[0], w[1]});
      mma::Mma16816<G>(acc[mt][n + 1], a[mt], {w[2], w[3]});
    }
  }
}

// A warp's kMT tiles of C fragments [kD / 8][4], zeroed.
template <int kMT, int kD>
__device__ inline void ZeroAccumulators(float (&acc)[kMT][kD / 8][4]) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
  }
}

// A warp's C fragments acc [kD / 8][4] (rows row0 + g and + 8, columns
// n * 8 + 2 t, + 1) times factor, rounded once, into rows [row0, row0 + 16)
// of dst whose rows lie rs apart; rows past T dropped.
template <typename G, int kD>
__device__ inline void StoreFragments(G* dst, const float (&acc)[kD / 8][4], int64_t row0, int64_t T, float factor,
                                      int64_t rs, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + g + 8 * r;
    if (row >= T) continue;
    G* out = dst + row * rs + 2 * t;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      mma::StorePair(out + n * 8, mma::RoundPair<G>(acc[n][2 * r] * factor, acc[n][2 * r + 1] * factor));
    }
  }
}

// FlashGradKV on mma.sync (mma_m16n8k16.h), selected by MmaFlashAttention():
// grid (key blocks, heads), kThreads; a warp owns 16 keys, whose k and v rows
// stay A fragments in registers (v's at D = 128 are read from shared memory
// at each step: kGradKVVInSharedFrom). Query tiles of q and dy rows come by
// cp.async two stages deep (lse and di beside them); per 16-query step:
// S^T = k q^T and dP^T = v dy^T in C fragments (B: ldmatrix of q's and dy's
// rows), P^T = exp(scale S^T - lse) (0 where not Visible) and
// dS^T = P^T (dP^T - di) per query column, rounded to G where they lie as
// the A fragments of dv += P^T dy and dk += dS^T q (B: the same rows by
// ldmatrix .trans), as FlashForward turns S into P's A fragments. Steps
// wholly above the diagonal (causal) are skipped: their P^T is 0.
// kStore (StoredScoreGrads()): each step's dS^T A fragments, transposed in
// registers (MovMatrixTrans) into dS's, also go to `score_grads`
// (flash_attention_math.h's blocks; a 16-byte store a lane), for
// FlashGradQStored; keys past T are then masked too, so their stored dS is
// 0. Without it `score_grads` is unused.
template <typename G, int kD, bool kStore = false>
__global__ void __launch_bounds__(kThreads)
    FlashGradKVMma(G* dk, G* dv, const G* q, const G* k, const G* v, const float* lse, const G* dy, const float* di,
                   int64_t T, float scale, bool causal, bool vec, HeadLayout layout, uint32_t* score_grads) {
  constexpr int ld = kLd<kD>;
  constexpr int kSteps = kD / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  G* const tiles = reinterpret_cast<G*>(smem);  // stage s: q rows at s * 2 kTile rows, dy rows kTile on
  float* const stats = reinterpret_cast<float*>(tiles + 4 * kTile * ld);  // stage s: lse at s * 2 kTile, di kTile on
  constexpr bool kVShared = kD >= kGradKVVInSharedFrom;
  G* const vs = kVShared ? reinterpret_cast<G*>(stats + 4 * kTile) : tiles + 3 * kTile * ld;  // v's rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // q, k, v and their gradients: slots of a packed qkv when layout.pack > 1 (y, dy: layout.Offset, RowStride).
  const int64_t head = blockIdx.y, off = layout.QkvOffset(head, T, kD), rs = layout.QkvRowStride(kD);
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kBlock;
  const int64_t dy_off = layout.Offset(head, T, kD), dy_rs = layout.RowStride(kD);  // however q is packed
  const int64_t kw0 = k0 + warp * kWarpRows;  // the warp's first key; the lane's are kw0 + g and + 8
  const float scale_log2 = scale * flash::kLog2e;
  const int64_t begin = flash::QueryBegin(k0, causal);
  // lse and di of query rows [i0, i0 + kTile) into stage `stage` by cp.async
  // (4 bytes a row; zeros past T), in the group of the tile's rows.
  const auto load_stats = [&](int64_t i0, int stage) {
    float* s = stats + stage * 2 * kTile;
    for (int idx = threadIdx.x; idx < 2 * kTile; idx += kThreads) {
      const int r = idx % kTile;
      const bool real = i0 + r < T;
      const float* src = (idx < kTile ? lse : di) + head * T + (real ? i0 + r : 0);
      mma::CpAsync4(s + idx, src, real);
    }
  };
  // k's (and v's) rows through stage 1, the first query tile into stage 0.
  IssueRows<G, kD, kBlock>(tiles + 2 * kTile * ld, k + off, k0, T, vec, rs);
  IssueRows<G, kD, kBlock>(vs, v + off, k0, T, vec, rs);
  mma::CpAsyncCommit();
  if (begin < T) {
    IssueRows<G, kD, kTile>(tiles, q + off, begin, T, vec, rs);
    IssueRows<G, kD, kTile>(tiles + kTile * ld, dy + dy_off, begin, T, vec, dy_rs);
    load_stats(begin, 0);
  }
  mma::CpAsyncCommit();
  mma::CpAsyncWait<1>();
  __syncthreads();
  uint32_t ka[1][kSteps][4], va[1][kVShared ? 1 : kSteps][4];
  LoadA<G, kD>(ka[0], tiles + (2 * kTile + warp * kWarpRows) * ld, lane);
  if constexpr (!kVShared) LoadA<G, kD>(va[0], vs + warp * kWarpRows * ld, lane);
  float dk_acc[1][kD / 8][4], dv_acc[1][kD / 8][4];
  ZeroAccumulators<1, kD>(dk_acc);
  ZeroAccumulators<1, kD>(dv_acc);
  for (int64_t i0 = begin, stage = 0; i0 < T; i0 += kTile, stage ^= 1) {
    NextStage<G, kD>(tiles, stage, q + off, dy + dy_off, i0 + kTile, i0 + kTile < T, T, vec, rs, dy_rs,
                     [&] { load_stats(i0 + kTile, static_cast<int>(stage ^ 1)); });
    const G* qs = tiles + stage * 2 * kTile * ld;
    const G* dys = qs + kTile * ld;
    const float* lses = stats + stage * 2 * kTile;
    const float* dis = lses + kTile;
    // The warp's key row kr lies after the tile's query row c when kr - c > diag.
    const int diag = static_cast<int>(i0 - kw0 < kTile ? i0 - kw0 : kTile);
#pragma unroll 1
    for (int s = 0; s < kTile / 16; ++s) {
      if (causal && i0 + s * 16 + 15 < kw0) continue;  // every query before every key of the warp
      float st[1][2][4], dpt[1][2][4];
      RowProducts<G, kD, 1>(st, ka, qs, 16 * s, lane);
      if constexpr (kVShared) {
        uint32_t vsa[1][kSteps][4];  // read at every step, as each mma needs it
        LoadA<G, kD>(vsa[0], vs + warp * kWarpRows * ld, lane);
        RowProducts<G, kD, 1>(dpt, vsa, dys, 16 * s, lane);
      } else {
        RowProducts<G, kD, 1>(dpt, va, dys, 16 * s, lane);
      }
      // P^T = Exp2(S^T scale log2(e) - lse log2(e)), masked only on steps
      // that cross the diagonal (a query row past T has lse 0 and zero q and
      // dy rows, so it adds nothing; a key row past T is never stored).
      // Query block n of the step is half of its A fragments: words (n * 2, n * 2 + 1).
      // Stored, keys past T are masked as well (only their own, never
      // stored dk and dv rows change), so that dq reads zeros there.
      const bool masked = (causal && i0 + s * 16 < kw0 + 15) || (kStore && kw0 + 16 > T);
      uint32_t pa[1][4], dsa[1][4];
      const auto probs = [&](auto with_mask) {  // two bodies, as the forward's to_base2
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          float p[4], ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = s * 16 + n * 8 + 2 * t + e % 2;  // the query's row of the tile
            p[e] = flash::Exp2(flash::GradExponent(st[0][n][e], scale_log2, flash::Lse2(lses[c])));
            if constexpr (decltype(with_mask)::value) {
              const int kr = g + 8 * (e / 2);  // the key's row of the warp
              if constexpr (kStore) {
                if ((causal && kr - c > diag) || kw0 + kr >= T) p[e] = 0.0f;
              } else {
                if (kr - c > diag) p[e] = 0.0f;  // the key after the query
              }
            }
            ds[e] = flash::ScoreGrad(p[e], dpt[0][n][e], dis[c]);
          }
          pa[0][n * 2] = mma::RoundPair<G>(p[0], p[1]);
          pa[0][n * 2 + 1] = mma::RoundPair<G>(p[2], p[3]);
          dsa[0][n * 2] = mma::RoundPair<G>(ds[0], ds[1]);
          dsa[0][n * 2 + 1] = mma::RoundPair<G>(ds[2], ds[3]);
        }
      };
      if (masked) {
        probs(std::true_type{});
      } else {
        probs(std::false_type{});
      }
      if constexpr (kStore) {
        // Query block qb's rows and key block kb's columns: dS^T's words
        // (keys g, g + 8 x queries 2t.., 2t + 8..) transposed.
        const int64_t qb = (i0 + s * 16) / 16, kb = kw0 / 16;
        const uint32_t w0 = mma::MovMatrixTrans(dsa[0][0]), w1 = mma::MovMatrixTrans(dsa[0][1]),
                       w2 = mma::MovMatrixTrans(dsa[0][2]), w3 = mma::MovMatrixTrans(dsa[0][3]);
        if (flash::ScoreGradStored(qb, kb, T, causal)) {
          uint32_t* at =
              score_grads + (head * flash::ScoreGradBlocks(T, causal) + flash::ScoreGradBlock(qb, kb, T, causal)) *
                                flash::kScoreGradBlockWords;
          *reinterpret_cast<uint4*>(at + 4 * lane) = make_uint4(w0, w2, w1, w3);
        }
      }
      AccumulateRows<G, kD, 1>(dv_acc, pa, dys, s, lane);
      AccumulateRows<G, kD, 1>(dk_acc, dsa, qs, s, lane);
    }
  }
  mma::CpAsyncWait<0>();  // the last (empty) group: no copy outlives the block
  StoreFragments<G, kD>(dk + off, dk_acc[0], kw0, T, scale, rs, g, t);
  StoreFragments<G, kD>(dv + off, dv_acc[0], kw0, T, 1.0f, rs, g, t);
}

// FlashGradQMma's warps own kMT 16-row tiles of queries (each B fragment
// then feeds kMT products): kDqTiles, 2 at D <= 64 (at D = 128 the dq
// accumulators of two would not fit beside the rest) unless MmaWideWarps()
// is off; its blocks kDqRows.
template <int kD>
constexpr int kDqTiles = kD <= 64 ? 2 : 1;
template <int kD, int kMT = kDqTiles<kD>>
constexpr int kDqRows = kWarps * kWarpRows * kMT;
template <int kD, int kMT = kDqTiles<kD>>
int64_t GradQBlocks(int64_t T) {
  return (T + kDqRows<kD, kMT> - 1) / kDqRows<kD, kMT>;
}
static_assert(kDqRows<64> <= 2 * kTile && kDqRows<128> <= 2 * kTile, "q's, then dy's rows fit in a stage");

// FlashGradQ on mma.sync, selected by MmaFlashAttention(): grid
// (GradQBlocks(T), heads), kThreads; a warp owns kDqTiles x 16 queries, whose
// q and dy rows stay A fragments in registers, lse and di of its rows in
// registers. Key tiles of k and v rows come by cp.async two stages deep; per
// 16-key step: S = q k^T and dP = dy v^T in C fragments (B: ldmatrix of k's
// and v's rows), dS = exp(scale S - lse) (dP - di) rounded to G as the A
// fragment of dq += dS k (B: k's rows by ldmatrix .trans). Steps wholly
// above the diagonal (causal) are skipped.
template <typename G, int kD, int kMT = kDqTiles<kD>>
__global__ void __launch_bounds__(kThreads)
    FlashGradQMma(G* dq, const G* q, const G* k, const G* v, const float* lse, const G* dy, const float* di, int64_t T,
                  float scale, bool causal, bool vec, HeadLayout layout) {
  constexpr int ld = kLd<kD>;
  constexpr int kSteps = kD / 16;
  constexpr int kWarpQueries = kMT * kWarpRows;
  extern __shared__ __align__(128) unsigned char smem[];
  G* const tiles = reinterpret_cast<G*>(smem);  // stage s: k rows at s * 2 kTile rows, v rows kTile on
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // q, k, v and their gradients: slots of a packed qkv when layout.pack > 1 (y, dy: layout.Offset, RowStride).
  const int64_t head = blockIdx.y, off = layout.QkvOffset(head, T, kD), rs = layout.QkvRowStride(kD);
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kDqRows<kD, kMT>;  // the longest first
  const int64_t qw0 = q0 + warp * kWarpQueries;  // the warp's first query
  float row_lse[kMT][2], row_di[kMT][2];         // of the lane's rows qw0 + 16 mt + g (+ 8)
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = qw0 + 16 * mt + g + 8 * r;
      row_lse[mt][r] = row < T ? flash::Lse2(lse[head * T + row]) : 0.0f;  // lse in base 2
      row_di[mt][r] = row < T ? di[head * T + row] : 0.0f;
    }
  }
  const int64_t end = flash::KeyEnd(q0, T, causal, kDqRows<kD, kMT>);
  const float scale_log2 = scale * flash::kLog2e;

  // q's rows through stage 1 and dy's through stage 0 (kDqRows each), into
  // A fragments; then the first key tile into stage 0.
  IssueRows<G, kD, kDqRows<kD, kMT>>(tiles + 2 * kTile * ld, q + off, q0, T, vec, rs);
  IssueRows<G, kD, kDqRows<kD, kMT>>(tiles, dy + layout.Offset(head, T, kD), q0, T, vec, layout.RowStride(kD));
  mma::CpAsyncCommit();
  mma::CpAsyncWait<0>();
  __syncthreads();
  uint32_t qa[kMT][kSteps][4], dya[kMT][kSteps][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    LoadA<G, kD>(qa[mt], tiles + (2 * kTile + warp * kWarpQueries + 16 * mt) * ld, lane);
    LoadA<G, kD>(dya[mt], tiles + (warp * kWarpQueries + 16 * mt) * ld, lane);
  }
  __syncthreads();  // every warp has its fragments: stage 0 takes the first tile
  IssueRows<G, kD, kTile>(tiles, k + off, 0, T, vec, rs);
  IssueRows<G, kD, kTile>(tiles + kTile * ld, v + off, 0, T, vec, rs);
  mma::CpAsyncCommit();
  float dq_acc[kMT][kD / 8][4];
  ZeroAccumulators<kMT, kD>(dq_acc);
  for (int64_t k0 = 0, stage = 0; k0 < end; k0 += kTile, stage ^= 1) {
    NextStage<G, kD>(tiles, stage, k + off, v + off, k0 + kTile, k0 + kTile < end, T, vec, rs, rs, [] {});
    const G* ks = tiles + stage * 2 * kTile * ld;
    const G* vs = ks + kTile * ld;
    const int keys_left = static_cast<int>(T - k0 < kTile ? T - k0 : kTile);
    // Key column c of the tile lies after the warp's query row r when c - r > diag.
    const int diag = static_cast<int>(qw0 - k0 < kTile ? qw0 - k0 : kTile);
#pragma unroll 1
    for (int s = 0; s < kTile / 16; ++s) {
      if (causal && k0 + s * 16 > qw0 + kWarpQueries - 1) continue;  // every key after every query of the warp
      float sc[kMT][2][4], dp[kMT][2][4];
      RowProducts<G, kD, kMT>(sc, qa, ks, 16 * s, lane);
      RowProducts<G, kD, kMT>(dp, dya, vs, 16 * s, lane);
      // P = Exp2(S scale log2(e) - lse log2(e)), masked only on steps that
      // cross the diagonal or reach past T (a key row past T is zero, and
      // its score 0 need not be below a row's lse); a query row past T has
      // lse 0 and zero dy and is never stored.
      const int col0 = s * 16;  // the step's first key column of the tile
      const bool masked = (causal && k0 + col0 + 15 > qw0) || k0 + col0 + 16 > T;
      uint32_t dsa[kMT][4];
      const auto score_grads = [&](auto with_mask) {  // two bodies, as the forward's to_base2
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            float ds[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float p = flash::Exp2(flash::GradExponent(sc[mt][n][e], scale_log2, row_lse[mt][e / 2]));
              if constexpr (decltype(with_mask)::value) {
                const int c = col0 + n * 8 + 2 * t + e % 2, r = 16 * mt + g + 8 * (e / 2);
                if (c >= keys_left || (causal && c - r > diag)) p = 0.0f;
              }
              ds[e] = flash::ScoreGrad(p, dp[mt][n][e], row_di[mt][e / 2]);
            }
            dsa[mt][n * 2] = mma::RoundPair<G>(ds[0], ds[1]);
            dsa[mt][n * 2 + 1] = mma::RoundPair<G>(ds[2], ds[3]);
          }
        }
      };
      if (masked) {
        score_grads(std::true_type{});
      } else {
        score_grads(std::false_type{});
      }
      AccumulateRows<G, kD, kMT>(dq_acc, dsa, ks, s, lane);
    }
  }
  mma::CpAsyncWait<0>();  // the last (empty) group: no copy outlives the block
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) StoreFragments<G, kD>(dq + off, dq_acc[mt], qw0 + 16 * mt, T, scale, rs, g, t);
}

// dq from the score gradients FlashGradKVMma<G, kD, true> stored
// (StoredScoreGrads()), in place of FlashGradQMma's second pass over the
// scores: grid (GradQBlocks(T), heads), kThreads, GradQStoredShared(kD); a
// warp owns kMT x 16 queries, as FlashGradQMma's. Key tiles of k's rows come
// by cp.async two stages deep; the warp's dS blocks of a tile, a 16-byte
// load a lane each, straight into A fragments one tile ahead (zeros for a
// block not stored: past T, or wholly above the diagonal); per 16-key step
// dq += dS k (B: k's rows by ldmatrix .trans). The same dS, the same
// products in the same order as FlashGradQMma's (its steps of zero dS
// change no sum: the accumulators start at +0), so the same bits.
template <typename G, int kD, int kMT = kDqTiles<kD>>
__global__ void __launch_bounds__(kThreads) FlashGradQStored(G* dq, const G* k, const uint32_t* ds, int64_t T,
                                                             float scale, bool causal, bool vec, HeadLayout layout) {
  constexpr int ld = kLd<kD>;
  constexpr int kWarpQueries = kMT * kWarpRows;
  constexpr int kSteps = kTile / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  G* const tiles = reinterpret_cast<G*>(smem);  // stage s: k rows at s * kTile rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t head = blockIdx.y, off = layout.QkvOffset(head, T, kD), rs = layout.QkvRowStride(kD);
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kDqRows<kD, kMT>;  // the longest first
  const int64_t qw0 = q0 + warp * kWarpQueries;                                            // the warp's first query
  const int64_t end = flash::KeyEnd(q0, T, causal, kDqRows<kD, kMT>);
  const uint32_t* head_ds = ds + head * flash::ScoreGradBlocks(T, causal) * flash::kScoreGradBlockWords + 4 * lane;
  // The warp's dS A fragments of the key tile at k0: f[step][mt].
  const auto load = [&](int64_t k0, uint32_t(&f)[kSteps][kMT][4]) {
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int64_t qb = (qw0 + 16 * mt) / 16, kb = (k0 + 16 * st) / 16;
        uint4 w = make_uint4(0, 0, 0, 0);
        if (flash::ScoreGradStored(qb, kb, T, causal)) {
          w = *reinterpret_cast<const uint4*>(head_ds +
                                              flash::ScoreGradBlock(qb, kb, T, causal) * flash::kScoreGradBlockWords);
        }
        f[st][mt][0] = w.x;
        f[st][mt][1] = w.y;
        f[st][mt][2] = w.z;
        f[st][mt][3] = w.w;
      }
    }
  };
  IssueRows<G, kD, kTile>(tiles, k + off, 0, T, vec, rs);
  mma::CpAsyncCommit();
  uint32_t cur[kSteps][kMT][4], next[kSteps][kMT][4];
  load(0, next);
  float dq_acc[kMT][kD / 8][4];
  ZeroAccumulators<kMT, kD>(dq_acc);
  for (int64_t k0 = 0, stage = 0; k0 < end; k0 += kTile, stage ^= 1) {
    std::memcpy(cur, next, sizeof(cur));
    const bool has_next = k0 + kTile < end;
    if (has_next) load(k0 + kTile, next);
    __syncthreads();  // every warp is done with the other stage
    if (has_next) IssueRows<G, kD, kTile>(tiles + (stage ^ 1) * kTile * ld, k + off, k0 + kTile, T, vec, rs);
    mma::CpAsyncCommit();
    mma::CpAsyncWait<1>();
    __syncthreads();  // this tile, from every thread's copies
    const G* ks = tiles + stage * kTile * ld;
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      if (causal && k0 + st * 16 > qw0 + kWarpQueries - 1) continue;  // every key after every query of the warp
      AccumulateRows<G, kD, kMT>(dq_acc, cur[st], ks, st, lane);
    }
  }
  mma::CpAsyncWait<0>();  // the last (empty) group: no copy outlives the block
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) StoreFragments<G, kD>(dq + off, dq_acc[mt], qw0 + 16 * mt, T, scale, rs, g, t);
}

// Its shared memory: two stages of a key tile's k rows [kTile][kLd].
constexpr size_t GradQStoredShared(int kD) { return sizeof(uint16_t) * 2 * kTile * (kD + 8); }

// Opts `kernel` into `shared` bytes of dynamic shared memory on the current
// device, once per device (`done`: a bit per device), so launches inside a
// CUDA-graph capture make no attribute call after the first eager run.
template <typename Kernel>
cudaError_t AllowShared(Kernel kernel, size_t shared, std::atomic<uint64_t>& done) {
  if (shared <= 48 * 1024) return cudaSuccess;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  if (cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
      e != cudaSuccess) {
    return e;
  }
  done.fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

dim3 Grid(int64_t T, int64_t heads) {
  return dim3(static_cast<unsigned>((T + kBlock - 1) / kBlock), static_cast<unsigned>(heads));
}

// Whether every pointer is 16-byte aligned (rows then move as 16-byte words:
// kD is a multiple of 8).
template <typename... P>
bool Aligned16(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

template <typename G, int kD, int kMT>
cudaError_t MmaForward(G* y, float* lse, const G* q, const G* k, const G* v, int64_t heads, int64_t T, float scale,
                       bool causal, cudaStream_t stream, HeadLayout layout, bool vec) {
  static_assert(ForwardShared(64) <= 48 * 1024, "no opt-in at D = 64");
  static std::atomic<uint64_t> done{0};
  constexpr size_t shared = ForwardShared(kD);
  if (cudaError_t e = AllowShared(FlashForward<G, kD, kMT>, shared, done); e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(ForwardBlocks<kD, kMT>(T)), static_cast<unsigned>(heads));
  FlashForward<G, kD, kMT><<<grid, kThreads, shared, stream>>>(y, lse, q, k, v, T, scale, causal, vec, layout);
  return cudaGetLastError();
}

// dq on mma.sync with kMT 16-row tiles a warp.
template <typename G, int kD, int kMT>
cudaError_t MmaGradQ(G* dq, const G* q, const G* k, const G* v, const float* lse, const G* dy, const float* di,
                     int64_t heads, int64_t T, float scale, bool causal, cudaStream_t stream, HeadLayout layout,
                     bool vec) {
  static std::atomic<uint64_t> done{0};
  constexpr size_t shared = GradQShared(kD);
  if (cudaError_t e = AllowShared(FlashGradQMma<G, kD, kMT>, shared, done); e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(GradQBlocks<kD, kMT>(T)), static_cast<unsigned>(heads));
  FlashGradQMma<G, kD, kMT><<<grid, kThreads, shared, stream>>>(dq, q, k, v, lse, dy, di, T, scale, causal, vec, layout);
  return cudaGetLastError();
}

template <typename G, int kD>
cudaError_t ForwardD(G* y, float* lse, const G* q, const G* k, const G* v, int64_t heads, int64_t T, float scale,
                     bool causal, cudaStream_t stream, HeadLayout layout) {
  const bool vec = Aligned16(q, k, v);
  if (MmaFlashAttention().load()) {
    if constexpr (kFwdTiles<kD> > 1) {
      if (MmaWideWarps().load()) {
        return MmaForward<G, kD, kFwdTiles<kD>>(y, lse, q, k, v, heads, T, scale, causal, stream, layout, vec);
      }
    }
    return MmaForward<G, kD, 1>(y, lse, q, k, v, heads, T, scale, causal, stream, layout, vec);
  }
  static std::atomic<uint64_t> done{0};
  constexpr size_t shared = WmmaForwardShared(kD);
  if (cudaError_t e = AllowShared(FlashForwardWmma<G, kD>, shared, done); e != cudaSuccess) return e;
  FlashForwardWmma<G, kD>
      <<<Grid(T, heads), kThreads, shared, stream>>>(y, lse, q, k, v, T, scale, causal, vec, layout);
  return cudaGetLastError();
}

template <typename G>
cudaError_t Forward(G* y, float* lse, const G* q, const G* k, const G* v, int64_t heads, int64_t T, int64_t D,
                    float scale, bool causal, cudaStream_t stream, HeadLayout layout) {
  if (!FlashTensorCoreHeadDim(D) || heads > kFlashMaxHeads) return cudaErrorInvalidValue;
  if (!layout.Valid() || (layout.bthd && heads % layout.H != 0)) return cudaErrorInvalidValue;
  if (heads == 0 || T == 0) return cudaSuccess;
  switch (D) {
    case 32:
      return ForwardD<G, 32>(y, lse, q, k, v, heads, T, scale, causal, stream, layout);
    case 64:
      return ForwardD<G, 64>(y, lse, q, k, v, heads, T, scale, causal, stream, layout);
    default:
      return ForwardD<G, 128>(y, lse, q, k, v, heads, T, scale, causal, stream, layout);
  }
}

// dq from the stored score gradients with kMT 16-row tiles a warp.
template <typename G, int kD, int kMT>
cudaError_t StoredGradQ(G* dq, const G* k, const uint32_t* ds, int64_t heads, int64_t T, float scale, bool causal,
                        cudaStream_t stream, HeadLayout layout, bool vec) {
  static_assert(GradQStoredShared(128) <= 48 * 1024, "no opt-in");
  const dim3 grid(static_cast<unsigned>(GradQBlocks<kD, kMT>(T)), static_cast<unsigned>(heads));
  FlashGradQStored<G, kD, kMT>
      <<<grid, kThreads, GradQStoredShared(kD), stream>>>(dq, k, ds, T, scale, causal, vec, layout);
  return cudaGetLastError();
}

// The mma.sync dk and dv, storing dS (kStore) or not.
template <typename G, int kD, bool kStore>
cudaError_t MmaGradKV(G* dk, G* dv, const G* q, const G* k, const G* v, const float* lse, const G* dy, const float* di,
                      uint32_t* ds, int64_t heads, int64_t T, float scale, bool causal, cudaStream_t stream,
                      HeadLayout layout, bool vec) {
  static_assert(GradKVShared(64) <= 48 * 1024 && GradQShared(64) <= 48 * 1024, "no opt-in at D = 64");
  static std::atomic<uint64_t> done{0};
  constexpr size_t shared = GradKVShared(kD);
  if (cudaError_t e = AllowShared(FlashGradKVMma<G, kD, kStore>, shared, done); e != cudaSuccess) return e;
  FlashGradKVMma<G, kD, kStore>
      <<<Grid(T, heads), kThreads, shared, stream>>>(dk, dv, q, k, v, lse, dy, di, T, scale, causal, vec, layout, ds);
  return cudaGetLastError();
}

template <typename G, int kD>
cudaError_t GradD(G* dq, G* dk, G* dv, const G* q, const G* k, const G* v, const float* lse, const G* dy,
                  const float* di, uint32_t* ds, int64_t heads, int64_t T, float scale, bool causal,
                  cudaStream_t stream, HeadLayout layout) {
  const bool vec = Aligned16(q, k, v, dy);
  if (ds != nullptr && !Aligned16(ds)) return cudaErrorMisalignedAddress;  // the op allocates it: a bug
  if (MmaFlashAttention().load() && ds != nullptr) {
    if (cudaError_t e =
            MmaGradKV<G, kD, true>(dk, dv, q, k, v, lse, dy, di, ds, heads, T, scale, causal, stream, layout, vec);
        e != cudaSuccess) {
      return e;
    }
    if constexpr ((kDqTiles<kD>) > 1) {
      if (MmaWideWarps().load()) {
        return StoredGradQ<G, kD, kDqTiles<kD>>(dq, k, ds, heads, T, scale, causal, stream, layout, vec);
      }
    }
    return StoredGradQ<G, kD, 1>(dq, k, ds, heads, T, scale, causal, stream, layout, vec);
  }
  if (MmaFlashAttention().load()) {
    if (cudaError_t e = MmaGradKV<G, kD, false>(dk, dv, q, k, v, lse, dy, di, nullptr, heads, T, scale, causal, stream,
                                                layout, vec);
        e != cudaSuccess) {
      return e;
    }
    if constexpr (kDqTiles<kD> > 1) {
      if (MmaWideWarps().load()) {
        return MmaGradQ<G, kD, kDqTiles<kD>>(dq, q, k, v, lse, dy, di, heads, T, scale, causal, stream, layout, vec);
      }
    }
    return MmaGradQ<G, kD, 1>(dq, q, k, v, lse, dy, di, heads, T, scale, causal, stream, layout, vec);
  }
  static std::atomic<uint64_t> kv_done{0}, q_done{0};
  constexpr size_t shared = GradShared(kD);
  if (cudaError_t e = AllowShared(FlashGradKV<G, kD>, shared, kv_done); e != cudaSuccess) return e;
  FlashGradKV<G, kD>
      <<<Grid(T, heads), kThreads, shared, stream>>>(dk, dv, q, k, v, lse, dy, di, T, scale, causal, vec, layout);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (cudaError_t e = AllowShared(FlashGradQ<G, kD>, shared, q_done); e != cudaSuccess) return e;
  FlashGradQ<G, kD>
      <<<Grid(T, heads), kThreads, shared, stream>>>(dq, q, k, v, lse, dy, di, T, scale, causal, vec, layout);
  return cudaGetLastError();
}

template <typename G>
cudaError_t Grad(G* dq, G* dk, G* dv, const G* q, const G* k, const G* v, const G* y, const float* lse, const G* dy,
                 const float* dlse, float* di, uint32_t* ds, int64_t heads, int64_t T, int64_t D, float scale,
                 bool causal, cudaStream_t stream, HeadLayout layout) {
  if (!FlashTensorCoreHeadDim(D) || heads > kFlashMaxHeads) return cudaErrorInvalidValue;
  if (!layout.Valid() || (layout.bthd && heads % layout.H != 0)) return cudaErrorInvalidValue;
  if (heads == 0 || T == 0) return cudaSuccess;
  if (cudaError_t e = LaunchAttentionRowDots(di, y, dy, dlse, heads * T, D, stream, T, layout); e != cudaSuccess) {
    return e;
  }
  switch (D) {
    case 32:
      return GradD<G, 32>(dq, dk, dv, q, k, v, lse, dy, di, ds, heads, T, scale, causal, stream, layout);
    case 64:
      return GradD<G, 64>(dq, dk, dv, q, k, v, lse, dy, di, ds, heads, T, scale, causal, stream, layout);
    default:
      return GradD<G, 128>(dq, dk, dv, q, k, v, lse, dy, di, ds, heads, T, scale, causal, stream, layout);
  }
}

}  // namespace

cudaError_t LaunchFlashAttention(__nv_bfloat16* y, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                 const __nv_bfloat16* v, int64_t heads, int64_t T, int64_t D, float scale, bool causal,
                                 cudaStream_t stream, HeadLayout layout) {
  return Forward(y, lse, q, k, v, heads, T, D, scale, causal, stream, layout);
}
cudaError_t LaunchFlashAttention(__half* y, float* lse, const __half* q, const __half* k, const __half* v,
                                 int64_t heads, int64_t T, int64_t D, float scale, bool causal, cudaStream_t stream,
                                 HeadLayout layout) {
  return Forward(y, lse, q, k, v, heads, T, D, scale, causal, stream, layout);
}

cudaError_t LaunchFlashAttentionGrad(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv, const __nv_bfloat16* q,
                                     const __nv_bfloat16* k, const __nv_bfloat16* v, const __nv_bfloat16* y,
                                     const float* lse, const __nv_bfloat16* dy, const float* dlse, float* di,
                                     int64_t heads, int64_t T, int64_t D, float scale, bool causal, cudaStream_t stream,
                                     HeadLayout layout, uint32_t* score_grads) {
  return Grad(dq, dk, dv, q, k, v, y, lse, dy, dlse, di, score_grads, heads, T, D, scale, causal, stream, layout);
}
cudaError_t LaunchFlashAttentionGrad(__half* dq, __half* dk, __half* dv, const __half* q, const __half* k,
                                     const __half* v, const __half* y, const float* lse, const __half* dy,
                                     const float* dlse, float* di, int64_t heads, int64_t T, int64_t D, float scale,
                                     bool causal, cudaStream_t stream, HeadLayout layout, uint32_t* score_grads) {
  return Grad(dq, dk, dv, q, k, v, y, lse, dy, dlse, di, score_grads, heads, T, D, scale, causal, stream, layout);
}

}  // namespace cuda
}  // namespace strata
