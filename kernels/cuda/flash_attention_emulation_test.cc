// flash_attention.cu's kernels on the CPU: the part of the file above its
// launchers (the genrule flash_attention_kernels_emulated cuts it out),
// compiled with g++ against testing/cuda_stand_in/ and run a block at a time
// with a fiber per CUDA thread, against a direct attention in double on the
// same 16-bit values. Both versions of each kernel: WMMA
// (STRATA_MMA_ATTENTION=0) and mma.sync (FlashForward, FlashGradKVMma,
// FlashGradQMma, the default since they passed on an H200 on 2026-11-29;
// written without a GPU, this test was all that checked them until then). It checks what a GPU run would show first and the GPU tests cannot
// tell apart: the shared-memory layout, the WMMA and mma.sync operand
// layouts, strides and alignment, the masks, the online softmax and the
// backward's products; not the hardware's rounding or timing. With
// CUDA_STAND_IN_OS_THREADS=1 (a std::thread per CUDA thread) and built with
// --copt=-fsanitize=thread --linkopt=-fsanitize=thread it also finds a
// missing __syncthreads or __syncwarp (ThreadSanitizer reports the race on
// shared memory; Bf16Head32, Bf16Head128 and Fp16Head64 ran clean so on
// 2026-11-27 before the mma.sync gradient, a few minutes each on two cores;
// Bf16Head64, both kernel sets with the mma.sync gradient and the 16-row
// warps, and Fp16Head64QkvPacked ran clean so that night, 348 s in all
// with --test_filter, built in an --output_base of its own).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"

namespace strata {
namespace cuda {
namespace {
// The kernels' `extern __shared__ unsigned char smem[]`: one block runs at a
// time. 232448 bytes: an H100's opt-in limit per block.
constexpr size_t kSharedLimit = 232448;
alignas(128) unsigned char smem[256 * 1024];
}  // namespace
}  // namespace cuda
}  // namespace strata

#include "kernels/cuda/flash_attention_kernels_emulated.inc"

namespace strata {
namespace cuda {
namespace {

// Runs kernel(args...) on grid (bx, by) of kThreads threads with `shared`
// bytes of dynamic shared memory (filled with NaN bytes first: reading what
// no thread wrote shows); checks that nothing past `shared` was written. The
// threads of a block are fibers on the calling thread (the stand-in's
// RunFibers, every other block in reverse order), or with
// CUDA_STAND_IN_OS_THREADS set a std::thread each.
template <typename Kernel, typename... Args>
void Launch(int64_t grid_x, int64_t grid_y, size_t shared, Kernel kernel, Args... args) {
  ASSERT_LE(shared, kSharedLimit);
  static const bool os_threads = std::getenv("CUDA_STAND_IN_OS_THREADS") != nullptr;
  for (int64_t by = 0; by < grid_y; ++by) {
    for (int64_t bx = 0; bx < grid_x; ++bx) {
      std::memset(smem, 0xff, sizeof(smem));
      cuda_stand_in::Barrier block(kThreads);
      cuda_stand_in::Barrier warps[kWarps] = {cuda_stand_in::Barrier(32), cuda_stand_in::Barrier(32),
                                              cuda_stand_in::Barrier(32), cuda_stand_in::Barrier(32)};
      std::vector<float> shuffle(kThreads);
      std::vector<uint64_t> wide(kThreads);
      cuda_stand_in::current = {&block, warps, shuffle.data(), smem, shared, wide.data()};
      const auto enter = [&](unsigned t) {
        threadIdx = {t, 0, 0};
        blockIdx = {static_cast<unsigned>(bx), static_cast<unsigned>(by), 0};
        blockDim = dim3(kThreads);
        gridDim = dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
      };
      if (os_threads) {
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < static_cast<unsigned>(kThreads); ++t) {
          threads.emplace_back([&, t] {
            enter(t);
            kernel(args...);
          });
        }
        for (std::thread& t : threads) t.join();
      } else {
        const bool finished = cuda_stand_in::RunFibers(
            kThreads, enter, [&](unsigned) { kernel(args...); }, /*reverse=*/(bx + by) % 2 == 1);
        if (!finished) {
          std::fprintf(stderr, "block (%lld, %lld) deadlocked at a barrier\n", static_cast<long long>(bx),
                       static_cast<long long>(by));
          std::abort();  // the deadlocked fibers' frames cannot be unwound
        }
      }
      cuda_stand_in::current = {};
      ASSERT_EQ(cuda_stand_in::DropPendingCopies(), 0) << "cp.async copies never waited for";
      for (size_t b = shared; b < sizeof(smem); ++b) {
        ASSERT_EQ(smem[b], 0xff) << "block (" << bx << ", " << by << ") wrote shared byte " << b << " of "
                                 << shared;
      }
    }
  }
  ASSERT_EQ(cuda_stand_in::errors.load(), 0);
}

template <typename G>
G Round(double x) {
  if constexpr (std::is_same_v<G, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(x));
  } else {
    return __float2half_rn(static_cast<float>(x));
  }
}

template <typename G>
std::vector<G> Random(int64_t n, double range, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-range, range);
  std::vector<G> out(n);
  for (G& x : out) x = Round<G>(u(rng));
  return out;
}

template <typename G>
std::vector<double> Wide(const std::vector<G>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = StandInToFloat(x[i]);
  return out;
}

struct Reference {
  std::vector<double> y, lse, dq, dk, dv;
};

