#ifndef STRATA_KERNELS_MATMUL_SHAPE_H_
#define STRATA_KERNELS_MATMUL_SHAPE_H_

// The shapes of y = op(a) @ op(b), shared by the CPU and CUDA matmul kernels
// so both accept and refuse the same operands with the same words.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "proto/shape_rules.h"
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
// (or their transposes): the schema's rule (proto/shape_rules.h), so a
// kernel refuses what the schema refuses, in its words after "matmul: ".
inline absl::StatusOr<MatmulShape> InferMatmulShape(const Shape& a, const Shape& b, bool transpose_a,
                                                    bool transpose_b) {
  absl::StatusOr<MatmulDims> d = ResolveMatmul(a, b, transpose_a, transpose_b);
  if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("matmul: ", d.status().message()));
  MatmulShape s;
  s.m = d->m;
  s.k = d->k;
  s.n = d->n;
  s.b_batched = d->b_batched;
  for (int64_t dim : d->batch) s.batch *= dim;
  s.lda = a.back();
  s.ldb = b.back();
  s.y = d->batch;
  s.y.push_back(s.m);
  s.y.push_back(s.n);
  return s;
}

// matmul_bias: a [..., M, K], a 2-D b ([K, N], or [N, K] with transpose_b)
// and bias [N]; one GEMM over a's folded rows.
inline absl::StatusOr<MatmulShape> InferMatmulBiasShape(const Shape& a, const Shape& b, const Shape& bias,
                                                        bool transpose_b) {
  if (b.size() != 2 || bias.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_bias: b must be 2-D and bias 1-D, got b ",
                                                   ShapeString(b), " and bias ", ShapeString(bias)));
  }
  absl::StatusOr<MatmulShape> s = InferMatmulShape(a, b, false, transpose_b);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("matmul_bias", s.status().message().substr(6)));
  if (bias[0] != s->n) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul_bias: bias ", ShapeString(bias), " must have the N=", s->n, " of y"));
  }
  return s;
}

// matmul_gelu_grad: a [..., M, K], a 2-D b ([K, N], or [N, K] with
// transpose_b) and z of the product's shape; one GEMM over a's folded rows.
inline absl::StatusOr<MatmulShape> InferMatmulGeluGradShape(const Shape& a, const Shape& b, const Shape& z,
                                                            bool transpose_b) {
  if (b.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_gelu_grad: b must be 2-D, got ", ShapeString(b)));
  }
  absl::StatusOr<MatmulShape> s = InferMatmulShape(a, b, false, transpose_b);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("matmul_gelu_grad", s.status().message().substr(6)));
  if (z != s->y) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_gelu_grad: z ", ShapeString(z),
                                                   " must have the shape of a @ op(b) ", ShapeString(s->y)));
  }
  return s;
}

// matmul_bias's optional residual (passes/fuse_epilogues): y's shape and its
// float type `y_dtype` (F32 or F64), and y not stored in 16 bits
// (`stored_low`, out_dtype), as the schema has it.
inline absl::Status CheckMatmulBiasResidual(const MatmulShape& s, DataType y_dtype, const Tensor& residual,
                                            bool stored_low) {
  if (stored_low || (y_dtype != F32 && y_dtype != F64)) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_bias: a residual needs an F32 or F64 y and no ",
                                                   "out_dtype, got y ", DataTypeName(y_dtype),
                                                   stored_low ? " with out_dtype" : ""));
  }
  if (residual.shape() != s.y || residual.dtype() != y_dtype) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_bias: residual ", DataTypeName(residual.dtype()),
                                                   ShapeString(residual.shape()), " does not match y ",
                                                   DataTypeName(y_dtype), ShapeString(s.y)));
  }
  return absl::OkStatus();
}

// matmul_bias's and matmul_bias_gelu's bias dtype, for operands `a` and a
// kernel summing in `sum` (a's own type, or F32 for BF16/F16 a): true where
// it is the 16-bit a's own type (passes/cast_bias: y, and z, stored in it),
// false where it is `sum`'s; anything else is refused, as the schema
// refuses it first.
inline absl::StatusOr<bool> MatmulBiasIsLow(DataType a, DataType sum, DataType bias) {
  const bool low = a != sum && bias == a;
  if (!low && bias != sum) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_bias: bias is ", DataTypeName(bias), ", expected ",
                                                   DataTypeName(sum), a != sum ? " or " : "",
                                                   a != sum ? DataTypeName(a) : ""));
  }
  return low;
}

