#include "runtime/cuda/cuda_device.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata {
namespace {

// The caching allocator's view of one GPU: cudaMalloc and stream events.
class CudaBackend final : public CachingAllocator::Backend {
 public:
  CudaBackend(int ordinal, std::shared_ptr<PeerStreams> streams) : ordinal_(ordinal), streams_(std::move(streams)) {}
  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  void* Malloc(size_t bytes) override {
    void* ptr = nullptr;
    if (cudaSetDevice(ordinal_) != cudaSuccess || cudaMalloc(&ptr, bytes) != cudaSuccess) {
      cudaGetLastError();  // out of memory is not sticky; clear it for the next call
      return nullptr;
    }
    return ptr;
  }
  void Free(void* ptr) override { cudaFree(ptr); }
  void* RecordEvent(StreamHandle stream) override {
    cudaEvent_t event = nullptr;
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) return nullptr;
    cudaEventRecord(event, static_cast<cudaStream_t>(stream));
    return event;
  }
  bool EventDone(void* event) override {
    // A null event (creation failed) never completes on its own; Synchronize
    // releases such blocks.
    return event != nullptr && cudaEventQuery(static_cast<cudaEvent_t>(event)) == cudaSuccess;
  }
  void DestroyEvent(void* event) override {
    if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  void Synchronize() override {
    cudaSetDevice(ordinal_);
    cudaDeviceSynchronize();
  }
  // Marks every stream whose work may wait for a peer (and the compute
  // stream, whose kernels feed them) and waits for the marks up to `limit`;
  // then the device's remaining work, which waits for nothing outside it.
  bool SynchronizeWithin(absl::Duration limit) override {
    cudaSetDevice(ordinal_);
    std::vector<cudaEvent_t> marks;
    for (cudaStream_t stream : streams_->All()) {
      cudaEvent_t event = nullptr;
      if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventRecord(event, stream) != cudaSuccess) {
        cudaGetLastError();
        if (event != nullptr) cudaEventDestroy(event);
        continue;  // unmarked: the device synchronization below waits for it
      }
      marks.push_back(event);
    }
    const absl::Time deadline = limit == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + limit;
    absl::Duration nap = absl::Microseconds(20);
    bool passed = false;
    for (;;) {
      passed = true;
      for (cudaEvent_t event : marks) passed = passed && cudaEventQuery(event) == cudaSuccess;
      if (passed || absl::Now() >= deadline) break;
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
    cudaGetLastError();  // cudaErrorNotReady is not sticky
    for (cudaEvent_t event : marks) cudaEventDestroy(event);
    if (!passed) return false;
    cudaDeviceSynchronize();
    return true;
  }

 private:
  int ordinal_;
  std::shared_ptr<PeerStreams> streams_;
};

// Page-locked host memory for staging buffers, with the compute stream's
// events: StagingAllocator reuses a freed block once the stream passed it.
class PinnedHostBackend final : public CachingAllocator::Backend {
 public:
  PinnedHostBackend(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}
  std::string name() const override { return absl::StrCat("cuda:", ordinal_, " pinned host"); }
  void* Malloc(size_t bytes) override {
    void* ptr = nullptr;
    if (cudaSetDevice(ordinal_) != cudaSuccess || cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return ptr;
  }
  void Free(void* ptr) override { cudaFreeHost(ptr); }
  // Frees come from the Gloo and send-waiter threads too: each call names the
  // rank's GPU first (a thread's current device defaults to 0, and a fresh
  // context there would cost GPU 0 memory), and clears a failure it leaves,
  // so no later WaitForWork reports it as a kernel's.
  void* RecordEvent(StreamHandle stream) override {
    cudaEvent_t event = nullptr;
    if (cudaSetDevice(ordinal_) != cudaSuccess ||
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    if (cudaEventRecord(event, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
      cudaGetLastError();
      cudaEventDestroy(event);
      return nullptr;
    }
    return event;
  }
  bool EventDone(void* event) override {
    if (event == nullptr || cudaSetDevice(ordinal_) != cudaSuccess) return false;
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e != cudaSuccess) cudaGetLastError();  // cudaErrorNotReady included: not an error of anyone's work
    return e == cudaSuccess;
  }
  void DestroyEvent(void* event) override {
    if (event == nullptr) return;
    cudaSetDevice(ordinal_);
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  void Synchronize() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
  }

 private:
  int ordinal_;
  cudaStream_t stream_;
};

}  // namespace

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, " failed: ", cudaGetErrorString(error)));
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal) {
  int count = 0;
  const cudaError_t count_error = cudaGetDeviceCount(&count);
  if (count_error != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: ", count_error != cudaSuccess ? cudaGetErrorString(count_error)
                                                                     : "the driver reports 0 devices"));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device ", ordinal, ": this machine has ", count));
  }
  if (absl::Status s = CudaStatus(cudaSetDevice(ordinal), "set device"); !s.ok()) return s;
  cudaStream_t compute = nullptr, comm = nullptr;
  if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "stream create");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking), "stream create");
      !s.ok()) {
    cudaStreamDestroy(compute);
    return s;
  }
  std::unique_ptr<CudaDevice> device(new CudaDevice(ordinal, compute, comm));
  if (cudaDeviceProp prop; cudaGetDeviceProperties(&prop, ordinal) == cudaSuccess) {
    // nvidia-smi's GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
    const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    std::string id = "GPU-";
    for (int i = 0; i < 16; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) id += '-';
      absl::StrAppend(&id, absl::Hex(b[i], absl::kZeroPad2));
    }
    device->physical_id_ = id;
  } else {
    cudaGetLastError();  // unknown: the ranks count GPUs instead
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    device->capacity_bytes_ = static_cast<int64_t>(total_bytes);
  } else {
    cudaGetLastError();  // unknown capacity: check then says so
  }
  device->peer_streams_->Add(compute);
  device->peer_streams_->Add(comm);
  device->allocator_ =
      std::make_unique<CachingAllocator>(std::make_unique<CudaBackend>(ordinal, device->peer_streams_), compute);
  device->staging_ = std::make_unique<StagingAllocator>(std::make_unique<PinnedHostBackend>(ordinal, compute), compute);
  auto gemm = cuda::LtGemm::Create();
  if (!gemm.ok()) return gemm.status();
  device->gemm_ = *std::move(gemm);
  // Misaligned operands of large GEMMs are staged through the device's own
  // memory, counted as the op's scratch (kernels/gemm_staging.h).
  device->gemm_->set_scratch_allocator(device->allocator_.get());
  return device;
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(ordinal_);
  cudaStreamSynchronize(compute_);
  cudaStreamSynchronize(comm_);
  gemm_.reset();
  staging_.reset();
  allocator_.reset();  // returns its segments after a device synchronisation
  cudaStreamDestroy(comm_);
  cudaStreamDestroy(compute_);
}

