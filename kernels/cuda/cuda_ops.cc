// The ops that have CUDA kernels, registered for DEVICE_CUDA: relu and its
// gradient (kernels/cuda/relu.cu), and matmul, its shared-b gradients and
// matmul_accumulate through the device's cuBLASLt handle (kernels/cuda/gemm.h).
// Each kernel enqueues on its device's compute stream and returns; errors of
// the launch come back at once, errors of the work at the device's next
// synchronisation.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cuda/binary.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/relu.h"
#include "kernels/cuda/unary.h"
#include "kernels/gemm_staging.h"
#include "kernels/kernel_checks.h"
#include "kernels/matmul_shape.h"
#include "proto/shape_rules.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

template <typename T>
class CudaReluKernel : public OpKernel {
 public:
  explicit CudaReluKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), x.shape()));
    return CudaStatus(cuda::LaunchRelu(y->data<T>(), x.data<T>(), x.num_elements(), device->stream()), "relu");
  }
};

// inputs (y, dy): dx = y > 0 ? dy : 0, as on the CPU.
template <typename T>
class CudaReluGradKernel : public OpKernel {
 public:
  explicit CudaReluGradKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& y = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckSameShapes(y, dy));
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, y.dtype(), y.shape()));
    return CudaStatus(
        cuda::LaunchReluGrad(dx->data<T>(), y.data<T>(), dy.data<T>(), y.num_elements(), device->stream()),
        "relu_grad");
  }
};

// The element type LtGemm takes for a tensor dtype's storage type.
template <typename T>
struct GemmType {
  using type = T;
};
template <>
struct GemmType<bfloat16> {
  using type = __nv_bfloat16;  // the same 16 bits
};
template <>
struct GemmType<float16> {
  using type = __half;  // the same 16 bits
};

// Float scratch of `count` elements on the kernel's device for `op`'s
// two-pass fallback (`what` says for what), or one ResourceExhausted line
// naming the op.
absl::StatusOr<Tensor> FloatScratch(const KernelContext& ctx, int64_t count, const char* op, const char* what = "") {
  Tensor t = Tensor::Empty(F32, Shape{count}, &ctx.device());
  if (!t.defined() && count > 0) {
    return absl::ResourceExhaustedError(absl::StrCat(op, ": out of memory allocating ", count,
                                                     " float elements of scratch", what, " on ", ctx.device().name()));
  }
  return t;
}

// The matmul family's attrs on the GPU: the transposes, and allow_tf32 (the
// strategy's allow_tf32, set by passes/tf32 on F32 GEMMs of GPU plans).
class CudaGemmAttrsKernel : public TransposeAttrsKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(TransposeAttrsKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(tf32_, AttrBool(op, "allow_tf32"));
    return absl::OkStatus();
  }

 protected:
  bool tf32_ = false;
};

// One LtGemm call; tf32 reaches cuBLASLt for float operands and output only
// (the other types have no TF32 mode).
template <typename C, typename G>
absl::Status Gemm(cuda::LtGemm& gemm, C* c, const G* a, const G* b, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                  cudaStream_t stream, bool accumulate, bool tf32) {
  if constexpr (std::is_same_v<C, float> && std::is_same_v<G, float>) {
    return gemm.Matmul(c, a, b, m, n, k, ta, tb, stream, accumulate, tf32);
  } else {
    return gemm.Matmul(c, a, b, m, n, k, ta, tb, stream, accumulate);
  }
}

// y = op(a) @ op(b), as kernels/cpu/matmul.cc: x @ W with a batched x and a
// 2-D W is one GEMM over the folded rows; other batches are one GEMM per item.
template <typename T>
class CudaMatmulKernel : public CudaGemmAttrsKernel {
 public:
  explicit CudaMatmulKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    using G = typename GemmType<T>::type;
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(MatmulShape s, InferMatmulShape(a.shape(), b.shape(), ta_, tb_));
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, a.dtype(), s.y));
    const G* pa = reinterpret_cast<const G*>(a.data<T>());
    const G* pb = reinterpret_cast<const G*>(b.data<T>());
    G* py = reinterpret_cast<G*>(y->data<T>());
    cuda::LtGemm& gemm = device->gemm();
    if (!s.b_batched && !ta_) {
      return Gemm(gemm, py, pa, pb, s.batch * s.m, s.n, s.k, false, tb_, device->stream(), false, tf32_);
    }
    for (int64_t i = 0; i < s.batch; ++i) {
      STRATA_RETURN_IF_ERROR(Gemm(gemm, py + i * s.m * s.n, pa + i * s.m * s.k,
                                  s.b_batched ? pb + i * s.k * s.n : pb, s.m, s.n, s.k, ta_, tb_, device->stream(), false,
                                  tf32_));
    }
    return absl::OkStatus();
  }
};

// da for y = op(a) @ op(b) with a batched a and a shared 2-D b, as
// kernels/cpu/matmul.cc: without transpose_a one GEMM over the folded batch,
// da [batch*M, K] = dy [batch*M, N] @ op(b)^T; with it one GEMM per item,
// da_i [K, M] = op(b) [K, N] @ dy_i^T.
template <typename T>
class CudaMatmulSharedBGradAKernel : public CudaGemmAttrsKernel {
 public:
  explicit CudaMatmulSharedBGradAKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& dy = ctx.input(0);
    const Tensor& b = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(MatmulGradShape s, InferMatmulSharedBGradAShape(dy.shape(), b.shape(), ta_, tb_));
    STRATA_ASSIGN_OR_RETURN(Tensor * da, ctx.AllocateOutput(0, dy.dtype(), s.out));
    using G = typename GemmType<T>::type;
    const G* pdy = reinterpret_cast<const G*>(dy.data<T>());
    const G* pb = reinterpret_cast<const G*>(b.data<T>());
    G* pda = reinterpret_cast<G*>(da->data<T>());
    cuda::LtGemm& gemm = device->gemm();
    if (!ta_) return Gemm(gemm, pda, pdy, pb, s.batch * s.m, s.k, s.n, false, !tb_, device->stream(), false, tf32_);
    for (int64_t i = 0; i < s.batch; ++i) {
      STRATA_RETURN_IF_ERROR(Gemm(gemm, pda + i * s.k * s.m, pb, pdy + i * s.m * s.n, s.k, s.m, s.n, tb_, true,
                                  device->stream(), false, tf32_));
    }
    return absl::OkStatus();
  }
};

