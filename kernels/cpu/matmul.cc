// matmul and its shared-weight backward helpers: F32 and F64 through
// OpenBLAS; BF16 through oneDNN's bf16 GEMM into float where the CPU has it
// (onednn_gemm.h), else the float kernels on widened copies; F16 widened.
//
// Threads: a 2-D product, and x @ W with a batched x and a 2-D W, are one GEMM
// that OpenBLAS threads itself. A batch of separate GEMMs runs the items in
// parallel over our pool when each is small enough for OpenBLAS to run it
// single-threaded, and one after another (each threaded by OpenBLAS) otherwise.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "kernels/attr_kernels.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_kernel_util.h"
#include "kernels/cpu/onednn_gemm.h"
#include "kernels/cpu/widened.h"
#include "kernels/cuda/unary_math.h"
#include "kernels/matmul_shape.h"
#include "proto/shape_rules.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

using nn_kernels::InitFactory;

// c = op(a) @ op(b) + beta * c with a and b stored as In and c as T:
// OpenBLAS when In is T, oneDNN's bf16 GEMM for bfloat16 into float (the
// kernels below run that one only where NativeBf16Gemm()).
template <typename In, typename T>
absl::Status GemmOf(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const In* a, int64_t lda, const In* b,
                    int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<In, T>) {
    GemmOrScale<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
    return absl::OkStatus();
  } else {
    static_assert(std::is_same_v<In, bfloat16> && std::is_same_v<T, float>, "bf16 operands into float only");
    return GemmOrScale(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  }
}

// One GEMM per batch item i: c_i = op(a_i) @ op(b_i); strides of 0 share an operand.
template <typename In, typename T>
absl::Status BatchedGemm(int64_t batch, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const In* a,
                         int64_t lda, int64_t a_stride, const In* b, int64_t ldb, int64_t b_stride, T* c,
                         int64_t ldc, int64_t c_stride) {
  FirstFailure first;
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end && !first.failed(); ++i) {
      first.Note(GemmOf<In, T>(ta, tb, m, n, k, a + i * a_stride, lda, b + i * b_stride, ldb, T(0),
                               c + i * c_stride, ldc));
    }
  };
  const double work = static_cast<double>(m) * n * k;
  if (work <= kSingleThreadedGemmWork) {
    ParallelFor(batch, nn_kernels::MinChunk(static_cast<int64_t>(work) + m * n), run);
  } else {
    run(0, batch);
  }
  return first.status();
}

absl::Status ReadTransposes(const Op& op, bool* ta, bool* tb) {
  auto a = AttrBool(op, "transpose_a");
  if (!a.ok()) return a.status();
  auto b = AttrBool(op, "transpose_b");
  if (!b.ok()) return b.status();
  *ta = *a;
  *tb = *b;
  return absl::OkStatus();
}

// The three kernels below read their operands as In and compute in T (In
// is T, or bfloat16 into float for oneDNN's bf16 GEMM, whose float outputs
// WidenedKernel rounds to the planned bf16).

// y = op(a) @ op(b); a [..., M, K] (or [..., K, M] transposed), b [K, N] or [..., K, N].
template <typename In, typename T>
class MatmulKernel : public OpKernel {
 public:
  explicit MatmulKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) { return ReadTransposes(op, &ta_, &tb_); }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(MatmulShape s, InferMatmulShape(a.shape(), b.shape(), ta_, tb_));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, s.y));
    const In* pa = a.data<In>();
    const In* pb = b.data<In>();
    T* py = y->data<T>();
    if (!s.b_batched && !ta_) {
      // x @ W: a's batch folds into the rows of one [batch*M, K] x [K, N] GEMM.
      return GemmOf<In, T>(false, tb_, s.batch * s.m, s.n, s.k, pa, s.lda, pb, s.ldb, T(0), py, s.n);
    }
    return BatchedGemm<In, T>(s.batch, ta_, tb_, s.m, s.n, s.k, pa, s.lda, s.m * s.k, pb, s.ldb,
                              s.b_batched ? s.k * s.n : 0, py, s.n, s.m * s.n);
  }

 private:
  bool ta_ = false, tb_ = false;
};

