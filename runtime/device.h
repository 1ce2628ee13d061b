#ifndef STRATA_RUNTIME_DEVICE_H_
#define STRATA_RUNTIME_DEVICE_H_

// A place where tensors live and kernels run: the host CPU, or one GPU.
//
// The executor, the kernels and Tensor talk to memory only through a Device:
// its allocator, its streams, and its copies between host and device. On the
// CPU there are no streams (null handles) and work runs inline when called;
// on a GPU (runtime/cuda/cuda_device.h) kernels enqueue on the compute
// stream, copies are ordered on it, and frees are stream-ordered (a freed
// block is handed again only to work that the stream runs after the free).
//
// Errors: the copies return a Status. Tensor's helpers that return no status
// (Fill, Clone, ValueAt) record a device error with NoteError, the way CUDA
// reports an asynchronous error at the next synchronisation; Synchronize
// returns the first one, and the executor synchronises at a step's end.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/plan.pb.h"
#include "runtime/allocator.h"

namespace strata {

// A device's work captured once and replayed as one launch (a CUDA graph):
// the same kernels on the same buffers, with whatever those buffers hold
// when it runs. Destroying it waits for its replays and returns its memory.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  // Enqueues one replay on the compute stream.
  virtual absl::Status Launch() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual int ordinal() const = 0;
  // "cpu:0", "cuda:0": how messages name the device.
  std::string name() const;
  virtual Allocator* allocator() const = 0;
  // Whether the host reads and writes this device's memory directly.
  bool host_accessible() const { return kind() == DEVICE_CPU; }
  // The bytes this device holds in all (a GPU's global memory, the host's
  // physical memory); 0 where unknown. What `strata check` holds each rank's
  // predicted peak against.
  virtual int64_t capacity_bytes() const { return 0; }
  // The most bytes the allocator has held from the driver at once, cached
  // blocks included (PyTorch's max_memory_reserved): what a caching device
  // allocator reports beside its allocated bytes. -1 where the device
  // reserves nothing apart from what is allocated (the CPU).
  virtual int64_t peak_reserved_bytes() const { return -1; }
  // Names the physical device on its machine, the same in two processes
  // that opened one device whatever their CUDA_VISIBLE_DEVICES (a GPU's
  // UUID); "" where unknown. Ranks compare them to tell a GPU each from
  // GPUs shared (PlaceOnGpus).
  virtual std::string physical_id() const { return ""; }

  // Kernels enqueue on the compute stream; collectives and transfers on the
  // communication stream (the same one until a device has two).
  virtual StreamHandle compute_stream() const { return nullptr; }
  virtual StreamHandle comm_stream() const { return compute_stream(); }

  // Work that may wait for other processes (NCCL kernels waiting for a
  // peer) runs on the communication stream and on streams added here (the
  // NCCL transfer pairs' own). An allocation that misses waits for the
  // device's work before returning the cache's segments, and with a limit
  // set a rank whose peer waits for it fails the allocation past it rather
  // than waiting forever (CachingAllocator::set_sync_limit). The stream
  // stays added while the returned handle lives (it may outlive the
  // device); null, and no-ops, where the device has no such streams.
  virtual std::shared_ptr<void> AddPeerStream(StreamHandle stream) { return nullptr; }
  virtual void LimitPeerWaits(absl::Duration limit) {}

  // Copies between host memory and this device's memory, ordered on the
  // compute stream. CopyToHost returns once the bytes are on the host;
  // CopyFromHost once `host_src` may be reused.
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  // The device-to-host copy without the wait: ordered on the compute stream,
  // it returns at once, and the bytes are on the host once the stream has
  // got there (after the next Synchronize). host_dst must stay allocated
  // until then, as a block of staging_allocator() does, which is handed out
  // again only after the stream passed its free. The host (and any device
  // without streams) copies before returning.
  virtual absl::Status EnqueueCopyToHost(void* host_dst, const void* src, size_t bytes) {
    return CopyToHost(host_dst, src, bytes);
  }
  virtual absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Memset(void* dst, int byte, size_t bytes) = 0;

  // Host memory for buffers that stage this device's tensors through the
  // host (StagedCommunicator): page-locked on a GPU, so copies run at full
  // speed, and freed in stream order there (a block is handed out again
  // only once the copies enqueued before its free have finished, so a
  // CopyFromHost out of it may still be running when it is freed). On the
  // CPU, the host allocator.
  virtual Allocator* staging_allocator() const { return GetCpuAllocator(); }

