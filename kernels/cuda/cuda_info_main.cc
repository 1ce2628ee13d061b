// strata cuda_info: the CUDA, cuBLASLt, cuDNN and NCCL versions this build
// links, and the devices it sees. Exits 1 when there is no device.

#include <cstdio>
#include <string>

#include "kernels/cuda/cuda_info.h"

int main() {
  std::fputs(strata::cuda::DescribeCuda().c_str(), stdout);
  return strata::cuda::CudaDeviceCount() > 0 ? 0 : 1;
}
