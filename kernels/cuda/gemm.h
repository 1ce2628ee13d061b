#ifndef STRATA_KERNELS_CUDA_GEMM_H_
#define STRATA_KERNELS_CUDA_GEMM_H_

// Row-major GEMM on the GPU through cuBLASLt, the GPU twin of
// kernels/cpu/gemm.h:
//   c[m, n] = op(a)[m, k] @ op(b)[k, n]
// with op transposing a stored [k, m] a or a stored [n, k] b. Operands are
// contiguous device memory. Float runs in FP32 (no TF32), so results match a
// CPU FP32 GEMM up to summation order. bf16 reads and writes bf16 and
// accumulates in FP32 (PyTorch's bf16 matmul).
//
// Each shape's descriptors and algorithm are chosen once and kept: a training
// step calls the same shapes every step, and cuBLASLt's heuristic costs more
// host time than a small GEMM's launch.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/env_switch.h"
#include "kernels/gemm_staging.h"

namespace strata {

class Allocator;  // runtime/allocator.h

namespace cuda {

// Whether matmul_bias_grad_b asks cuBLASLt for its bias-gradient epilogue
// (BGRADA / BGRADB: the weight gradient's GEMM sums dy as it reads it) or
// runs the plain GEMM and sums dy apart (for 16-bit dy a second GEMM,
// ones @ dy). On by default; STRATA_FUSED_BIAS_GRAD=0 turns it off for a
// process, so a GPU run can time both: on the H200 (2026-11-29) the fused
// GEMMs took 1.46x their plain GEMM's time (qkv.dw 0.063 against 0.043
// ms), where the separate sum reads dy once more (about 11 us at qkv's
// [8192, 2304] bf16). Each setting gives its own bits, every run the same.
inline std::atomic<bool>& FusedBiasGrad() {
  static std::atomic<bool> on{EnvSwitch("STRATA_FUSED_BIAS_GRAD", /*default_on=*/true)};
  return on;
}

// Owns a cuBLASLt handle, its workspace on the current device and the plans
// of the shapes it has run. Not thread safe: one per stream (or guard it).
class LtGemm {
 public:
  // 32 MiB is what cuBLAS recommends for Hopper's kernels.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // Fails (FailedPrecondition) when there is no usable CUDA device.
  static absl::StatusOr<std::unique_ptr<LtGemm>> Create(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Enqueues c = op(a) @ op(b) on `stream`; c is overwritten, or with
  // `accumulate` c += op(a) @ op(b) in place (beta = 1; c is cuBLASLt's C and
  // D both). Sizes of 0 are fine (k == 0 zeroes c, or leaves it as it is when
  // accumulating); negative sizes are InvalidArgument.
  // tf32: CUBLAS_COMPUTE_32F_FAST_TF32 (operands rounded to TF32 on tensor
  // cores; the strategy's allow_tf32), else full FP32 products.
  absl::Status Matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool transpose_a,
                      bool transpose_b, cudaStream_t stream, bool accumulate = false, bool tf32 = false);
  absl::Status Matmul(double* c, const double* a, const double* b, int64_t m, int64_t n, int64_t k, bool transpose_a,
                      bool transpose_b, cudaStream_t stream, bool accumulate = false);
  // bf16 operands and result, FP32 products and sums (CUBLAS_COMPUTE_32F),
  // rounded to bf16 on the way out; as under PyTorch's defaults, a split-K
  // algorithm may round its partial sums too. A buffer of strata::bfloat16
  // (runtime/float16.h) holds the same 16 bits: reinterpret_cast its pointer.
  absl::Status Matmul(__nv_bfloat16* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t m, int64_t n, int64_t k,
                      bool transpose_a, bool transpose_b, cudaStream_t stream, bool accumulate = false);

