// Registers CudaDevice as the factory of DEVICE_CUDA devices: a binary that
// links this (alwayslink) opens GPUs by kind through FindDeviceFactory, as
// `strata_gpu run --device gpu` does.

#include <memory>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

#include "runtime/cuda/cuda_device.h"
#include "runtime/device.h"

namespace strata {
namespace {

const bool registered = RegisterDeviceFactory(DEVICE_CUDA, [](int ordinal) -> absl::StatusOr<std::unique_ptr<Device>> {
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(ordinal);
  if (!device.ok()) return device.status();
  return std::unique_ptr<Device>(*std::move(device));
});

const bool counted = RegisterDeviceCounter(DEVICE_CUDA, []() -> absl::StatusOr<int> {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", cudaGetErrorString(error)));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device: the driver reports 0 devices");
  return count;
});

}  // namespace
}  // namespace strata