// da for y = op(a) @ op(b) with a batched a and a shared 2-D b:
//   transpose_a: da_i [K, M] = op(b) [K, N] @ dy_i^T;  else da [batch*M, K] = dy @ op(b)^T.
template <typename In, typename T>
class MatmulSharedBGradAKernel : public OpKernel {
 public:
  explicit MatmulSharedBGradAKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) { return ReadTransposes(op, &ta_, &tb_); }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& dy = ctx.input(0);
    const Tensor& b = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(MatmulGradShape s, InferMatmulSharedBGradAShape(dy.shape(), b.shape(), ta_, tb_));
    const int64_t M = s.m, K = s.k, N = s.n, batch = s.batch;
    STRATA_ASSIGN_OR_RETURN(Tensor * da, ctx.AllocateOutput(0, DataTypeOf<T>::value, s.out));
    const In* pdy = dy.data<In>();
    const In* pb = b.data<In>();
    T* pda = da->data<T>();
    const int64_t ldb = b.dim(1);
    if (ta_) return BatchedGemm<In, T>(batch, tb_, true, K, M, N, pb, ldb, 0, pdy, N, M * N, pda, M, K * M);
    return GemmOf<In, T>(false, !tb_, batch * M, K, N, pdy, N, pb, ldb, T(0), pda, K);
  }

 private:
  bool ta_ = false, tb_ = false;
};

// db for a shared 2-D b, summed over a's batch:
//   db [K, N] = sum_i op(a_i)^T @ dy_i   (transpose_b: db [N, K] = sum_i dy_i^T @ op(a_i)).
// Without transpose_a the batch folds into the GEMM's inner dim: one GEMM.
template <typename In, typename T>
class MatmulSharedBGradBKernel : public OpKernel {
 public:
  explicit MatmulSharedBGradBKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) { return ReadTransposes(op, &ta_, &tb_); }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(MatmulGradShape s, InferMatmulSharedBGradBShape(a.shape(), dy.shape(), ta_, tb_));
    const int64_t M = s.m, K = s.k, N = s.n, batch = s.batch;
    STRATA_ASSIGN_OR_RETURN(Tensor * db, ctx.AllocateOutput(0, DataTypeOf<T>::value, s.out));
    const In* pa = a.data<In>();
    const In* pdy = dy.data<In>();
    T* pdb = db->data<T>();
    if (!ta_) {
      if (!tb_) return GemmOf<In, T>(true, false, K, N, batch * M, pa, K, pdy, N, T(0), pdb, N);
      return GemmOf<In, T>(true, false, N, K, batch * M, pdy, N, pa, K, T(0), pdb, K);
    }
    // a_i is stored [K, M]: the items are not one matrix, so accumulate GEMM by GEMM.
    if (batch == 0) std::memset(pdb, 0, db->bytes());
    for (int64_t i = 0; i < batch; ++i) {
      const T beta = i == 0 ? T(0) : T(1);
      const In* ai = pa + i * K * M;
      const In* dyi = pdy + i * M * N;
      if (!tb_) {
        STRATA_RETURN_IF_ERROR((GemmOf<In, T>(false, false, K, N, M, ai, M, dyi, N, beta, pdb, N)));
      } else {
        STRATA_RETURN_IF_ERROR((GemmOf<In, T>(true, true, N, K, M, dyi, N, ai, M, beta, pdb, K)));
      }
    }
    return absl::OkStatus();
  }

 private:
  bool ta_ = false, tb_ = false;
};

// acc [M, N] += op(a) @ op(b) for 2-D a and b: one GEMM with beta = 1 into
// the persistent buffer.
template <typename T>
class MatmulAccumulateKernel : public OpKernel {
 public:
  explicit MatmulAccumulateKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) { return ReadTransposes(op, &ta_, &tb_); }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const Tensor& acc = ctx.input(2);
    STRATA_ASSIGN_OR_RETURN(MatmulGradShape s,
                            InferMatmulAccumulateShape(a.shape(), b.shape(), acc.shape(), ta_, tb_));
    const int64_t M = s.m, K = s.k, N = s.n;
    T* pacc = const_cast<T*>(acc.data<T>());  // stateful: updates the persistent buffer in place
    GemmOrScale<T>(ta_, tb_, M, N, K, T(1), a.data<T>(), a.dim(1), b.data<T>(), b.dim(1), T(1), pacc, N);
    ctx.SetOutput(0, acc);
    return absl::OkStatus();
  }

 private:
  bool ta_ = false, tb_ = false;
};