// The shapes of the shared-b backward helpers and of matmul_accumulate.
struct MatmulGradShape {
  int64_t batch = 1;  // product of the batched operand's leading dims
  int64_t m = 0, n = 0, k = 0;
  Shape out;  // da laid out as a, or db laid out as b
};

// matmul_shared_b_grad_a: dy [..., M, N] (rank >= 3) and the forward's 2-D b
// ([K, N], or [N, K] with transpose_b); da [..., M, K] (or [..., K, M] with
// transpose_a).
inline absl::StatusOr<MatmulGradShape> InferMatmulSharedBGradAShape(const Shape& dy, const Shape& b,
                                                                     bool transpose_a, bool transpose_b) {
  const int r = static_cast<int>(dy.size());
  MatmulGradShape s;
  if (b.size() == 2) {
    s.k = transpose_b ? b[1] : b[0];
    s.n = transpose_b ? b[0] : b[1];
  }
  if (r < 3 || b.size() != 2 || dy[r - 1] != s.n) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_shared_b_grad_a: dy ", ShapeString(dy),
                                                   " does not match b ", ShapeString(b)));
  }
  s.m = dy[r - 2];
  for (int i = 0; i < r - 2; ++i) s.batch *= dy[i];
  s.out.assign(dy.begin(), dy.end() - 2);
  s.out.push_back(transpose_a ? s.k : s.m);
  s.out.push_back(transpose_a ? s.m : s.k);
  return s;
}

// matmul_shared_b_grad_b: the forward's a [..., M, K] (or [..., K, M] with
// transpose_a) and dy [..., M, N] with a's batch dims; db [K, N] (or [N, K]
// with transpose_b), summed over the batch.
inline absl::StatusOr<MatmulGradShape> InferMatmulSharedBGradBShape(const Shape& a, const Shape& dy,
                                                                     bool transpose_a, bool transpose_b) {
  const int r = static_cast<int>(a.size());
  bool ok = r >= 2 && static_cast<int>(dy.size()) == r;
  for (int i = 0; ok && i < r - 1; ++i) ok = i == r - 2 || a[i] == dy[i];
  MatmulGradShape s;
  if (ok) {
    s.m = transpose_a ? a[r - 1] : a[r - 2];
    s.k = transpose_a ? a[r - 2] : a[r - 1];
  }
  if (!ok || dy[r - 2] != s.m) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_shared_b_grad_b: a ", ShapeString(a),
                                                   " does not match dy ", ShapeString(dy)));
  }
  s.n = dy[r - 1];
  for (int i = 0; i < r - 2; ++i) s.batch *= a[i];
  s.out = transpose_b ? Shape{s.n, s.k} : Shape{s.k, s.n};
  return s;
}

// matmul_bias_grad_b: matmul_shared_b_grad_b's a and dy without
// transpose_a (a of rank >= 2, one GEMM over its folded rows); dbias is [n].
inline absl::StatusOr<MatmulGradShape> InferMatmulBiasGradBShape(const Shape& a, const Shape& dy, bool transpose_b) {
  absl::StatusOr<MatmulGradShape> s = InferMatmulSharedBGradBShape(a, dy, false, transpose_b);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_bias_grad_b: a ", ShapeString(a), " does not match dy ",
                                                   ShapeString(dy)));
  }
  return s;
}

// matmul_accumulate: 2-D a, b and acc with acc [M, N] = op(a) @ op(b).
inline absl::StatusOr<MatmulGradShape> InferMatmulAccumulateShape(const Shape& a, const Shape& b, const Shape& acc,
                                                                   bool transpose_a, bool transpose_b) {
  if (a.size() != 2 || b.size() != 2 || acc.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_accumulate: a ", ShapeString(a), ", b ", ShapeString(b),
                                                   " and acc ", ShapeString(acc), " must be 2-D"));
  }
  MatmulGradShape s;
  s.m = transpose_a ? a[1] : a[0];
  s.k = transpose_a ? a[0] : a[1];
  const int64_t kb = transpose_b ? b[1] : b[0];
  s.n = transpose_b ? b[0] : b[1];
  if (s.k != kb || acc[0] != s.m || acc[1] != s.n) {
    return absl::InvalidArgumentError(absl::StrCat("matmul_accumulate: op(a) ", ShapeString(a), " @ op(b) ",
                                                   ShapeString(b), " (transpose_a=", transpose_a,
                                                   ", transpose_b=", transpose_b, ") does not fit acc ",
                                                   ShapeString(acc)));
  }
  s.out = acc;
  return s;
}

}  // namespace strata

#endif  // STRATA_KERNELS_MATMUL_SHAPE_H_
