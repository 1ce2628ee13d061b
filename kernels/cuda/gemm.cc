// cuBLASLt GEMM for row-major operands.
// Blocks: whatever algorithm cuBLASLt's heuristic picks for the shape, asked
// once per plan key (types, sizes, transposes, alignments) and then reused.
//
// cuBLASLt is column-major. A row-major [r, c] matrix is the column-major
// [c, r] matrix over the same bytes, so row-major c = op(a) @ op(b) is
// column-major c^T = op(b)^T @ op(a)^T: we hand cuBLASLt b as its A and a as
// its B, with m and n swapped, and nothing is copied.

#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/allocator.h"

namespace strata {
namespace cuda {
namespace {

// NOT_SUPPORTED (no algorithm or attribute for these types or this epilogue)
// is Unimplemented, which MatmulBias's callers answer with GEMM + add;
// INVALID_VALUE (cublasLt.h's answer to an unsupported type combination) is
// InvalidArgument, which a float epilogue beside a 16-bit D takes as a
// refusal too (MatmulImpl); anything else is Internal.
absl::Status LtError(cublasStatus_t status, const char* what) {
  const std::string message = absl::StrCat("cuBLASLt ", what, " failed: ", cublasLtGetStatusString(status));
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return absl::UnimplementedError(message);
  if (status == CUBLAS_STATUS_INVALID_VALUE) return absl::InvalidArgumentError(message);
  return absl::InternalError(message);
}

// Whether a float bias or aux beside a 16-bit D was refused (rather than the
// GEMM failing for another reason, which must surface).
bool RefusedCombination(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnimplemented || s.code() == absl::StatusCode::kInvalidArgument;
}

absl::Status CudaError(cudaError_t error, const char* what) {
  return absl::InternalError(absl::StrCat("CUDA ", what, " failed: ", cudaGetErrorString(error)));
}

#define STRATA_LT_RETURN_IF_ERROR(expr, what)        \
  do {                                               \
    const cublasStatus_t strata_lt_status = (expr);  \
    if (strata_lt_status != CUBLAS_STATUS_SUCCESS) { \
      return LtError(strata_lt_status, what);        \
    }                                                \
  } while (false)

// Owners of the descriptors, so every early return frees them.
struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* d) const { cublasLtMatrixLayoutDestroy(d); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* d) const { cublasLtMatmulPreferenceDestroy(d); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

// The column-major layout of a row-major [rows, cols] matrix whose rows
// start `pitch` elements apart (cols: contiguous).
absl::StatusOr<Layout> RowMajorLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t pitch) {
  cublasLtMatrixLayout_t raw = nullptr;
  STRATA_LT_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&raw, type, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), pitch),
      "matrix layout");
  return Layout(raw);
}

// The largest power of two (up to 256) that divides the address. cuBLASLt's
// heuristic assumes 256-byte aligned operands unless told otherwise, and a
// caller may pass a view into the middle of a buffer.
uint32_t Alignment(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// Whether `epilogue` reads or writes CUBLASLT_MATMUL_DESC_BIAS_POINTER (and
// so has a BIAS_DATA_TYPE), and whether it reads or writes the aux matrix
// (EPILOGUE_AUX_POINTER, laid out as c). DGELU has an aux and no bias.
bool EpilogueUsesBias(cublasLtEpilogue_t epilogue) {
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_BGRADB:
      return true;
    default:
      return false;
  }
}
bool EpilogueUsesAux(cublasLtEpilogue_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_DGELU;
}

// A bias of D's 16-bit type (passes/cast_bias): cuBLASLt's documented
// combination, never yet run on a GPU when written (2026-11-29), so a
// refusal of it (INVALID_VALUE or NOT_SUPPORTED, at the plan or at the
// call) is taken as the float bias's is: the shape's "no algorithm", its
// line in epilogue_fallbacks(), the caller's two passes.
bool SixteenBitBias(cublasLtEpilogue_t epilogue, cudaDataType_t c_type, bool float_epilogue) {
  return !float_epilogue && (epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) &&
         (c_type == CUDA_R_16BF || c_type == CUDA_R_16F);
}

const char* EpilogueName(cublasLtEpilogue_t epilogue) {
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU:
      return "DGELU";
    case CUBLASLT_EPILOGUE_BGRADA:
      return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "BGRADB";
    default:
      return "an epilogue";
  }
}

// Bytes of one element of a cuBLASLt operand type.
int64_t TypeBytes(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_64F:
      return 8;
    case CUDA_R_32F:
      return 4;
    default:
      return 2;  // CUDA_R_16BF, CUDA_R_16F
  }
}

// A [rows, cols] block between row pitches (in elements), on `stream`.
absl::Status Copy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t rows, int64_t cols,
                    int64_t bytes, cudaStream_t stream) {
  const cudaError_t error =
      cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch * bytes), src, static_cast<size_t>(src_pitch * bytes),
                        static_cast<size_t>(cols * bytes), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream);
  return error == cudaSuccess ? absl::OkStatus() : CudaError(error, "GEMM staging copy");
}

}  // namespace

// Everything cublasLtMatmul needs besides the pointers, for one PlanKey.
struct LtGemm::Plan {
  MatmulDesc desc;
  Layout a_layout, b_layout, c_layout;  // our a, b, c (cuBLASLt's B, A, C and D)
  cublasLtMatmulAlgo_t algo;
};

