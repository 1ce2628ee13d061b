#ifndef STRATA_KERNELS_HOST_DEVICE_H_
#define STRATA_KERNELS_HOST_DEVICE_H_

// STRATA_HOST_DEVICE marks a function that nvcc compiles for the host and the
// device and g++ for the host: the math a CPU kernel and a CUDA kernel share.

#ifdef __CUDACC__
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

#endif  // STRATA_KERNELS_HOST_DEVICE_H_
