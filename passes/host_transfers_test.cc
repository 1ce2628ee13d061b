#include "passes/host_transfers.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "analysis/memory_plan.h"
#include "compiler/graph.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/testing/pass_test_util.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/executor.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

CompileResult CompileFor(const std::string& text, const Strategy& strategy, DeviceKind device,
                         const std::string& dump_after = "") {
  CompileOptions options;
  options.batch_size = 4;
  options.device_kind = device;
  options.dump_after = dump_after;
  auto r = Compile(ParseProgramOrFail(text), strategy, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : CompileResult();
}

// The single-device program of pass_test_util (x, label -> loss), one stage.
std::string OneStage() {
  std::string text = TwoStagesProgram();
  for (size_t at = text.find("gpu:1"); at != std::string::npos; at = text.find("gpu:1")) text.replace(at, 5, "gpu:0");
  return text + R"pb(op { type: "reduce_mean" input: ["h"] output: ["hm"] device: "gpu:0" }
                     fetch: "hm")pb";
}

std::vector<std::string> Readers(const Program& p, const std::string& var) {
  std::vector<std::string> types;
  for (const Op& op : p.op()) {
    for (const auto& in : op.input()) {
      if (in == var) types.push_back(op.type());
    }
  }
  return types;
}

TEST(HostTransfersTest, CpuPlansHaveNoCopies) {
  CompileResult r = CompileFor(OneStage(), Strategy(), DEVICE_CPU);
  ASSERT_EQ(r.plans.size(), 1u);
  const Program& p = r.plans[0].program();
  EXPECT_TRUE(OpsOfType(p, "copy_to_device").empty());
  EXPECT_TRUE(OpsOfType(p, "copy_to_host").empty());
  EXPECT_TRUE(p.host_copy().empty());
  for (const Var& v : p.var()) EXPECT_FALSE(v.host_memory()) << v.name();
}

TEST(HostTransfersTest, FeedsAreCopiedInFirstAndTheLossAndFetchesCopiedOut) {
  CompileResult r = CompileFor(OneStage(), Strategy(), DEVICE_CUDA);
  ASSERT_EQ(r.plans.size(), 1u);
  const Program& p = r.plans[0].program();
  EXPECT_EQ(r.pass_names.back(), "host-transfers");
  // The two feeds stay host vars, read by their copies only, which head the program.
  ASSERT_EQ(OpsOfType(p, "copy_to_device").size(), 2u);
  for (const std::string feed : {"x", "label"}) {
    SCOPED_TRACE(feed);
    ASSERT_NE(FindVar(p, feed), nullptr);
    EXPECT_TRUE(FindVar(p, feed)->host_memory());
    EXPECT_EQ(Readers(p, feed), std::vector<std::string>{"copy_to_device"});
    const Var* on_device = FindVar(p, feed + "@device");
    ASSERT_NE(on_device, nullptr);
    EXPECT_FALSE(on_device->host_memory());
    EXPECT_EQ(on_device->kind(), ACTIVATION);
    EXPECT_EQ(on_device->dtype(), FindVar(p, feed)->dtype());
    const std::vector<const Op*> writers = OpsWriting(p, feed + "@device");
    ASSERT_EQ(writers.size(), 1u);
    EXPECT_LT(IndexOf(p, writers[0]), 2);
    EXPECT_EQ(writers[0]->role(), FORWARD);
  }
  // x's readers, the fused forward GEMM and the weight gradient's, read its device copy.
  const std::vector<std::string> x_readers = Readers(p, "x@device");
  ASSERT_EQ(x_readers.size(), 2u);
  EXPECT_EQ(x_readers[0], "matmul_bias");
  EXPECT_EQ(Readers(p, "label@device"), (std::vector<std::string>{"softmax_cross_entropy", "softmax_cross_entropy_grad"}));
  // The loss and the fetch: copied right after their producers into host vars the program records.
  ASSERT_EQ(p.host_copy().size(), 2u);
  for (const std::string metric : {"loss", "hm"}) {
    SCOPED_TRACE(metric);
    ASSERT_TRUE(p.host_copy().contains(metric));
    const std::string host = p.host_copy().at(metric);
    EXPECT_EQ(host, metric + "@host");
    ASSERT_NE(FindVar(p, host), nullptr);
    EXPECT_TRUE(FindVar(p, host)->host_memory());
    const std::vector<const Op*> copies = OpsWriting(p, host);
    ASSERT_EQ(copies.size(), 1u);
    EXPECT_EQ(copies[0]->type(), "copy_to_host");
    EXPECT_EQ(copies[0]->input(0), metric);
    const std::vector<const Op*> producers = OpsWriting(p, metric);
    ASSERT_EQ(producers.size(), 1u);
    EXPECT_EQ(IndexOf(p, copies[0]), IndexOf(p, producers[0]) + 1);
    EXPECT_EQ(copies[0]->role(), producers[0]->role());
    EXPECT_TRUE(Readers(p, host).empty());
  }
}

