// copy_to_device and copy_to_host registered for DEVICE_CUDA, on one
// CudaDevice; send, recv, allreduce, bucket_allreduce and bucket_wait: two ranks as threads, each with its own CudaDevice on GPU 0
// (two ranks sharing a GPU), over Gloo staged through pinned host memory
// (StagedCommunicator), run through the kernel registry as the executor
// runs them. Moved bytes must arrive bit for bit; the sums of two ranks'
// integer-valued floats are exact. Tagged gpu: without a device every test
// FAILS.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_op_test_util.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/comm/staged_communicator.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/cuda_test_util.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

using testing::BitEqual;
using testing::RandomTensor;

STRATA_CUDA_OPS_TESTED(cuda_comm_ops_test, {
                                               {"send", {F32, F64, I64, I32, BOOL}},
                                               {"recv", {F32, F64, I64, I32, BOOL}},
                                               {"allreduce", {F32, F64}},
                                               {"bucket_allreduce", {F32, F64}},
                                               {"bucket_wait", {F32, F64}},
                                               {"copy_to_device", {F32, F64, I64, I32, BOOL, BF16, F16}},
                                               {"copy_to_host", {F32, F64, I64, I32, BOOL, BF16, F16}},
                                           });

std::unique_ptr<OpKernel> MakeKernel(const Op& op, DataType dtype, std::vector<TensorType> ins,
                                     std::vector<TensorType> outs) {
  KernelDef def;
  def.op = &op;
  def.input_types = std::move(ins);
  def.output_types = std::move(outs);
  const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), DEVICE_CUDA, dtype);
  EXPECT_NE(factory, nullptr) << op.type() << " " << DataTypeName(dtype);
  if (factory == nullptr) return nullptr;
  auto kernel = (*factory)(def);
  EXPECT_TRUE(kernel.ok()) << kernel.status();
  return kernel.ok() ? *std::move(kernel) : nullptr;
}

CommGroup WorldGroup() {
  CommGroup g;
  g.set_id(0);
  g.add_axis("dp");
  g.add_rank(0);
  g.add_rank(1);
  return g;
}

// Two ranks, each a CudaDevice on GPU 0 and a staged communicator.
struct Ranks {
  std::unique_ptr<CudaDevice> devices[2];
  std::vector<std::unique_ptr<Communicator>> comms;
};

bool Connect(Ranks* ranks) {
  for (auto& device : ranks->devices) {
    device = testing::CudaDeviceOrFail();
    if (device == nullptr) return false;
  }
  ranks->comms = testing::ConnectRanks(2);
  for (auto& comm : ranks->comms) comm = std::make_unique<StagedCommunicator>(std::move(comm));
  return true;
}

