// The rows of attention's softmax on the CPU (kernels/cpu/attention.cc):
// the forward's max and exp-and-sum, the backward's probabilities and score
// gradients. Here rather than in attention.cc so that softmax_rows_test can
// hold the loop the loader picked for this CPU to the scalar code's bits.

#ifndef STRATA_KERNELS_CPU_SOFTMAX_ROWS_H_
#define STRATA_KERNELS_CPU_SOFTMAX_ROWS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/elementwise.h"
#include "kernels/host_device.h"

namespace strata {
namespace softmax_rows {

// The softmax rows' element loops, in blocks of kLanes with one partial
// result per lane, so -O2 vectorizes them (the float ones on AVX-512 or
// AVX2 where the CPU has it: STRATA_ISA_CLONES, elementwise.h) and every
// ISA sums in the same order. Float takes kernel_math::PolyExp (within 1
// ulp; glibc's expf is a call per element and does not vectorize); double
// keeps the library's exp (the float64 checks against PyTorch hold to
// 1e-10).
constexpr int64_t kLanes = 16;

// The largest of row[0, n). `m < x ? x : m` is std::max's comparison
// (a NaN x leaves m), written so that GCC vectorizes it.
static STRATA_ISA_CLONES float RowMax(const float* __restrict row, int64_t n) {
  float lane[kLanes];
  for (int64_t k = 0; k < kLanes; ++k) lane[k] = -std::numeric_limits<float>::infinity();
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) {
      const float x = row[c + k];
      lane[k] = lane[k] < x ? x : lane[k];
    }
  }
  float max = lane[0];
  for (int64_t k = 1; k < kLanes; ++k) max = max < lane[k] ? lane[k] : max;
  for (; c < n; ++c) max = max < row[c] ? row[c] : max;
  return max;
}
inline double RowMax(const double* row, int64_t n) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < n; ++c) max = std::max(max, row[c]);
  return max;
}

// row[c] = exp(row[c] - shift) for c < n; returns their sum in double.
static STRATA_ISA_CLONES double ExpShiftedSum(float* row, int64_t n, float shift) {
  double lane[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) {
      row[c + k] = kernel_math::PolyExp(row[c + k] - shift);
      lane[k] += row[c + k];
    }
  }
  for (; c < n; ++c) {
    row[c] = kernel_math::PolyExp(row[c] - shift);
    lane[0] += row[c];
  }
  double sum = 0;
  for (int64_t k = 0; k < kLanes; ++k) sum += lane[k];
  return sum;
}
inline double ExpShiftedSum(double* row, int64_t n, double shift) {
  double sum = 0;
  for (int64_t c = 0; c < n; ++c) {
    row[c] = std::exp(row[c] - shift);
    sum += row[c];
  }
  return sum;
}

// The backward's row: p[c] = exp(p[c] - lse) (the forward's probabilities
// again) and dp[c] = p[c] (dp[c] - di), dp holding dY V^T on entry (p and
// dp apart: __restrict, or the loop would not vectorize).
static STRATA_ISA_CLONES void ProbsAndScoreGrads(float* __restrict p, float* __restrict dp, int64_t n, float lse,
                                                 float di) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) {
      p[c + k] = kernel_math::PolyExp(p[c + k] - lse);
      dp[c + k] = p[c + k] * (dp[c + k] - di);
    }
  }
  for (; c < n; ++c) {
    p[c] = kernel_math::PolyExp(p[c] - lse);
    dp[c] = p[c] * (dp[c] - di);
  }
}
inline void ProbsAndScoreGrads(double* p, double* dp, int64_t n, double lse, double di) {
  for (int64_t c = 0; c < n; ++c) {
    p[c] = std::exp(p[c] - lse);
    dp[c] = p[c] * (dp[c] - di);
  }
}

}  // namespace softmax_rows
}  // namespace strata

#endif  // STRATA_KERNELS_CPU_SOFTMAX_ROWS_H_