// out [rows, N] = a @ op(b) over a's folded rows (a, b: the kernel's inputs
// 0 and 1; b 2-D), as matmul's kernel calls the GEMM; 16-bit In operands
// go to oneDNN's bf16 GEMM as they are where matmul's kernel runs it
// (NativeBf16Gemm), else are widened to T in scratch first, as matmul's
// widened kernel runs them.
template <typename In, typename T>
absl::Status FoldedGemmInto(KernelContext& ctx, const MatmulShape& s, bool transpose_b, T* out) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if constexpr (std::is_same_v<In, T>) {
    return GemmOf<T, T>(false, transpose_b, s.batch * s.m, s.n, s.k, a.data<T>(), s.lda, b.data<T>(), s.ldb, T(0),
                        out, s.n);
  } else {
    if constexpr (std::is_same_v<In, bfloat16> && std::is_same_v<T, float>) {
      if (NativeBf16Gemm()) {
        return GemmOf<In, T>(false, transpose_b, s.batch * s.m, s.n, s.k, a.data<In>(), s.lda, b.data<In>(), s.ldb,
                             T(0), out, s.n);
      }
    }
    STRATA_ASSIGN_OR_RETURN(Tensor wide_a, WidenToScratch<In>(ctx, a));
    STRATA_ASSIGN_OR_RETURN(Tensor wide_b, WidenToScratch<In>(ctx, b));
    return GemmOf<T, T>(false, transpose_b, s.batch * s.m, s.n, s.k, wide_a.data<T>(), s.lda, wide_b.data<T>(),
                        s.ldb, T(0), out, s.n);
  }
}

// y = a @ op(b) + bias (passes/fuse_epilogues): the GEMM over a's folded rows
// into y, then bias added row by row, so y has the bits of matmul then add.
// `In` is a's and b's storage; BF16/F16 operands are widened to float first
// (y and bias are float then: no rounding to the low precision on the way).
//
// With the optional residual r (y's float type; passes/fuse_epilogues), each
// element then becomes r + y in T, in the same row pass: the bits of
// matmul_bias then add(r, y) (or add(y, r): one IEEE sum either way).
//
// out_dtype (passes/fold_casts; 16-bit a and b only): y computed as above
// into float scratch, then stored as In, each value rounded as the cast
// kernel rounds it, so the op equals matmul_bias then cast bit for bit.
// A bias of the 16-bit In itself (passes/cast_bias) is widened and added
// in float the same way, y stored as In: the bits of cast (bias up), then
// matmul_bias then cast.
template <typename In, typename T>
class MatmulBiasKernel : public StoredOutKernel<TransposeBAttrKernel> {
 public:
  explicit MatmulBiasKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const Tensor& bias = ctx.input(2);
    STRATA_ASSIGN_OR_RETURN(MatmulShape s, InferMatmulBiasShape(a.shape(), b.shape(), bias.shape(), tb_));
    STRATA_ASSIGN_OR_RETURN(const bool low_bias, LowBias(bias));
    const T* residual = nullptr;
    if (ctx.num_inputs() > 3) {
      STRATA_RETURN_IF_ERROR(CheckMatmulBiasResidual(s, low_bias ? DataTypeOf<In>::value : DataTypeOf<T>::value,
                                                     ctx.input(3), out_dtype_ != DT_INVALID));
      residual = ctx.input(3).data<T>();
    }
    if constexpr (!std::is_same_v<In, T>) {
      if (StoresAs<In>() || low_bias) {
        STRATA_ASSIGN_OR_RETURN(Tensor wide, nn_kernels::Scratch(ctx, F32, NumElements(s.y)));
        STRATA_RETURN_IF_ERROR(MatmulBiasInto(ctx, s, &wide));
        STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<In>::value, s.y));
        UnaryMap(wide.num_elements(), wide.data<T>(), y->data<In>(), [](T v) { return cuda::Convert<In>(v); });
        return absl::OkStatus();
      }
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, s.y));
    return MatmulBiasInto(ctx, s, y, residual);
  }

 protected:
  // y = a @ op(b) + bias for the op's inputs, y allocated by the caller; with
  // `residual` (y's shape), y = residual + (a @ op(b) + bias).
  absl::Status MatmulBiasInto(KernelContext& ctx, const MatmulShape& s, Tensor* y, const T* residual = nullptr) {
    const Tensor& bias = ctx.input(2);
    T* py = y->data<T>();
    const int64_t rows = s.batch * s.m;
    STRATA_RETURN_IF_ERROR((FoldedGemmInto<In, T>(ctx, s, tb_, py)));
    const T* pbias = bias.data<T>();
    std::vector<T> wide_bias;  // a 16-bit bias, widened (exact)
    if constexpr (!std::is_same_v<In, T>) {
      if (bias.dtype() == DataTypeOf<In>::value) {
        wide_bias.resize(s.n);
        for (int64_t j = 0; j < s.n; ++j) wide_bias[j] = cuda::Convert<T>(bias.data<In>()[j]);
        pbias = wide_bias.data();
      }
    }
    ParallelFor(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, s.n)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        T* row = py + r * s.n;
        for (int64_t j = 0; j < s.n; ++j) row[j] = row[j] + pbias[j];
        if (residual != nullptr) {
          const T* res = residual + r * s.n;
          for (int64_t j = 0; j < s.n; ++j) row[j] = res[j] + row[j];
        }
      }
    });
    return absl::OkStatus();
  }

  // Whether the bias has the 16-bit In's type (y then In too).
  static absl::StatusOr<bool> LowBias(const Tensor& bias) {
    return MatmulBiasIsLow(DataTypeOf<In>::value, DataTypeOf<T>::value, bias.dtype());
  }
};

