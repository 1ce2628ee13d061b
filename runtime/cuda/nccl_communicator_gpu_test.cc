// NcclCommunicator on the real NcclApi (libnccl, CUDA events) at world size
// 1 on GPU 0: the ops end to end, then the abort paths, the failure injected
// through a decorator of the real NcclApi. Tagged gpu: without a device
// every test FAILS (never skips).

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/nccl_communicator.h"
#include "runtime/comm/store.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/cuda_nccl_api.h"
#include "runtime/cuda/cuda_test_util.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(30);

// The real NcclApi, except that once `hang` is set an op never completes
// and, with `fail` set too, the communicator reports an async error.
class InjectingNcclApi : public NcclApi {
 public:
  explicit InjectingNcclApi(std::shared_ptr<NcclApi> real) : real_(std::move(real)) {}
  std::atomic<bool> hang{false};
  std::atomic<bool> fail{false};
  std::atomic<int> aborts{0};

  int Version() const override { return real_->Version(); }
  absl::StatusOr<std::string> GetUniqueId() override { return real_->GetUniqueId(); }
  absl::StatusOr<Comm> CommInitRank(int o, int n, const std::string& id, int r) override {
    return real_->CommInitRank(o, n, id, r);
  }
  absl::Status Send(const void* b, size_t n, int p, Comm c, StreamHandle s) override { return real_->Send(b, n, p, c, s); }
  absl::Status Recv(void* b, size_t n, int p, Comm c, StreamHandle s) override { return real_->Recv(b, n, p, c, s); }
  absl::Status AllReduce(const void* a, void* b, size_t n, DataType t, ReduceOp o, Comm c, StreamHandle s) override {
    return real_->AllReduce(a, b, n, t, o, c, s);
  }
  absl::Status Broadcast(const void* a, void* b, size_t n, int r, Comm c, StreamHandle s) override {
    return real_->Broadcast(a, b, n, r, c, s);
  }
  absl::Status AllGather(const void* a, void* b, size_t n, Comm c, StreamHandle s) override {
    return real_->AllGather(a, b, n, c, s);
  }
  absl::Status ReduceScatter(const void* a, void* b, size_t n, DataType t, ReduceOp o, Comm c,
                             StreamHandle s) override {
    return real_->ReduceScatter(a, b, n, t, o, c, s);
  }
  absl::Status GroupStart() override { return real_->GroupStart(); }
  absl::Status GroupEnd() override { return real_->GroupEnd(); }
  absl::Status CommGetAsyncError(Comm c) override {
    if (fail) return absl::UnavailableError("injected NCCL remote error (connection lost)");
    return real_->CommGetAsyncError(c);
  }
  absl::Status CommAbort(Comm c) override {
    ++aborts;
    return real_->CommAbort(c);
  }
  absl::Status CommDestroy(Comm c) override { return real_->CommDestroy(c); }
  absl::StatusOr<Event> RecordEvent(StreamHandle s) override { return real_->RecordEvent(s); }
  absl::StatusOr<bool> EventDone(Event e) override {
    if (hang) return false;
    return real_->EventDone(e);
  }
  void DestroyEvent(Event e) override { real_->DestroyEvent(e); }
  absl::Status StreamWaitEvent(StreamHandle s, Event e) override { return real_->StreamWaitEvent(s, e); }
  absl::StatusOr<StreamHandle> CreateStream(int ordinal) override { return real_->CreateStream(ordinal); }
  void DestroyStream(StreamHandle s) override { real_->DestroyStream(s); }

 private:
  std::shared_ptr<NcclApi> real_;
};

std::unique_ptr<NcclCommunicator> Connect(std::shared_ptr<NcclApi> api, CudaDevice* device) {
  static int counter = 0;
  auto store = OpenStore("memory://nccl-gpu-test-" + std::to_string(counter++));
  EXPECT_TRUE(store.ok()) << store.status();
  auto comm = NcclCommunicator::Create(std::move(api), **store, device, 0, 1, kWait);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? *std::move(comm) : nullptr;
}

Tensor OnGpu(CudaDevice* device, std::vector<float> values) {
  Tensor host = Tensor::Empty(F32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), host.data<float>());
  return *host.CopyTo(device);
}

std::vector<float> Back(const Tensor& t) {
  Tensor host = *t.CopyTo(GetCpuDevice());
  return {host.data<float>(), host.data<float>() + host.num_elements()};
}

TEST(NcclCommunicatorGpuTest, OneRankRunsEveryOpEndToEnd) {
  std::unique_ptr<CudaDevice> device = testing::CudaDeviceOrFail();
  ASSERT_NE(device, nullptr);
  std::unique_ptr<NcclCommunicator> comm = Connect(NewCudaNcclApi(), device.get());
  ASSERT_NE(comm, nullptr);
  Tensor t = OnGpu(device.get(), {1, 2, 3});
  ASSERT_TRUE(comm->AllReduce(&t, ReduceOp::kSum)->Wait(kWait).ok());
  EXPECT_EQ(Back(t), (std::vector<float>{1, 2, 3}));
  ASSERT_TRUE(comm->AllReduce(&t, ReduceOp::kAvg)->Wait(kWait).ok());
  EXPECT_EQ(Back(t), (std::vector<float>{1, 2, 3}));
  ASSERT_TRUE(comm->Broadcast(&t, 0)->Wait(kWait).ok());
  Tensor gathered = OnGpu(device.get(), {0, 0, 0});
  ASSERT_TRUE(comm->AllGather(t, &gathered)->Wait(kWait).ok());
  EXPECT_EQ(Back(gathered), (std::vector<float>{1, 2, 3}));
  Tensor out = OnGpu(device.get(), {0, 0, 0});
  ASSERT_TRUE(comm->ReduceScatter(t, &out, ReduceOp::kMax)->Wait(kWait).ok());
  EXPECT_EQ(Back(out), (std::vector<float>{1, 2, 3}));
  std::unique_ptr<Work> barrier = comm->Barrier();
  ASSERT_TRUE(barrier->Wait(kWait).ok());
  EXPECT_EQ(barrier->sequence_number(), 5);
  EXPECT_FALSE(comm->aborted());
  EXPECT_TRUE(device->Synchronize().ok());
}