// The memory plan counts device bytes only: the host feeds and copies drop
// out, each feed's device copy takes its place, and the device's loss and
// fetch may now be freed after their copies.
TEST(HostTransfersTest, TheMemoryPlanLeavesHostVarsOut) {
  CompileResult before = CompileFor(OneStage(), Strategy(), DEVICE_CUDA, "micro-batch");
  CompileResult after = CompileFor(OneStage(), Strategy(), DEVICE_CUDA);
  ASSERT_EQ(after.plans.size(), 1u);
  auto graph = Graph::FromProgram(before.dumped);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const RankPlan& plan = after.plans[0];
  auto memory = PlanMemory(**graph, plan.schedule(), plan.schedule().micro_batch_size(), nullptr, 0, DEVICE_CUDA);
  ASSERT_TRUE(memory.ok()) << memory.status();
  const int64_t metric_bytes = 8 + 8;  // loss and hm, F64 scalars
  EXPECT_LE(plan.memory().activation_peak_bytes(), memory->activation_peak_bytes());
  EXPECT_GE(plan.memory().activation_peak_bytes(), memory->activation_peak_bytes() - metric_bytes);
  EXPECT_EQ(plan.memory().param_bytes(), memory->param_bytes());
  // A host feed is dropped (the executor lets go of the loader's tensor) right after its copy.
  for (const Op* copy : OpsOfType(plan.program(), "copy_to_device")) {
    const auto& frees = plan.memory().frees_after_op(IndexOf(plan.program(), copy)).var();
    EXPECT_NE(std::find(frees.begin(), frees.end(), copy->input(0)), frees.end()) << copy->input(0);
  }
}

TEST(HostTransfersTest, EachPipelineStageCopiesWhatItReadsAndWrites) {
  CompileResult r = CompileFor(TwoStagesProgram(), PipelineStrategy(2), DEVICE_CUDA);
  ASSERT_EQ(r.plans.size(), 2u);
  const Program& first = r.plans[0].program();
  const Program& last = r.plans[1].program();
  ASSERT_EQ(OpsOfType(first, "copy_to_device").size(), 1u);
  EXPECT_EQ(OpsOfType(first, "copy_to_device")[0]->input(0), "x");
  EXPECT_EQ(OpsOfType(first, "copy_to_device")[0]->device(), "gpu:0");
  EXPECT_TRUE(first.host_copy().empty());
  ASSERT_EQ(OpsOfType(last, "copy_to_device").size(), 1u);
  EXPECT_EQ(OpsOfType(last, "copy_to_device")[0]->input(0), "label");
  EXPECT_EQ(OpsOfType(last, "copy_to_device")[0]->device(), "gpu:1");
  ASSERT_EQ(OpsOfType(last, "copy_to_host").size(), 1u);
  EXPECT_EQ(last.host_copy().at("loss"), "loss@host");
}

TEST(HostTransfersTest, RunningTwiceChangesNothing) {
  CompileResult r = CompileFor(OneStage(), Strategy(), DEVICE_CUDA);
  ASSERT_EQ(r.plans.size(), 1u);
  Program p = r.plans[0].program();
  auto changed = RunOnProgram(HostTransfersPass(), p, CompileContext());
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed);
}