// Direct attention in double on [heads, T, D]; the gradient from the given
// y (rounded as the kernel's) and lse, with dlse.
Reference Direct(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                 const std::vector<double>& dy, const std::vector<double>& dlse, int64_t heads, int64_t T, int64_t D,
                 double scale, bool causal) {
  Reference r;
  r.y.assign(heads * T * D, 0);
  r.lse.assign(heads * T, 0);
  r.dq.assign(heads * T * D, 0);
  r.dk.assign(heads * T * D, 0);
  r.dv.assign(heads * T * D, 0);
  std::vector<double> s(T), p(T), dp(T);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t off = h * T * D;
    for (int64_t i = 0; i < T; ++i) {
      const int64_t n = causal ? i + 1 : T;
      double m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[off + i * D + d] * k[off + j * D + d];
        s[j] = scale * dot;
        m = std::max(m, s[j]);
      }
      double l = 0;
      for (int64_t j = 0; j < n; ++j) l += std::exp(s[j] - m);
      const double lse = m + std::log(l);
      r.lse[h * T + i] = lse;
      for (int64_t j = 0; j < n; ++j) {
        p[j] = std::exp(s[j] - lse);
        for (int64_t d = 0; d < D; ++d) r.y[off + i * D + d] += p[j] * v[off + j * D + d];
      }
      double di = -dlse[h * T + i];
      for (int64_t d = 0; d < D; ++d) di += dy[off + i * D + d] * r.y[off + i * D + d];
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += dy[off + i * D + d] * v[off + j * D + d];
        const double ds = p[j] * (dot - di);
        for (int64_t d = 0; d < D; ++d) {
          r.dq[off + i * D + d] += scale * ds * k[off + j * D + d];
          r.dk[off + j * D + d] += scale * ds * q[off + i * D + d];
          r.dv[off + j * D + d] += p[j] * dy[off + i * D + d];
        }
      }
    }
  }
  return r;
}

