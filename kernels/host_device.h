#ifndef STRATA_KERNELS_HOST_DEVICE_H_
#define STRATA_KERNELS_HOST_DEVICE_H_

// STRATA_HOST_DEVICE marks a function that nvcc compiles for the host and the
// device and g++ for the host: the math a CPU kernel and a CUDA kernel share.
// Sqrt, Exp, Log, Tanh, Erf, Pow and Cos call the device's or the host's
// library.

#include <cmath>

#ifdef __CUDACC__
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata {
namespace kernel_math {

// The C library's functions under one name on both sides: CUDA's on the
// device (sqrtf, expf, ... for float), the host's std:: ones on the host.
// CUDA's sqrt is IEEE (correctly rounded: nvcc's default -prec-sqrt=true);
// exp, log, tanh, erf, pow and cos are within a few ulp of glibc's, as each
// kernel test that uses them says.
#ifdef __CUDA_ARCH__
#define STRATA_LIBM_1(Name, f, d)                                           \
  STRATA_HOST_DEVICE inline float Name(float x) { return f(x); }            \
  STRATA_HOST_DEVICE inline double Name(double x) { return d(x); }
#else
#define STRATA_LIBM_1(Name, f, d)                                           \
  STRATA_HOST_DEVICE inline float Name(float x) { return std::d(x); }       \
  STRATA_HOST_DEVICE inline double Name(double x) { return std::d(x); }
#endif
STRATA_LIBM_1(Sqrt, sqrtf, sqrt)
STRATA_LIBM_1(Exp, expf, exp)
STRATA_LIBM_1(Log, logf, log)
STRATA_LIBM_1(Tanh, tanhf, tanh)
STRATA_LIBM_1(Erf, erff, erf)
#undef STRATA_LIBM_1

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
