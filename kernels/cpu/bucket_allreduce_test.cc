// bucket_allreduce and bucket_wait over two ranks (threads, Gloo on
// loopback): a bucket is posted once per optimizer update, in the backward
// of the step's last micro-batch, and the wait hands back the gradients
// summed over the group, in the bucket's order.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

std::unique_ptr<OpKernel> MakeKernel(const Op& op, std::vector<TensorType> ins, std::vector<TensorType> outs) {
  KernelDef def;
  def.op = &op;
  def.input_types = std::move(ins);
  def.output_types = std::move(outs);
  const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), DEVICE_CPU, F64);
  EXPECT_NE(factory, nullptr) << op.type();
  auto kernel = (*factory)(def);
  EXPECT_TRUE(kernel.ok()) << kernel.status();
  return *std::move(kernel);
}

Tensor Values(std::vector<double> v, Shape shape) {
  Tensor t = Tensor::Empty(F64, std::move(shape));
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}

// Group 0: both ranks, served by the world's communicator.
CommGroup WorldGroup() {
  CommGroup g;
  g.set_id(0);
  g.add_axis("dp");
  g.add_rank(0);
  g.add_rank(1);
  return g;
}

std::vector<double> ValuesOf(const Tensor& t) { return {t.data<double>(), t.data<double>() + t.num_elements()}; }

// One rank's step: the post in micro-batch `micro_batch` of `micro_batches`
// (update step or not), then the wait. Returns the waited gradients.
struct Posting {
  int micro_batch;
  int micro_batches;
  bool update;
};

TEST(BucketAllReduceTest, PostsOncePerUpdateAndWaitsForTheGroupSum) {
  Op post;
  post.set_type("bucket_allreduce");
  post.set_group(0);
  (*post.mutable_attr())["bucket"].set_i(3);
  Op wait;
  wait.set_type("bucket_wait");
  (*wait.mutable_attr())["bucket"].set_i(3);
  const TensorType bucket_type{F64, {5}}, a_type{F64, {2, 1}}, b_type{F64, {3}};

  auto comms = testing::ConnectRanks(2);
  testing::RunRanks(2, [&](int rank) {
    CommunicatorSet set(comms[rank].get());
    ASSERT_TRUE(set.Add(WorldGroup(), nullptr).ok());
    auto poster = MakeKernel(post, {bucket_type, a_type, b_type}, {bucket_type});
    auto waiter = MakeKernel(wait, {bucket_type}, {a_type, b_type});
    Tensor bucket = Tensor::Zeros(F64, {5});
    const double r = rank + 1;
    Tensor a = Values({1 * r, 2 * r}, {2, 1});
    Tensor b = Values({3 * r, 4 * r, 5 * r}, {3});
    std::map<int64_t, PendingCollective> pending;
    RunContext run;
    run.comms = &set;
    run.pending_buckets = &pending;
    run.comm_timeout_s = 30;
    std::vector<Tensor> post_out(1);
    auto post_once = [&](const Posting& p) {
      run.micro_batch = p.micro_batch;
      run.micro_batches = p.micro_batches;
      run.update_step = p.update;
      const Tensor* ins[] = {&bucket, &a, &b};
      KernelContext ctx(&run, ins, absl::MakeSpan(post_out));
      absl::Status s = poster->Compute(ctx);
      ASSERT_TRUE(s.ok()) << s;
    };
    // Not the last micro-batch, or a step between gradient-merge updates: nothing goes out.
    post_once({0, 2, true});
    post_once({1, 2, false});
    EXPECT_TRUE(pending.empty()) << "rank " << rank;
    EXPECT_EQ(ValuesOf(bucket), std::vector<double>(5, 0.0)) << "rank " << rank;
    // The last micro-batch of an update step posts bucket 3.
    post_once({1, 2, true});
    ASSERT_EQ(pending.size(), 1u);
    EXPECT_EQ(pending.begin()->first, 3);
    EXPECT_NE(pending.begin()->second.what.find("bucket 3 (2 gradients, F64[5])"), std::string::npos)
        << pending.begin()->second.what;

    std::vector<Tensor> grads(2);
    const Tensor* wait_ins[] = {&bucket};
    KernelContext ctx(&run, wait_ins, absl::MakeSpan(grads));
    ASSERT_TRUE(waiter->Compute(ctx).ok());
    EXPECT_TRUE(pending.empty());
    // Sums over ranks 1 and 2 (r = 1, 2): 3x each rank-1 value, in the bucket's order and shapes.
    EXPECT_EQ(grads[0].shape(), (Shape{2, 1}));
    EXPECT_EQ(ValuesOf(grads[0]), (std::vector<double>{3, 6}));
    EXPECT_EQ(ValuesOf(grads[1]), (std::vector<double>{9, 12, 15}));
    // The gradients themselves are left as they were.
    EXPECT_EQ(ValuesOf(a), (std::vector<double>{1 * r, 2 * r}));
  });
}

// A wait whose bucket was never posted, on ranks with peers, is an error
// naming the bucket, not a silent copy of stale sums.
TEST(BucketAllReduceTest, WaitWithoutAPostIsAnError) {
  Op wait;
  wait.set_type("bucket_wait");
  (*wait.mutable_attr())["bucket"].set_i(1);
  auto comms = testing::ConnectRanks(2);
  testing::RunRanks(2, [&](int rank) {
    CommunicatorSet set(comms[rank].get());
    ASSERT_TRUE(set.Add(WorldGroup(), nullptr).ok());
    auto waiter = MakeKernel(wait, {{F64, {2}}}, {{F64, {2}}});
    Tensor bucket = Tensor::Zeros(F64, {2});
    std::map<int64_t, PendingCollective> pending;
    RunContext run;
    run.comms = &set;
    run.pending_buckets = &pending;
    std::vector<Tensor> out(1);
    const Tensor* ins[] = {&bucket};
    KernelContext ctx(&run, ins, absl::MakeSpan(out));
    absl::Status s = waiter->Compute(ctx);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("bucket 1"), std::string::npos) << s;
  });
}

}  // namespace
}  // namespace strata