absl::StatusOr<std::unique_ptr<LtGemm::Plan>> LtGemm::MakePlan(const PlanKey& key) const {
  // Combinations cuBLASLt does not run, per NVIDIA's own wrappers
  // (nvmath-python): DGELU over k = 1, and a bias gradient of a transposed
  // A (BGRADA) or of an untransposed B (BGRADB), in cuBLASLt's terms: our b
  // and a. No algorithm, as the heuristic would say: the caller runs two
  // passes, and the shape is remembered and reported (epilogue_fallbacks).
  const bool dgelu = key.epilogue == CUBLASLT_EPILOGUE_DGELU || key.epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  if ((dgelu && key.k == 1) || (key.epilogue == CUBLASLT_EPILOGUE_BGRADA && key.transpose_b) ||
      (key.epilogue == CUBLASLT_EPILOGUE_BGRADB && !key.transpose_a)) {
    return absl::UnimplementedError(absl::StrCat("cuBLASLt runs no ", EpilogueName(key.epilogue), " for k=", key.k,
                                                 " transpose_a=", key.transpose_a, " transpose_b=", key.transpose_b));
  }
  auto plan = std::make_unique<Plan>();
  // cuBLASLt's (A, B, C) = our (b, a, c) in column-major terms; see the top.
  cublasLtMatmulDesc_t raw_desc = nullptr;
  STRATA_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&raw_desc, key.compute, key.scale_type), "matmul desc");
  plan->desc.reset(raw_desc);
  const cublasOperation_t op_a = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "set transa");
  STRATA_LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "set transb");
  if (key.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    // BIAS: cuBLASLt's bias runs along its rows, our c's columns, one per
    // output feature. BGRADA sums its A (our b) over k, one per row of its
    // D (our n); BGRADB its B (our a), one per column of its D (our m).
    const cublasLtEpilogue_t epilogue = key.epilogue;
    STRATA_LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
        "set epilogue");
    if (EpilogueUsesBias(epilogue)) {
      const cudaDataType_t bias_type = key.float_epilogue ? CUDA_R_32F : key.c_type;
      STRATA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                               &bias_type, sizeof(bias_type)),
                                "set bias type");
      // As for the aux below: the heuristic reads the bias pointer's
      // alignment only (cublasLt.h), so a stand-in with the real one's
      // alignment (in the key) picks the algorithm; Launch sets the real one.
      const void* stand_in = reinterpret_cast<const void*>(static_cast<uintptr_t>(key.alignment_bias));
      STRATA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                               &stand_in, sizeof(stand_in)),
                                "set bias pointer");
    }
  }
  if (key.float_aux && key.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
    // z stays float for a float gelu_grad, whatever D's type.
    const cudaDataType_t aux_type = CUDA_R_32F;
    STRATA_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->desc.get(),
                                                             CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                                             sizeof(aux_type)),
                              "set aux type");
  }
  if (EpilogueUsesAux(key.epilogue)) {
    // The aux (z: GELU_AUX_BIAS writes it, DGELU reads it) is laid out as
    // c, unstaged: its leading dimension is our n (cuBLASLt's rows), a
    // multiple of 8 (MatmulImpl checked). Its type defaults to D's
    // (c_type): float z for float c, bf16 operands included, and a 16-bit z
    // beside a 16-bit c (z_dtype, and DGELU's 16-bit z); float_aux makes
    // GELU_AUX_BIAS's float beside a 16-bit c (above).
    const int64_t aux_ld = key.n;
    STRATA_LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)),
        "set aux ld");
    // The heuristic does not dereference the aux pointer, only reads its
    // alignment (cublasLt.h): a stand-in address with the real one's
    // alignment picks the algorithm; Launch sets the real pointer.
    const void* stand_in = reinterpret_cast<const void*>(static_cast<uintptr_t>(key.alignment_aux));
    STRATA_LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan->desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &stand_in,
                                       sizeof(stand_in)),
        "set aux pointer");
  }

  // Stored shapes (row-major): b is [k, n] or, transposed, [n, k]; a is
  // [m, k] or [k, m]; c is [m, n].
  const int64_t m = key.m, n = key.n, k = key.k;
  absl::StatusOr<Layout> b_layout =
      key.transpose_b ? RowMajorLayout(key.type, n, k, key.pitch_b) : RowMajorLayout(key.type, k, n, key.pitch_b);
  if (!b_layout.ok()) return b_layout.status();
  absl::StatusOr<Layout> a_layout =
      key.transpose_a ? RowMajorLayout(key.type, k, m, key.pitch_a) : RowMajorLayout(key.type, m, k, key.pitch_a);
  if (!a_layout.ok()) return a_layout.status();
  absl::StatusOr<Layout> c_layout = RowMajorLayout(key.c_type, m, n, key.pitch_c);
  if (!c_layout.ok()) return c_layout.status();
  plan->a_layout = *std::move(a_layout);
  plan->b_layout = *std::move(b_layout);
  plan->c_layout = *std::move(c_layout);
  if (key.batch > 1) {
    // Each operand's items one after another.
    const int32_t count = static_cast<int32_t>(key.batch);
    const std::pair<cublasLtMatrixLayout_t, int64_t> strided[] = {
        {plan->a_layout.get(), m * k}, {plan->b_layout.get(), k * n}, {plan->c_layout.get(), m * n}};
    for (const auto& [layout, stride] : strided) {
      STRATA_LT_RETURN_IF_ERROR(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
          "set batch count");
      STRATA_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                                 &stride, sizeof(stride)),
                                "set batch stride");
    }
  }

  // The preference only steers the heuristic; the plan does not keep it.
  cublasLtMatmulPreference_t raw_preference = nullptr;
  STRATA_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_preference), "preference");
  Preference preference(raw_preference);
  const uint64_t max_workspace = workspace_bytes_;
  STRATA_LT_RETURN_IF_ERROR(
      cublasLtMatmulPreferenceSetAttribute(preference.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                           sizeof(max_workspace)),
      "set workspace preference");
  // cuBLASLt's A is our b, its B our a, its C and D our c.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.alignment_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.alignment_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.alignment_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.alignment_c},
  };
  for (const auto& [attribute, alignment] : alignments) {
    STRATA_LT_RETURN_IF_ERROR(
        cublasLtMatmulPreferenceSetAttribute(preference.get(), attribute, &alignment, sizeof(alignment)),
        "set alignment preference");
  }

  cublasLtMatmulHeuristicResult_t heuristic = {};
  int found = 0;
  STRATA_LT_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(
                                handle_, plan->desc.get(), plan->b_layout.get(), plan->a_layout.get(),
                                plan->c_layout.get(), plan->c_layout.get(), preference.get(), 1, &heuristic, &found),
                            "algorithm heuristic");
  // The result's fields are valid only where its state is SUCCESS (cublasLt.h).
  if (found == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS) {
    return absl::UnimplementedError(absl::StrCat("cuBLASLt has no algorithm for m=", m, " n=", n, " k=", k,
                                                 " transpose_a=", key.transpose_a, " transpose_b=", key.transpose_b));
  }
  plan->algo = heuristic.algo;
  return plan;
}