  // bf16 operands into a float c: FP32 products and sums, never rounded to bf16.
  absl::Status Matmul(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t m, int64_t n, int64_t k,
                      bool transpose_a, bool transpose_b, cudaStream_t stream, bool accumulate = false);
  // The same two for fp16 (F16 mixed precision): FP32 products and sums.
  absl::Status Matmul(__half* c, const __half* a, const __half* b, int64_t m, int64_t n, int64_t k, bool transpose_a,
                      bool transpose_b, cudaStream_t stream, bool accumulate = false);
  absl::Status Matmul(float* c, const __half* a, const __half* b, int64_t m, int64_t n, int64_t k, bool transpose_a,
                      bool transpose_b, cudaStream_t stream, bool accumulate = false);

  // c [m, n] = op(a) @ op(b) + bias (bias [n] broadcast over the rows),
  // the bias added in cuBLASLt's BIAS epilogue (rounded once with the
  // product). float, or bf16 operands into a float c (FP32 products and
  // sums, nothing rounded to bf16). Unimplemented when cuBLASLt has no
  // algorithm with that epilogue for the shape: the caller falls back to
  // Matmul and a separate add.
  // residual (matmul_bias's, passes/fuse_epilogues): c = op(a) @ op(b) +
  // bias + residual, residual [m, n] read as cuBLASLt's C with beta = 1 (C
  // and D of one type and layout; residual may be c itself); it may be
  // staged with c. Unimplemented as above: the caller adds it after.
  absl::Status MatmulBias(float* c, const float* a, const float* b, const float* bias, int64_t m, int64_t n, int64_t k,
                          bool transpose_b, cudaStream_t stream, bool tf32 = false, const float* residual = nullptr);
  absl::Status MatmulBias(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* bias, int64_t m,
                          int64_t n, int64_t k, bool transpose_b, cudaStream_t stream,
                          const float* residual = nullptr);
  absl::Status MatmulBias(float* c, const __half* a, const __half* b, const float* bias, int64_t m, int64_t n,
                          int64_t k, bool transpose_b, cudaStream_t stream, const float* residual = nullptr);
  // The same into a c of the operands' 16-bit type (passes/fold_casts'
  // out_dtype): FP32 products, sums and bias (a float bias vector,
  // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), rounded once to c's type on the
  // way out. Unimplemented where this cuBLASLt takes no float bias for a
  // 16-bit D or has no algorithm (remembered per shape): the caller computes
  // a float c and casts it.
  absl::Status MatmulBias(__nv_bfloat16* c, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* bias,
                          int64_t m, int64_t n, int64_t k, bool transpose_b, cudaStream_t stream);
  absl::Status MatmulBias(__half* c, const __half* a, const __half* b, const float* bias, int64_t m, int64_t n,
                          int64_t k, bool transpose_b, cudaStream_t stream);
  // The same with a bias of c's 16-bit type (passes/cast_bias; cuBLASLt's
  // default bias type, the one PyTorch's bf16 addmm and linear pass): FP32
  // products and sums, the bias widened into the float sum, c rounded once.
  // Unimplemented where cuBLASLt has no algorithm: the caller computes a
  // float c over the widened bias and casts it.
  absl::Status MatmulBias(__nv_bfloat16* c, const __nv_bfloat16* a, const __nv_bfloat16* b, const __nv_bfloat16* bias,
                          int64_t m, int64_t n, int64_t k, bool transpose_b, cudaStream_t stream);
  absl::Status MatmulBias(__half* c, const __half* a, const __half* b, const __half* bias, int64_t m, int64_t n,
                          int64_t k, bool transpose_b, cudaStream_t stream);

