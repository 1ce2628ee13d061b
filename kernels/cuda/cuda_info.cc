// Library versions through each library's own query (cudart, cuBLASLt, cuDNN,
// NCCL), so a binary that links this really links all four.

#include "kernels/cuda/cuda_info.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace strata {
namespace cuda {

CudaVersions CompiledCudaVersions() {
  CudaVersions v;
  v.runtime = CUDART_VERSION;
  v.driver = 0;  // not known at build time
  v.cublaslt = CUBLAS_VERSION;
  v.cudnn = CUDNN_VERSION;
  v.nccl = NCCL_VERSION_CODE;
  return v;
}

CudaVersions LoadedCudaVersions() {
  CudaVersions v;
  if (cudaRuntimeGetVersion(&v.runtime) != cudaSuccess) v.runtime = 0;
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
  v.cublaslt = cublasLtGetVersion();
  v.cudnn = cudnnGetVersion();
  if (ncclGetVersion(&v.nccl) != ncclSuccess) v.nccl = 0;
  return v;
}

int CudaDeviceCount(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // Clear the sticky last error so later calls do not report it again.
    cudaGetLastError();
    if (why != nullptr) *why = absl::StrCat(cudaGetErrorName(error), ": ", cudaGetErrorString(error));
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "the driver reports 0 devices";
  return count;
}

std::string DescribeCuda() {
  const CudaVersions built = CompiledCudaVersions();
  const CudaVersions loaded = LoadedCudaVersions();
  std::string out = absl::StrCat("CUDA runtime ", loaded.runtime, " (built against ", built.runtime, "), driver ",
                                 loaded.driver, "\n", "cuBLASLt ", loaded.cublaslt, " (built against ",
                                 built.cublaslt, ")\n", "cuDNN ", loaded.cudnn, " (built against ", built.cudnn,
                                 ")\n", "NCCL ", loaded.nccl, " (built against ", built.nccl, ")\n");
  std::string why;
  const int devices = CudaDeviceCount(&why);
  if (devices == 0) {
    absl::StrAppend(&out, "no CUDA device: ", why, "\n");
    return out;
  }
  for (int d = 0; d < devices; ++d) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    absl::StrAppend(&out, "device ", d, ": ", prop.name, ", sm_", prop.major, prop.minor, ", ",
                    prop.totalGlobalMem >> 20, " MiB\n");
  }
  return out;
}

}  // namespace cuda
}  // namespace strata