LtGemm::LtGemm(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes)
    : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}

absl::StatusOr<std::unique_ptr<LtGemm>> LtGemm::Create(size_t workspace_bytes) {
  int devices = 0;
  const cudaError_t count_error = cudaGetDeviceCount(&devices);
  if (count_error != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device for cuBLASLt: ",
                     count_error != cudaSuccess ? cudaGetErrorString(count_error) : "device count is 0"));
  }
  cublasLtHandle_t handle = nullptr;
  STRATA_LT_RETURN_IF_ERROR(cublasLtCreate(&handle), "create");
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    const cudaError_t error = cudaMalloc(&workspace, workspace_bytes);
    if (error != cudaSuccess) {
      cublasLtDestroy(handle);
      return CudaError(error, "workspace allocation");
    }
  }
  return std::unique_ptr<LtGemm>(new LtGemm(handle, workspace, workspace_bytes));
}

LtGemm::~LtGemm() {
  plans_.clear();  // descriptors before the handle they were used with
  if (workspace_ != nullptr) cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

absl::Status LtGemm::Matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool transpose_a,
                            bool transpose_b, cudaStream_t stream, bool accumulate, bool tf32) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // CUBLAS_COMPUTE_32F unless asked: full FP32 products, like the CPU.
  return MatmulImpl(CUDA_R_32F, CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F,
                    &alpha, &beta, accumulate, sizeof(float), c, a, b, nullptr, m, n, k, transpose_a, transpose_b,
                    stream);
}

absl::Status LtGemm::Matmul(double* c, const double* a, const double* b, int64_t m, int64_t n, int64_t k,
                            bool transpose_a, bool transpose_b, cudaStream_t stream, bool accumulate) {
  const double alpha = 1.0, beta = accumulate ? 1.0 : 0.0;
  return MatmulImpl(CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F, &alpha, &beta, accumulate, sizeof(double),
                    c, a, b, nullptr, m, n, k, transpose_a, transpose_b, stream);
}

absl::Status LtGemm::Matmul(__nv_bfloat16* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t m, int64_t n,
                            int64_t k, bool transpose_a, bool transpose_b, cudaStream_t stream, bool accumulate) {
  // FP32 accumulation, so alpha and beta are floats (the scale type).
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, accumulate,
                    sizeof(__nv_bfloat16), c, a, b, nullptr, m, n, k, transpose_a, transpose_b, stream);
}

absl::Status LtGemm::Matmul(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t m, int64_t n, int64_t k,
                            bool transpose_a, bool transpose_b, cudaStream_t stream, bool accumulate) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, accumulate, sizeof(float),
                    c, a, b, nullptr, m, n, k, transpose_a, transpose_b, stream);
}

absl::Status LtGemm::Matmul(__half* c, const __half* a, const __half* b, int64_t m, int64_t n, int64_t k,
                            bool transpose_a, bool transpose_b, cudaStream_t stream, bool accumulate) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, accumulate, sizeof(__half),
                    c, a, b, nullptr, m, n, k, transpose_a, transpose_b, stream);
}

absl::Status LtGemm::Matmul(float* c, const __half* a, const __half* b, int64_t m, int64_t n, int64_t k,
                            bool transpose_a, bool transpose_b, cudaStream_t stream, bool accumulate) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, accumulate, sizeof(float), c,
                    a, b, nullptr, m, n, k, transpose_a, transpose_b, stream);
}

absl::Status LtGemm::MatmulBias(float* c, const __half* a, const __half* b, const float* bias, int64_t m, int64_t n,
                                int64_t k, bool transpose_b, cudaStream_t stream, const float* residual) {
  const float alpha = 1.0f, beta = residual != nullptr ? 1.0f : 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(float), c, a,
                    b, bias, m, n, k, false, transpose_b, stream, 1, CUBLASLT_EPILOGUE_BIAS, /*stage=*/true,
                    /*aux=*/nullptr, /*float_epilogue=*/false, /*float_aux=*/false, residual);
}