TEST(NcclCommunicatorGpuTest, AnInjectedAsyncErrorAbortsTheRealCommunicator) {
  std::unique_ptr<CudaDevice> device = testing::CudaDeviceOrFail();
  ASSERT_NE(device, nullptr);
  auto api = std::make_shared<InjectingNcclApi>(NewCudaNcclApi());
  std::unique_ptr<NcclCommunicator> comm = Connect(api, device.get());
  ASSERT_NE(comm, nullptr);
  Tensor t = OnGpu(device.get(), {1});
  ASSERT_TRUE(comm->AllReduce(&t, ReduceOp::kSum)->Wait(kWait).ok());
  api->hang = true;
  api->fail = true;
  absl::Status s = comm->AllReduce(&t, ReduceOp::kSum)->Wait(kWait);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("injected NCCL remote error"));
  EXPECT_TRUE(comm->aborted());
  EXPECT_EQ(api->aborts, 1);
  absl::Status later = comm->Barrier()->Wait(kWait);
  EXPECT_TRUE(absl::IsFailedPrecondition(later)) << later;
  comm.reset();
  EXPECT_EQ(api->aborts, 1) << "aborted once, never destroyed after";
  EXPECT_TRUE(device->Synchronize().ok()) << "the device still works";
}

TEST(NcclCommunicatorGpuTest, ATimedOutWaitAbortsTheRealCommunicator) {
  std::unique_ptr<CudaDevice> device = testing::CudaDeviceOrFail();
  ASSERT_NE(device, nullptr);
  auto api = std::make_shared<InjectingNcclApi>(NewCudaNcclApi());
  std::unique_ptr<NcclCommunicator> comm = Connect(api, device.get());
  ASSERT_NE(comm, nullptr);
  Tensor t = OnGpu(device.get(), {1});
  api->hang = true;
  absl::Status s = comm->AllReduce(&t, ReduceOp::kSum)->Wait(absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_TRUE(comm->aborted());
  EXPECT_EQ(api->aborts, 1);
}

// A CUDA graph holds NCCL's ops as the executor captures a step that
// communicates: issued and waited on under the capture, recorded rather
// than run, and run at each replay on what the buffers hold then.
TEST(NcclCommunicatorGpuTest, OpsCapturedIntoAGraphRunAtEachReplay) {
  std::unique_ptr<CudaDevice> device = testing::CudaDeviceOrFail();
  ASSERT_NE(device, nullptr);
  std::unique_ptr<NcclCommunicator> comm = Connect(NewCudaNcclApi(), device.get());
  ASSERT_NE(comm, nullptr);
  Tensor src = OnGpu(device.get(), {1, 2, 3});
  Tensor gathered = OnGpu(device.get(), {0, 0, 0});
  // NCCL sets a communicator up at its first op: outside the capture, as the
  // executor's eager first step does.
  ASSERT_TRUE(comm->AllGather(src, &gathered)->Wait(kWait).ok());
  ASSERT_TRUE(device->Memset(gathered.raw_data(), 0, gathered.bytes()).ok());
  ASSERT_TRUE(device->Synchronize().ok());

  ASSERT_TRUE(device->BeginCapture(nullptr).ok());
  EXPECT_TRUE(device->capturing());
  std::unique_ptr<Work> work = comm->AllGather(src, &gathered);
  absl::Status waited = work->Wait(kWait);
  absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = device->EndCapture();
  ASSERT_TRUE(waited.ok()) << waited;
  ASSERT_TRUE(graph.ok()) << graph.status() << " (every stream the op used must rejoin the capture)";
  EXPECT_FALSE(device->capturing());
  EXPECT_EQ(Back(gathered), (std::vector<float>{0, 0, 0})) << "recorded, not run";

  for (const std::vector<float>& values : {std::vector<float>{1, 2, 3}, std::vector<float>{4, 5, 6}}) {
    ASSERT_TRUE(device->CopyFromHost(src.raw_data(), values.data(), src.bytes()).ok());
    ASSERT_TRUE((*graph)->Launch().ok());
    absl::StatusOr<bool> done = false;
    const absl::Time deadline = absl::Now() + kWait;
    while (done.ok() && !*done && absl::Now() < deadline) done = device->WorkDone();
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_TRUE(*done) << "the replay did not finish";
    EXPECT_EQ(Back(gathered), values);
  }
  EXPECT_TRUE(comm->CheckHealth().ok());
  EXPECT_FALSE(comm->aborted());
  graph->reset();
  EXPECT_TRUE(device->Synchronize().ok());
}

}  // namespace
}  // namespace strata