// db for a shared 2-D b, summed over a's batch, as kernels/cpu/matmul.cc:
// without transpose_a the batch folds into the GEMM's inner dim, one GEMM
// with K = batch*M (db [K, N] = a^T @ dy, or with transpose_b db [N, K] =
// dy^T @ a); with it one GEMM per item, each after the first accumulating
// into db (beta = 1) on the stream in item order.
template <typename T>
class CudaMatmulSharedBGradBKernel : public CudaGemmAttrsKernel {
 public:
  explicit CudaMatmulSharedBGradBKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& a = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(MatmulGradShape s, InferMatmulSharedBGradBShape(a.shape(), dy.shape(), ta_, tb_));
    STRATA_ASSIGN_OR_RETURN(Tensor * db, ctx.AllocateOutput(0, a.dtype(), s.out));
    using G = typename GemmType<T>::type;
    const G* pa = reinterpret_cast<const G*>(a.data<T>());
    const G* pdy = reinterpret_cast<const G*>(dy.data<T>());
    G* pdb = reinterpret_cast<G*>(db->data<T>());
    cuda::LtGemm& gemm = device->gemm();
    const int64_t M = s.m, K = s.k, N = s.n;
    if (!ta_ || s.batch == 0) {
      // An empty batch is an empty sum: a GEMM with k = 0 zeroes db.
      const int64_t inner = s.batch * M;
      return tb_ ? Gemm(gemm, pdb, pdy, pa, N, K, inner, true, false, device->stream(), false, tf32_)
                 : Gemm(gemm, pdb, pa, pdy, K, N, inner, true, false, device->stream(), false, tf32_);
    }
    // a_i is stored [K, M]: the items are not one matrix.
    for (int64_t i = 0; i < s.batch; ++i) {
      const G* ai = pa + i * K * M;
      const G* dyi = pdy + i * M * N;
      const bool accumulate = i > 0;
      STRATA_RETURN_IF_ERROR(tb_ ? Gemm(gemm, pdb, dyi, ai, N, K, M, true, true, device->stream(), accumulate, tf32_)
                                 : Gemm(gemm, pdb, ai, dyi, K, N, M, false, false, device->stream(), accumulate, tf32_));
    }
    return absl::OkStatus();
  }
};

// acc [M, N] += op(a) @ op(b) for 2-D a and b, as kernels/cpu/matmul.cc: one
// GEMM with beta = 1 into the persistent buffer, in place (the output is acc).
template <typename T>
class CudaMatmulAccumulateKernel : public CudaGemmAttrsKernel {
 public:
  explicit CudaMatmulAccumulateKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const Tensor& acc = ctx.input(2);
    STRATA_ASSIGN_OR_RETURN(MatmulGradShape s,
                            InferMatmulAccumulateShape(a.shape(), b.shape(), acc.shape(), ta_, tb_));
    T* pacc = const_cast<T*>(acc.data<T>());  // stateful: updates the persistent buffer in place
    STRATA_RETURN_IF_ERROR(Gemm(device->gemm(), pacc, a.data<T>(), b.data<T>(), s.m, s.n, s.k, ta_, tb_,
                                device->stream(), /*accumulate=*/true, tf32_));
    ctx.SetOutput(0, acc);
    return absl::OkStatus();
  }
};

// The epilogue-fused GEMMs' attrs on the GPU: the shared b's transpose and
// allow_tf32 (F32 operands only; passes/tf32).
class CudaBiasGemmAttrsKernel : public TransposeBAttrKernel {
 public:
  absl::Status Init(const Op& op) {
    STRATA_RETURN_IF_ERROR(TransposeBAttrKernel::Init(op));
    STRATA_ASSIGN_OR_RETURN(tf32_, AttrBool(op, "allow_tf32"));
    return absl::OkStatus();
  }

 protected:
  bool tf32_ = false;
};