absl::Status LtGemm::MatmulBias(float* c, const float* a, const float* b, const float* bias, int64_t m, int64_t n,
                                int64_t k, bool transpose_b, cudaStream_t stream, bool tf32, const float* residual) {
  const float alpha = 1.0f, beta = residual != nullptr ? 1.0f : 0.0f;
  return MatmulImpl(CUDA_R_32F, CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F,
                    &alpha, &beta, false, sizeof(float), c, a, b, bias, m, n, k, false, transpose_b, stream, 1,
                    CUBLASLT_EPILOGUE_BIAS, /*stage=*/true, /*aux=*/nullptr, /*float_epilogue=*/false,
                    /*float_aux=*/false, residual);
}

absl::Status LtGemm::MatmulBias(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* bias, int64_t m,
                                int64_t n, int64_t k, bool transpose_b, cudaStream_t stream, const float* residual) {
  const float alpha = 1.0f, beta = residual != nullptr ? 1.0f : 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(float), c, a,
                    b, bias, m, n, k, false, transpose_b, stream, 1, CUBLASLT_EPILOGUE_BIAS, /*stage=*/true,
                    /*aux=*/nullptr, /*float_epilogue=*/false, /*float_aux=*/false, residual);
}

absl::Status LtGemm::MatmulBias(__nv_bfloat16* c, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* bias,
                                int64_t m, int64_t n, int64_t k, bool transpose_b, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false,
                    sizeof(__nv_bfloat16), c, a, b, bias, m, n, k, false, transpose_b, stream, 1,
                    CUBLASLT_EPILOGUE_BIAS, /*stage=*/true, /*aux=*/nullptr, /*float_epilogue=*/true);
}

absl::Status LtGemm::MatmulBias(__half* c, const __half* a, const __half* b, const float* bias, int64_t m, int64_t n,
                                int64_t k, bool transpose_b, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(__half), c, a,
                    b, bias, m, n, k, false, transpose_b, stream, 1, CUBLASLT_EPILOGUE_BIAS, /*stage=*/true,
                    /*aux=*/nullptr, /*float_epilogue=*/true);
}

absl::Status LtGemm::MatmulBias(__nv_bfloat16* c, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                const __nv_bfloat16* bias, int64_t m, int64_t n, int64_t k, bool transpose_b,
                                cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false,
                    sizeof(__nv_bfloat16), c, a, b, bias, m, n, k, false, transpose_b, stream, 1,
                    CUBLASLT_EPILOGUE_BIAS);
}

absl::Status LtGemm::MatmulBias(__half* c, const __half* a, const __half* b, const __half* bias, int64_t m, int64_t n,
                                int64_t k, bool transpose_b, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(__half), c, a,
                    b, bias, m, n, k, false, transpose_b, stream, 1, CUBLASLT_EPILOGUE_BIAS);
}

absl::Status LtGemm::MatmulBiasGelu(__nv_bfloat16* c, float* z, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    const float* bias, int64_t m, int64_t n, int64_t k, bool transpose_b,
                                    cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false,
                    sizeof(__nv_bfloat16), c, a, b, bias, m, n, k, false, transpose_b, stream, 1,
                    CUBLASLT_EPILOGUE_GELU_AUX_BIAS, /*stage=*/true, z, /*float_epilogue=*/true, /*float_aux=*/true);
}

absl::Status LtGemm::MatmulBiasGelu(__half* c, float* z, const __half* a, const __half* b, const float* bias,
                                    int64_t m, int64_t n, int64_t k, bool transpose_b, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(__half), c, a,
                    b, bias, m, n, k, false, transpose_b, stream, 1, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, /*stage=*/true, z,
                    /*float_epilogue=*/true, /*float_aux=*/true);
}

absl::Status LtGemm::MatmulBiasGelu(__nv_bfloat16* c, __nv_bfloat16* z, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    const float* bias, int64_t m, int64_t n, int64_t k, bool transpose_b,
                                    cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false,
                    sizeof(__nv_bfloat16), c, a, b, bias, m, n, k, false, transpose_b, stream, 1,
                    CUBLASLT_EPILOGUE_GELU_AUX_BIAS, /*stage=*/true, z, /*float_epilogue=*/true, /*float_aux=*/false);
}

absl::Status LtGemm::MatmulBiasGelu(__half* c, __half* z, const __half* a, const __half* b, const float* bias,
                                    int64_t m, int64_t n, int64_t k, bool transpose_b, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(__half), c, a,
                    b, bias, m, n, k, false, transpose_b, stream, 1, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, /*stage=*/true, z,
                    /*float_epilogue=*/true, /*float_aux=*/false);
}

absl::Status LtGemm::MatmulBiasGelu(__nv_bfloat16* c, __nv_bfloat16* z, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    const __nv_bfloat16* bias, int64_t m, int64_t n, int64_t k, bool transpose_b,
                                    cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false,
                    sizeof(__nv_bfloat16), c, a, b, bias, m, n, k, false, transpose_b, stream, 1,
                    CUBLASLT_EPILOGUE_GELU_AUX_BIAS, /*stage=*/true, z);
}

