#ifndef STRATA_KERNELS_CPU_GEMM_H_
#define STRATA_KERNELS_CPU_GEMM_H_

// Row-major GEMM over OpenBLAS for the nn kernels (matmul, conv2d):
//   c[m, n] = alpha * op(a)[m, k] @ op(b)[k, n] + beta * c[m, n]
// One overload per element type so kernels template over T.

#include <cblas.h>

#include <algorithm>
#include <cstdint>

namespace strata {

// GEMMs at or below this many multiply-adds run single-threaded inside
// OpenBLAS (its SMP threshold, 65536 * GEMM_MULTITHREAD_THRESHOLD), so several
// of them may run concurrently on our own threads without contending for its
// thread server. Larger ones are best issued one at a time.
constexpr double kSingleThreadedGemmWork = 65536.0 * 4;

inline void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(std::max<int64_t>(lda, 1)), b, static_cast<blasint>(std::max<int64_t>(ldb, 1)),
              beta, c, static_cast<blasint>(std::max<int64_t>(ldc, 1)));
}

inline void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                 int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(std::max<int64_t>(lda, 1)), b, static_cast<blasint>(std::max<int64_t>(ldb, 1)),
              beta, c, static_cast<blasint>(std::max<int64_t>(ldc, 1)));
}

// A GEMM that tolerates empty sizes: nothing to do when m or n is 0, and
// c = beta * c when k is 0 (BLAS would reject the zero leading dimensions).
template <typename T>
void GemmOrScale(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                 const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    }
    return;
  }
  Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace strata

#endif  // STRATA_KERNELS_CPU_GEMM_H_