// y = a @ op(b) + bias (passes/fuse_epilogues): one cuBLASLt GEMM with the
// BIAS epilogue for float y (F32 operands, or BF16 operands into F32: FP32
// products and sums, nothing rounded to bf16); where cuBLASLt has no such
// algorithm for the shape, and for F64, the GEMM then the broadcast add of
// kernels/cuda/binary.h (the unfused add's bits).
//
// out_dtype (passes/fold_casts; 16-bit a and b over an F32 bias): y stored
// in a's type, rounded once from the float epilogue's value (cuBLASLt's D in
// that type, a float bias); where cuBLASLt takes no float bias beside a
// 16-bit D, the float y into scratch, then the cast kernel: the unfolded
// ops' bits either way, up to the GEMM's summation order.
//
// residual (passes/fuse_epilogues; float y, no out_dtype): y = residual +
// (a @ op(b) + bias), the residual read as cuBLASLt's C with beta 1 in the
// same GEMM (F32 y: F32 operands, or BF16/F16 into F32); where cuBLASLt has
// no algorithm, and for F64, the fallback above then binary.cu's same-shape
// add of the residual (the unfused matmul_bias then add).
template <typename In, typename T>
class CudaMatmulBiasKernel : public StoredOutKernel<CudaBiasGemmAttrsKernel> {
 public:
  explicit CudaMatmulBiasKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
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
        STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<In>::value, s.y));
        using G = typename GemmType<In>::type;
        const int64_t rows = s.batch * s.m;
        G* py = reinterpret_cast<G*>(y->data<In>());
        const G* pa = reinterpret_cast<const G*>(a.data<In>());
        const G* pb = reinterpret_cast<const G*>(b.data<In>());
        absl::Status fused =
            low_bias ? device->gemm().MatmulBias(py, pa, pb, reinterpret_cast<const G*>(bias.data<In>()), rows, s.n,
                                                 s.k, tb_, device->stream())
                     : device->gemm().MatmulBias(py, pa, pb, bias.data<float>(), rows, s.n, s.k, tb_, device->stream());
        if (fused.code() != absl::StatusCode::kUnimplemented) return fused;
        STRATA_ASSIGN_OR_RETURN(FloatBias wide_bias, WidenBias(ctx, device, bias, "matmul_bias"));
        STRATA_ASSIGN_OR_RETURN(Tensor wide, FloatScratch(ctx, rows * s.n, "matmul_bias"));
        STRATA_RETURN_IF_ERROR(MatmulBiasInto(device, a, b, wide_bias.data, s, wide.data<float>()));
        return CudaStatus(cuda::LaunchCast<float, In>(y->data<In>(), wide.data<float>(), rows * s.n, device->stream()),
                          "matmul_bias");
      }
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, s.y));
    return MatmulBiasInto(device, a, b, bias.data<T>(), s, y->data<T>(), residual);
  }

 protected:
  // Whether the bias has the 16-bit In's type (passes/cast_bias: y, and
  // z, then In too).
  static absl::StatusOr<bool> LowBias(const Tensor& bias) {
    return MatmulBiasIsLow(DataTypeOf<In>::value, DataTypeOf<T>::value, bias.dtype());
  }

  // The bias as T for the two-pass fallbacks: its own data, or a 16-bit
  // bias widened into scratch (exact) on the stream.
  struct FloatBias {
    Tensor held;  // the widened copy, if any
    const T* data = nullptr;
  };
  static absl::StatusOr<FloatBias> WidenBias(const KernelContext& ctx, CudaDevice* device, const Tensor& bias,
                                             const char* op) {
    FloatBias out;
    if constexpr (!std::is_same_v<In, T>) {
      if (bias.dtype() == DataTypeOf<In>::value) {
        STRATA_ASSIGN_OR_RETURN(out.held, FloatScratch(ctx, bias.num_elements(), op, " for the widened bias"));
        STRATA_RETURN_IF_ERROR(CudaStatus(cuda::LaunchCast<In, float>(out.held.template data<float>(), bias.data<In>(),
                                                                      bias.num_elements(), device->stream()),
                                          op));
        out.data = out.held.template data<float>();
        return out;
      }
    }
    out.data = bias.data<T>();
    return out;
  }

  // py [rows, N] = a @ op(b) + bias, a and b the op's inputs, pbias [N] of
  // T; with `residual` ([rows, N]), py = residual + (a @ op(b) + bias).
  absl::Status MatmulBiasInto(CudaDevice* device, const Tensor& a, const Tensor& b, const T* pbias,
                              const MatmulShape& s, T* py, const T* residual = nullptr) {
    using G = typename GemmType<In>::type;
    const G* pa = reinterpret_cast<const G*>(a.data<In>());
    const G* pb = reinterpret_cast<const G*>(b.data<In>());
    const int64_t rows = s.batch * s.m;
    cuda::LtGemm& gemm = device->gemm();
    if constexpr (std::is_same_v<T, float>) {
      absl::Status fused;
      if constexpr (std::is_same_v<In, float>) {
        fused = gemm.MatmulBias(py, pa, pb, pbias, rows, s.n, s.k, tb_, device->stream(), tf32_, residual);
      } else {
        fused = gemm.MatmulBias(py, pa, pb, pbias, rows, s.n, s.k, tb_, device->stream(), residual);
      }
      if (fused.code() != absl::StatusCode::kUnimplemented) return fused;
    }
    STRATA_RETURN_IF_ERROR(Gemm(gemm, py, pa, pb, rows, s.n, s.k, false, tb_, device->stream(), false, tf32_));
    cuda::BroadcastStrides strides;
    strides.rank = 2;
    strides.dims[0] = rows;
    strides.dims[1] = s.n;
    strides.x_strides[0] = s.n;
    strides.x_strides[1] = 1;
    strides.y_strides[0] = 0;
    strides.y_strides[1] = 1;
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cuda::LaunchBinaryBroadcast(cuda::BinaryOp::kAdd, py, py, pbias, rows * s.n, strides, device->stream()),
        "matmul_bias"));
    if (residual == nullptr) return absl::OkStatus();
    return CudaStatus(
        cuda::LaunchBinarySameShape(cuda::BinaryOp::kAdd, py, residual, py, rows * s.n, device->stream()),
        "matmul_bias");
  }
};

// (y, z) = (gelu(z), a @ op(b) + bias) with gelu's tanh form
// (passes/fuse_epilogues): one cuBLASLt GEMM with the GELU_AUX_BIAS epilogue
// for float y and z (F32 operands, or BF16/F16 operands into F32), z its aux
// output. Where cuBLASLt has no such algorithm for the shape (or N is not a
// multiple of 8, the aux's leading dimension), and for F64: matmul_bias's
// kernel into z, then the gelu kernel's tanh form (unary.cu) into y, the
// unfused ops' bits.
template <typename In, typename T>
class CudaMatmulBiasGeluKernel : public CudaMatmulBiasKernel<In, T> {
 public:
  explicit CudaMatmulBiasGeluKernel(const KernelDef& def) : CudaMatmulBiasKernel<In, T>(def) {}

