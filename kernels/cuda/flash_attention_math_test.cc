// flash_attention_math.h on the CPU: the tile loops of flash_attention.cu
// (written here as the kernels walk them) visit every visible (query, key)
// pair exactly once and skip only masked ones; the online softmax over 64-key
// tiles gives the direct softmax's y and lse; the backward's probabilities
// from that lse sum to one.

#include "kernels/cuda/flash_attention_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace cuda {
namespace flash {
namespace {

constexpr int64_t kLengths[] = {1, 2, 17, 63, 64, 65, 100, 128, 257};

// Visits of each (i, j) among [0, rows) x [0, rows), rows the padded length.
class PairCounts {
 public:
  explicit PairCounts(int64_t rows) : rows_(rows), counts_(rows * rows, 0) {}
  void Visit(int64_t i, int64_t j) { ++counts_[i * rows_ + j]; }
  int At(int64_t i, int64_t j) const { return counts_[i * rows_ + j]; }

 private:
  int64_t rows_;
  std::vector<int> counts_;
};

// T rounded up to whole blocks of kBlockRows and of the mma.sync forward's
// 2 kBlockRows.
int64_t Padded(int64_t T) { return (T + 2 * kBlockRows - 1) / (2 * kBlockRows) * (2 * kBlockRows); }

// The forward's and dq's loops: query blocks of `rows`, then key tiles up to
// KeyEnd (the mma.sync forward's blocks are 2 kBlockRows at D <= 64).
PairCounts QueryBlockVisits(int64_t T, bool causal, int64_t rows = kBlockRows) {
  PairCounts counts(Padded(T));
  for (int64_t q0 = 0; q0 < T; q0 += rows) {
    for (int64_t k0 = 0; k0 < KeyEnd(q0, T, causal, rows); k0 += kTileRows) {
      for (int64_t i = q0; i < q0 + rows; ++i) {
        for (int64_t j = k0; j < k0 + kTileRows; ++j) {
          if (Visible(i, j, T, causal)) counts.Visit(i, j);
        }
      }
    }
  }
  return counts;
}

// dk's and dv's loops: key blocks, then query tiles from QueryBegin to T.
PairCounts KeyBlockVisits(int64_t T, bool causal) {
  PairCounts counts(Padded(T));
  for (int64_t k0 = 0; k0 < T; k0 += kBlockRows) {
    for (int64_t i0 = QueryBegin(k0, causal); i0 < T; i0 += kTileRows) {
      for (int64_t j = k0; j < k0 + kBlockRows; ++j) {
        for (int64_t i = i0; i < i0 + kTileRows; ++i) {
          if (Visible(i, j, T, causal)) counts.Visit(i, j);
        }
      }
    }
  }
  return counts;
}

TEST(FlashAttentionMathTest, TileLoopsVisitEveryVisiblePairOnce) {
  for (int64_t T : kLengths) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "T " << T << (causal ? " causal" : ""));
      const PairCounts by_query = QueryBlockVisits(T, causal), by_key = KeyBlockVisits(T, causal),
                       by_wide_query = QueryBlockVisits(T, causal, 2 * kBlockRows);
      for (int64_t i = 0; i < Padded(T); ++i) {
        for (int64_t j = 0; j < Padded(T); ++j) {
          const int want = i < T && j < T && (!causal || j <= i) ? 1 : 0;
          ASSERT_EQ(by_query.At(i, j), want) << i << ", " << j;
          ASSERT_EQ(by_key.At(i, j), want) << i << ", " << j;
          ASSERT_EQ(by_wide_query.At(i, j), want) << i << ", " << j << " (128-row blocks)";
        }
      }
    }
  }
}

// A causal block stops at its diagonal tile, and a key block starts at its own.
TEST(FlashAttentionMathTest, CausalLoopsSkipTilesAboveTheDiagonal) {
  EXPECT_EQ(KeyEnd(0, 1024, true), 64);
  EXPECT_EQ(KeyEnd(960, 1024, true), 1024);
  EXPECT_EQ(KeyEnd(256, 300, true), 300);
  EXPECT_EQ(KeyEnd(256, 300, false), 300);
  EXPECT_EQ(KeyEnd(0, 1024, true, 128), 128);
  EXPECT_EQ(KeyEnd(896, 1000, true, 128), 1000);
  EXPECT_EQ(QueryBegin(192, true), 192);
  EXPECT_EQ(QueryBegin(192, false), 0);
}

// A row that has seen only masked scores: factor 1 and probabilities 0, so
// no NaN reaches l or the output.
TEST(FlashAttentionMathTest, MaskedRowsStayFinite) {
  EXPECT_EQ(Rescale(-INFINITY, -INFINITY), 1.0f);
  EXPECT_EQ(Prob(-INFINITY, -INFINITY), 0.0f);
  EXPECT_EQ(Prob(-INFINITY, 3.0f), 0.0f);
  EXPECT_EQ(Rescale(-INFINITY, 2.0f), 0.0f);
  EXPECT_EQ(NewMax(-INFINITY, -INFINITY), -INFINITY);
}