absl::Status LtGemm::MatmulBiasGelu(__half* c, __half* z, const __half* a, const __half* b, const __half* bias,
                                    int64_t m, int64_t n, int64_t k, bool transpose_b, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(__half), c, a,
                    b, bias, m, n, k, false, transpose_b, stream, 1, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, /*stage=*/true,
                    z);
}

absl::Status LtGemm::MatmulBiasGelu(float* c, float* z, const float* a, const float* b, const float* bias, int64_t m,
                                    int64_t n, int64_t k, bool transpose_b, cudaStream_t stream, bool tf32) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_32F, CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F,
                    &alpha, &beta, false, sizeof(float), c, a, b, bias, m, n, k, false, transpose_b, stream, 1,
                    CUBLASLT_EPILOGUE_GELU_AUX_BIAS, /*stage=*/true, z);
}

absl::Status LtGemm::MatmulBiasGelu(float* c, float* z, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    const float* bias, int64_t m, int64_t n, int64_t k, bool transpose_b,
                                    cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(float), c, a,
                    b, bias, m, n, k, false, transpose_b, stream, 1, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, /*stage=*/true,
                    z);
}

absl::Status LtGemm::MatmulBiasGelu(float* c, float* z, const __half* a, const __half* b, const float* bias, int64_t m,
                                    int64_t n, int64_t k, bool transpose_b, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(float), c, a,
                    b, bias, m, n, k, false, transpose_b, stream, 1, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, /*stage=*/true,
                    z);
}

// z is DGELU's aux input: MatmulImpl's aux is not written through for it.
absl::Status LtGemm::MatmulGeluGrad(float* c, const float* a, const float* b, const float* z, int64_t m, int64_t n,
                                    int64_t k, bool transpose_b, cudaStream_t stream, bool tf32) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_32F, CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F,
                    &alpha, &beta, false, sizeof(float), c, a, b, /*bias=*/nullptr, m, n, k, false, transpose_b, stream,
                    1, CUBLASLT_EPILOGUE_DGELU, /*stage=*/true, const_cast<float*>(z));
}

absl::Status LtGemm::MatmulGeluGrad(__nv_bfloat16* c, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    const __nv_bfloat16* z, int64_t m, int64_t n, int64_t k, bool transpose_b,
                                    cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false,
                    sizeof(__nv_bfloat16), c, a, b, /*bias=*/nullptr, m, n, k, false, transpose_b, stream, 1,
                    CUBLASLT_EPILOGUE_DGELU, /*stage=*/true, const_cast<__nv_bfloat16*>(z));
}

absl::Status LtGemm::MatmulGeluGrad(__half* c, const __half* a, const __half* b, const __half* z, int64_t m,
                                    int64_t n, int64_t k, bool transpose_b, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(__half), c, a,
                    b, /*bias=*/nullptr, m, n, k, false, transpose_b, stream, 1, CUBLASLT_EPILOGUE_DGELU,
                    /*stage=*/true, const_cast<__half*>(z));
}

namespace {
cublasLtEpilogue_t BiasGradEpilogue(LtGemm::BiasGradOf of) {
  // cuBLASLt's A is our b, its B our a.
  return of == LtGemm::BiasGradOf::kA ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
}
}  // namespace

absl::Status LtGemm::MatmulBiasGrad(float* c, float* bias_grad, const float* a, const float* b, int64_t m, int64_t n,
                                    int64_t k, bool transpose_a, bool transpose_b, BiasGradOf of, cudaStream_t stream,
                                    bool tf32) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_32F, CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F,
                    &alpha, &beta, false, sizeof(float), c, a, b, bias_grad, m, n, k, transpose_a, transpose_b, stream,
                    1, BiasGradEpilogue(of));
}

absl::Status LtGemm::MatmulBiasGrad(float* c, float* bias_grad, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    int64_t m, int64_t n, int64_t k, bool transpose_a, bool transpose_b, BiasGradOf of,
                                    cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(float), c, a,
                    b, bias_grad, m, n, k, transpose_a, transpose_b, stream, 1, BiasGradEpilogue(of));
}

absl::Status LtGemm::MatmulBiasGrad(float* c, float* bias_grad, const __half* a, const __half* b, int64_t m, int64_t n,
                                    int64_t k, bool transpose_a, bool transpose_b, BiasGradOf of, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(float), c, a,
                    b, bias_grad, m, n, k, transpose_a, transpose_b, stream, 1, BiasGradEpilogue(of));
}

absl::Status LtGemm::BatchedMatmul(float* c, const float* a, const float* b, int64_t batch, int64_t m, int64_t n,
                                   int64_t k, bool transpose_a, bool transpose_b, float alpha, cudaStream_t stream,
                                   bool tf32) {
  const float beta = 0.0f;
  return MatmulImpl(CUDA_R_32F, CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F,
                    &alpha, &beta, false, sizeof(float), c, a, b, nullptr, m, n, k, transpose_a, transpose_b, stream,
                    batch, CUBLASLT_EPILOGUE_BIAS, /*stage=*/false);
}

absl::Status LtGemm::BatchedMatmul(double* c, const double* a, const double* b, int64_t batch, int64_t m, int64_t n,
                                   int64_t k, bool transpose_a, bool transpose_b, double alpha, cudaStream_t stream) {
  const double beta = 0.0;
  return MatmulImpl(CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F, &alpha, &beta, false, sizeof(double), c, a,
                    b, nullptr, m, n, k, transpose_a, transpose_b, stream, batch, CUBLASLT_EPILOGUE_BIAS,
                    /*stage=*/false);
}