  // c [m, n] = gelu(z) and z [m, n] = op(a) @ op(b) + bias from one GEMM
  // (cuBLASLt's GELU_AUX_BIAS epilogue, z its aux output, the pre-activation
  // the backward's gelu_grad reads). cuBLASLt's GELU is the tanh form
  // (gelu's approximate "tanh"). float, or bf16/fp16 operands into float c
  // and z (FP32 products and sums; the aux takes c's type). Unimplemented
  // where cuBLASLt has no such algorithm for the shape (its heuristic also
  // sees z's alignment), or n is not a multiple of 8 (the aux's leading
  // dimension must be): the caller falls back to MatmulBias and a gelu.
  absl::Status MatmulBiasGelu(float* c, float* z, const float* a, const float* b, const float* bias, int64_t m,
                              int64_t n, int64_t k, bool transpose_b, cudaStream_t stream, bool tf32 = false);
  absl::Status MatmulBiasGelu(float* c, float* z, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* bias,
                              int64_t m, int64_t n, int64_t k, bool transpose_b, cudaStream_t stream);
  absl::Status MatmulBiasGelu(float* c, float* z, const __half* a, const __half* b, const float* bias, int64_t m,
                              int64_t n, int64_t k, bool transpose_b, cudaStream_t stream);
  // gelu(z) rounded once into a c of the operands' 16-bit type, z and the
  // bias float (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE and
  // BIAS_DATA_TYPE); Unimplemented as above where cuBLASLt takes no float
  // aux or bias beside a 16-bit D: the caller computes z and stores the gelu.
  absl::Status MatmulBiasGelu(__nv_bfloat16* c, float* z, const __nv_bfloat16* a, const __nv_bfloat16* b,
                              const float* bias, int64_t m, int64_t n, int64_t k, bool transpose_b,
                              cudaStream_t stream);
  absl::Status MatmulBiasGelu(__half* c, float* z, const __half* a, const __half* b, const float* bias, int64_t m,
                              int64_t n, int64_t k, bool transpose_b, cudaStream_t stream);
  // z too in the operands' 16-bit type (matmul_bias_gelu's z_dtype, mixed
  // precision's 16-bit gelu_grad reading it): the aux takes D's type, as
  // cuBLASLt documents for every aux but fp8's, the bias float. c =
  // gelu(z) from the float z before z is rounded, each rounded once.
  // Unimplemented as above where cuBLASLt takes no float bias beside a
  // 16-bit D, or has no algorithm: the caller computes a float z and
  // stores the gelu and z in 16 bits.
  absl::Status MatmulBiasGelu(__nv_bfloat16* c, __nv_bfloat16* z, const __nv_bfloat16* a, const __nv_bfloat16* b,
                              const float* bias, int64_t m, int64_t n, int64_t k, bool transpose_b,
                              cudaStream_t stream);
  absl::Status MatmulBiasGelu(__half* c, __half* z, const __half* a, const __half* b, const float* bias, int64_t m,
                              int64_t n, int64_t k, bool transpose_b, cudaStream_t stream);
  // And with the bias of c's type too (passes/cast_bias): D, aux and bias
  // in one 16-bit type, as PyTorch's bf16 _addmm_activation passes them.
  // Unimplemented where cuBLASLt has no algorithm: the caller computes a
  // float z over the widened bias and stores the gelu and z in 16 bits.
  absl::Status MatmulBiasGelu(__nv_bfloat16* c, __nv_bfloat16* z, const __nv_bfloat16* a, const __nv_bfloat16* b,
                              const __nv_bfloat16* bias, int64_t m, int64_t n, int64_t k, bool transpose_b,
                              cudaStream_t stream);
  absl::Status MatmulBiasGelu(__half* c, __half* z, const __half* a, const __half* b, const __half* bias, int64_t m,
                              int64_t n, int64_t k, bool transpose_b, cudaStream_t stream);

  // c [m, n] = gelu'(z) * (op(a) @ op(b)) with gelu's tanh form
  // (matmul_gelu_grad: a gelu's output-gradient GEMM fused with the
  // gelu_grad reading it), through cuBLASLt's DGELU epilogue, z [m, n] its
  // aux input: the pre-activation, laid out as c (rows n apart, unstaged)
  // and of c's type (cuBLASLt's default aux type, as llm.c and
  // TransformerEngine pass it). FP32 products and sums; the product is not
  // rounded to 16 bits before the derivative multiplies it, c is rounded
  // once. No bias. Unimplemented where cuBLASLt has no such algorithm for
  // the shape (its heuristic also sees z's alignment) or refuses it at the
  // call (both remembered per shape, with a line in epilogue_fallbacks()),
  // n is not a multiple of 8 (the aux's leading dimension must be), or
  // k = 0: the caller runs Matmul and a gelu_grad.
  absl::Status MatmulGeluGrad(float* c, const float* a, const float* b, const float* z, int64_t m, int64_t n,
                              int64_t k, bool transpose_b, cudaStream_t stream, bool tf32 = false);
  absl::Status MatmulGeluGrad(__nv_bfloat16* c, const __nv_bfloat16* a, const __nv_bfloat16* b,
                              const __nv_bfloat16* z, int64_t m, int64_t n, int64_t k, bool transpose_b,
                              cudaStream_t stream);
  absl::Status MatmulGeluGrad(__half* c, const __half* a, const __half* b, const __half* z, int64_t m, int64_t n,
                              int64_t k, bool transpose_b, cudaStream_t stream);

