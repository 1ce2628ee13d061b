#ifndef STRATA_KERNELS_HOST_DEVICE_H_
#define STRATA_KERNELS_HOST_DEVICE_H_

// STRATA_HOST_DEVICE marks a function that nvcc compiles for the host and the
// device and g++ for the host: the math a CPU kernel and a CUDA kernel share.
// Sqrt, Pow and Cos call the device's or the host's library.

#include <cmath>

#ifdef __CUDACC__
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata {
namespace kernel_math {

// The C library's functions under one name on both sides: CUDA's on the
// device, the host's (std::) on the host.
// IEEE sqrt (correctly rounded on both sides: nvcc's default -prec-sqrt=true).
STRATA_HOST_DEVICE inline float Sqrt(float x) {
#ifdef __CUDA_ARCH__
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
STRATA_HOST_DEVICE inline double Sqrt(double x) {
#ifdef __CUDA_ARCH__
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}
STRATA_HOST_DEVICE inline double Pow(double x, double y) {
#ifdef __CUDA_ARCH__
  return pow(x, y);
#else
  return std::pow(x, y);
#endif
}
STRATA_HOST_DEVICE inline double Cos(double x) {
#ifdef __CUDA_ARCH__
  return cos(x);
#else
  return std::cos(x);
#endif
}

}  // namespace kernel_math
}  // namespace strata

#endif  // STRATA_KERNELS_HOST_DEVICE_H_