template <typename X>
::testing::AssertionResult Near(const std::vector<X>& got, const std::vector<double>& want, double fraction,
                                const char* what) {
  double largest = 0, worst = 0;
  size_t at = 0;
  for (double w : want) largest = std::max(largest, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = StandInToFloat(got[i]), diff = std::abs(g - want[i]);
    if (!(diff <= worst)) {  // NaN too
      worst = std::isnan(diff) ? INFINITY : diff;
      at = i;
    }
  }
  if (worst <= fraction * largest) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max |diff| " << worst << " at element " << at << " (got "
                                       << StandInToFloat(got[at]) << ", want " << want[at] << "), bar "
                                       << fraction * largest;
}

struct Case {
  int64_t heads, T;
  bool causal;
  double scale;  // 0: 1/sqrt(D)
  double range;  // q and k uniform in [-range, range]
  // q all +range and k all -range instead: every score -range^2 D scale, so
  // every row's lse is far below 0 and a zero-padded key's score 0 is far
  // above it (exp(0 - lse) overflows float where it is not masked).
  bool opposed = false;
};

// dq, dk and dv on the stored score gradients (StoredScoreGrads()):
// FlashGradKVMma storing dS, then FlashGradQStored with kMT 16-row tiles a
// warp. The store starts poisoned, and every word of it must be written: the
// blocks the dk/dv kernel stores are all the dq kernel may read.
template <typename G, int kD, int kMT>
void StoredGrad(G* dq, G* dk, G* dv, const G* q, const G* k, const G* v, const float* lse, const G* dy, const float* di,
                int64_t heads, int64_t T, float scale, bool causal, bool vec, HeadLayout layout) {
  constexpr uint32_t kPoison = 0xdeadbeefu;  // halves bf16 -6.3e18 and -0.43: no word of dS here
  std::vector<uint32_t> ds(flash::ScoreGradWords(heads, T, causal), kPoison);
  Launch((T + kBlock - 1) / kBlock, heads, GradKVShared(kD), FlashGradKVMma<G, kD, true>, dk, dv, q, k, v, lse, dy, di,
         T, scale, causal, vec, layout, ds.data());
  ASSERT_EQ(std::count(ds.begin(), ds.end(), kPoison), 0) << "score-gradient words never stored";
  Launch(GradQBlocks<kD, kMT>(T), heads, GradQStoredShared(kD), FlashGradQStored<G, kD, kMT>, dq, k,
         static_cast<const uint32_t*>(ds.data()), T, scale, causal, vec, layout);
}

template <typename X>
::testing::AssertionResult SameBits(const std::vector<X>& got, const std::vector<X>& want, const char* what);

// The kernels as the launchers run them, the gradient from the reference's y
// (rounded) and lse; di as LaunchAttentionRowDots computes it.
template <typename G, int kD>
void Check(const Case& c, bool vec, double bar) {
  const int64_t n = c.heads * c.T * kD;
  const double scale = c.scale != 0 ? c.scale : 1 / std::sqrt(static_cast<double>(kD));
  const std::vector<G> q = c.opposed ? std::vector<G>(n, Round<G>(c.range)) : Random<G>(n, c.range, 1),
                       k = c.opposed ? std::vector<G>(n, Round<G>(-c.range)) : Random<G>(n, c.range, 2),
                       v = Random<G>(n, 1, 3),
                       dy = Random<G>(n, 1, 4);
  std::vector<double> dlse(c.heads * c.T);
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  for (double& x : dlse) x = static_cast<float>(u(rng));
  const std::vector<double> wq = Wide(q), wk = Wide(k), wv = Wide(v), wdy = Wide(dy);
  const Reference want = Direct(wq, wk, wv, wdy, dlse, c.heads, c.T, kD, scale, c.causal);
  const int64_t blocks = (c.T + kBlock - 1) / kBlock;

  // Both forwards: mma.sync in registers, and WMMA through shared memory.
  for (const bool mma : {true, false}) {
    SCOPED_TRACE(mma ? "mma.sync forward" : "WMMA forward");
    std::vector<G> y(n, Round<G>(12345));
    std::vector<float> lse(c.heads * c.T, 12345.0f);
    if (mma) {
      Launch(ForwardBlocks<kD>(c.T), c.heads, ForwardShared(kD), FlashForward<G, kD>, y.data(), lse.data(), q.data(), k.data(),
             v.data(), c.T, static_cast<float>(scale), c.causal, vec, HeadLayout{});
    } else {
      Launch(blocks, c.heads, WmmaForwardShared(kD), FlashForwardWmma<G, kD>, y.data(), lse.data(), q.data(),
             k.data(), v.data(), c.T, static_cast<float>(scale), c.causal, vec, HeadLayout{});
    }
    EXPECT_TRUE(Near(y, want.y, bar, "y"));
    EXPECT_TRUE(Near(lse, want.lse, 1e-5, "lse"));
  }
  // The mma.sync forward and dq with 16-row warps (STRATA_MMA_WIDE_WARPS=0)
  // where the default is 32.
  if constexpr (kFwdTiles<kD> > 1) {
    SCOPED_TRACE("mma.sync forward, 16-row warps");
    std::vector<G> y(n, Round<G>(12345));
    std::vector<float> lse(c.heads * c.T, 12345.0f);
    Launch(ForwardBlocks<kD, 1>(c.T), c.heads, ForwardShared(kD), FlashForward<G, kD, 1>, y.data(), lse.data(),
           q.data(), k.data(), v.data(), c.T, static_cast<float>(scale), c.causal, vec, HeadLayout{});
    EXPECT_TRUE(Near(y, want.y, bar, "y"));
    EXPECT_TRUE(Near(lse, want.lse, 1e-5, "lse"));
  }

  // The gradient from the reference's forward outputs, as the GPU tests feed it.
  std::vector<G> y_in(n);
  for (int64_t i = 0; i < n; ++i) y_in[i] = Round<G>(want.y[i]);
  std::vector<float> lse_in(want.lse.begin(), want.lse.end()), di(c.heads * c.T);
  for (int64_t row = 0; row < c.heads * c.T; ++row) {
    double dot = 0;
    for (int64_t d = 0; d < kD; ++d) dot += wdy[row * kD + d] * StandInToFloat(y_in[row * kD + d]);
    di[row] = static_cast<float>(dot - dlse[row]);
  }
  // Both gradients: mma.sync in registers, and WMMA through shared memory.
  std::vector<G> mma_dq, mma_dk, mma_dv;
  for (const bool mma : {true, false}) {
    SCOPED_TRACE(mma ? "mma.sync gradient" : "WMMA gradient");
    std::vector<G> dq(n, Round<G>(12345)), dk(n, Round<G>(12345)), dv(n, Round<G>(12345));
    if (mma) {
      Launch(blocks, c.heads, GradKVShared(kD), FlashGradKVMma<G, kD>, dk.data(), dv.data(), q.data(), k.data(),
             v.data(), lse_in.data(), dy.data(), di.data(), c.T, static_cast<float>(scale), c.causal, vec, HeadLayout{},
             nullptr);
      Launch(GradQBlocks<kD>(c.T), c.heads, GradQShared(kD), FlashGradQMma<G, kD>, dq.data(), q.data(), k.data(), v.data(),
             lse_in.data(), dy.data(), di.data(), c.T, static_cast<float>(scale), c.causal, vec, HeadLayout{});
    } else {
      Launch(blocks, c.heads, GradShared(kD), FlashGradKV<G, kD>, dk.data(), dv.data(), q.data(), k.data(), v.data(),
             lse_in.data(), dy.data(), di.data(), c.T, static_cast<float>(scale), c.causal, vec, HeadLayout{});
      Launch(blocks, c.heads, GradShared(kD), FlashGradQ<G, kD>, dq.data(), q.data(), k.data(), v.data(), lse_in.data(),
             dy.data(), di.data(), c.T, static_cast<float>(scale), c.causal, vec, HeadLayout{});
    }
    EXPECT_TRUE(Near(dq, want.dq, bar, "dq"));
    EXPECT_TRUE(Near(dk, want.dk, bar, "dk"));
    EXPECT_TRUE(Near(dv, want.dv, bar, "dv"));
    if (mma) {
      mma_dq = dq;
      mma_dk = dk;
      mma_dv = dv;
    }
  }
  // The stored score gradients: the mma.sync gradient's bits.
  {
    SCOPED_TRACE("mma.sync gradient on stored score gradients");
    std::vector<G> dq(n, Round<G>(12345)), dk(n, Round<G>(12345)), dv(n, Round<G>(12345));
    StoredGrad<G, kD, kDqTiles<kD>>(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(), lse_in.data(),
                                    dy.data(), di.data(), c.heads, c.T, static_cast<float>(scale), c.causal, vec,
                                    HeadLayout{});
    EXPECT_TRUE(SameBits(dq, mma_dq, "dq"));
    EXPECT_TRUE(SameBits(dk, mma_dk, "dk"));
    EXPECT_TRUE(SameBits(dv, mma_dv, "dv"));
  }
  if constexpr (kDqTiles<kD> > 1) {
    SCOPED_TRACE("mma.sync dq, 16-row warps");
    std::vector<G> dq(n, Round<G>(12345));
    Launch(GradQBlocks<kD, 1>(c.T), c.heads, GradQShared(kD), FlashGradQMma<G, kD, 1>, dq.data(), q.data(), k.data(),
           v.data(), lse_in.data(), dy.data(), di.data(), c.T, static_cast<float>(scale), c.causal, vec, HeadLayout{});
    EXPECT_TRUE(Near(dq, want.dq, bar, "dq"));
    std::vector<G> stored_dq(n, Round<G>(12345)), dk(n), dv(n);
    StoredGrad<G, kD, 1>(stored_dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(), lse_in.data(), dy.data(),
                         di.data(), c.heads, c.T, static_cast<float>(scale), c.causal, vec, HeadLayout{});
    EXPECT_TRUE(SameBits(stored_dq, dq, "dq on stored score gradients, 16-row warps"));
  }
}

// T: one row, not a multiple of the 64-row blocks, exactly one and two
// blocks; scale and range: large scores, where the running max moves.
const Case kCases[] = {
    {1, 1, true, 0, 1},     {2, 17, false, 0, 1},  {1, 64, true, 0, 1},    {1, 65, false, 0.3, 1},
    {1, 130, true, 0, 1},   {1, 128, false, 0, 1}, {1, 150, true, 1.7, 3}, {1, 150, false, 1.7, 3},
    {3, 100, true, 0, 1},   {1, 100, true, 1.5, 2, true}, {1, 100, false, 1.5, 2, true},
    {1, 300, true, 1.5, 2, true},  // three 128-query blocks, the last partial
};

// bf16 rounds P and dS to 8 bits (relative 2^-9) for their products, fp16
// to 11: within 1e-2 resp. 2e-3 of each tensor's largest magnitude.
template <typename G, int kD>
void CheckAll(double bar) {
  for (const Case& c : kCases) {
    for (bool vec : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "D " << kD << " heads " << c.heads << " T " << c.T
                                        << (c.causal ? " causal" : "") << " scale " << c.scale << " range "
                                        << c.range << (vec ? " 16-byte loads" : " element loads"));
      Check<G, kD>(c, vec, bar);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// The stand-in's 16-bit types encode as the hardware's (the reference reads
// the same bits back, so a consistent misencoding would pass unnoticed).
TEST(FlashAttentionEmulationTest, StandInRoundsLikeCuda) {
  EXPECT_EQ(__float2bfloat16_rn(1.0f).bits, 0x3f80);
  EXPECT_EQ(__float2bfloat16_rn(-2.5f).bits, 0xc020);
  EXPECT_EQ(__float2bfloat16_rn(1.0f + 0x1p-8f).bits, 0x3f80);  // a tie: to even
  EXPECT_EQ(__float2bfloat16_rn(1.0f + 0x1p-7f + 0x1p-8f).bits, 0x3f82);
  EXPECT_EQ(__float2half_rn(1.0f).bits, 0x3c00);
  EXPECT_EQ(__float2half_rn(-2.5f).bits, 0xc100);
  EXPECT_EQ(__float2half_rn(65504.0f).bits, 0x7bff);
  EXPECT_EQ(__float2half_rn(65536.0f).bits, 0x7c00);
  EXPECT_EQ(__float2half_rn(0x1p-24f).bits, 0x0001);
  EXPECT_EQ(__float2half_rn(0x1p-14f).bits, 0x0400);
  EXPECT_EQ(__float2half_rn(1.0f + 0x1p-11f).bits, 0x3c00);  // a tie: to even
  for (float x : {0.1f, -3.7f, 1e-5f, 300.25f}) {
    EXPECT_EQ(StandInToFloat(__float2half_rn(x)), static_cast<float>(static_cast<_Float16>(x)));
  }
  EXPECT_EQ(StandInToFloat(__float2bfloat16_rn(0.1f)), 0.10009765625f);
}

// The stand-in's mma.sync (mma_m16n8k16.h) against a direct product: every
// lane forms its fragments of A [16][16] and B [16][8] by the PTX ISA's
// layouts, and its four outputs must be rows g, g + 8, columns 2t, 2t + 1 of
// A B (small integers: exact in bf16 and in float sums).
__global__ void MmaLayoutKernel(float* d_out, const float* a, const float* b) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const auto pair = [](float lo, float hi) {
    return mma::Pair(__float2bfloat16_rn(lo), __float2bfloat16_rn(hi));
  };
  const uint32_t af[4] = {pair(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),
                          pair(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
                          pair(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),
                          pair(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t bf[2] = {pair(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]),
                          pair(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g])};
  float d[4] = {1, 1, 1, 1};
  mma::Mma16816<__nv_bfloat16>(d, af, bf);
  if (threadIdx.x < 32) {
    for (int i = 0; i < 4; ++i) d_out[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + i % 2] = d[i];
  }
}

TEST(FlashAttentionEmulationTest, StandInMmaFollowsThePtxLayouts) {
  std::vector<float> a(16 * 16), b(16 * 8), d(16 * 8, -1);
  for (int i = 0; i < 256; ++i) a[i] = static_cast<float>(i % 7 - 3);
  for (int i = 0; i < 128; ++i) b[i] = static_cast<float>(i % 5 - 2);
  Launch(1, 1, 0, MmaLayoutKernel, d.data(), a.data(), b.data());
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 8; ++c) {
      float want = 1;
      for (int k = 0; k < 16; ++k) want += a[r * 16 + k] * b[k * 8 + c];
      EXPECT_EQ(d[r * 8 + c], want) << "row " << r << " column " << c;
    }
  }
}

// The stand-in's ldmatrix x4 (mma_m16n8k16.h) against the PTX ISA's
// fragment layouts, lane by lane: a [16][16] tile of distinct 16-bit values
// in shared memory (rows padded to 24 elements, 48 bytes); without .trans
// lane l's word i holds elements (row 8 (i % 2) + l / 4, columns
// 8 (i / 2) + 2 (l % 4), + 1) of the four 8 x 8 quadrants the lanes address
// (lane l: row l % 16, column 8 (l / 16): mma's A fragment a[i]); with
// .trans (rows 8 (i % 2) + 2 (l % 4), + 1 of column 8 (i / 2) + l / 4).
// Beside them, each plain word through the stand-in's movmatrix .trans
// (mma_m16n8k16.h's MovMatrixTrans), which must give the .trans word: the
// same quadrant transposed.
__global__ void LdMatrixKernel(uint32_t* out, const uint16_t* tile) {
  constexpr int ld = 24;
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* s = reinterpret_cast<uint16_t*>(smem);
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int r = 0; r < 16; ++r) {
      for (int c = 0; c < 16; ++c) s[r * ld + c] = tile[r * 16 + c];
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    uint32_t plain[4], trans[4];
    mma::LdMatrixX4<false>(plain, s + (lane % 16) * ld + 8 * (lane / 16));
    mma::LdMatrixX4<true>(trans, s + (lane % 16) * ld + 8 * (lane / 16));
    for (int i = 0; i < 4; ++i) {
      out[lane * 12 + i] = plain[i];
      out[lane * 12 + 4 + i] = trans[i];
      out[lane * 12 + 8 + i] = mma::MovMatrixTrans(plain[i]);
    }
  }
}

