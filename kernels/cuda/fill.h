#ifndef STRATA_KERNELS_CUDA_FILL_H_
#define STRATA_KERNELS_CUDA_FILL_H_

// Fills n elements of element_size bytes (1, 2, 4 or 8) with one bit
// pattern, its low element_size bytes (the host converts the value to the
// dtype, so every dtype rounds exactly as on the CPU). Asynchronous on
// `stream`; cudaErrorInvalidValue for another size.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata {
namespace cuda {

cudaError_t LaunchFill(void* y, int element_size, uint64_t bits, int64_t n, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_FILL_H_