  absl::Status Init(const Op& op) {
    using Base = CudaMatmulBiasKernel<In, T>;
    STRATA_RETURN_IF_ERROR(Base::Init(op));
    STRATA_ASSIGN_OR_RETURN(z_dtype_, MatmulBiasGeluZDtype<In>(op));
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const Tensor& bias = ctx.input(2);
    STRATA_ASSIGN_OR_RETURN(MatmulShape s, InferMatmulBiasShape(a.shape(), b.shape(), bias.shape(), this->tb_));
    STRATA_ASSIGN_OR_RETURN(const bool low_bias, this->LowBias(bias));
    if constexpr (!std::is_same_v<In, T>) {
      if (z_dtype_ != DT_INVALID || low_bias) return SixteenBitZ(ctx, device, a, b, bias, s, low_bias);
      if (this->template StoresAs<In>()) return Stored(ctx, device, a, b, bias, s);
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, s.y));
    STRATA_ASSIGN_OR_RETURN(Tensor * z, ctx.AllocateOutput(1, DataTypeOf<T>::value, s.y));
    return GeluInto(device, a, b, bias.data<T>(), s, y->data<T>(), z->data<T>());
  }

 private:
  // py = gelu(pz) and pz = a @ op(b) + bias, both [rows, N] of T: the fused
  // GEMM, or where it has no algorithm (and for F64) matmul_bias's kernel
  // then unary.cu's gelu.
  absl::Status GeluInto(CudaDevice* device, const Tensor& a, const Tensor& b, const T* pbias, const MatmulShape& s,
                        T* py, T* pz) {
    const int64_t rows = s.batch * s.m;
    if constexpr (std::is_same_v<T, float>) {
      using G = typename GemmType<In>::type;
      const G* pa = reinterpret_cast<const G*>(a.data<In>());
      const G* pb = reinterpret_cast<const G*>(b.data<In>());
      cuda::LtGemm& gemm = device->gemm();
      absl::Status fused;
      if constexpr (std::is_same_v<In, float>) {
        fused = gemm.MatmulBiasGelu(py, pz, pa, pb, pbias, rows, s.n, s.k, this->tb_, device->stream(), this->tf32_);
      } else {
        fused = gemm.MatmulBiasGelu(py, pz, pa, pb, pbias, rows, s.n, s.k, this->tb_, device->stream());
      }
      if (fused.code() != absl::StatusCode::kUnimplemented) return fused;
    }
    STRATA_RETURN_IF_ERROR(this->MatmulBiasInto(device, a, b, pbias, s, pz));
    return CudaStatus(cuda::LaunchUnary(cuda::UnaryOp::kGeluTanh, py, pz, rows * s.n, device->stream()),
                      "matmul_bias_gelu");
  }

  // out_dtype: y in a's 16-bit type, z float. One GEMM whose D is 16-bit
  // and whose aux and bias are float; where cuBLASLt takes no such
  // combination, matmul_bias's float z, then the gelu stored in 16 bits in
  // one pass (gelu then cast's bits).
  absl::Status Stored(KernelContext& ctx, CudaDevice* device, const Tensor& a, const Tensor& b, const Tensor& bias,
                      const MatmulShape& s) {
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<In>::value, s.y));
    STRATA_ASSIGN_OR_RETURN(Tensor * z, ctx.AllocateOutput(1, F32, s.y));
    using G = typename GemmType<In>::type;
    const int64_t rows = s.batch * s.m;
    absl::Status fused = device->gemm().MatmulBiasGelu(
        reinterpret_cast<G*>(y->data<In>()), z->data<float>(), reinterpret_cast<const G*>(a.data<In>()),
        reinterpret_cast<const G*>(b.data<In>()), bias.data<float>(), rows, s.n, s.k, this->tb_, device->stream());
    if (fused.code() != absl::StatusCode::kUnimplemented) return fused;
    STRATA_RETURN_IF_ERROR(this->MatmulBiasInto(device, a, b, bias.data<float>(), s, z->data<float>()));
    return CudaStatus(cuda::LaunchGeluTanhStored<In>(y->data<In>(), z->data<float>(), rows * s.n, device->stream()),
                      "matmul_bias_gelu");
  }

  // z_dtype, or a bias of a's 16-bit type (low_bias, passes/cast_bias): z
  // in a's 16-bit type, the float z = a @ op(b) + bias rounded once; y =
  // gelu of the float z (not of the rounded one), stored per out_dtype (a
  // 16-bit bias: in 16 bits). A 16-bit y: one GEMM whose D and aux are
  // 16-bit beside a float bias (the aux in D's type, cuBLASLt's default),
  // or beside a 16-bit one (all three of one type). Where cuBLASLt refuses
  // that or has no algorithm (N not a multiple of 8 included), and for a
  // float y: the float z into scratch (a float y's own fused GEMM writing it
  // as the aux) over the bias widened, y from it, then z cast from it.
  absl::Status SixteenBitZ(KernelContext& ctx, CudaDevice* device, const Tensor& a, const Tensor& b, const Tensor& bias,
                           const MatmulShape& s, bool low_bias) {
    using G = typename GemmType<In>::type;
    const bool low_y = this->template StoresAs<In>() || low_bias;
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, low_y ? DataTypeOf<In>::value : F32, s.y));
    STRATA_ASSIGN_OR_RETURN(Tensor * z, ctx.AllocateOutput(1, DataTypeOf<In>::value, s.y));
    const int64_t rows = s.batch * s.m, count = rows * s.n;
    if (low_y) {
      G* py = reinterpret_cast<G*>(y->data<In>());
      G* pz = reinterpret_cast<G*>(z->data<In>());
      const G* pa = reinterpret_cast<const G*>(a.data<In>());
      const G* pb = reinterpret_cast<const G*>(b.data<In>());
      absl::Status fused =
          low_bias ? device->gemm().MatmulBiasGelu(py, pz, pa, pb, reinterpret_cast<const G*>(bias.data<In>()), rows,
                                                   s.n, s.k, this->tb_, device->stream())
                   : device->gemm().MatmulBiasGelu(py, pz, pa, pb, bias.data<float>(), rows, s.n, s.k, this->tb_,
                                                   device->stream());
      if (fused.code() != absl::StatusCode::kUnimplemented) return fused;
    }
    STRATA_ASSIGN_OR_RETURN(auto wide_bias, this->WidenBias(ctx, device, bias, "matmul_bias_gelu"));
    STRATA_ASSIGN_OR_RETURN(Tensor wide, FloatScratch(ctx, count, "matmul_bias_gelu", " for z"));
    float* wide_z = wide.data<float>();
    if (low_y) {
      STRATA_RETURN_IF_ERROR(this->MatmulBiasInto(device, a, b, wide_bias.data, s, wide_z));
      STRATA_RETURN_IF_ERROR(CudaStatus(cuda::LaunchGeluTanhStored<In>(y->data<In>(), wide_z, count, device->stream()),
                                        "matmul_bias_gelu"));
    } else {
      STRATA_RETURN_IF_ERROR(GeluInto(device, a, b, wide_bias.data, s, y->data<float>(), wide_z));
    }
    return CudaStatus(cuda::LaunchCast<float, In>(z->data<In>(), wide_z, count, device->stream()), "matmul_bias_gelu");
  }

  DataType z_dtype_ = DT_INVALID;
};

