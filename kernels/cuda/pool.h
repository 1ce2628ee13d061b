#ifndef STRATA_KERNELS_CUDA_POOL_H_
#define STRATA_KERNELS_CUDA_POOL_H_

// max_pool2d, avg_pool2d and their grads on the GPU (NCHW), with the numbers
// of kernels/cpu/pool2d.cc bit for bit: one thread per output element
// (forward) or per input element (backward, a gather over the windows that
// cover it, in the CPU's order of outputs, so no atomics). Asynchronous on
// `stream`. Overloads for float and double.
//
// - max: the window's maximum, NaN winning (v taken when v > best or v is
//   NaN, scanning from -inf row by row); max_pool2d_grad gives each dy to its
//   window's ArgMax under that rule (the last NaN, else the first maximum,
//   else the window's first element), as the CPU.
// - avg: the window's sum in row order divided by the clipped area when
//   exclusive, else the area counting padding (torch's count_include_pad).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata {
namespace cuda {

// planes = N * C; input h x w, output ho x wo; window kh x kw; strides; paddings.
struct Pool2dShape {
  int64_t planes, h, w, ho, wo;
  int64_t kh, kw, sh, sw, ph, pw;
};

// y [planes, ho, wo] from x [planes, h, w].
cudaError_t LaunchMaxPool2d(float* y, const float* x, const Pool2dShape& g, cudaStream_t stream);
cudaError_t LaunchMaxPool2d(double* y, const double* x, const Pool2dShape& g, cudaStream_t stream);
cudaError_t LaunchAvgPool2d(float* y, const float* x, const Pool2dShape& g, bool exclusive, cudaStream_t stream);
cudaError_t LaunchAvgPool2d(double* y, const double* x, const Pool2dShape& g, bool exclusive, cudaStream_t stream);

// dx [planes, h, w] from x [planes, h, w] and dy [planes, ho, wo].
cudaError_t LaunchMaxPool2dGrad(float* dx, const float* x, const float* dy, const Pool2dShape& g, cudaStream_t stream);
cudaError_t LaunchMaxPool2dGrad(double* dx, const double* x, const double* dy, const Pool2dShape& g,
                                cudaStream_t stream);
// dx [planes, h, w] from dy [planes, ho, wo].
cudaError_t LaunchAvgPool2dGrad(float* dx, const float* dy, const Pool2dShape& g, bool exclusive, cudaStream_t stream);
cudaError_t LaunchAvgPool2dGrad(double* dx, const double* dy, const Pool2dShape& g, bool exclusive,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_POOL_H_
