#include "runtime/device.h"

#include <cstddef>
#include <cstring>
#include <map>
#include <utility>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace strata {

std::string Device::name() const {
  return absl::StrCat(kind() == DEVICE_CUDA ? "cuda" : "cpu", ":", ordinal());
}

absl::Status Device::Synchronize() {
  absl::Status waited = WaitForWork();
  absl::MutexLock lock(&mu_);
  absl::Status first = std::move(first_error_);
  first_error_ = absl::OkStatus();
  return first.ok() ? waited : first;
}

void Device::NoteError(absl::Status status) {
  if (status.ok()) return;
  absl::MutexLock lock(&mu_);
  if (first_error_.ok()) first_error_ = std::move(status);
}

namespace {

struct CpuFallbacks {
  absl::Mutex mu;
  std::vector<std::string> lines ABSL_GUARDED_BY(mu);
};

CpuFallbacks& GetCpuFallbacks() {
  static CpuFallbacks* fallbacks = new CpuFallbacks();
  return *fallbacks;
}

}  // namespace

void NoteCpuKernelFallback(const std::string& line) {
  CpuFallbacks& f = GetCpuFallbacks();
  absl::MutexLock lock(&f.mu);
  for (const std::string& l : f.lines) {
    if (l == line) return;
  }
  f.lines.push_back(line);
}

std::vector<std::string> CpuDevice::KernelFallbacks(size_t from) const {
  CpuFallbacks& f = GetCpuFallbacks();
  absl::MutexLock lock(&f.mu);
  if (from >= f.lines.size()) return {};
  return std::vector<std::string>(f.lines.begin() + static_cast<std::ptrdiff_t>(from), f.lines.end());
}

int64_t CpuDevice::capacity_bytes() const {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size : 0;
}

absl::Status CpuDevice::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::Memset(void* dst, int byte, size_t bytes) {
  if (bytes > 0) std::memset(dst, byte, bytes);
  return absl::OkStatus();
}

Device* GetCpuDevice() {
  static Device* device = new CpuDevice();
  return device;
}

namespace {

std::map<DeviceKind, DeviceFactory>& DeviceFactories() {
  static auto* factories = new std::map<DeviceKind, DeviceFactory>;
  return *factories;
}

}  // namespace

bool RegisterDeviceFactory(DeviceKind kind, DeviceFactory factory) {
  DeviceFactories()[kind] = std::move(factory);
  return true;
}

const DeviceFactory* FindDeviceFactory(DeviceKind kind) {
  auto it = DeviceFactories().find(kind);
  return it == DeviceFactories().end() ? nullptr : &it->second;
}

namespace {

std::map<DeviceKind, DeviceCounter>& DeviceCounters() {
  static auto* counters = new std::map<DeviceKind, DeviceCounter>;
  return *counters;
}

}  // namespace

bool RegisterDeviceCounter(DeviceKind kind, DeviceCounter counter) {
  DeviceCounters()[kind] = std::move(counter);
  return true;
}

absl::StatusOr<int> CountDevices(DeviceKind kind) {
  if (kind == DEVICE_CPU) return 1;
  auto it = DeviceCounters().find(kind);
  if (it == DeviceCounters().end()) {
    return absl::FailedPreconditionError(absl::StrCat("this binary cannot count devices of kind ", DeviceKind_Name(kind)));
  }
  return it->second();
}

}  // namespace strata
