#ifndef STRATA_KERNELS_CUDA_KERNEL_MATH_H_
#define STRATA_KERNELS_CUDA_KERNEL_MATH_H_

// The binary ops' per-element math (add, sub, mul, div) as __host__
// __device__ functors, written as kernels/cpu/binary.cc's; the .cu files are
// built with --fmad=false, so the GPU rounds as the CPU does. The optimizer
// family's math is kernels/optimizer_math.h, shared with the CPU kernels;
// Sqrt, Pow and Cos are kernels/host_device.h's.

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace strata {
namespace cuda {

using kernel_math::Cos;
using kernel_math::Pow;
using kernel_math::Sqrt;

// add, sub, mul, div: kernels/cpu/binary.cc's functors.
struct AddFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};
struct SubFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T a, T b) const { return a - b; }
};
struct MulFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
};
struct DivFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T a, T b) const { return a / b; }
};

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_KERNEL_MATH_H_
