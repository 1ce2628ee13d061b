#ifndef STRATA_KERNELS_HOST_DEVICE_H_
#define STRATA_KERNELS_HOST_DEVICE_H_

// STRATA_HOST_DEVICE marks a function that nvcc compiles for the host and the
// device and g++ for the host: the math a CPU kernel and a CUDA kernel share.
// Sqrt, Exp, Log, Erf, Pow and Cos call the device's or the host's
// library; Tanh too, but for float on the host (below).

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
STRATA_LIBM_1(Erf, erff, erf)
#undef STRATA_LIBM_1

// tanh: CUDA's tanhf on the device. On the host, glibc's tanhf goes
// through expm1f and costs about 11 ns an element here (a GPT's tanh-form
// gelu and gelu_grad were 40% of its CPU training step); float instead
// takes Cephes' tanhf (S. L. Moshier): an odd minimax polynomial below
// 0.625, else 1 - 2 / (exp(2|x|) + 1) through expf (2 ns), the sign copied
// back. 5 ns an element, within 1.34 ulp of tanh (the worst over [0, 10],
// at 0.631; glibc's tanhf: 2.2), exactly odd, +-1 past 44 (no exp
// overflow), NaN for NaN, denormals as they are.
// Pure IEEE arithmetic and expf, so the CPU kernels and the CUDA files run
// on the CPU (the *_emulation_tests) compute the same bits. double stays
// the library's (the float64 cross-checks against PyTorch hold to 1e-10).
#ifdef __CUDA_ARCH__
STRATA_HOST_DEVICE inline float Tanh(float x) { return tanhf(x); }
STRATA_HOST_DEVICE inline double Tanh(double x) { return tanh(x); }
#else
inline float Tanh(float x) {
  const float a = std::fabs(x);
  float r;
  if (a < 0.625f) {
    const float s = a * a;
    r = ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s + 1.33314422036e-1f) * s -
         3.33332819422e-1f) *
            s * a +
        a;
  } else {
    r = a > 44.0f ? 1.0f : 1.0f - 2.0f / (std::exp(2.0f * a) + 1.0f);
  }
  return std::copysign(r, x);  // NaN stays NaN (a NaN a takes the second branch)
}
inline double Tanh(double x) { return std::tanh(x); }
#endif

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
