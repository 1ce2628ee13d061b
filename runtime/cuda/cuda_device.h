#ifndef STRATA_RUNTIME_CUDA_CUDA_DEVICE_H_
#define STRATA_RUNTIME_CUDA_CUDA_DEVICE_H_

// One GPU as a Device: a compute stream and a communication stream, a
// stream-ordered caching allocator over cudaMalloc (runtime/caching_allocator.h,
// the design of PyTorch's CUDA allocator), the copies between host and
// device, and the cuBLASLt handle its GEMM kernels share.
//
// Stream order: every kernel runs on the compute stream, and the allocator
// hands out blocks for work on it, so a block freed by the host after the
// kernels that used it were enqueued may serve the next kernel at once (the
// stream runs them in order). A block that work on the communication stream
// also read is marked with RecordUse and reused only once that stream has
// passed the free.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/cuda/gemm.h"
#include "runtime/caching_allocator.h"
#include "runtime/device.h"
#include "runtime/kernel.h"
#include "runtime/staging_allocator.h"

namespace strata {

// The streams of one GPU whose work may wait for other processes (and the
// compute stream that feeds them), guarded for the threads that add and
// remove them while an allocation marks them.
class PeerStreams {
 public:
  void Add(cudaStream_t stream) {
    absl::MutexLock lock(&mu_);
    if (std::find(streams_.begin(), streams_.end(), stream) == streams_.end()) streams_.push_back(stream);
  }
  void Remove(cudaStream_t stream) {
    absl::MutexLock lock(&mu_);
    streams_.erase(std::remove(streams_.begin(), streams_.end(), stream), streams_.end());
  }
  std::vector<cudaStream_t> All() const {
    absl::MutexLock lock(&mu_);
    return streams_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<cudaStream_t> streams_ ABSL_GUARDED_BY(mu_);
};

class CudaDevice final : public Device {
 public:
  // FailedPrecondition when there is no usable GPU `ordinal` (no driver, no
  // device, or an ordinal past the count).
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal = 0);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  DeviceKind kind() const override { return DEVICE_CUDA; }
  int ordinal() const override { return ordinal_; }
  Allocator* allocator() const override { return allocator_.get(); }
  int64_t capacity_bytes() const override { return capacity_bytes_; }
  int64_t peak_reserved_bytes() const override { return allocator_->stats().peak_reserved_bytes; }
  std::string physical_id() const override { return physical_id_; }
  std::shared_ptr<void> AddPeerStream(StreamHandle stream) override;
  void LimitPeerWaits(absl::Duration limit) override;
  CachingAllocator* caching_allocator() const { return allocator_.get(); }
  // Page-locked host memory (cudaHostAlloc), freed in compute-stream order.
  Allocator* staging_allocator() const override { return staging_.get(); }
  StreamHandle compute_stream() const override { return compute_; }
  StreamHandle comm_stream() const override { return comm_; }
  cudaStream_t stream() const { return compute_; }
  // The device's cuBLASLt handle and workspace, for kernels on the compute stream.
  cuda::LtGemm& gemm() const { return *gemm_; }

  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  absl::Status EnqueueCopyToHost(void* host_dst, const void* src, size_t bytes) override;
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  absl::Status Memset(void* dst, int byte, size_t bytes) override;

  // CUDA graphs: the compute stream captured in relaxed mode (the caching
  // allocator may cudaMalloc a segment of the graph's pool meanwhile), the
  // allocations from BeginCapture to EndCapture served from the graph's
  // private pools (CachingAllocator::BeginCapture, as PyTorch's graph pools).
  std::string GraphUnsupported() const override { return ""; }
  absl::Status BeginCapture(const DeviceGraph* share_memory_with) override;
  absl::StatusOr<std::unique_ptr<DeviceGraph>> EndCapture() override;
  std::vector<std::string> KernelFallbacks(size_t from) const override;
  bool capturing() const override { return capture_active_.load(std::memory_order_acquire); }
  // cudaStreamQuery of both streams (a graph replays on the compute stream).
  absl::StatusOr<bool> WorkDone() override;
  // The pools of a capture; shared by the graphs captured into them.
  struct CapturePools;

  // The block at `ptr` is read or written by work on `stream` too.
  void RecordUse(void* ptr, cudaStream_t stream) { allocator_->RecordStream(ptr, stream); }
  // The compute stream waits for the work enqueued so far on the comm stream (an event).
  absl::Status ComputeWaitsForComm();

 protected:
  absl::Status WaitForWork() override;

 private:
  CudaDevice(int ordinal, cudaStream_t compute, cudaStream_t comm)
      : ordinal_(ordinal), compute_(compute), comm_(comm) {}

  int ordinal_;
  cudaStream_t compute_;
  cudaStream_t comm_;
  int64_t capacity_bytes_ = 0;
  std::string physical_id_;  // "GPU-<uuid>", nvidia-smi's form
  // The compute and communication streams and the ones AddPeerStream
  // adds, shared with the allocator's backend (SynchronizeWithin).
  std::shared_ptr<PeerStreams> peer_streams_ = std::make_shared<PeerStreams>();
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<StagingAllocator> staging_;
  std::unique_ptr<cuda::LtGemm> gemm_;
  std::shared_ptr<CapturePools> capturing_;  // set from BeginCapture to EndCapture
  // Whether capturing_ is set, for threads other than the capturing one
  // (a communicator's Work may be waited on anywhere).
  std::atomic<bool> capture_active_{false};
};

// "CUDA <what> failed: <error string>" as an Internal status; OK for cudaSuccess.
absl::Status CudaStatus(cudaError_t error, const char* what);

// The CudaDevice a CUDA kernel runs on; Internal if the run's device is not
// one (the executor picks kernels by the plan's device kind, so only a
// mismatched test gets here).
absl::StatusOr<CudaDevice*> CudaDeviceOf(const KernelContext& ctx);

}  // namespace strata

#endif  // STRATA_RUNTIME_CUDA_CUDA_DEVICE_H_