absl::Status LtGemm::BatchedMatmul(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t batch, int64_t m,
                                   int64_t n, int64_t k, bool transpose_a, bool transpose_b, float alpha,
                                   cudaStream_t stream) {
  const float beta = 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(float), c, a,
                    b, nullptr, m, n, k, transpose_a, transpose_b, stream, batch, CUBLASLT_EPILOGUE_BIAS,
                    /*stage=*/false);
}

absl::Status LtGemm::BatchedMatmul(__nv_bfloat16* c, const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t batch,
                                   int64_t m, int64_t n, int64_t k, bool transpose_a, bool transpose_b, float alpha,
                                   cudaStream_t stream) {
  const float beta = 0.0f;
  return MatmulImpl(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false,
                    sizeof(__nv_bfloat16), c, a, b, nullptr, m, n, k, transpose_a, transpose_b, stream, batch,
                    CUBLASLT_EPILOGUE_BIAS, /*stage=*/false);
}

absl::Status LtGemm::BatchedMatmul(float* c, const __half* a, const __half* b, int64_t batch, int64_t m, int64_t n,
                                   int64_t k, bool transpose_a, bool transpose_b, float alpha, cudaStream_t stream) {
  const float beta = 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(float), c, a,
                    b, nullptr, m, n, k, transpose_a, transpose_b, stream, batch, CUBLASLT_EPILOGUE_BIAS,
                    /*stage=*/false);
}

absl::Status LtGemm::BatchedMatmul(__half* c, const __half* a, const __half* b, int64_t batch, int64_t m, int64_t n,
                                   int64_t k, bool transpose_a, bool transpose_b, float alpha, cudaStream_t stream) {
  const float beta = 0.0f;
  return MatmulImpl(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, &alpha, &beta, false, sizeof(__half), c, a,
                    b, nullptr, m, n, k, transpose_a, transpose_b, stream, batch, CUBLASLT_EPILOGUE_BIAS,
                    /*stage=*/false);
}