// The forward's per-row steps over tiles of kTileRows keys (the two lanes of a
// row combine max and sum the same way the whole row does here) against a
// direct softmax in double.
TEST(FlashAttentionMathTest, OnlineSoftmaxMatchesTheDirectSoftmax) {
  constexpr int D = 8;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t T : {1, 63, 65, 200}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "T " << T << (causal ? " causal" : ""));
      std::vector<float> q(T * D), k(T * D), v(T * D);
      for (auto* x : {&q, &k, &v}) {
        for (float& e : *x) e = normal(rng);
      }
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      for (int64_t i = 0; i < T; ++i) {
        std::vector<float> s(T);
        for (int64_t j = 0; j < T; ++j) {
          float dot = 0;
          for (int d = 0; d < D; ++d) dot += q[i * D + d] * k[j * D + d];
          s[j] = Visible(i, j, T, causal) ? scale * dot : -INFINITY;
        }
        // Direct, in double.
        double max = -INFINITY, sum = 0;
        for (float x : s) max = std::max<double>(max, x);
        for (float x : s) sum += x == -INFINITY ? 0 : std::exp(x - max);
        const double want_lse = max + std::log(sum);
        // Online, as the kernel: tiles up to KeyEnd of the row's block.
        float m = -INFINITY, l = 0;
        std::vector<float> acc(D, 0.0f);
        const int64_t q0 = i / kBlockRows * kBlockRows;
        for (int64_t k0 = 0; k0 < KeyEnd(q0, T, causal); k0 += kTileRows) {
          float tile_max = -INFINITY;
          for (int64_t j = k0; j < std::min(T, k0 + kTileRows); ++j) tile_max = std::max(tile_max, s[j]);
          const float new_m = NewMax(m, tile_max);
          const float correction = Rescale(m, new_m);
          float tile_sum = 0;
          std::vector<float> pv(D, 0.0f);
          for (int64_t j = k0; j < std::min(T, k0 + kTileRows); ++j) {
            const float p = Prob(s[j], new_m);
            tile_sum += p;
            for (int d = 0; d < D; ++d) pv[d] += p * v[j * D + d];
          }
          l = l * correction + tile_sum;
          for (int d = 0; d < D; ++d) acc[d] = acc[d] * correction + pv[d];
          m = new_m;
        }
        EXPECT_NEAR(Lse(m, l), want_lse, 1e-5 * std::max(1.0, std::abs(want_lse)));
        for (int d = 0; d < D; ++d) {
          double want = 0;
          for (int64_t j = 0; j < T; ++j) {
            if (s[j] != -INFINITY) want += std::exp(s[j] - want_lse) * v[j * D + d];
          }
          EXPECT_NEAR(acc[d] / l, want, 1e-5 * 4);
        }
        // The backward's probabilities from that lse sum to one over the row.
        float total = 0;
        for (int64_t j = 0; j < T; ++j) total += Visible(i, j, T, causal) ? BackwardProb(s[j], Lse(m, l)) : 0.0f;
        EXPECT_NEAR(total, 1.0f, 1e-5);
      }
    }
  }
}

TEST(FlashAttentionMathTest, ScoreGradIsPTimesDpMinusDi) {
  EXPECT_EQ(ScoreGrad(0.5f, 3.0f, 1.0f), 1.0f);
  EXPECT_EQ(ScoreGrad(0.0f, 3.0f, 1.0f), 0.0f);
}

// The gradients' exponent rounds once: 1 + 2^-12 squared is 1 + 2^-11 +
// 2^-24, which a separate multiply rounds to 1 + 2^-11 (a tie, to even)
// before 1 + 2^-11 is taken off.
TEST(FlashAttentionMathTest, GradExponentIsOneFusedMultiplyAdd) {
  const float a = 1.0f + std::ldexp(1.0f, -12);
  EXPECT_EQ(GradExponent(a, a, 1.0f + std::ldexp(1.0f, -11)), std::ldexp(1.0f, -24));
  EXPECT_EQ(Lse2(2.0f), 2.0f * kLog2e);
}

// The stored score gradients' blocks: every block a visible pair lies in is
// stored, at its own place among [0, ScoreGradBlocks) (no two blocks share
// one, none left out), and a block not stored holds only masked pairs.
TEST(FlashAttentionMathTest, StoredScoreGradBlocksCoverEveryVisiblePairOnce) {
  for (int64_t T : kLengths) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "T " << T << (causal ? " causal" : ""));
      const int64_t nb = ScoreGradRowBlocks(T), blocks = ScoreGradBlocks(T, causal);
      std::vector<int> uses(blocks, 0);
      for (int64_t qb = 0; qb < nb + 1; ++qb) {
        for (int64_t kb = 0; kb < nb + 1; ++kb) {
          bool visible = false;
          for (int64_t i = 16 * qb; i < 16 * qb + 16; ++i) {
            for (int64_t j = 16 * kb; j < 16 * kb + 16; ++j) visible = visible || Visible(i, j, T, causal);
          }
          if (!ScoreGradStored(qb, kb, T, causal)) {
            EXPECT_FALSE(visible) << "block " << qb << ", " << kb;
            continue;
          }
          const int64_t at = ScoreGradBlock(qb, kb, T, causal);
          ASSERT_GE(at, 0);
          ASSERT_LT(at, blocks);
          ++uses[at];
        }
      }
      for (int64_t b = 0; b < blocks; ++b) EXPECT_EQ(uses[b], 1) << "block slot " << b;
      EXPECT_EQ(ScoreGradWords(3, T, causal), 3 * blocks * kScoreGradBlockWords);
    }
  }
}

}  // namespace
}  // namespace flash
}  // namespace cuda
}  // namespace strata
