#ifndef STRATA_KERNELS_CUDA_GEMM_H_
#define STRATA_KERNELS_CUDA_GEMM_H_

// Row-major GEMM on the GPU through cuBLASLt, the GPU twin of
// kernels/cpu/gemm.h:
//   c[m, n] = op(a)[m, k] @ op(b)[k, n]
// with op transposing a stored [k, m] a or a stored [n, k] b. Operands are
// contiguous device memory. Float runs in FP32 (no TF32), so results match a
// CPU FP32 GEMM up to summation order.

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {
namespace cuda {

// Owns a cuBLASLt handle and its workspace on the current device. Not thread
// safe: one per stream (or guard it).
class LtGemm {
 public:
  // 32 MiB is what cuBLAS recommends for Hopper's kernels.
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // Fails (FailedPrecondition) when there is no usable CUDA device.
  static absl::StatusOr<std::unique_ptr<LtGemm>> Create(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Enqueues c = op(a) @ op(b) on `stream`; c is overwritten. Sizes of 0 are
  // fine (k == 0 zeroes c); negative sizes are InvalidArgument.
  absl::Status Matmul(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool transpose_a,
                      bool transpose_b, cudaStream_t stream);
  absl::Status Matmul(double* c, const double* a, const double* b, int64_t m, int64_t n, int64_t k,
                      bool transpose_a, bool transpose_b, cudaStream_t stream);

 private:
  LtGemm(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}
  absl::Status MatmulImpl(cudaDataType_t type, cublasComputeType_t compute, const void* alpha, const void* beta,
                          size_t element_bytes, void* c, const void* a, const void* b, int64_t m, int64_t n,
                          int64_t k, bool transpose_a, bool transpose_b, cudaStream_t stream);

  cublasLtHandle_t handle_;
  void* workspace_;
  size_t workspace_bytes_;
};

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_GEMM_H_