absl::Status CudaDevice::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  // From pageable memory, cudaMemcpyAsync returns once the source is staged,
  // so the caller may reuse it; the copy itself stays ordered on the stream.
  // From the staging allocator's page-locked memory it returns at once, and
  // that allocator reuses the block only after the stream passed its free.
  return CudaStatus(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, compute_), "copy to device");
}

absl::Status CudaDevice::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = CudaStatus(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, compute_),
                                  "copy to host");
      !s.ok()) {
    return s;
  }
  return CudaStatus(cudaStreamSynchronize(compute_), "copy to host (wait)");
}

absl::Status CudaDevice::EnqueueCopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, compute_), "copy to host");
}

absl::Status CudaDevice::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_), "device copy");
}

std::vector<std::string> CudaDevice::KernelFallbacks(size_t from) const {
  const std::vector<std::string>& all = gemm_->epilogue_fallbacks();
  if (from >= all.size()) return {};
  return std::vector<std::string>(all.begin() + static_cast<std::ptrdiff_t>(from), all.end());
}

absl::Status CudaDevice::Memset(void* dst, int byte, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemsetAsync(dst, byte, bytes, compute_), "memset");
}

void CudaDevice::LimitPeerWaits(absl::Duration limit) { allocator_->set_sync_limit(limit); }

std::shared_ptr<void> CudaDevice::AddPeerStream(StreamHandle stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  peer_streams_->Add(s);
  // Holds the registry, not the device: the handle may outlive either.
  return std::shared_ptr<void>(s, [registry = peer_streams_](void* added) {
    registry->Remove(static_cast<cudaStream_t>(added));
  });
}

absl::Status CudaDevice::ComputeWaitsForComm() {
  cudaEvent_t event = nullptr;
  if (absl::Status s = CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event create");
      !s.ok()) {
    return s;
  }
  absl::Status s = CudaStatus(cudaEventRecord(event, comm_), "event record");
  if (s.ok()) s = CudaStatus(cudaStreamWaitEvent(compute_, event, 0), "stream wait");
  cudaEventDestroy(event);  // released once the wait has passed it
  return s;
}

absl::Status CudaDevice::WaitForWork() {
  absl::Status s = CudaStatus(cudaStreamSynchronize(compute_), "compute stream synchronize");
  absl::Status c = CudaStatus(cudaStreamSynchronize(comm_), "comm stream synchronize");
  // A kernel's own fault (an illegal address) shows up here as well.
  absl::Status launch = CudaStatus(cudaGetLastError(), "kernel");
  return !s.ok() ? s : !c.ok() ? c : launch;
}