// (y, z) = (gelu(z), a @ op(b) + bias), gelu's tanh form
// (passes/fuse_epilogues): z exactly as matmul_bias computes it, then y with
// the gelu kernel's own function (cuda::GeluTanhFn over UnaryMap), so both
// have the bits of matmul_bias (or matmul then add) then gelu. out_dtype
// stores y as In, rounded as a cast after the gelu would round it; z_dtype
// stores z as In the same way, y staying the gelu of the float z (what
// cuBLASLt's GELU_AUX_BIAS gives with its aux in D's 16-bit type). A bias
// of the 16-bit In (passes/cast_bias) stores both as In, as the two attrs
// together do over its widened value.
template <typename In, typename T>
class MatmulBiasGeluKernel : public MatmulBiasKernel<In, T> {
 public:
  explicit MatmulBiasGeluKernel(const KernelDef& def) : MatmulBiasKernel<In, T>(def) {}

  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR((MatmulBiasKernel<In, T>::Init(op)));
    STRATA_ASSIGN_OR_RETURN(z_dtype_, MatmulBiasGeluZDtype<In>(op));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    const Shape &a = ctx.input(0).shape(), &b = ctx.input(1).shape(), &bias = ctx.input(2).shape();
    STRATA_ASSIGN_OR_RETURN(MatmulShape s, InferMatmulBiasShape(a, b, bias, this->tb_));
    STRATA_ASSIGN_OR_RETURN(const bool low_bias, this->LowBias(ctx.input(2)));
    Tensor wide;  // the float z when z is stored in 16 bits
    Tensor* z = nullptr;
    if (z_dtype_ != DT_INVALID || low_bias) {
      STRATA_ASSIGN_OR_RETURN(wide, nn_kernels::Scratch(ctx, DataTypeOf<T>::value, NumElements(s.y)));
      z = &wide;
    } else {
      STRATA_ASSIGN_OR_RETURN(z, ctx.AllocateOutput(1, DataTypeOf<T>::value, s.y));
    }
    STRATA_RETURN_IF_ERROR(this->MatmulBiasInto(ctx, s, z));
    if constexpr (!std::is_same_v<In, T>) {
      if (z == &wide) {
        STRATA_ASSIGN_OR_RETURN(Tensor * stored, ctx.AllocateOutput(1, DataTypeOf<In>::value, s.y));
        UnaryMap(wide.num_elements(), wide.data<T>(), stored->data<In>(), [](T v) { return cuda::Convert<In>(v); });
      }
      if (this->template StoresAs<In>() || low_bias) {
        STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<In>::value, s.y));
        const cuda::GeluTanhFn gelu;
        UnaryMap(z->num_elements(), z->data<T>(), y->data<In>(), [gelu](T v) { return cuda::Convert<In>(gelu(v)); });
        return absl::OkStatus();
      }
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, s.y));
    UnaryMap(z->num_elements(), z->data<T>(), y->data<T>(), cuda::GeluTanhFn());
    return absl::OkStatus();
  }

 private:
  DataType z_dtype_ = DT_INVALID;  // z_dtype's type (In's, checked in Init), or none: z in T
};