  // c [m, n] = op(a) @ op(b) and, from the same GEMM, bias_grad = the sums
  // over k of one operand (cuBLASLt's bias-gradient epilogues): of op(a),
  // bias_grad [m] (kA, BGRADB in cuBLASLt's terms, whose B is our a), or of
  // op(b), bias_grad [n] (kB, BGRADA). bias_grad has c's type: float, also
  // for bf16/fp16 operands (FP32 products and sums, the 16-bit operand's
  // elements summed in float). The weight and bias gradients of
  // y = x @ W + bias in one GEMM: dW = x^T @ dy with dy as b (kB), or
  // dW^T = dy^T @ x with dy as a (kA). Unimplemented when cuBLASLt has no
  // algorithm with that epilogue for the shape (or k = 0): the caller runs
  // Matmul and a separate sum.
  enum class BiasGradOf { kA, kB };
  absl::Status MatmulBiasGrad(float* c, float* bias_grad, const float* a, const float* b, int64_t m, int64_t n,
                              int64_t k, bool transpose_a, bool transpose_b, BiasGradOf of, cudaStream_t stream,
                              bool tf32 = false);
  absl::Status MatmulBiasGrad(float* c, float* bias_grad, const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t m,
                              int64_t n, int64_t k, bool transpose_a, bool transpose_b, BiasGradOf of,
                              cudaStream_t stream);
  absl::Status MatmulBiasGrad(float* c, float* bias_grad, const __half* a, const __half* b, int64_t m, int64_t n,
                              int64_t k, bool transpose_a, bool transpose_b, BiasGradOf of, cudaStream_t stream);

  // `batch` products in one cuBLASLt call (its strided batch), each operand's
  // items one after another: c_i = alpha op(a_i) @ op(b_i) with a_i at
  // a + i*m*k, b_i at b + i*k*n and c_i at c + i*m*n. Float in FP32 (TF32 on
  // request), double in FP64.
  absl::Status BatchedMatmul(float* c, const float* a, const float* b, int64_t batch, int64_t m, int64_t n, int64_t k,
                             bool transpose_a, bool transpose_b, float alpha, cudaStream_t stream, bool tf32 = false);
  absl::Status BatchedMatmul(double* c, const double* a, const double* b, int64_t batch, int64_t m, int64_t n,
                             int64_t k, bool transpose_a, bool transpose_b, double alpha, cudaStream_t stream);

  // The same with bf16 or fp16 operands (FP32 products and sums): into a
  // float c, or into a c of the operands' type rounded once.
  absl::Status BatchedMatmul(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t batch, int64_t m,
                             int64_t n, int64_t k, bool transpose_a, bool transpose_b, float alpha,
                             cudaStream_t stream);
  absl::Status BatchedMatmul(__nv_bfloat16* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t batch, int64_t m,
                             int64_t n, int64_t k, bool transpose_a, bool transpose_b, float alpha,
                             cudaStream_t stream);
  absl::Status BatchedMatmul(float* c, const __half* a, const __half* b, int64_t batch, int64_t m, int64_t n, int64_t k,
                             bool transpose_a, bool transpose_b, float alpha, cudaStream_t stream);
  absl::Status BatchedMatmul(__half* c, const __half* a, const __half* b, int64_t batch, int64_t m, int64_t n,
                             int64_t k, bool transpose_a, bool transpose_b, float alpha, cudaStream_t stream);

