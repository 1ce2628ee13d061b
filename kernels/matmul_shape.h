#ifndef STRATA_KERNELS_MATMUL_SHAPE_H_
#define STRATA_KERNELS_MATMUL_SHAPE_H_

// The shapes of y = op(a) @ op(b), shared by the CPU and CUDA matmul kernels
// so both accept and refuse the same operands with the same words.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/tensor.h"

namespace strata {

struct MatmulShape {
  int64_t batch = 1;     // product of a's leading dims
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0;  // row strides of a and b as stored
  bool b_batched = false;    // b has a's batch dims (else one 2-D b is shared)
  Shape y;                   // [..., m, n]
};

// a [..., M, K] (or [..., K, M] with transpose_a), b [K, N] or [..., K, N]
// (or their transposes).
inline absl::StatusOr<MatmulShape> InferMatmulShape(const Shape& a, const Shape& b, bool transpose_a,
                                                    bool transpose_b) {
  const int ra = static_cast<int>(a.size()), rb = static_cast<int>(b.size());
  if (ra < 2 || rb < 2 || (rb > 2 && rb != ra)) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul: bad ranks a ", ShapeString(a), ", b ", ShapeString(b)));
  }
  MatmulShape s;
  s.m = transpose_a ? a[ra - 1] : a[ra - 2];
  s.k = transpose_a ? a[ra - 2] : a[ra - 1];
  const int64_t kb = transpose_b ? b[rb - 1] : b[rb - 2];
  s.n = transpose_b ? b[rb - 2] : b[rb - 1];
  s.b_batched = rb > 2;
  bool batch_match = true;
  for (int i = 0; s.b_batched && i < ra - 2; ++i) batch_match &= a[i] == b[i];
  if (s.k != kb || !batch_match) {
    return absl::InvalidArgumentError(absl::StrCat("matmul: a ", ShapeString(a), " and b ", ShapeString(b),
                                                   " do not multiply (transpose_a=", transpose_a,
                                                   ", transpose_b=", transpose_b, ")"));
  }
  for (int i = 0; i < ra - 2; ++i) s.batch *= a[i];
  s.lda = a[ra - 1];
  s.ldb = b[rb - 1];
  s.y.assign(a.begin(), a.end() - 2);
  s.y.push_back(s.m);
  s.y.push_back(s.n);
  return s;
}

}  // namespace strata

#endif  // STRATA_KERNELS_MATMUL_SHAPE_H_
