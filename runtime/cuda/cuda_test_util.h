#ifndef STRATA_RUNTIME_CUDA_CUDA_TEST_UTIL_H_
#define STRATA_RUNTIME_CUDA_CUDA_TEST_UTIL_H_

// For gpu-tagged tests: GPU 0 as a CudaDevice, or a test failure that says
// why and how to filter the test out. Without a device such tests FAIL,
// never skip, so a GPU run that found no GPU cannot pass.

#include <memory>

#include "gtest/gtest.h"
#include "runtime/cuda/cuda_device.h"

namespace strata {
namespace testing {

inline std::unique_ptr<CudaDevice> CudaDeviceOrFail() {
  auto device = CudaDevice::Create(0);
  if (!device.ok()) {
    ADD_FAILURE() << device.status()
                  << ". This test is tagged gpu: filter it out with --test_tag_filters=-gpu, or run it on a GPU "
                     "machine (kernels/cuda/README.md).";
    return nullptr;
  }
  return *std::move(device);
}

}  // namespace testing
}  // namespace strata

#endif  // STRATA_RUNTIME_CUDA_CUDA_TEST_UTIL_H_