  // How many shapes have a plan, or a remembered "no algorithm" (for tests).
  size_t cached_plans() const { return plans_.size(); }
  // How many times cuBLASLt refused a float bias or aux beside a 16-bit D
  // (the callers then took their two-pass fallback): which path ran.
  int64_t float_epilogue_refusals() const { return float_epilogue_refusals_; }
  // The fused-epilogue GEMMs this LtGemm ran as two passes, one line per
  // shape in the order found: no algorithm for the epilogue, or a float bias
  // or aux beside a 16-bit D refused (e.g. "cuBLASLt refused GELU_AUX_BIAS
  // (bf16 a and b, bf16 D with a float bias and aux, m=8192 n=3072 k=768):
  // the GEMM and its epilogue ran as two passes"), for a run to report where
  // cuBLASLt did not take the fusion its plan asked for. Grows as plans are
  // made; lines are never removed.
  const std::vector<std::string>& epilogue_fallbacks() const { return epilogue_fallbacks_; }

  // Scratch for one-product GEMMs with a row not a multiple of 16 bytes
  // (kernels/gemm_staging.h): such an operand is copied into scratch with
  // padded rows, the GEMM runs on the aligned copy, and a staged c is copied
  // back, all on the GEMM's stream; the scratch is freed after (the
  // allocator must reuse it only for work the stream runs later, as the
  // device's caching allocator does). CudaDevice sets its allocator; without
  // one, or when the allocation fails, the GEMM runs on the operands as they
  // are. The memory plan counts the scratch (the matmul family's workspace
  // functions call PlanGemmStaging with the same sizes).
  void set_scratch_allocator(Allocator* allocator) { scratch_ = allocator; }
  // GEMMs of fewer FLOPs (2 m n k) are not staged; tests lower it to 0.
  void set_staging_min_flops(double flops) { staging_min_flops_ = flops; }

 private:
  // What a plan depends on: the heuristic's choice changes with the operands'
  // alignment, so a view into the middle of a buffer gets its own plan.
  struct PlanKey {
    cudaDataType_t type;          // of a and b
    cudaDataType_t c_type;        // of c (and of the bias or bias gradient)
    cublasLtEpilogue_t epilogue;  // DEFAULT, BIAS, GELU_AUX_BIAS, DGELU, BGRADA or BGRADB
    cublasComputeType_t compute;
    cudaDataType_t scale_type;  // of alpha and beta
    int64_t batch, m, n, k;     // batch 1: one product
    bool transpose_a, transpose_b;
    uint32_t alignment_a, alignment_b, alignment_c;
    int64_t pitch_a, pitch_b, pitch_c;  // row pitches in elements (the stored rows' lengths unless staged)
    uint32_t alignment_aux = 0;         // GELU_AUX_BIAS's or DGELU's z (the heuristic reads its alignment)
    uint32_t alignment_bias = 0;        // the bias or bias gradient's (likewise)
    bool float_epilogue = false;        // the bias float beside a 16-bit c
    bool float_aux = false;             // and GELU_AUX_BIAS's aux float too (else c's type)

    friend bool operator==(const PlanKey& x, const PlanKey& y) {
      return std::tie(x.type, x.c_type, x.epilogue, x.compute, x.scale_type, x.batch, x.m, x.n, x.k, x.transpose_a,
                      x.transpose_b, x.alignment_a, x.alignment_b, x.alignment_c, x.pitch_a, x.pitch_b, x.pitch_c,
                      x.alignment_aux, x.alignment_bias, x.float_epilogue, x.float_aux) ==
             std::tie(y.type, y.c_type, y.epilogue, y.compute, y.scale_type, y.batch, y.m, y.n, y.k, y.transpose_a,
                      y.transpose_b, y.alignment_a, y.alignment_b, y.alignment_c, y.pitch_a, y.pitch_b, y.pitch_c,
                      y.alignment_aux, y.alignment_bias, y.float_epilogue, y.float_aux);
    }
    template <typename H>
    friend H AbslHashValue(H h, const PlanKey& key) {
      return H::combine(std::move(h), key.type, key.c_type, key.epilogue, key.compute, key.scale_type, key.batch, key.m,
                        key.n, key.k, key.transpose_a, key.transpose_b, key.alignment_a, key.alignment_b,
                        key.alignment_c, key.pitch_a, key.pitch_b, key.pitch_c, key.alignment_aux, key.alignment_bias,
                        key.float_epilogue, key.float_aux);
    }
  };
  struct Plan;  // descriptors and algorithm, in gemm.cc