TEST(FlashAttentionEmulationTest, StandInLdMatrixAndMovMatrixFollowThePtxLayouts) {
  std::vector<uint16_t> tile(256);
  for (int i = 0; i < 256; ++i) tile[i] = static_cast<uint16_t>(0x1000 + i);
  std::vector<uint32_t> out(32 * 12, 0);
  Launch(1, 1, 16 * 24 * 2, LdMatrixKernel, out.data(), tile.data());
  const auto at = [&](int r, int c) { return static_cast<uint32_t>(tile[r * 16 + c]); };
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const int r0 = 8 * (i % 2), c0 = 8 * (i / 2);
      const uint32_t plain = at(r0 + lane / 4, c0 + 2 * (lane % 4)) | at(r0 + lane / 4, c0 + 2 * (lane % 4) + 1) << 16;
      const uint32_t trans = at(r0 + 2 * (lane % 4), c0 + lane / 4) | at(r0 + 2 * (lane % 4) + 1, c0 + lane / 4) << 16;
      EXPECT_EQ(out[lane * 12 + i], plain) << "lane " << lane << " word " << i;
      EXPECT_EQ(out[lane * 12 + 4 + i], trans) << "lane " << lane << " word " << i << " (.trans)";
      EXPECT_EQ(out[lane * 12 + 8 + i], trans) << "lane " << lane << " word " << i << " (movmatrix .trans)";
    }
  }
}