  // Graphs. "" when this device captures its compute stream's work, else
  // why it cannot.
  virtual std::string GraphUnsupported() const { return absl::StrCat(name(), " has no graphs"); }
  // From BeginCapture to EndCapture the compute stream's work is recorded,
  // not run, and every allocation of the device (and of its staging
  // allocator) comes from a pool of the graph's own, which no work outside
  // it is handed until the graph is gone; `share_memory_with`, when set,
  // lends its pool instead (graphs that never run at the same time). Nothing
  // may synchronise with the device in between.
  virtual absl::Status BeginCapture(const DeviceGraph* share_memory_with) {
    return absl::UnimplementedError(GraphUnsupported());
  }
  // Ends the capture BeginCapture started, successful or not: the graph
  // ready to Launch, or why the capture failed (then nothing was recorded
  // and the device is out of capture).
  virtual absl::StatusOr<std::unique_ptr<DeviceGraph>> EndCapture() {
    return absl::UnimplementedError(GraphUnsupported());
  }
  // Where the device's libraries ran part of the plan less fused than the
  // plan asked (CUDA: a cuBLASLt epilogue run as two passes, one line per
  // GEMM shape), the lines from index `from` on, in the order found; a run
  // prints each once as a note ("note: LINE"). Lines are only ever added.
  virtual std::vector<std::string> KernelFallbacks(size_t from) const { return {}; }

  // Whether a capture is under way (between BeginCapture and EndCapture):
  // work enqueued now is recorded, not run, so nothing may wait for it on
  // the host (a transport's Work then only orders the compute stream).
  virtual bool capturing() const { return false; }

  // Whether every piece of work enqueued so far has finished, without
  // waiting (cudaStreamQuery): how the host watches a replayed graph whose
  // communication could hang, instead of blocking in Synchronize. An error
  // of that work is the status. The host (no streams) is always done.
  virtual absl::StatusOr<bool> WorkDone() { return true; }

  // Waits for the device's work; returns the first error noted since the
  // last call (and clears it), else the synchronisation's own status.
  absl::Status Synchronize();
  // Records an error of work that had no status to return it through.
  void NoteError(absl::Status status);

 protected:
  virtual absl::Status WaitForWork() = 0;

 private:
  absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

// The host. Copies are memcpy; there are no streams. Each CpuDevice draws
// from the allocator it is given (tests and ranks pass their own, for their
// own byte counters).
class CpuDevice final : public Device {
 public:
  explicit CpuDevice(Allocator* allocator = GetCpuAllocator()) : allocator_(allocator) {}
  DeviceKind kind() const override { return DEVICE_CPU; }
  int ordinal() const override { return 0; }
  Allocator* allocator() const override { return allocator_; }
  int64_t capacity_bytes() const override;
  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status Memset(void* dst, int byte, size_t bytes) override;
  // The host kernels' fallbacks (NoteCpuKernelFallback), process-wide.
  std::vector<std::string> KernelFallbacks(size_t from) const override;

 protected:
  absl::Status WaitForWork() override { return absl::OkStatus(); }

 private:
  Allocator* allocator_;
};

// A host kernel ran part of the plan another way than planned (a oneDNN
// GEMM refused for its scratchpad, run on widened copies): one line, noted
// once per distinct text; every CpuDevice reports them (KernelFallbacks).
void NoteCpuKernelFallback(const std::string& line);

// The process-wide host device, on the process-wide host allocator.
Device* GetCpuDevice();

// Opens device `ordinal` of a kind. The host's is always there; a binary that
// links a GPU runtime registers its kind's (runtime/cuda:cuda_device_factory
// for DEVICE_CUDA), so a binary without it says so instead of failing later.
using DeviceFactory = std::function<absl::StatusOr<std::unique_ptr<Device>>(int ordinal)>;
// At static initialisation; returns true so it can initialise a static.
bool RegisterDeviceFactory(DeviceKind kind, DeviceFactory factory);
// The factory of `kind`, or nullptr when this binary has none.
const DeviceFactory* FindDeviceFactory(DeviceKind kind);

// How many devices of a kind this machine has, from the same binary that
// registers the kind's factory (a GPU runtime counts its GPUs); the host has
// one. FailedPrecondition when the binary has no counter for the kind, or the
// runtime cannot count (no driver).
using DeviceCounter = std::function<absl::StatusOr<int>()>;
bool RegisterDeviceCounter(DeviceKind kind, DeviceCounter counter);
absl::StatusOr<int> CountDevices(DeviceKind kind);

}  // namespace strata

#endif  // STRATA_RUNTIME_DEVICE_H_