// A GPU plan run on the CPU's kernels (whose copies are memcpy) trains what
// the CPU plan trains, bit for bit, and evaluates alike: the metrics come
// from the host copies.
TEST(HostTransfersTest, AGpuPlanOnCpuKernelsTrainsWhatTheCpuPlanTrains) {
  CompileResult cpu = CompileFor(OneStage(), Strategy(), DEVICE_CPU);
  CompileResult gpu = CompileFor(OneStage(), Strategy(), DEVICE_CUDA);
  ASSERT_EQ(cpu.plans.size(), 1u);
  ASSERT_EQ(gpu.plans.size(), 1u);
  gpu.plans[0].set_device_kind(DEVICE_CPU);
  auto a = Executor::Create(cpu.plans[0], ExecutorOptions());
  auto b = Executor::Create(gpu.plans[0], ExecutorOptions());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*a)->InitializeState().ok());
  ASSERT_TRUE((*b)->InitializeState().ok());
  for (int step = 0; step < 3; ++step) {
    std::map<std::string, Tensor> feeds;
    feeds["x"] = Tensor::Empty(F64, {4, 4});
    feeds["label"] = Tensor::Empty(I64, {4});
    for (int i = 0; i < 16; ++i) feeds["x"].data<double>()[i] = 0.1 * ((i * 7 + step) % 11) - 0.5;
    for (int i = 0; i < 4; ++i) feeds["label"].data<int64_t>()[i] = (i + step) % 3;
    auto ra = (*a)->TrainStep(feeds, step * 4);
    auto rb = (*b)->TrainStep(feeds, step * 4);
    ASSERT_TRUE(ra.ok()) << ra.status();
    ASSERT_TRUE(rb.ok()) << rb.status();
    ASSERT_TRUE(rb->has_loss);
    EXPECT_EQ(ra->loss, rb->loss) << "step " << step;
    EXPECT_EQ(ra->fetches.at("hm"), rb->fetches.at("hm")) << "step " << step;
    if (step == 2) {
      auto ea = (*a)->Evaluate(feeds, 0);
      auto eb = (*b)->Evaluate(feeds, 0);
      ASSERT_TRUE(ea.ok()) << ea.status();
      ASSERT_TRUE(eb.ok()) << eb.status();
      EXPECT_EQ(ea->loss, eb->loss);
    }
  }
}

// Two micro-batches of feeds a caller put on the device (a benchmark's
// fixed batch): each micro-batch's rows are sliced on that device and
// copied there by copy_to_device; the run trains what host feeds train.
// The device is a FakeAccelerator (DEVICE_CUDA to the runtime, host memory
// underneath), so the CPU's kernels run on it.
TEST(HostTransfersTest, FeedsAlreadyOnTheDeviceAreSlicedAndCopiedThere) {
  Strategy micro_batches;
  micro_batches.mutable_pipeline()->set_micro_batch_size(2);
  micro_batches.mutable_pipeline()->set_accumulate_steps(2);
  CompileResult gpu = CompileFor(OneStage(), micro_batches, DEVICE_CUDA);
  ASSERT_EQ(gpu.plans.size(), 1u);
  ASSERT_EQ(gpu.plans[0].schedule().micro_batches(), 2);
  gpu.plans[0].set_device_kind(DEVICE_CPU);
  testing::FakeAccelerator device;
  ExecutorOptions on_device;
  on_device.device = &device;
  auto host = Executor::Create(gpu.plans[0], ExecutorOptions());
  auto fake = Executor::Create(gpu.plans[0], on_device);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_TRUE(fake.ok()) << fake.status();
  ASSERT_TRUE((*host)->InitializeState().ok());
  ASSERT_TRUE((*fake)->InitializeState().ok());
  for (int step = 0; step < 2; ++step) {
    std::map<std::string, Tensor> feeds, device_feeds;
    feeds["x"] = Tensor::Empty(F64, {4, 4});
    feeds["label"] = Tensor::Empty(I64, {4});
    for (int i = 0; i < 16; ++i) feeds["x"].data<double>()[i] = 0.1 * ((i * 5 + step) % 9) - 0.4;
    for (int i = 0; i < 4; ++i) feeds["label"].data<int64_t>()[i] = (i + 2 * step) % 3;
    for (const auto& [name, t] : feeds) {
      absl::StatusOr<Tensor> moved = t.CopyTo(&device);
      ASSERT_TRUE(moved.ok()) << moved.status();
      device_feeds[name] = *moved;
    }
    auto a = (*host)->TrainStep(feeds, step * 4);
    auto b = (*fake)->TrainStep(device_feeds, step * 4);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->loss, b->loss) << "step " << step;
  }
}

// A plan whose ordinary op reads a host var is refused before it runs.
TEST(HostTransfersTest, TheExecutorRefusesAnOpReadingAHostVar) {
  CompileResult gpu = CompileFor(OneStage(), Strategy(), DEVICE_CUDA);
  ASSERT_EQ(gpu.plans.size(), 1u);
  RankPlan plan = gpu.plans[0];
  plan.set_device_kind(DEVICE_CPU);
  for (Op& op : *plan.mutable_program()->mutable_op()) {
    for (std::string& in : *op.mutable_input()) {
      if (in == "x@device" && op.type() == "matmul_bias") in = "x";
    }
  }
  auto e = Executor::Create(plan, ExecutorOptions());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("reads host var 'x' (only copy_to_device may)"), std::string::npos)
      << e.status();
}

}  // namespace
}  // namespace strata
