#ifndef STRATA_KERNELS_CUDA_CUDA_INFO_H_
#define STRATA_KERNELS_CUDA_CUDA_INFO_H_

// Which CUDA libraries this build links and which versions it finds at run
// time, for logs and for checking a GPU machine's setup. None of these
// queries needs a GPU, except the device fields.

#include <cstddef>
#include <string>

namespace strata {
namespace cuda {

// Versions in each library's own encoding: CUDA 13.0 = 13000,
// cuDNN 9.19.0 = 91900, NCCL 2.28.9 = 22809, cuBLASLt 13.1.0 = 130100.
struct CudaVersions {
  int runtime = 0;  // cudart (static, so the toolkit's)
  int driver = 0;   // 0 when no driver is installed
  size_t cublaslt = 0;
  size_t cudnn = 0;
  int nccl = 0;
};

// The versions the headers promised at build time.
CudaVersions CompiledCudaVersions();
// The versions of the libraries loaded now.
CudaVersions LoadedCudaVersions();

// The number of usable CUDA devices; 0 (with the CUDA error in *why, if
// non-null) when there is none or no driver.
int CudaDeviceCount(std::string* why = nullptr);

// A few lines: the versions, compiled and loaded, and each device's name,
// compute capability and memory.
std::string DescribeCuda();

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_CUDA_INFO_H_