// dz = gelu'(z) * (a @ op(b)), gelu's tanh form (matmul_gelu_grad,
// passes/fuse_epilogues: a gelu's output-gradient GEMM and the gelu_grad
// reading it): one GEMM over a's folded rows. F32, BF16 and F16 through
// cuBLASLt's DGELU epilogue, z its aux input and dz its D, both of a's type
// (FP32 products and sums; the product is not rounded to 16 bits before
// gelu' multiplies it, dz is rounded once). Where cuBLASLt has no such
// algorithm for the shape (N not a multiple of 8 included: the aux's
// leading dimension), and for F64: the GEMM, then unary.cu's tanh-form
// gelu_grad, for F32/F64 in place over dz (the unfused matmul and
// gelu_grad's bits), for BF16/F16 over the float product in scratch with
// dz rounded once (the CPU kernel's formula).
template <typename In>
class CudaMatmulGeluGradKernel : public CudaBiasGemmAttrsKernel {
 public:
  explicit CudaMatmulGeluGradKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    using G = typename GemmType<In>::type;
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const Tensor& z = ctx.input(2);
    STRATA_ASSIGN_OR_RETURN(MatmulShape s, InferMatmulGeluGradShape(a.shape(), b.shape(), z.shape(), tb_));
    STRATA_ASSIGN_OR_RETURN(Tensor * dz, ctx.AllocateOutput(0, DataTypeOf<In>::value, s.y));
    const G* pa = reinterpret_cast<const G*>(a.data<In>());
    const G* pb = reinterpret_cast<const G*>(b.data<In>());
    const G* pz = reinterpret_cast<const G*>(z.data<In>());
    G* pdz = reinterpret_cast<G*>(dz->data<In>());
    const int64_t rows = s.batch * s.m, count = rows * s.n;
    cuda::LtGemm& gemm = device->gemm();
    cudaStream_t stream = device->stream();
    if constexpr (!std::is_same_v<In, double>) {
      absl::Status fused;
      if constexpr (std::is_same_v<In, float>) {
        fused = gemm.MatmulGeluGrad(pdz, pa, pb, pz, rows, s.n, s.k, tb_, stream, tf32_);
      } else {
        fused = gemm.MatmulGeluGrad(pdz, pa, pb, pz, rows, s.n, s.k, tb_, stream);
      }
      if (fused.code() != absl::StatusCode::kUnimplemented) return fused;
    }
    if constexpr (std::is_same_v<In, float> || std::is_same_v<In, double>) {
      // Each element is read, then written, by one thread: dx may be dy.
      STRATA_RETURN_IF_ERROR(Gemm(gemm, pdz, pa, pb, rows, s.n, s.k, false, tb_, stream, false, tf32_));
      return CudaStatus(cuda::LaunchUnaryGrad(cuda::UnaryGradOp::kGeluTanhGrad, pdz, pz, pdz, count, stream),
                        "matmul_gelu_grad");
    } else {
      STRATA_ASSIGN_OR_RETURN(Tensor product, FloatScratch(ctx, count, "matmul_gelu_grad", " for the product"));
      STRATA_RETURN_IF_ERROR(gemm.Matmul(product.data<float>(), pa, pb, rows, s.n, s.k, false, tb_, stream));
      return CudaStatus(cuda::LaunchGeluGradStored<In, float, In>(cuda::UnaryGradOp::kGeluTanhGrad, dz->data<In>(),
                                                                  z.data<In>(), product.data<float>(), count, stream),
                        "matmul_gelu_grad");
    }
  }
};