absl::Status LtGemm::MatmulImpl(cudaDataType_t type, cudaDataType_t c_type, cublasComputeType_t compute,
                                cudaDataType_t scale_type, const void* alpha, const void* beta, bool accumulate,
                                size_t c_bytes, void* c, const void* a, const void* b, const void* bias, int64_t m,
                                int64_t n, int64_t k, bool transpose_a, bool transpose_b, cudaStream_t stream,
                                int64_t batch, cublasLtEpilogue_t epilogue, bool stage, void* aux, bool float_epilogue,
                                bool float_aux, const void* c_in) {
  if (m < 0 || n < 0 || k < 0 || batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM sizes must be >= 0, got batch=", batch, " m=", m, " n=", n, " k=", k));
  }
  if (batch > INT32_MAX) return absl::InvalidArgumentError(absl::StrCat("GEMM batch over 2^31 - 1: ", batch));
  if (m == 0 || n == 0 || batch == 0) return absl::OkStatus();
  // The epilogue runs where its operand is given: one with a bias where
  // bias is (the plain GEMMs pass the default BIAS and none), DGELU (no
  // bias) where its aux is. Else the plain GEMM.
  const bool applies = EpilogueUsesBias(epilogue) ? bias != nullptr : EpilogueUsesAux(epilogue) && aux != nullptr;
  const cublasLtEpilogue_t applied = applies ? epilogue : CUBLASLT_EPILOGUE_DEFAULT;
  if (aux != nullptr && (n % 8 != 0 || !EpilogueUsesAux(applied) || batch != 1)) {
    // cuBLASLt's aux leading dimension (our n) must be a multiple of 8; the caller falls back.
    return absl::UnimplementedError(absl::StrCat(EpilogueName(epilogue), " epilogue for n=", n,
                                                 ": the aux leading dimension must be a multiple of 8"));
  }
  if (applied == CUBLASLT_EPILOGUE_GELU_AUX_BIAS && aux == nullptr) {
    return absl::InvalidArgumentError("GELU_AUX_BIAS epilogue without its aux (z) buffer");
  }
  if (k == 0) {  // An empty sum; cuBLASLt rejects k == 0.
    if (applied != CUBLASLT_EPILOGUE_DEFAULT) {  // the caller falls back
      return absl::UnimplementedError(absl::StrCat("GEMM with the ", EpilogueName(applied), " epilogue and k = 0"));
    }
    if (accumulate) return absl::OkStatus();  // c += 0
    const cudaError_t error = cudaMemsetAsync(c, 0, static_cast<size_t>(batch * m * n) * c_bytes, stream);
    return error == cudaSuccess ? absl::OkStatus() : CudaError(error, "memset");
  }

  const int64_t ab_bytes = TypeBytes(type), cb = static_cast<int64_t>(c_bytes);
  // Operands whose rows are not 16-byte multiples go through scratch with
  // padded rows (kernels/gemm_staging.h), one product at a time. (Zero
  // element sizes: the operands' own pitches, nothing staged.)
  const bool may_stage = stage && batch == 1 && scratch_ != nullptr;
  GemmStaging staging = PlanGemmStaging(m, n, k, transpose_a, transpose_b, may_stage ? ab_bytes : 0, may_stage ? cb : 0,
                                        staging_min_flops_);
  char* scratch = nullptr;
  if (staging.any()) {
    scratch = static_cast<char*>(scratch_->Allocate(static_cast<size_t>(staging.scratch_bytes)));
    if (scratch == nullptr) staging = PlanGemmStaging(m, n, k, transpose_a, transpose_b, 0, 0);  // run unstaged
  }
  // Each staged operand's slot, in the order a, b, c (PlanGemmStaging's sum).
  char* next = scratch;
  auto slot = [&next](int64_t rows, int64_t pitch, int64_t bytes) {
    char* at = next;
    next += RoundUp(rows * pitch * bytes, kStagingOffsetAlign);
    return at;
  };
  const int64_t a_rows = transpose_a ? k : m, a_cols = transpose_a ? m : k;
  const int64_t b_rows = transpose_b ? n : k, b_cols = transpose_b ? k : n;
  const void* a_used = staging.stage_a ? slot(a_rows, staging.a_pitch, ab_bytes) : a;
  const void* b_used = staging.stage_b ? slot(b_rows, staging.b_pitch, ab_bytes) : b;
  void* c_used = staging.stage_c ? slot(m, staging.c_pitch, cb) : c;

  // The plan first: where cuBLASLt has no algorithm (an epilogue the caller
  // then runs apart) nothing has been copied.
  PlanKey key = KeyFor(type, c_type, compute, scale_type, applied, batch, m, n, k, transpose_a, transpose_b, a_used,
                       b_used, c_used, staging.a_pitch, staging.b_pitch, staging.c_pitch);
  // A separate C read in place of c (unstaged): the heuristic sees the lesser alignment of the two.
  if (c_in != nullptr && !staging.stage_c) key.alignment_c = std::min(key.alignment_c, Alignment(c_in));
  if (aux != nullptr) key.alignment_aux = Alignment(aux);
  if (bias != nullptr && EpilogueUsesBias(applied)) key.alignment_bias = Alignment(bias);
  key.float_epilogue = float_epilogue;
  key.float_aux = float_epilogue && float_aux && aux != nullptr;
  absl::StatusOr<Plan*> plan = GetPlan(key);
  absl::Status status = plan.status();
  if (!status.ok() && float_epilogue && status.code() == absl::StatusCode::kUnimplemented) ++float_epilogue_refusals_;
  if (status.ok() && staging.stage_a)
    status = Copy2D(const_cast<void*>(a_used), staging.a_pitch, a, a_cols, a_rows, a_cols, ab_bytes, stream);
  if (status.ok() && staging.stage_b)
    status = Copy2D(const_cast<void*>(b_used), staging.b_pitch, b, b_cols, b_rows, b_cols, ab_bytes, stream);
  if (status.ok() && staging.stage_c && (accumulate || c_in != nullptr)) {
    status = Copy2D(c_used, staging.c_pitch, c_in != nullptr ? c_in : c, n, m, n, cb, stream);
  }
  if (status.ok()) {
    // A staged c holds c_in's copy: cuBLASLt's C is then the staged c itself.
    status = Launch(**plan, alpha, beta, c_used, a_used, b_used, bias, aux, stream, staging.stage_c ? nullptr : c_in);
    if (!status.ok() && float_epilogue && RefusedCombination(status)) {
      ++float_epilogue_refusals_;
      // Refused at the call rather than at the plan: remembered the same way.
      RememberNoPlan(key, /*refused=*/true);
      status = absl::UnimplementedError(
          absl::StrCat("cuBLASLt refused a float bias or aux beside a 16-bit D: ", status.message()));
    } else if (!status.ok() && SixteenBitBias(applied, c_type, float_epilogue) && RefusedCombination(status)) {
      // NOT_SUPPORTED or INVALID_VALUE at the call though the plan was made:
      // remembered as the float bias's refusal is (on the H200 cuBLASLt
      // refused the float bias with INVALID_VALUE), so the caller's two
      // passes run, with the run's note saying so, rather than the step
      // failing: the cast-bias pass puts this epilogue in GPT-2's default
      // step, and no GPU has run it yet (2026-11-30).
      RememberNoPlan(key, /*refused=*/true);
      status = absl::UnimplementedError(
          absl::StrCat("cuBLASLt refused a 16-bit bias beside a 16-bit D: ", status.message()));
    } else if (!status.ok() && EpilogueUsesAux(applied) && !EpilogueUsesBias(applied) &&
               status.code() == absl::StatusCode::kUnimplemented) {
      // DGELU refused at the call (NOT_SUPPORTED) though its plan was made:
      // remembered as the shape's "no algorithm" with its line, so the
      // caller's two passes run from then on without asking again, and a
      // run reports it. INVALID_VALUE (a misuse: an aux pointer or leading
      // dimension it rejects) surfaces as the error it is.
      RememberNoPlan(key, /*refused=*/true);
      status = absl::UnimplementedError(absl::StrCat("cuBLASLt refused ", EpilogueName(applied), ": ", status.message()));
    }
  }
  if (status.ok() && staging.stage_c) status = Copy2D(c, n, c_used, staging.c_pitch, m, n, cb, stream);
  if (scratch != nullptr) scratch_->Free(scratch, static_cast<size_t>(staging.scratch_bytes));
  return status;
}