// A host tensor up to the device and back through the host-transfers ops:
// the copy back is not waited for, so its bytes are compared only after the
// device has synchronised.
TEST(CudaCommOpsTest, CopiesToTheDeviceAndBackMoveEveryDtypeBitForBit) {
  std::unique_ptr<CudaDevice> device = testing::CudaDeviceOrFail();
  ASSERT_NE(device, nullptr);
  for (DataType dtype : {F32, F64, I64, I32, BOOL, BF16, F16}) {
    SCOPED_TRACE(DataTypeName(dtype));
    Op to_device, to_host;
    to_device.set_type("copy_to_device");
    to_host.set_type("copy_to_host");
    const Shape shape{3, 5};
    const TensorType type{dtype, {-1, 5}};
    const Tensor host = dtype == BOOL ? Tensor::Zeros(BOOL, shape) : RandomTensor(dtype, shape, 11);
    RunContext run;
    run.device = device.get();
    run.micro_batch_size = 3;
    auto up = MakeKernel(to_device, dtype, {type}, {type});
    auto down = MakeKernel(to_host, dtype, {type}, {type});
    ASSERT_NE(up, nullptr);
    ASSERT_NE(down, nullptr);
    std::vector<Tensor> on_device(1), back(1);
    const Tensor* host_in[] = {&host};
    KernelContext up_ctx(&run, host_in, absl::MakeSpan(on_device));
    absl::Status s = up->Compute(up_ctx);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(on_device[0].device(), device.get());
    const Tensor* device_in[] = {&on_device[0]};
    KernelContext down_ctx(&run, device_in, absl::MakeSpan(back));
    s = down->Compute(down_ctx);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(back[0].on_host());
    ASSERT_TRUE(device->Synchronize().ok());
    EXPECT_TRUE(BitEqual(back[0], host));
    // A feed its caller already put on the device is copied there.
    std::vector<Tensor> again(1);
    KernelContext again_ctx(&run, device_in, absl::MakeSpan(again));
    s = up->Compute(again_ctx);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(again[0].device(), device.get());
    EXPECT_NE(again[0].raw_data(), on_device[0].raw_data());
    absl::StatusOr<Tensor> again_back = again[0].CopyTo(GetCpuDevice());
    ASSERT_TRUE(again_back.ok()) << again_back.status();
    EXPECT_TRUE(BitEqual(*again_back, host));
  }
}

TEST(CudaCommOpsTest, SendAndRecvMoveEveryDtypeBitForBitBetweenRanksSharingAGpu) {
  Ranks ranks;
  ASSERT_TRUE(Connect(&ranks));
  for (DataType dtype : {F32, F64, I64, I32, BOOL}) {
    SCOPED_TRACE(DataTypeName(dtype));
    Op send, recv;
    send.set_type("send");
    recv.set_type("recv");
    for (Op* op : {&send, &recv}) {
      op->mutable_channel()->set_id(4);
      op->mutable_channel()->set_src_rank(0);
      op->mutable_channel()->set_dst_rank(1);
      op->mutable_channel()->set_var("h");
    }
    const Shape shape{3, 5};
    const Tensor host = dtype == BOOL ? Tensor::Zeros(BOOL, shape) : RandomTensor(dtype, shape, 7);
    testing::RunRanks(2, [&](int rank) {
      CudaDevice* device = ranks.devices[rank].get();
      CommunicatorSet set(ranks.comms[rank].get());
      std::vector<std::unique_ptr<Work>> sends;
      RunContext run;
      run.device = device;
      run.comms = &set;
      run.pending_sends = &sends;
      run.comm_timeout_s = 30;
      run.micro_batch_size = 3;
      std::vector<Tensor> outputs(1);
      if (rank == 0) {
        absl::StatusOr<Tensor> x = host.CopyTo(device);
        ASSERT_TRUE(x.ok()) << x.status();
        auto kernel = MakeKernel(send, dtype, {TensorType{dtype, shape}}, {});
        ASSERT_NE(kernel, nullptr);
        const Tensor* ins[] = {&*x};
        KernelContext ctx(&run, ins, absl::MakeSpan(outputs).subspan(0, 0));
        ASSERT_TRUE(kernel->Compute(ctx).ok());
        ASSERT_EQ(sends.size(), 1u);
        EXPECT_TRUE(sends[0]->Wait(absl::Seconds(30)).ok());
      } else {
        auto kernel = MakeKernel(recv, dtype, {}, {TensorType{dtype, {-1, 5}}});
        ASSERT_NE(kernel, nullptr);
        KernelContext ctx(&run, {}, absl::MakeSpan(outputs));
        absl::Status s = kernel->Compute(ctx);
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_EQ(outputs[0].device(), device);
        absl::StatusOr<Tensor> back = outputs[0].CopyTo(GetCpuDevice());
        ASSERT_TRUE(back.ok()) << back.status();
        EXPECT_TRUE(BitEqual(*back, host));
      }
      EXPECT_TRUE(device->Synchronize().ok());
    });
  }
}