// db and dbias for y = a @ op(b) + bias (passes/fuse_epilogues): one
// cuBLASLt GEMM over a's folded rows whose bias-gradient epilogue sums the dy
// operand it reads (db [K, N] = a^T @ dy with dy as b, BGRADA; with
// transpose_b db [N, K] = dy^T @ a with dy as a, BGRADB). F32 operands, or
// BF16/F16 into F32 db and dbias (FP32 products and sums, the 16-bit dy's
// elements summed in float). Where cuBLASLt has no such algorithm for the
// shape, for F64, and with cuda::FusedBiasGrad() off
// (STRATA_FUSED_BIAS_GRAD=0): matmul_shared_b_grad_b's GEMM, then
// sum_to_like's reduction (F32/F64), or for 16-bit dy a second GEMM,
// dbias = ones @ dy (which sums the 16-bit elements in float as the
// epilogue does).
template <typename In>
class CudaMatmulBiasGradBKernel : public CudaBiasGemmAttrsKernel {
 public:
  using T = std::conditional_t<std::is_same_v<In, double>, double, float>;
  explicit CudaMatmulBiasGradBKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& a = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(MatmulGradShape s, InferMatmulBiasGradBShape(a.shape(), dy.shape(), tb_));
    const int64_t K = s.k, N = s.n, rows = s.batch * s.m;
    STRATA_ASSIGN_OR_RETURN(Tensor * db, ctx.AllocateOutput(0, DataTypeOf<T>::value, s.out));
    STRATA_ASSIGN_OR_RETURN(Tensor * dbias, ctx.AllocateOutput(1, DataTypeOf<T>::value, Shape{N}));
    using G = typename GemmType<In>::type;
    const G* pa = reinterpret_cast<const G*>(a.data<In>());
    const G* pdy = reinterpret_cast<const G*>(dy.data<In>());
    T* pdb = db->data<T>();
    T* pbias = dbias->data<T>();
    cuda::LtGemm& gemm = device->gemm();
    cudaStream_t stream = device->stream();
    using Of = cuda::LtGemm::BiasGradOf;
    if constexpr (!std::is_same_v<In, double>) {
      if (cuda::FusedBiasGrad().load()) {
        absl::Status fused;
        if constexpr (std::is_same_v<In, float>) {
          fused = tb_ ? gemm.MatmulBiasGrad(pdb, pbias, pdy, pa, N, K, rows, true, false, Of::kA, stream, tf32_)
                      : gemm.MatmulBiasGrad(pdb, pbias, pa, pdy, K, N, rows, true, false, Of::kB, stream, tf32_);
        } else {
          fused = tb_ ? gemm.MatmulBiasGrad(pdb, pbias, pdy, pa, N, K, rows, true, false, Of::kA, stream)
                      : gemm.MatmulBiasGrad(pdb, pbias, pa, pdy, K, N, rows, true, false, Of::kB, stream);
        }
        if (fused.code() != absl::StatusCode::kUnimplemented) return fused;
      }
    }
    // Unfused: the weight gradient's GEMM (k = 0 zeroes db), then dbias.
    STRATA_RETURN_IF_ERROR(tb_ ? Gemm(gemm, pdb, pdy, pa, N, K, rows, true, false, stream, false, tf32_)
                               : Gemm(gemm, pdb, pa, pdy, K, N, rows, true, false, stream, false, tf32_));
    if constexpr (std::is_same_v<In, T>) {
      bool any = false;
      STRATA_ASSIGN_OR_RETURN(const std::vector<bool> reduced, SumToLikeDims(dy.shape(), Shape{N}, &any));
      if (!any) {
        return CudaStatus(cudaMemcpyAsync(pbias, pdy, dbias->bytes(), cudaMemcpyDeviceToDevice, stream),
                          "matmul_bias_grad_b");
      }
      cuda::ReducePlan plan;
      if (!cuda::MakeReducePlan(dy.rank(), dy.shape().data(), reduced, &plan)) {
        return absl::InternalError("matmul_bias_grad_b: no reduction plan for dy");  // [..., N] to [N] always has one
      }
      return CudaStatus(cuda::LaunchReduceSum(pbias, pdy, plan, stream), "matmul_bias_grad_b");
    } else {
      // dbias [1, N] = ones [1, rows] @ dy [rows, N], FP32 products and sums.
      if (rows == 0 || N == 0) return gemm.Matmul(pbias, pdy, pdy, 1, N, 0, false, false, stream);  // zeroes dbias
      Tensor ones = Tensor::Empty(dy.dtype(), Shape{rows}, &ctx.device());
      if (!ones.defined()) {
        return absl::ResourceExhaustedError(absl::StrCat("matmul_bias_grad_b: out of memory allocating ", rows,
                                                         " elements of scratch on ", ctx.device().name()));
      }
      const uint64_t one = std::is_same_v<In, bfloat16> ? 0x3F80 : 0x3C00;  // 1.0 in bf16 / fp16
      STRATA_RETURN_IF_ERROR(
          CudaStatus(cuda::LaunchFill(ones.data<In>(), sizeof(In), one, rows, stream), "matmul_bias_grad_b"));
      return gemm.Matmul(pbias, reinterpret_cast<const G*>(ones.data<In>()), pdy, 1, N, rows, false, false, stream);
    }
  }

};

// The memory plan's scratch for the matmul family on the GPU: what LtGemm
// stages (kernels/gemm_staging.h) for the GEMMs each kernel above issues,
// with the same sizes (one GEMM's at a time: each frees its own).
int64_t Staged(int64_t m, int64_t n, int64_t k, bool ta, bool tb, DataType ab, DataType c) {
  return cuda::PlanGemmStaging(m, n, k, ta, tb, DataTypeSize(ab), DataTypeSize(c)).scratch_bytes;
}

absl::StatusOr<bool> BoolAttrOr(const KernelDef& def, const char* name) {
  if (def.op == nullptr) return absl::InternalError("workspace without an op");
  return AttrBool(*def.op, name);
}

absl::StatusOr<int64_t> MatmulWorkspace(const KernelDef& def, int) {
  STRATA_ASSIGN_OR_RETURN(const bool ta, BoolAttrOr(def, "transpose_a"));
  STRATA_ASSIGN_OR_RETURN(const bool tb, BoolAttrOr(def, "transpose_b"));
  const DataType t = def.input_types[0].dtype;
  STRATA_ASSIGN_OR_RETURN(MatmulShape s, InferMatmulShape(def.input_types[0].shape, def.input_types[1].shape, ta, tb));
  if (!s.b_batched && !ta) return Staged(s.batch * s.m, s.n, s.k, false, tb, t, t);
  return s.batch == 0 ? int64_t{0} : Staged(s.m, s.n, s.k, ta, tb, t, t);
}

absl::StatusOr<int64_t> MatmulSharedBGradAWorkspace(const KernelDef& def, int) {
  STRATA_ASSIGN_OR_RETURN(const bool ta, BoolAttrOr(def, "transpose_a"));
  STRATA_ASSIGN_OR_RETURN(const bool tb, BoolAttrOr(def, "transpose_b"));
  const DataType t = def.input_types[0].dtype;
  STRATA_ASSIGN_OR_RETURN(MatmulGradShape s, InferMatmulSharedBGradAShape(def.input_types[0].shape,
                                                                          def.input_types[1].shape, ta, tb));
  if (!ta) return Staged(s.batch * s.m, s.k, s.n, false, !tb, t, t);
  return s.batch == 0 ? int64_t{0} : Staged(s.k, s.m, s.n, tb, true, t, t);
}