LtGemm::PlanKey LtGemm::KeyFor(cudaDataType_t type, cudaDataType_t c_type, cublasComputeType_t compute,
                               cudaDataType_t scale_type, cublasLtEpilogue_t epilogue, int64_t batch, int64_t m,
                               int64_t n, int64_t k, bool transpose_a, bool transpose_b, const void* a, const void* b,
                               const void* c, int64_t pitch_a, int64_t pitch_b, int64_t pitch_c) {
  // A batch's later items start a stride further on: each is only as aligned
  // as the first item and the stride both allow.
  const auto aligned = [batch](const void* p, int64_t stride_bytes) {
    if (batch <= 1) return Alignment(p);
    return Alignment(
        reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(stride_bytes)));
  };
  const int64_t ab_bytes = TypeBytes(type), cb = TypeBytes(c_type);
  return PlanKey{type,
                 c_type,
                 epilogue,
                 compute,
                 scale_type,
                 batch,
                 m,
                 n,
                 k,
                 transpose_a,
                 transpose_b,
                 aligned(a, m * k * ab_bytes),
                 aligned(b, k * n * ab_bytes),
                 aligned(c, m * n * cb),
                 pitch_a,
                 pitch_b,
                 pitch_c};
}

namespace {

const char* TypeName(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_32F:
      return "float";
    case CUDA_R_16BF:
      return "bf16";
    case CUDA_R_16F:
      return "fp16";
    case CUDA_R_64F:
      return "double";
    default:
      return "another type";
  }
}

}  // namespace

void LtGemm::RememberNoPlan(const PlanKey& key, bool refused) {
  plans_[key] = nullptr;
  if (key.epilogue == CUBLASLT_EPILOGUE_DEFAULT) return;
  // What stood beside a 16-bit D: a float bias, and GELU_AUX_BIAS's aux float or of D's type;
  // DGELU's aux (read) has D's type.
  std::string beside;
  if (key.epilogue == CUBLASLT_EPILOGUE_DGELU) beside = absl::StrCat(" with a ", TypeName(key.c_type), " aux");
  if (SixteenBitBias(key.epilogue, key.c_type, key.float_epilogue)) {
    beside = absl::StrCat(" with a ", TypeName(key.c_type), " bias");
    if (key.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) absl::StrAppend(&beside, " and aux");
  }
  if (key.float_epilogue) {
    beside = " with a float bias";
    if (key.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
      absl::StrAppend(&beside, key.float_aux ? " and aux" : absl::StrCat(" and a ", TypeName(key.c_type), " aux"));
    }
  }
  epilogue_fallbacks_.push_back(absl::StrCat(
      "cuBLASLt ", refused ? "refused " : "has no algorithm for ", EpilogueName(key.epilogue), " (", TypeName(key.type),
      " a and b, ", TypeName(key.c_type), " D", beside, key.batch > 1 ? absl::StrCat(", batch ", key.batch) : "",
      ", m=", key.m, " n=", key.n, " k=", key.k, "): the GEMM and its epilogue ran as two passes"));
}

absl::StatusOr<LtGemm::Plan*> LtGemm::GetPlan(const PlanKey& key) {
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    absl::StatusOr<std::unique_ptr<Plan>> plan = MakePlan(key);
    const bool sixteen_bit_bias = SixteenBitBias(key.epilogue, key.c_type, key.float_epilogue);
    if (!plan.ok() && (key.float_epilogue || sixteen_bit_bias) &&
        plan.status().code() == absl::StatusCode::kInvalidArgument) {
      // A float bias or aux beside a 16-bit D that this cuBLASLt refuses
      // (its headers: INVALID_VALUE for an unsupported type combination),
      // or a 16-bit one (SixteenBitBias), is the shape's "no algorithm":
      // the caller stores in two passes.
      plan = absl::UnimplementedError(absl::StrCat("cuBLASLt refused a ", key.float_epilogue ? "float" : "16-bit",
                                                   " bias", key.float_epilogue ? " or aux" : "",
                                                   " beside a 16-bit D: ", plan.status().message()));
    }
    if (!plan.ok()) {
      // No algorithm is the shape's answer, kept so a step does not ask the
      // heuristic again; any other failure may pass, and is not kept.
      if (plan.status().code() == absl::StatusCode::kUnimplemented) {
        RememberNoPlan(key, /*refused=*/(key.float_epilogue || sixteen_bit_bias) &&
                                absl::StrContains(plan.status().message(), "cuBLASLt refused a "));
      }
      return plan.status();
    }
    it = plans_.emplace(key, *std::move(plan)).first;
  }
  if (it->second == nullptr) {
    return absl::UnimplementedError(absl::StrCat("cuBLASLt has no algorithm for m=", key.m, " n=", key.n, " k=", key.k,
                                                 " transpose_a=", key.transpose_a, " transpose_b=", key.transpose_b,
                                                 " with epilogue ", static_cast<int>(key.epilogue)));
  }
  return it->second.get();
}

absl::Status LtGemm::Launch(Plan& plan, const void* alpha, const void* beta, void* c, const void* a, const void* b,
                            const void* bias, void* aux, cudaStream_t stream, const void* c_in) {
  if (bias != nullptr) {
    STRATA_LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
        "set bias pointer");
  }
  if (aux != nullptr) {
    STRATA_LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan.desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)),
        "set aux pointer");
  }
  // cuBLASLt's A is our b, its B our a, its C and D our c (C c_in where given).
  const void* c_read = c_in != nullptr ? c_in : c;
  STRATA_LT_RETURN_IF_ERROR(
      cublasLtMatmul(handle_, plan.desc.get(), alpha, b, plan.b_layout.get(), a, plan.a_layout.get(), beta, c_read,
                     plan.c_layout.get(), c, plan.c_layout.get(), &plan.algo, workspace_, workspace_bytes_, stream),
      "matmul");
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace strata