TEST(CudaCommOpsTest, AllreduceAndBucketsSumOverRanksSharingAGpu) {
  Ranks ranks;
  ASSERT_TRUE(Connect(&ranks));
  for (DataType dtype : {F32, F64}) {
    SCOPED_TRACE(DataTypeName(dtype));
    Op allreduce, post, wait;
    allreduce.set_type("allreduce");
    allreduce.set_group(0);
    post.set_type("bucket_allreduce");
    post.set_group(0);
    (*post.mutable_attr())["bucket"].set_i(1);
    wait.set_type("bucket_wait");
    (*wait.mutable_attr())["bucket"].set_i(1);
    testing::RunRanks(2, [&](int rank) {
      CudaDevice* device = ranks.devices[rank].get();
      CommunicatorSet set(ranks.comms[rank].get());
      ASSERT_TRUE(set.Add(WorldGroup(), nullptr).ok());
      std::map<int64_t, PendingCollective> pending;
      RunContext run;
      run.device = device;
      run.comms = &set;
      run.pending_buckets = &pending;
      run.comm_timeout_s = 30;
      auto on_device = [&](std::vector<double> values, Shape shape) {
        Tensor t = Tensor::Empty(dtype, shape);
        for (size_t i = 0; i < values.size(); ++i) {
          if (dtype == F32) t.data<float>()[i] = static_cast<float>(values[i]);
          else t.data<double>()[i] = values[i];
        }
        return *t.CopyTo(device);
      };
      const double r = rank + 1;
      // allreduce: 1x and 2x summed is 3x.
      Tensor x = on_device({1 * r, 2 * r, 3 * r}, {3});
      std::vector<Tensor> out(1);
      {
        auto kernel = MakeKernel(allreduce, dtype, {TensorType{dtype, {3}}}, {TensorType{dtype, {3}}});
        ASSERT_NE(kernel, nullptr);
        const Tensor* ins[] = {&x};
        KernelContext ctx(&run, ins, absl::MakeSpan(out));
        absl::Status s = kernel->Compute(ctx);
        ASSERT_TRUE(s.ok()) << s;
      }
      for (int i = 0; i < 3; ++i) EXPECT_EQ(out[0].ValueAt(i), 3.0 * (i + 1));
      EXPECT_EQ(x.ValueAt(0), r) << "the input is left as it was";
      // A bucket of two gradients: posted, then waited and split back.
      Tensor bucket = on_device({0, 0, 0, 0, 0}, {5});
      Tensor a = on_device({1 * r, 2 * r}, {2, 1});
      Tensor b = on_device({3 * r, 4 * r, 5 * r}, {3});
      const TensorType bucket_type{dtype, {5}}, a_type{dtype, {2, 1}}, b_type{dtype, {3}};
      auto poster = MakeKernel(post, dtype, {bucket_type, a_type, b_type}, {bucket_type});
      auto waiter = MakeKernel(wait, dtype, {bucket_type}, {a_type, b_type});
      ASSERT_NE(poster, nullptr);
      ASSERT_NE(waiter, nullptr);
      std::vector<Tensor> post_out(1), grads(2);
      const Tensor* post_ins[] = {&bucket, &a, &b};
      KernelContext post_ctx(&run, post_ins, absl::MakeSpan(post_out));
      ASSERT_TRUE(poster->Compute(post_ctx).ok());
      ASSERT_EQ(pending.size(), 1u);
      const Tensor* wait_ins[] = {&bucket};
      KernelContext wait_ctx(&run, wait_ins, absl::MakeSpan(grads));
      absl::Status s = waiter->Compute(wait_ctx);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(grads[0].ValueAt(0), 3);
      EXPECT_EQ(grads[0].ValueAt(1), 6);
      EXPECT_EQ(grads[1].ValueAt(2), 15);
      EXPECT_TRUE(device->Synchronize().ok());
    });
  }
}

}  // namespace
}  // namespace strata