absl::StatusOr<int64_t> MatmulSharedBGradBWorkspace(const KernelDef& def, int) {
  STRATA_ASSIGN_OR_RETURN(const bool ta, BoolAttrOr(def, "transpose_a"));
  STRATA_ASSIGN_OR_RETURN(const bool tb, BoolAttrOr(def, "transpose_b"));
  const DataType t = def.input_types[0].dtype;
  STRATA_ASSIGN_OR_RETURN(MatmulGradShape s, InferMatmulSharedBGradBShape(def.input_types[0].shape,
                                                                          def.input_types[1].shape, ta, tb));
  if (!ta || s.batch == 0) {
    return tb ? Staged(s.n, s.k, s.batch * s.m, true, false, t, t) : Staged(s.k, s.n, s.batch * s.m, true, false, t, t);
  }
  return tb ? Staged(s.n, s.k, s.m, true, true, t, t) : Staged(s.k, s.n, s.m, false, false, t, t);
}

absl::StatusOr<int64_t> MatmulAccumulateWorkspace(const KernelDef& def, int) {
  STRATA_ASSIGN_OR_RETURN(const bool ta, BoolAttrOr(def, "transpose_a"));
  STRATA_ASSIGN_OR_RETURN(const bool tb, BoolAttrOr(def, "transpose_b"));
  const DataType t = def.input_types[0].dtype;
  STRATA_ASSIGN_OR_RETURN(MatmulGradShape s, InferMatmulAccumulateShape(def.input_types[0].shape,
                                                                        def.input_types[1].shape,
                                                                        def.input_types[2].shape, ta, tb));
  return Staged(s.m, s.n, s.k, ta, tb, t, t);
}

// The GEMM's staging scratch. With out_dtype (a 16-bit y over an F32 bias)
// the fused GEMM stages a 16-bit c, the fallback a float one (matmul_bias's
// into a float y's scratch, counted too; matmul_bias_gelu's into its z).
// matmul_bias_gelu with a 16-bit z (z_dtype): the fused GEMM's c as y's
// type, or the float z's scratch and a float c (the fallback, and a float
// y's fused GEMM). A 16-bit bias (16-bit y and z) as out_dtype and z_dtype,
// the fallback also widening the bias (N floats).
absl::StatusOr<int64_t> MatmulBiasWorkspace(const KernelDef& def, int) {
  STRATA_ASSIGN_OR_RETURN(const bool tb, BoolAttrOr(def, "transpose_b"));
  const DataType t = def.input_types[0].dtype;
  const DataType y = def.output_types.empty() ? t : def.output_types[0].dtype;
  STRATA_ASSIGN_OR_RETURN(MatmulShape s, InferMatmulBiasShape(def.input_types[0].shape, def.input_types[1].shape,
                                                              def.input_types[2].shape, tb));
  const int64_t rows = s.batch * s.m;
  const bool gelu = def.op != nullptr && def.op->type() == "matmul_bias_gelu";
  const bool stored = IsHalfFloating(y);
  const bool low_z = gelu && def.output_types.size() > 1 && IsHalfFloating(def.output_types[1].dtype);
  if (!stored && !low_z) return Staged(rows, s.n, s.k, false, tb, t, y);
  const int64_t wide_bias = IsHalfFloating(def.input_types[2].dtype) ? s.n * static_cast<int64_t>(sizeof(float)) : 0;
  const int64_t wide = (gelu && !low_z ? 0 : rows * s.n * static_cast<int64_t>(sizeof(float))) + wide_bias;
  return std::max(Staged(rows, s.n, s.k, false, tb, t, y), wide + Staged(rows, s.n, s.k, false, tb, t, F32));
}

// matmul_gelu_grad's GEMM over a's folded rows, fused (c of a's type) or
// not; for BF16/F16 the fallback's float product (rows * N floats) and its
// GEMM's staging with a float c.
absl::StatusOr<int64_t> MatmulGeluGradWorkspace(const KernelDef& def, int) {
  STRATA_ASSIGN_OR_RETURN(const bool tb, BoolAttrOr(def, "transpose_b"));
  if (def.input_types.size() < 3) return absl::InternalError("matmul_gelu_grad workspace without its three inputs");
  const DataType t = def.input_types[0].dtype;
  STRATA_ASSIGN_OR_RETURN(MatmulShape s, InferMatmulGeluGradShape(def.input_types[0].shape, def.input_types[1].shape,
                                                                  def.input_types[2].shape, tb));
  const int64_t rows = s.batch * s.m;
  const int64_t fused = Staged(rows, s.n, s.k, false, tb, t, t);
  if (!IsHalfFloating(t)) return fused;
  const int64_t product = rows * s.n * static_cast<int64_t>(sizeof(float));
  return std::max(fused, product + Staged(rows, s.n, s.k, false, tb, t, F32));
}

// The weight gradient's GEMM (fused or not), and the 16-bit fallback's ones
// vector (one element per row of dy) with its second GEMM.
absl::StatusOr<int64_t> MatmulBiasGradBWorkspace(const KernelDef& def, int) {
  STRATA_ASSIGN_OR_RETURN(const bool tb, BoolAttrOr(def, "transpose_b"));
  const DataType t = def.input_types[0].dtype;
  const DataType out = t == F64 ? F64 : F32;
  STRATA_ASSIGN_OR_RETURN(MatmulGradShape s,
                          InferMatmulBiasGradBShape(def.input_types[0].shape, def.input_types[1].shape, tb));
  const int64_t rows = s.batch * s.m;
  const int64_t gemm = tb ? Staged(s.n, s.k, rows, true, false, t, out) : Staged(s.k, s.n, rows, true, false, t, out);
  if (!IsHalfFloating(def.input_types[1].dtype)) return gemm;
  const Shape& dy = def.input_types[1].shape;
  const int64_t ones = dy.empty() || dy.back() == 0 ? 0 : NumElements(dy) / dy.back() * 2;
  return std::max(gemm, ones + Staged(1, s.n, rows, false, false, t, out));
}