// [B, H, T, D] -> [B, T, H, D] (to_bthd) or back.
template <typename X>
std::vector<X> SwapTH(const std::vector<X>& x, int64_t B, int64_t H, int64_t T, int64_t D, bool to_bthd) {
  std::vector<X> out(x.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t bhtd = ((b * H + h) * T + t) * D, bthd = ((b * T + t) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) {
          if (to_bthd) {
            out[bthd + d] = x[bhtd + d];
          } else {
            out[bhtd + d] = x[bthd + d];
          }
        }
      }
    }
  }
  return out;
}

template <typename X>
::testing::AssertionResult SameBits(const std::vector<X>& got, const std::vector<X>& want, const char* what) {
  if (got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * sizeof(X)) == 0) {
    return ::testing::AssertionSuccess();
  }
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(X)) != 0) {
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << StandInToFloat(got[i])
                                           << ", want " << StandInToFloat(want[i]);
    }
  }
  return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, want " << want.size();
}

// Layout "bthd" (HeadLayout{H, true}: q, k, v, y, dy and the gradients
// [B, T, H, D], read and written in place) gives the bits of the [B, H, T, D]
// run on the transposed operands, transposed back: the same tiles reach
// shared memory, so the same products and sums follow. lse stays [B, H, T].
// HeadLayout::Row, which the row dots (di) read y and dy by, names the same
// rows. The [B, H, T, D] run itself is checked against the reference above.
template <typename G, int kD>
void CheckBthd(int64_t B, int64_t H, int64_t T, bool causal, bool vec, bool mma) {
  const int64_t heads = B * H, n = heads * T * kD, blocks = (T + kBlock - 1) / kBlock;
  const float scale = static_cast<float>(1 / std::sqrt(static_cast<double>(kD)));
  const std::vector<G> q = Random<G>(n, 1, 11), k = Random<G>(n, 1, 12), v = Random<G>(n, 1, 13),
                       dy = Random<G>(n, 1, 14);
  std::vector<float> di(heads * T);
  std::mt19937 rng(15);
  std::uniform_real_distribution<double> u(-1, 1);
  for (float& x : di) x = static_cast<float>(u(rng));
  const HeadLayout bhtd{}, bthd{H, true};
  struct Run {
    std::vector<G> y, dq, dk, dv;
    std::vector<float> lse;
  };
  // Both gradients take the [B, H, T, D] forward's lse (and the same di).
  const auto run = [&](const std::vector<G>& q, const std::vector<G>& k, const std::vector<G>& v,
                       const std::vector<G>& dy, const std::vector<float>* lse_in, const HeadLayout& layout) {
    Run r{std::vector<G>(n, Round<G>(12345)), std::vector<G>(n, Round<G>(12345)), std::vector<G>(n, Round<G>(12345)),
          std::vector<G>(n, Round<G>(12345)), std::vector<float>(heads * T, 12345.0f)};
    if (mma) {
      Launch(ForwardBlocks<kD>(T), heads, ForwardShared(kD), FlashForward<G, kD>, r.y.data(), r.lse.data(), q.data(), k.data(),
             v.data(), T, scale, causal, vec, layout);
    } else {
      Launch(blocks, heads, WmmaForwardShared(kD), FlashForwardWmma<G, kD>, r.y.data(), r.lse.data(), q.data(),
             k.data(), v.data(), T, scale, causal, vec, layout);
    }
    const std::vector<float>& lse = lse_in != nullptr ? *lse_in : r.lse;
    if (mma) {
      Launch(blocks, heads, GradKVShared(kD), FlashGradKVMma<G, kD>, r.dk.data(), r.dv.data(), q.data(), k.data(),
             v.data(), lse.data(), dy.data(), di.data(), T, scale, causal, vec, layout, nullptr);
      Launch(GradQBlocks<kD>(T), heads, GradQShared(kD), FlashGradQMma<G, kD>, r.dq.data(), q.data(), k.data(), v.data(),
             lse.data(), dy.data(), di.data(), T, scale, causal, vec, layout);
    } else {
      Launch(blocks, heads, GradShared(kD), FlashGradKV<G, kD>, r.dk.data(), r.dv.data(), q.data(), k.data(), v.data(),
             lse.data(), dy.data(), di.data(), T, scale, causal, vec, layout);
      Launch(blocks, heads, GradShared(kD), FlashGradQ<G, kD>, r.dq.data(), q.data(), k.data(), v.data(), lse.data(),
             dy.data(), di.data(), T, scale, causal, vec, layout);
    }
    return r;
  };
  const Run want = run(q, k, v, dy, nullptr, bhtd);
  if (::testing::Test::HasFatalFailure()) return;
  const auto to_bthd = [&](const std::vector<G>& x) { return SwapTH(x, B, H, T, kD, true); };
  const Run got = run(to_bthd(q), to_bthd(k), to_bthd(v), to_bthd(dy), &want.lse, bthd);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_TRUE(SameBits(got.lse, want.lse, "lse"));
  EXPECT_TRUE(SameBits(SwapTH(got.y, B, H, T, kD, false), want.y, "y"));
  EXPECT_TRUE(SameBits(SwapTH(got.dq, B, H, T, kD, false), want.dq, "dq"));
  EXPECT_TRUE(SameBits(SwapTH(got.dk, B, H, T, kD, false), want.dk, "dk"));
  EXPECT_TRUE(SameBits(SwapTH(got.dv, B, H, T, kD, false), want.dv, "dv"));
  // Row r of [heads, T] (di's) is row bthd.Row(r, T) of the [B, T, H, D] y.
  bool rows_match = true;
  for (int64_t r = 0; r < heads * T && rows_match; ++r) {
    rows_match = std::memcmp(&got.y[bthd.Row(r, T) * kD], &want.y[r * kD], kD * sizeof(G)) == 0;
    EXPECT_TRUE(rows_match) << "row " << r;
  }
  // The last head's last row ends the tensor.
  EXPECT_EQ(bthd.Offset(heads - 1, T, kD) + (T - 1) * bthd.RowStride(kD) + kD, n);
}

