// Registers CudaDevice as the factory of DEVICE_CUDA devices: a binary that
// links this (alwayslink) opens GPUs by kind through FindDeviceFactory, as
// `strata_gpu run --device gpu` does.

#include <memory>

#include "runtime/cuda/cuda_device.h"
#include "runtime/device.h"

namespace strata {
namespace {

const bool registered = RegisterDeviceFactory(DEVICE_CUDA, [](int ordinal) -> absl::StatusOr<std::unique_ptr<Device>> {
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(ordinal);
  if (!device.ok()) return device.status();
  return std::unique_ptr<Device>(*std::move(device));
});

}  // namespace
}  // namespace strata