STRATA_REGISTER_KERNEL("relu", DEVICE_CUDA, F32, MakeFactory<CudaReluKernel<float>>());
STRATA_REGISTER_KERNEL("relu", DEVICE_CUDA, F64, MakeFactory<CudaReluKernel<double>>());
STRATA_REGISTER_KERNEL("relu_grad", DEVICE_CUDA, F32, MakeFactory<CudaReluGradKernel<float>>());
STRATA_REGISTER_KERNEL("relu_grad", DEVICE_CUDA, F64, MakeFactory<CudaReluGradKernel<double>>());
STRATA_REGISTER_KERNEL("matmul", DEVICE_CUDA, F32, InitFactory<CudaMatmulKernel<float>>());
STRATA_REGISTER_KERNEL("matmul", DEVICE_CUDA, F64, InitFactory<CudaMatmulKernel<double>>());
STRATA_REGISTER_KERNEL("matmul", DEVICE_CUDA, BF16, InitFactory<CudaMatmulKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("matmul", DEVICE_CUDA, F16, InitFactory<CudaMatmulKernel<float16>>());
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_a", DEVICE_CUDA, F32, InitFactory<CudaMatmulSharedBGradAKernel<float>>());
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_a", DEVICE_CUDA, F64, InitFactory<CudaMatmulSharedBGradAKernel<double>>());
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_b", DEVICE_CUDA, F32, InitFactory<CudaMatmulSharedBGradBKernel<float>>());
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_b", DEVICE_CUDA, F64, InitFactory<CudaMatmulSharedBGradBKernel<double>>());
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_a", DEVICE_CUDA, BF16,
                       InitFactory<CudaMatmulSharedBGradAKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_b", DEVICE_CUDA, BF16,
                       InitFactory<CudaMatmulSharedBGradBKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_a", DEVICE_CUDA, F16, InitFactory<CudaMatmulSharedBGradAKernel<float16>>());
STRATA_REGISTER_KERNEL("matmul_shared_b_grad_b", DEVICE_CUDA, F16, InitFactory<CudaMatmulSharedBGradBKernel<float16>>());
STRATA_REGISTER_KERNEL("matmul_bias", DEVICE_CUDA, F32, (InitFactory<CudaMatmulBiasKernel<float, float>>()));
STRATA_REGISTER_KERNEL("matmul_bias", DEVICE_CUDA, F64, (InitFactory<CudaMatmulBiasKernel<double, double>>()));
STRATA_REGISTER_KERNEL("matmul_bias", DEVICE_CUDA, BF16, (InitFactory<CudaMatmulBiasKernel<bfloat16, float>>()));
STRATA_REGISTER_KERNEL("matmul_bias", DEVICE_CUDA, F16, (InitFactory<CudaMatmulBiasKernel<float16, float>>()));
STRATA_REGISTER_KERNEL("matmul_bias_gelu", DEVICE_CUDA, F32, (InitFactory<CudaMatmulBiasGeluKernel<float, float>>()));
STRATA_REGISTER_KERNEL("matmul_bias_gelu", DEVICE_CUDA, F64,
                       (InitFactory<CudaMatmulBiasGeluKernel<double, double>>()));
STRATA_REGISTER_KERNEL("matmul_bias_gelu", DEVICE_CUDA, BF16,
                       (InitFactory<CudaMatmulBiasGeluKernel<bfloat16, float>>()));
STRATA_REGISTER_KERNEL("matmul_bias_gelu", DEVICE_CUDA, F16, (InitFactory<CudaMatmulBiasGeluKernel<float16, float>>()));
STRATA_REGISTER_KERNEL("matmul_gelu_grad", DEVICE_CUDA, F32, InitFactory<CudaMatmulGeluGradKernel<float>>());
STRATA_REGISTER_KERNEL("matmul_gelu_grad", DEVICE_CUDA, F64, InitFactory<CudaMatmulGeluGradKernel<double>>());
STRATA_REGISTER_KERNEL("matmul_gelu_grad", DEVICE_CUDA, BF16, InitFactory<CudaMatmulGeluGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("matmul_gelu_grad", DEVICE_CUDA, F16, InitFactory<CudaMatmulGeluGradKernel<float16>>());
STRATA_REGISTER_WORKSPACE("matmul_gelu_grad", DEVICE_CUDA, MatmulGeluGradWorkspace);
STRATA_REGISTER_KERNEL("matmul_bias_grad_b", DEVICE_CUDA, F32, InitFactory<CudaMatmulBiasGradBKernel<float>>());
STRATA_REGISTER_KERNEL("matmul_bias_grad_b", DEVICE_CUDA, F64, InitFactory<CudaMatmulBiasGradBKernel<double>>());
STRATA_REGISTER_KERNEL("matmul_bias_grad_b", DEVICE_CUDA, BF16, InitFactory<CudaMatmulBiasGradBKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("matmul_bias_grad_b", DEVICE_CUDA, F16, InitFactory<CudaMatmulBiasGradBKernel<float16>>());
STRATA_REGISTER_WORKSPACE("matmul_bias_grad_b", DEVICE_CUDA, MatmulBiasGradBWorkspace);
STRATA_REGISTER_WORKSPACE("matmul", DEVICE_CUDA, MatmulWorkspace);
STRATA_REGISTER_WORKSPACE("matmul_shared_b_grad_a", DEVICE_CUDA, MatmulSharedBGradAWorkspace);
STRATA_REGISTER_WORKSPACE("matmul_shared_b_grad_b", DEVICE_CUDA, MatmulSharedBGradBWorkspace);
STRATA_REGISTER_WORKSPACE("matmul_accumulate", DEVICE_CUDA, MatmulAccumulateWorkspace);
STRATA_REGISTER_WORKSPACE("matmul_bias", DEVICE_CUDA, MatmulBiasWorkspace);
// The same GEMM (fused or the fallback's), the same staging scratch.
STRATA_REGISTER_WORKSPACE("matmul_bias_gelu", DEVICE_CUDA, MatmulBiasWorkspace);
STRATA_REGISTER_KERNEL("matmul_accumulate", DEVICE_CUDA, F32, InitFactory<CudaMatmulAccumulateKernel<float>>());
STRATA_REGISTER_KERNEL("matmul_accumulate", DEVICE_CUDA, F64, InitFactory<CudaMatmulAccumulateKernel<double>>());

}  // namespace
}  // namespace strata