// dz = gelu'(z) * (a @ op(b)), the tanh form (passes/fuse_epilogues): the
// GEMM over a's folded rows into dz (F32/F64) or float scratch (BF16/F16
// operands, widened to float first as matmul's widened kernel runs them),
// then gelu_grad's own
// function (cuda::GeluTanhGradFn) on z widened to T and the unrounded
// product, dz rounded once to In. For F32/F64 the bits of matmul then
// gelu_grad; for BF16/F16 those of the float ops on widened operands, then
// a cast (the unfused 16-bit ops also round the product to 16 bits).
template <typename In, typename T>
class MatmulGeluGradKernel : public TransposeBAttrKernel {
 public:
  explicit MatmulGeluGradKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& z = ctx.input(2);
    STRATA_ASSIGN_OR_RETURN(MatmulShape s,
                            InferMatmulGeluGradShape(ctx.input(0).shape(), ctx.input(1).shape(), z.shape(), tb_));
    const int64_t rows = s.batch * s.m, count = rows * s.n;
    STRATA_ASSIGN_OR_RETURN(Tensor * dz, ctx.AllocateOutput(0, DataTypeOf<In>::value, s.y));
    const cuda::GeluTanhGradFn grad;
    if constexpr (std::is_same_v<In, T>) {
      // The product into dz, then gelu_grad over it in place (BinaryMap's
      // aliasing path: each element read, then written).
      STRATA_RETURN_IF_ERROR((FoldedGemmInto<In, T>(ctx, s, tb_, dz->data<T>())));
      BinaryMap(count, z.data<T>(), dz->data<T>(), dz->data<T>(), grad);
    } else {
      STRATA_ASSIGN_OR_RETURN(Tensor product, nn_kernels::Scratch(ctx, DataTypeOf<T>::value, count));
      STRATA_RETURN_IF_ERROR((FoldedGemmInto<In, T>(ctx, s, tb_, product.data<T>())));
      BinaryMap(count, z.data<In>(), product.data<T>(), dz->data<In>(),
                [grad](In x, T dy) { return cuda::Convert<In>(grad(cuda::Convert<T>(x), dy)); });
    }
    return absl::OkStatus();
  }
};

// Whether FoldedGemmInto widens operands of this dtype to float scratch:
// 16-bit ones, except BF16 where oneDNN's bf16 GEMM reads them as they are.
bool WidensOperands(DataType dtype) { return IsHalfFloating(dtype) && !(dtype == BF16 && NativeBf16Gemm()); }

// For 16-bit operands the float product, and their float copies where
// FoldedGemmInto widens them (F32 and F64 run in dz itself).
absl::StatusOr<int64_t> MatmulGeluGradWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty() || !IsHalfFloating(def.input_types[0].dtype)) return 0;
  int64_t elements = 0;
  for (size_t i = 0; i < 2 && i < def.input_types.size(); ++i) {
    if (WidensOperands(def.input_types[i].dtype)) elements += NumElements(def.input_types[i].shape);
  }
  if (!def.output_types.empty()) elements += NumElements(def.output_types[0].shape);
  return elements * static_cast<int64_t>(sizeof(float));
}

// The widened operands' float copies (WidensOperands), for the memory
// plan, and matmul_bias's float y before its 16-bit store (out_dtype: a
// 16-bit y over an F32 bias, or a 16-bit bias, whose widened copy of N
// floats is a vector outside the plan).
absl::StatusOr<int64_t> MatmulBiasWorkspace(const KernelDef& def, int) {
  int64_t elements = 0;
  for (size_t i = 0; i < 2 && i < def.input_types.size(); ++i) {
    if (WidensOperands(def.input_types[i].dtype)) elements += NumElements(def.input_types[i].shape);
  }
  if (def.op != nullptr && def.op->type() == "matmul_bias" && !def.output_types.empty() &&
      IsHalfFloating(def.output_types[0].dtype)) {
    elements += NumElements(def.output_types[0].shape);
  }
  // matmul_bias_gelu's float z before its 16-bit store (z_dtype).
  if (def.op != nullptr && def.op->type() == "matmul_bias_gelu" && def.output_types.size() > 1 &&
      IsHalfFloating(def.output_types[1].dtype)) {
    elements += NumElements(def.output_types[1].shape);
  }
  return elements * static_cast<int64_t>(sizeof(float));
}