absl::StatusOr<bool> CudaDevice::WorkDone() {
  for (cudaStream_t stream : {compute_, comm_}) {
    const cudaError_t queried = cudaStreamQuery(stream);
    if (queried == cudaErrorNotReady) return false;
    if (queried != cudaSuccess) return CudaStatus(queried, "stream query");
  }
  return true;
}

// The pools a capture drew from: given back once the last graph captured
// into them is gone (after its replays finished).
struct CudaDevice::CapturePools {
  CapturePools(CudaDevice* device, int64_t device_pool, int64_t staging_pool)
      : device(device), device_pool(device_pool), staging_pool(staging_pool) {}
  ~CapturePools() {
    cudaSetDevice(device->ordinal());
    cudaStreamSynchronize(device->stream());
    device->caching_allocator()->ReleasePool(device_pool);
    device->staging_->ReleasePool(staging_pool);
  }
  CudaDevice* device;
  const int64_t device_pool;
  const int64_t staging_pool;
};

namespace {

class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(int ordinal, cudaGraphExec_t exec, cudaStream_t stream, std::shared_ptr<CudaDevice::CapturePools> pools)
      : pools_(std::move(pools)), ordinal_(ordinal), exec_(exec), stream_(stream) {}
  ~CudaGraph() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);  // its replays end before its memory goes back
    cudaGraphExecDestroy(exec_);
  }
  absl::Status Launch() override {
    if (absl::Status s = CudaStatus(cudaSetDevice(ordinal_), "set device"); !s.ok()) return s;
    return CudaStatus(cudaGraphLaunch(exec_, stream_), "graph launch");
  }
  const std::shared_ptr<CudaDevice::CapturePools>& pools() const { return pools_; }

 private:
  std::shared_ptr<CudaDevice::CapturePools> pools_;  // first member: released last
  int ordinal_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

absl::Status CudaDevice::BeginCapture(const DeviceGraph* share_memory_with) {
  if (capturing_ != nullptr) return absl::FailedPreconditionError(absl::StrCat(name(), " is already capturing"));
  std::shared_ptr<CapturePools> shared;
  if (share_memory_with != nullptr) {
    const auto* graph = dynamic_cast<const CudaGraph*>(share_memory_with);
    if (graph == nullptr || graph->pools()->device != this) {
      return absl::InvalidArgumentError(absl::StrCat("a graph of another device cannot lend its memory to ", name()));
    }
    shared = graph->pools();
  }
  if (absl::Status s = CudaStatus(cudaSetDevice(ordinal_), "set device"); !s.ok()) return s;
  // A new pool takes no block of the general cache, where the eager steps'
  // segments sit free: give those back first (legal: nothing captures yet),
  // or a plan near the device's size has room for only one of the two.
  if (shared == nullptr) allocator_->EmptyCache();
  const int64_t device_pool = allocator_->BeginCapture(shared ? shared->device_pool : 0);
  const int64_t staging_pool = staging_->BeginCapture(shared ? shared->staging_pool : 0);
  std::shared_ptr<CapturePools> pools = shared ? shared : std::make_shared<CapturePools>(this, device_pool, staging_pool);
  if (absl::Status s =
          CudaStatus(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeRelaxed), "stream begin capture");
      !s.ok()) {
    allocator_->EndCapture();
    staging_->EndCapture();
    return s;
  }
  capturing_ = std::move(pools);
  capture_active_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceGraph>> CudaDevice::EndCapture() {
  if (capturing_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(name(), " is not capturing"));
  cudaSetDevice(ordinal_);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(compute_, &graph);
  allocator_->EndCapture();
  staging_->EndCapture();
  std::shared_ptr<CapturePools> pools = std::move(capturing_);
  capturing_ = nullptr;
  capture_active_.store(false, std::memory_order_release);
  if (ended != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // the invalidated capture's error is this status, not the next kernel's
    return CudaStatus(ended != cudaSuccess ? ended : cudaErrorStreamCaptureInvalidated, "stream capture");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (instantiated != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(instantiated, "graph instantiate");
  }
  return std::unique_ptr<DeviceGraph>(new CudaGraph(ordinal_, exec, compute_, std::move(pools)));
}

absl::StatusOr<CudaDevice*> CudaDeviceOf(const KernelContext& ctx) {
  if (ctx.device().kind() != DEVICE_CUDA) {
    return absl::InternalError(absl::StrCat("a CUDA kernel ran on ", ctx.device().name()));
  }
  return static_cast<CudaDevice*>(&ctx.device());
}

}  // namespace strata
