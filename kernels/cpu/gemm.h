#ifndef STRATA_KERNELS_CPU_GEMM_H_
#define STRATA_KERNELS_CPU_GEMM_H_

// Row-major GEMM for the nn kernels (matmul, conv2d, attention): OpenBLAS,
// and for float32 GEMMs above a size oneDNN's f32 matmul where it has a JIT
// kernel for the CPU (onednn_gemm.h; about 2x OpenBLAS 0.3.21 on an AMD
// EPYC with AVX-512, where OpenBLAS runs its Haswell kernels):
//   c[m, n] = alpha * op(a)[m, k] @ op(b)[k, n] + beta * c[m, n]
// One overload per element type so kernels template over T.
//
// Threads: OpenBLAS runs single-threaded; a large GEMM is cut into panels of
// C's rows or columns over Strata's pool (CutGemm: the same panels for any
// thread count). OpenBLAS's own threads spin after
// each call and fought the pool for the cores (conv was often slower on 2
// threads than on 1).

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cpu/onednn_gemm.h"
#include "runtime/thread_pool.h"

namespace strata {

// GEMMs at or below this many multiply-adds run whole on the calling thread
// (OpenBLAS's own SMP threshold, 65536 * GEMM_MULTITHREAD_THRESHOLD); larger
// ones are split into panels over the pool by GemmOrScale.
constexpr double kSingleThreadedGemmWork = 65536.0 * 4;

// Keeps OpenBLAS to the calling thread, once per process (before the first GEMM).
inline void SingleThreadedBlas() {
  static const bool done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

// Float32 GEMMs of more than this many multiply-adds go to oneDNN where
// OnednnF32Gemm() (a call costs about 1 us more than OpenBLAS's: up to
// 32^3 OpenBLAS is faster, 0.8 against 1.3 us at 32^3).
constexpr double kOnednnMinGemmWork = 32768.0;

inline void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (static_cast<double>(m) * n * k > kOnednnMinGemmWork && OnednnF32Gemm()) {
    // oneDNN's failure (it has none for valid sizes; a scratchpad over
    // kMaxScratchpadBytes, or out of memory) leaves the GEMM to OpenBLAS.
    if (OnednnGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc).ok()) return;
  }
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

// C = beta * C for a GEMM with an empty inner size (BLAS would reject the
// zero leading dimensions).
template <typename T>
void ScaleOnly(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
  }
}

// GemmOrScale on the calling thread only (for callers already inside ParallelFor).
template <typename T>
void SerialGemmOrScale(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                       int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    ScaleOnly(m, n, beta, c, ldc);
    return;
  }
  SingleThreadedBlas();
  Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// How GemmOrScale cuts a GEMM of C [m, n] with inner size k: into `count`
// panels of whole 16-row (or column) blocks along C's longer side, each of
// at least 128 rows (columns) and 4 * kSingleThreadedGemmWork multiply-adds
// (a oneDNN call costs about 1 us, and each packs its share of B again),
// at most kMaxGemmPanels. A function of the sizes only, never
// of the thread count: oneDNN's bits for an element depend on the panel
// it is computed in (column panels, a transposed A), so a cut that
// followed the threads would make results depend on STRATA_NUM_THREADS.
struct GemmCut {
  bool by_rows = true;
  int64_t blocks = 0;  // 16-row (or column) blocks along the cut side
  int64_t count = 1;   // panels; 1: the whole GEMM in one call
  // Panel i's first and last-plus-one row (or column).
  int64_t Begin(int64_t i, int64_t length) const { return std::min(length, i * blocks / count * kBlock); }
  int64_t End(int64_t i, int64_t length) const { return std::min(length, (i + 1) * blocks / count * kBlock); }
  static constexpr int64_t kBlock = 16;
};
constexpr int64_t kMaxGemmPanels = 64;
constexpr int64_t kMinPanelBlocks = 8;  // 128 rows (or columns)

inline GemmCut CutGemm(int64_t m, int64_t n, int64_t k) {
  GemmCut cut;
  const double work = static_cast<double>(m) * n * k;
  cut.by_rows = m >= n;
  cut.blocks = ((cut.by_rows ? m : n) + GemmCut::kBlock - 1) / GemmCut::kBlock;
  if (work <= kSingleThreadedGemmWork) return cut;
  const int64_t by_work = static_cast<int64_t>(work / (4 * kSingleThreadedGemmWork));
  const int64_t by_length = cut.blocks / kMinPanelBlocks;
  cut.count = std::max<int64_t>(1, std::min({by_length, kMaxGemmPanels, by_work}));
  return cut;
}

// The first failure among work that ParallelFor spreads (GEMM panels,
// batch items), noted from any thread.
class FirstFailure {
 public:
  void Note(absl::Status s) {
    if (s.ok()) return;
    absl::MutexLock lock(&mu_);
    if (first_.ok()) first_ = std::move(s);
    failed_.store(true, std::memory_order_relaxed);
  }
  // Whether any work failed yet (no lock: asked between items).
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return first_;
  }

 private:
  absl::Mutex mu_;
  absl::Status first_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
};

// panel(r0, r1, c0, c1) for C's rows [r0, r1) and columns [c0, c1), for
// each of CutGemm's panels, spread over Strata's pool (a single panel on
// the calling thread).
template <typename Panel>
void ForEachGemmPanel(int64_t m, int64_t n, int64_t k, const Panel& panel) {
  const GemmCut cut = CutGemm(m, n, k);
  if (cut.count == 1) {
    panel(int64_t{0}, m, int64_t{0}, n);
    return;
  }
  ParallelFor(cut.count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (cut.by_rows) {
        panel(cut.Begin(i, m), cut.End(i, m), int64_t{0}, n);
      } else {
        panel(int64_t{0}, m, cut.Begin(i, n), cut.End(i, n));
      }
    }
  });
}

// A GEMM that tolerates empty sizes: nothing to do when m or n is 0, and
// c = beta * c when k is 0; cut over the pool by ForEachGemmPanel.
template <typename T>
void GemmOrScale(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                 const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    ScaleOnly(m, n, beta, c, ldc);
    return;
  }
  SingleThreadedBlas();
  ForEachGemmPanel(m, n, k, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    Gemm(trans_a, trans_b, r1 - r0, c1 - c0, k, alpha, trans_a ? a + r0 : a + r0 * lda, lda,
         trans_b ? b + c0 * ldb : b + c0, ldb, beta, c + r0 * ldc + c0, ldc);
  });
}

}  // namespace strata

#endif  // STRATA_KERNELS_CPU_GEMM_H_