// db, dbias for y = a @ op(b) + bias (passes/fuse_epilogues): db as
// matmul_shared_b_grad_b computes it without transpose_a (the same GEMM
// call), dbias as sum_to_like sums dy to [N] (the same ReduceSum), so both
// have the unfused ops' bits. BF16/F16 run widened (WidenedKernel): both
// outputs are planned F32 and copied through unrounded.
template <typename T>
class MatmulBiasGradBKernel : public TransposeBAttrKernel {
 public:
  explicit MatmulBiasGradBKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(MatmulGradShape s, InferMatmulBiasGradBShape(a.shape(), dy.shape(), tb_));
    const int64_t M = s.m, K = s.k, N = s.n, batch = s.batch;
    STRATA_ASSIGN_OR_RETURN(Tensor * db, ctx.AllocateOutput(0, a.dtype(), s.out));
    const T* pa = a.data<T>();
    const T* pdy = dy.data<T>();
    T* pdb = db->data<T>();
    if (!tb_) {
      GemmOrScale<T>(true, false, K, N, batch * M, T(1), pa, K, pdy, N, T(0), pdb, N);
    } else {
      GemmOrScale<T>(true, false, N, K, batch * M, T(1), pdy, N, pa, K, T(0), pdb, K);
    }
    const Shape like = {N};
    bool any = false;
    STRATA_ASSIGN_OR_RETURN(const std::vector<bool> reduced, SumToLikeDims(dy.shape(), like, &any));
    STRATA_ASSIGN_OR_RETURN(Tensor * dbias, ctx.AllocateOutput(1, dy.dtype(), like));
    if (!any) {
      // One row: sum_to_like passes dy through (a reshape), so copy it as it is.
      std::memcpy(dbias->data<T>(), pdy, dbias->bytes());
    } else {
      ReduceSum(pdy, dy.shape(), reduced, dbias->data<T>(), AccumulatorOf<T>(1));
    }
    return absl::OkStatus();
  }
};

// F32 and F64 through OpenBLAS. BF16: oneDNN's bf16 GEMM on the stored
// operands where this CPU has it (NativeBf16Gemm, asked when the kernel is
// made), else the float32 kernel on widened copies; F16 always widened.
// Either way the float outputs are rounded to the planned 16 bits.
template <template <typename, typename> class K>
KernelFactory Bf16GemmFactory() {
  return [](const KernelDef& def) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
    if (NativeBf16Gemm()) return InitFactory<WidenedKernel<bfloat16, K<bfloat16, float>, false>>()(def);
    return InitFactory<WidenedKernel<bfloat16, K<float, float>>>()(def);
  };
}

// The memory plan's side of Bf16GemmFactory: the float outputs before they
// are rounded, and the widened operands' float copies where they are made.
absl::StatusOr<int64_t> GemmWorkspace(const KernelDef& def, int) {
  const bool native = !def.input_types.empty() && def.input_types[0].dtype == BF16 && NativeBf16Gemm();
  return WidenedWorkspaceOver(def, 0, /*widen_inputs=*/!native);
}