// B x H heads of T rows (not a multiple of the 64-row blocks, one and two
// blocks), causal and not, 16-byte and element loads.
template <typename G, int kD>
void CheckAllBthd() {
  struct Shape {
    int64_t B, H, T;
    bool causal;
  };
  for (const Shape& c : {Shape{2, 3, 17, false}, Shape{1, 2, 70, true}, Shape{2, 2, 64, false}}) {
    for (bool vec : {true, false}) {
      for (bool mma : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << "D " << kD << " B " << c.B << " H " << c.H << " T " << c.T << (c.causal ? " causal" : "")
                     << (vec ? " 16-byte loads" : " element loads") << (mma ? ", mma.sync kernels" : ", WMMA kernels"));
        CheckBthd<G, kD>(c.B, c.H, c.T, c.causal, vec, mma);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// Which kernels a packed run takes: WMMA, mma.sync at the default warp width,
// or mma.sync with 16-row warps (STRATA_MMA_WIDE_WARPS=0) where the default is 32.
// kStored, kStoredNarrow: mma.sync on stored score gradients (StoredGrad).
enum class Kernels { kWmma, kMma, kMmaNarrow, kStored, kStoredNarrow };

// Layout "bthd" with pack 3 (HeadLayout{H, true, 3}: q, k, v and dq, dk, dv
// the slots of one [B, T, 3, H, D] qkv, scaled_dot_product_attention_qkv's)
// gives the bits of the same kernels on separate [B, T, H, D] q, k, v: only
// the row stride (3 H D) and the slots' pointers differ, so the same tiles
// reach shared memory. y and dy stay [B, T, H, D]; lse [B, H, T].
template <typename G, int kD, Kernels kKernels>
void CheckQkvPacked(int64_t B, int64_t H, int64_t T, bool causal, bool vec) {
  const int64_t heads = B * H, n = heads * T * kD, blocks = (T + kBlock - 1) / kBlock;
  constexpr bool kNarrow = kKernels == Kernels::kMmaNarrow || kKernels == Kernels::kStoredNarrow;
  constexpr int kFwdMT = kNarrow ? 1 : kFwdTiles<kD>;
  constexpr int kDqMT = kNarrow ? 1 : kDqTiles<kD>;
  const float scale = static_cast<float>(1 / std::sqrt(static_cast<double>(kD)));
  const std::vector<G> q = Random<G>(n, 1, 21), k = Random<G>(n, 1, 22), v = Random<G>(n, 1, 23),
                       dy = Random<G>(n, 1, 24);
  std::vector<float> di(heads * T);
  std::mt19937 rng(25);
  std::uniform_real_distribution<double> u(-1, 1);
  for (float& x : di) x = static_cast<float>(u(rng));
  struct Run {
    std::vector<G> y, dq, dk, dv;
    std::vector<float> lse;
  };
  // y and lse, then dq, dk and dv into `grads` (all poisoned first with
  // `poison`, a different value a run, so an element neither run writes
  // cannot match) at offsets dq_at, dk_at and dv_at, from q, k, v, dy and
  // di (the gradient from lse_in where given, else from the run's own lse).
  const auto run = [&](const G* q, const G* k, const G* v, std::vector<G>& grads, int64_t dq_at, int64_t dk_at,
                       int64_t dv_at, const std::vector<float>* lse_in, const HeadLayout& layout, float poison) {
    Run r{std::vector<G>(n, Round<G>(poison)), {}, {}, {}, std::vector<float>(heads * T, poison)};
    std::fill(grads.begin(), grads.end(), Round<G>(poison));
    G *const dq = grads.data() + dq_at, *const dk = grads.data() + dk_at, *const dv = grads.data() + dv_at;
    if constexpr (kKernels == Kernels::kWmma) {
      Launch(blocks, heads, WmmaForwardShared(kD), FlashForwardWmma<G, kD>, r.y.data(), r.lse.data(), q, k, v, T,
             scale, causal, vec, layout);
    } else {
      Launch(ForwardBlocks<kD, kFwdMT>(T), heads, ForwardShared(kD), FlashForward<G, kD, kFwdMT>, r.y.data(),
             r.lse.data(), q, k, v, T, scale, causal, vec, layout);
    }
    const std::vector<float>& lse = lse_in != nullptr ? *lse_in : r.lse;
    if constexpr (kKernels == Kernels::kWmma) {
      Launch(blocks, heads, GradShared(kD), FlashGradKV<G, kD>, dk, dv, q, k, v, lse.data(), dy.data(), di.data(), T,
             scale, causal, vec, layout);
      Launch(blocks, heads, GradShared(kD), FlashGradQ<G, kD>, dq, q, k, v, lse.data(), dy.data(), di.data(), T,
             scale, causal, vec, layout);
    } else if constexpr (kKernels == Kernels::kStored || kKernels == Kernels::kStoredNarrow) {
      StoredGrad<G, kD, kDqMT>(dq, dk, dv, q, k, v, lse.data(), dy.data(), di.data(), heads, T, scale, causal, vec,
                               layout);
    } else {
      Launch(blocks, heads, GradKVShared(kD), FlashGradKVMma<G, kD>, dk, dv, q, k, v, lse.data(), dy.data(), di.data(),
             T, scale, causal, vec, layout, nullptr);
      Launch(GradQBlocks<kD, kDqMT>(T), heads, GradQShared(kD), FlashGradQMma<G, kD, kDqMT>, dq, q, k, v, lse.data(),
             dy.data(), di.data(), T, scale, causal, vec, layout);
    }
    return r;
  };
  // Separate [B, T, H, D] tensors, the gradients in one buffer of three.
  std::vector<G> separate_grads(3 * n);
  Run want = run(q.data(), k.data(), v.data(), separate_grads, 0, n, 2 * n, nullptr, HeadLayout{H, true}, 12345.0f);
  if (::testing::Test::HasFatalFailure()) return;
  want.dq.assign(separate_grads.begin(), separate_grads.begin() + n);
  want.dk.assign(separate_grads.begin() + n, separate_grads.begin() + 2 * n);
  want.dv.assign(separate_grads.begin() + 2 * n, separate_grads.end());
  // qkv [B, T, 3, H, D]: row (b, t) holds q's, k's and v's rows (b, t).
  const int64_t HD = H * kD;
  std::vector<G> qkv(3 * n);
  for (int64_t bt = 0; bt < B * T; ++bt) {
    std::copy_n(q.begin() + bt * HD, HD, qkv.begin() + (3 * bt + 0) * HD);
    std::copy_n(k.begin() + bt * HD, HD, qkv.begin() + (3 * bt + 1) * HD);
    std::copy_n(v.begin() + bt * HD, HD, qkv.begin() + (3 * bt + 2) * HD);
  }
  std::vector<G> dqkv(3 * n);
  const HeadLayout packed{H, true, 3};
  const Run got =
      run(qkv.data(), qkv.data() + HD, qkv.data() + 2 * HD, dqkv, 0, HD, 2 * HD, &want.lse, packed, -54321.0f);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_TRUE(SameBits(got.lse, want.lse, "lse"));
  EXPECT_TRUE(SameBits(got.y, want.y, "y"));
  // dqkv's slots, every element of it (none left poisoned).
  std::vector<G> slot[3] = {std::vector<G>(n), std::vector<G>(n), std::vector<G>(n)};
  for (int64_t bt = 0; bt < B * T; ++bt) {
    for (int s = 0; s < 3; ++s) std::copy_n(dqkv.begin() + (3 * bt + s) * HD, HD, slot[s].begin() + bt * HD);
  }
  EXPECT_TRUE(SameBits(slot[0], want.dq, "dq"));
  EXPECT_TRUE(SameBits(slot[1], want.dk, "dk"));
  EXPECT_TRUE(SameBits(slot[2], want.dv, "dv"));
  // The last head's last row of the v slot ends qkv; y's offsets are pack 1's.
  EXPECT_EQ(2 * HD + packed.QkvOffset(heads - 1, T, kD) + (T - 1) * packed.QkvRowStride(kD) + kD, 3 * n);
  const HeadLayout unpacked{H, true};
  EXPECT_EQ(packed.Offset(heads - 1, T, kD), unpacked.Offset(heads - 1, T, kD));
  EXPECT_EQ(packed.RowStride(kD), HD);
}

// B x H heads of T rows (T off the 64- and 128-row blocks, one and several
// blocks), causal and not, 16-byte and element loads, each set of kernels.
template <typename G, int kD>
void CheckAllQkvPacked() {
  struct Shape {
    int64_t B, H, T;
    bool causal;
  };
  for (const Shape& c : {Shape{2, 2, 100, true}, Shape{1, 2, 100, false}, Shape{1, 1, 300, true}}) {
    for (bool vec : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "D " << kD << " B " << c.B << " H " << c.H << " T " << c.T
                                        << (c.causal ? " causal" : "") << (vec ? " 16-byte loads" : " element loads"));
      {
        SCOPED_TRACE("WMMA kernels");
        CheckQkvPacked<G, kD, Kernels::kWmma>(c.B, c.H, c.T, c.causal, vec);
      }
      {
        SCOPED_TRACE("mma.sync kernels");
        CheckQkvPacked<G, kD, Kernels::kMma>(c.B, c.H, c.T, c.causal, vec);
      }
      if constexpr (kFwdTiles<kD> > 1 || kDqTiles<kD> > 1) {
        SCOPED_TRACE("mma.sync kernels, 16-row warps");
        CheckQkvPacked<G, kD, Kernels::kMmaNarrow>(c.B, c.H, c.T, c.causal, vec);
      }
      {
        SCOPED_TRACE("mma.sync kernels on stored score gradients");
        CheckQkvPacked<G, kD, Kernels::kStored>(c.B, c.H, c.T, c.causal, vec);
      }
      if constexpr (kDqTiles < kD >> 1) {
        SCOPED_TRACE("mma.sync kernels on stored score gradients, 16-row warps");
        CheckQkvPacked<G, kD, Kernels::kStoredNarrow>(c.B, c.H, c.T, c.causal, vec);
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(FlashAttentionEmulationTest, Bf16Head32QkvPacked) { CheckAllQkvPacked<__nv_bfloat16, 32>(); }
TEST(FlashAttentionEmulationTest, Fp16Head64QkvPacked) { CheckAllQkvPacked<__half, 64>(); }
TEST(FlashAttentionEmulationTest, Bf16Head128QkvPacked) { CheckAllQkvPacked<__nv_bfloat16, 128>(); }

TEST(FlashAttentionEmulationTest, Bf16Head32Bthd) { CheckAllBthd<__nv_bfloat16, 32>(); }
TEST(FlashAttentionEmulationTest, Fp16Head64Bthd) { CheckAllBthd<__half, 64>(); }
TEST(FlashAttentionEmulationTest, Bf16Head128Bthd) { CheckAllBthd<__nv_bfloat16, 128>(); }

TEST(FlashAttentionEmulationTest, Bf16Head32) { CheckAll<__nv_bfloat16, 32>(1e-2); }
TEST(FlashAttentionEmulationTest, Bf16Head64) { CheckAll<__nv_bfloat16, 64>(1e-2); }
TEST(FlashAttentionEmulationTest, Bf16Head128) { CheckAll<__nv_bfloat16, 128>(1e-2); }
TEST(FlashAttentionEmulationTest, Fp16Head32) { CheckAll<__half, 32>(2e-3); }
TEST(FlashAttentionEmulationTest, Fp16Head64) { CheckAll<__half, 64>(2e-3); }
TEST(FlashAttentionEmulationTest, Fp16Head128) { CheckAll<__half, 128>(2e-3); }

}  // namespace
}  // namespace cuda
}  // namespace strata