  LtGemm(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes);
  // The descriptors for `key` and the heuristic's first algorithm.
  absl::StatusOr<std::unique_ptr<Plan>> MakePlan(const PlanKey& key) const;
  // c_bytes: the size of one element of c; bias: null, or the vector of
  // `epilogue` (c_type's): BIAS reads it, BGRADA/BGRADB write it. An
  // epilogue with a bias applies only when bias is given, DGELU (no bias)
  // only when aux is; else the plain GEMM runs. stage: misaligned rows may
  // go through scratch (set_scratch_allocator); the batched calls
  // (attention's, whose workspace counts no such scratch) pass false. aux:
  // GELU_AUX_BIAS's z (written) or DGELU's (read), [m, n] with rows n
  // apart, else null.
  // float_epilogue: the bias is float beside a 16-bit c, and with
  // float_aux GELU_AUX_BIAS's aux too (else the aux has c's type); where
  // cuBLASLt refuses that, at the plan or at the call, Unimplemented, and
  // the shape is remembered as having no algorithm. c_in: null, or
  // cuBLASLt's C when it is not c (D): laid out as c, beta 1 (c = product +
  // bias + c_in); a staged c is first copied from it, as `accumulate` copies
  // c itself. The plan key takes the lesser alignment of c and c_in.
  absl::Status MatmulImpl(cudaDataType_t type, cudaDataType_t c_type, cublasComputeType_t compute,
                          cudaDataType_t scale_type, const void* alpha, const void* beta, bool accumulate,
                          size_t c_bytes, void* c, const void* a, const void* b, const void* bias, int64_t m, int64_t n,
                          int64_t k, bool transpose_a, bool transpose_b, cudaStream_t stream, int64_t batch = 1,
                          cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS, bool stage = true, void* aux = nullptr,
                          bool float_epilogue = false, bool float_aux = false, const void* c_in = nullptr);

  // The plan key of a GEMM on these operands, whose rows start pitch_*
  // elements apart (batch 1 for pitches other than the rows' lengths).
  static PlanKey KeyFor(cudaDataType_t type, cudaDataType_t c_type, cublasComputeType_t compute,
                        cudaDataType_t scale_type, cublasLtEpilogue_t epilogue, int64_t batch, int64_t m, int64_t n,
                        int64_t k, bool transpose_a, bool transpose_b, const void* a, const void* b, const void* c,
                        int64_t pitch_a, int64_t pitch_b, int64_t pitch_c);
  // The key's plan, made on first use. A key cuBLASLt has no algorithm for
  // is remembered as such (Unimplemented, every call, without asking again).
  absl::StatusOr<Plan*> GetPlan(const PlanKey& key);
  // The cublasLtMatmul call itself; c_in is cuBLASLt's C (null: c, D).
  absl::Status Launch(Plan& plan, const void* alpha, const void* beta, void* c, const void* a, const void* b,
                      const void* bias, void* aux, cudaStream_t stream, const void* c_in = nullptr);

  cublasLtHandle_t handle_;
  void* workspace_;
  size_t workspace_bytes_;
  Allocator* scratch_ = nullptr;
  double staging_min_flops_ = kStagingMinFlops;
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans_;
  int64_t float_epilogue_refusals_ = 0;
  std::vector<std::string> epilogue_fallbacks_;
  // Remembers `key` as having no plan (its epilogue runs apart), with its
  // line in epilogue_fallbacks_ where it has an epilogue.
  void RememberNoPlan(const PlanKey& key, bool refused);
};

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_GEMM_H_