STRATA_REGISTER_KERNEL("matmul", DEVICE_CPU, F32, (InitFactory<MatmulKernel<float, float>>()));
STRATA_REGISTER_KERNEL("matmul", DEVICE_CPU, F64, (InitFactory<MatmulKernel<double, double>>()));
STRATA_REGISTER_KERNEL("matmul", DEVICE_CPU, BF16, Bf16GemmFactory<MatmulKernel>());
STRATA_REGISTER_KERNEL("matmul", DEVICE_CPU, F16, (InitFactory<WidenedKernel<float16, MatmulKernel<float, float>>>()));
STRATA_REGISTER_WORKSPACE("matmul", DEVICE_CPU, GemmWorkspace);
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_a", DEVICE_CPU, F32, (InitFactory<MatmulSharedBGradAKernel<float, float>>()));
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_a", DEVICE_CPU, F64, (InitFactory<MatmulSharedBGradAKernel<double, double>>()));
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_a", DEVICE_CPU, BF16, Bf16GemmFactory<MatmulSharedBGradAKernel>());
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_a", DEVICE_CPU, F16, (InitFactory<WidenedKernel<float16, MatmulSharedBGradAKernel<float, float>>>()));
STRATA_REGISTER_WORKSPACE("matmul_shared_b_grad_a", DEVICE_CPU, GemmWorkspace);
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_b", DEVICE_CPU, F32, (InitFactory<MatmulSharedBGradBKernel<float, float>>()));
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_b", DEVICE_CPU, F64, (InitFactory<MatmulSharedBGradBKernel<double, double>>()));
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_b", DEVICE_CPU, BF16, Bf16GemmFactory<MatmulSharedBGradBKernel>());
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_b", DEVICE_CPU, F16, (InitFactory<WidenedKernel<float16, MatmulSharedBGradBKernel<float, float>>>()));
STRATA_REGISTER_WORKSPACE("matmul_shared_b_grad_b", DEVICE_CPU, GemmWorkspace);
STRATA_REGISTER_KERNEL("matmul_bias", DEVICE_CPU, F32, (InitFactory<MatmulBiasKernel<float, float>>()));
STRATA_REGISTER_KERNEL("matmul_bias", DEVICE_CPU, F64, (InitFactory<MatmulBiasKernel<double, double>>()));
STRATA_REGISTER_KERNEL("matmul_bias", DEVICE_CPU, BF16, (InitFactory<MatmulBiasKernel<bfloat16, float>>()));
STRATA_REGISTER_KERNEL("matmul_bias", DEVICE_CPU, F16, (InitFactory<MatmulBiasKernel<float16, float>>()));
STRATA_REGISTER_WORKSPACE("matmul_bias", DEVICE_CPU, MatmulBiasWorkspace);
STRATA_REGISTER_KERNEL("matmul_bias_gelu", DEVICE_CPU, F32, (InitFactory<MatmulBiasGeluKernel<float, float>>()));
STRATA_REGISTER_KERNEL("matmul_bias_gelu", DEVICE_CPU, F64, (InitFactory<MatmulBiasGeluKernel<double, double>>()));
STRATA_REGISTER_KERNEL("matmul_bias_gelu", DEVICE_CPU, BF16, (InitFactory<MatmulBiasGeluKernel<bfloat16, float>>()));
STRATA_REGISTER_KERNEL("matmul_bias_gelu", DEVICE_CPU, F16, (InitFactory<MatmulBiasGeluKernel<float16, float>>()));
STRATA_REGISTER_WORKSPACE("matmul_bias_gelu", DEVICE_CPU, MatmulBiasWorkspace);
STRATA_REGISTER_KERNEL("matmul_gelu_grad", DEVICE_CPU, F32, (InitFactory<MatmulGeluGradKernel<float, float>>()));
STRATA_REGISTER_KERNEL("matmul_gelu_grad", DEVICE_CPU, F64, (InitFactory<MatmulGeluGradKernel<double, double>>()));
STRATA_REGISTER_KERNEL("matmul_gelu_grad", DEVICE_CPU, BF16, (InitFactory<MatmulGeluGradKernel<bfloat16, float>>()));
STRATA_REGISTER_KERNEL("matmul_gelu_grad", DEVICE_CPU, F16, (InitFactory<MatmulGeluGradKernel<float16, float>>()));
STRATA_REGISTER_WORKSPACE("matmul_gelu_grad", DEVICE_CPU, MatmulGeluGradWorkspace);
STRATA_REGISTER_KERNEL("matmul_bias_grad_b", DEVICE_CPU, F32, InitFactory<MatmulBiasGradBKernel<float>>());
STRATA_REGISTER_KERNEL("matmul_bias_grad_b", DEVICE_CPU, F64, InitFactory<MatmulBiasGradBKernel<double>>());
template <typename Half>
using WidenedMatmulBiasGradB = WidenedKernel<Half, MatmulBiasGradBKernel<float>>;
STRATA_REGISTER_KERNEL("matmul_bias_grad_b", DEVICE_CPU, BF16, InitFactory<WidenedMatmulBiasGradB<bfloat16>>());
STRATA_REGISTER_KERNEL("matmul_bias_grad_b", DEVICE_CPU, F16, InitFactory<WidenedMatmulBiasGradB<float16>>());
STRATA_REGISTER_WORKSPACE("matmul_bias_grad_b", DEVICE_CPU, WidenedWorkspace);
STRATA_REGISTER_KERNEL("matmul_accumulate", DEVICE_CPU, F32, InitFactory<MatmulAccumulateKernel<float>>());
STRATA_REGISTER_KERNEL("matmul_accumulate", DEVICE_CPU, F64, InitFactory<MatmulAccumulateKernel<double>>());

}  // namespace
}  // namespace strata
