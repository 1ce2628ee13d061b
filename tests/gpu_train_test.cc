// A GPU training run against the CPU run of the same program (issue 18's
// bar): the MLP of the examples (784-256-128-100-10, ReLU, Adam with a cosine
// schedule), compiled once for the CPU and once for a GPU, trained 20 steps
// on the same synthetic data from the same seed through the same trainer,
// one on the host and one on a CudaDevice. Each step's loss agrees within
// 1e-4 relative in float32; two GPU runs give the same bits; the GPU's
// measured peak is within 10% of the plan's prediction, as on the CPU.
// Tagged gpu: without a CUDA device every test FAILS (never skips).

#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/cuda_test_util.h"
#include "runtime/trainer.h"
#include "tests/parity_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

constexpr int kSteps = 20;

RankPlan CompileMlp(DeviceKind kind, const std::string& dtype) {
  GenOptions gen;
  gen.dtype = dtype;
  auto text = GenerateProgram("mlp", gen);
  EXPECT_TRUE(text.ok()) << text.status();
  auto program = ParseProgramText(*text, "mlp.pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  CompileOptions options;
  options.batch_size = 64;
  options.device_kind = kind;
  auto result = Compile(*program, Strategy(), options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->plans[0] : RankPlan();
}

absl::StatusOr<TrainReport> TrainOn(const RankPlan& plan, Device* device) {
  TrainOptions options;
  options.data = "synthetic:classes=10,size=1280";
  options.steps = kSteps;
  options.seed = 11;
  options.progress = false;
  options.device = device;
  return Train(plan, options);
}

class GpuTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = testing::CudaDeviceOrFail();
    ASSERT_NE(device_, nullptr);
  }
  std::unique_ptr<CudaDevice> device_;
};

void ExpectLossesNear(const TrainReport& gpu, const TrainReport& cpu, double rel) {
  ASSERT_EQ(gpu.steps.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(cpu.steps.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    const double g = gpu.steps[i].loss, c = cpu.steps[i].loss;
    EXPECT_LE(std::abs(g - c), rel * std::abs(c)) << "step " << i + 1 << ": gpu " << g << " cpu " << c;
  }
  EXPECT_LT(cpu.steps.back().loss, cpu.steps.front().loss) << "the run trains";
}

TEST_F(GpuTrainTest, Float32MlpTrainsLikeTheCpuForTwentySteps) {
  const RankPlan cpu_plan = CompileMlp(DEVICE_CPU, "F32");
  const RankPlan gpu_plan = CompileMlp(DEVICE_CUDA, "F32");
  ASSERT_EQ(gpu_plan.device_kind(), DEVICE_CUDA);
  auto cpu = TrainOn(cpu_plan, GetCpuDevice());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = TrainOn(gpu_plan, device_.get());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ExpectLossesNear(*gpu, *cpu, 1e-4);
  for (int i = 0; i < kSteps; i += 5) {
    std::printf("step %2d  cpu %.9f  gpu %.9f  rel %.2e\n", i + 1, cpu->steps[i].loss, gpu->steps[i].loss,
                std::abs(gpu->steps[i].loss - cpu->steps[i].loss) / std::abs(cpu->steps[i].loss));
  }
  // The memory rule on the GPU: allocated bytes, predicted >= measured and at
  // most 10% above it; the reserved bytes reported beside (at least the allocated).
  const double measured = static_cast<double>(gpu->measured_peak_bytes);
  const double predicted = static_cast<double>(gpu->predicted_peak_bytes);
  std::printf("gpu peak: measured %.0f predicted %.0f (ratio %.3f); reserved %lld bytes in %lld segments\n", measured,
              predicted, measured / predicted, static_cast<long long>(gpu->peak_reserved_bytes),
              static_cast<long long>(device_->caching_allocator()->stats().segment_allocations));
  EXPECT_LE(measured, predicted);
  EXPECT_LE(predicted, measured * 1.10);
  EXPECT_GE(gpu->peak_reserved_bytes, gpu->measured_peak_bytes);
  EXPECT_EQ(gpu->peak_reserved_bytes, device_->caching_allocator()->stats().peak_reserved_bytes);
}

TEST_F(GpuTrainTest, Float64MlpTrainsLikeTheCpu) {
  auto cpu = TrainOn(CompileMlp(DEVICE_CPU, "F64"), GetCpuDevice());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = TrainOn(CompileMlp(DEVICE_CUDA, "F64"), device_.get());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  // Summation order alone differs: float64 keeps the runs 1e-9 apart.
  ExpectLossesNear(*gpu, *cpu, 1e-9);
}

TEST_F(GpuTrainTest, TwoGpuRunsGiveTheSameBits) {
  const RankPlan plan = CompileMlp(DEVICE_CUDA, "F32");
  auto a = TrainOn(plan, device_.get());
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = TrainOn(plan, device_.get());
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->steps.size(), b->steps.size());
  for (size_t i = 0; i < a->steps.size(); ++i) EXPECT_EQ(a->steps[i].loss, b->steps[i].loss) << "step " << i + 1;
  EXPECT_EQ(a->final_state, b->final_state);
}

// --cuda_graph: the steady-state step captured once and replayed trains
// the bits of eager steps. Gradient merge over two micro-batches makes two
// step shapes (with and without the optimizer update), so two graphs, the
// second sharing the first's memory; dropout draws its masks from the
// executor's counters in device memory, which a replay reads afresh.
absl::StatusOr<TrainReport> TrainGraphCase(const std::string& model, const GenOptions& gen, const Strategy& strategy,
                                           bool cuda_graph, Device* device, double clip_global_norm = 0) {
  auto text = GenerateProgram(model, gen);
  if (!text.ok()) return text.status();
  auto program = ParseProgramText(*text, model + ".pbtxt");
  if (!program.ok()) return program.status();
  program->mutable_optimizer()->set_clip_global_norm(clip_global_norm);
  CompileOptions copts;
  copts.batch_size = 16;
  copts.device_kind = DEVICE_CUDA;
  auto compiled = Compile(*program, strategy, copts);
  if (!compiled.ok()) return compiled.status();
  TrainOptions options;
  // The MLP's epochs are 4 steps, each ending with an evaluation between
  // the replays (eager, on the general memory pool).
  options.data = model == "gpt" ? "synthetic:vocab=256,size=512" : "synthetic:classes=10,size=64";
  if (model != "gpt") options.eval_data = "synthetic:classes=10,size=64,test";
  options.steps = 8;
  options.seed = 5;
  options.progress = false;
  options.device = device;
  options.cuda_graph = cuda_graph;
  return Train(compiled->plans[0], options);
}

void ExpectGraphsTrainTheEagerBits(const std::string& model, const GenOptions& gen, const Strategy& strategy,
                                   int want_graphs, Device* device, double clip_global_norm = 0) {
  auto eager = TrainGraphCase(model, gen, strategy, false, device, clip_global_norm);
  ASSERT_TRUE(eager.ok()) << eager.status();
  auto graphed = TrainGraphCase(model, gen, strategy, true, device, clip_global_norm);
  ASSERT_TRUE(graphed.ok()) << graphed.status();
  EXPECT_EQ(graphed->cuda_graphs, want_graphs) << graphed->cuda_graph_note;
  EXPECT_TRUE(absl::StrContains(graphed->cuda_graph_note, "captured")) << graphed->cuda_graph_note;
  EXPECT_EQ(eager->cuda_graphs, 0);
  ASSERT_EQ(graphed->steps.size(), eager->steps.size());
  for (size_t i = 0; i < eager->steps.size(); ++i) {
    EXPECT_EQ(graphed->steps[i].loss, eager->steps[i].loss) << "step " << i + 1;
  }
  EXPECT_EQ(graphed->final_state, eager->final_state);
  ASSERT_EQ(graphed->evals.size(), eager->evals.size());
  for (size_t i = 0; i < eager->evals.size(); ++i) EXPECT_EQ(graphed->evals[i].loss, eager->evals[i].loss);
}

TEST_F(GpuTrainTest, CudaGraphStepsTrainTheEagerBits) {
  GenOptions gen;
  gen.layers = {784, 64, 10};
  gen.dropout = 0.2;
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(8);
  strategy.mutable_pipeline()->set_accumulate_steps(2);
  strategy.mutable_gradient_merge()->set_k_steps(2);
  ExpectGraphsTrainTheEagerBits("mlp", gen, strategy, 2, device_.get());
}

// The tiny GPT's heads of 16 take attention's GEMM path; one head of 64
// (GPT-2's head size) the flash kernels (FlashEligible), so that they run
// captured too; clipping (folded into the updates as grad_scale, its
// squared norm copied to the host for the metrics) likewise.
GenOptions TinyGptOnFlashKernels() {
  GenOptions gen = TinyGpt("F32");
  gen.heads = 1;
  return gen;
}

TEST_F(GpuTrainTest, CudaGraphStepsOfABf16GptTrainTheEagerBits) {
  Strategy strategy;
  strategy.mutable_mixed_precision()->set_dtype(BF16);
  ExpectGraphsTrainTheEagerBits("gpt", TinyGpt("F32"), strategy, 1, device_.get());
}

TEST_F(GpuTrainTest, CudaGraphStepsOfABf16GptOnTheFlashKernelsWithClippingTrainTheEagerBits) {
  Strategy strategy;
  strategy.mutable_mixed_precision()->set_dtype(BF16);
  ExpectGraphsTrainTheEagerBits("gpt", TinyGptOnFlashKernels(), strategy, 1, device_.get(), /*clip_global_norm=*/1.0);
}

// Over micro-batches and gradient merge the bf16 weights are copies
// (hoist-param-casts) that the captured optimizer step rewrites in their
// buffers, and that the executor casts once before the first step.
TEST_F(GpuTrainTest, CudaGraphStepsOfABf16GptWithWeightCopiesTrainTheEagerBits) {
  Strategy strategy;
  strategy.mutable_mixed_precision()->set_dtype(BF16);
  strategy.mutable_pipeline()->set_micro_batch_size(8);  // 2 x 8 = TrainGraphCase's batch
  strategy.mutable_pipeline()->set_accumulate_steps(2);
  strategy.mutable_gradient_merge()->set_k_steps(2);
  ExpectGraphsTrainTheEagerBits("gpt", TinyGpt("F32"), strategy, 2, device_.get());
}

// Deterministic by default (issue 18): two runs of a bf16 GPT on the flash
// kernels, captured steps, clipping, give the same bits (no float atomics:
// the attention gradient's dq is its own kernel, sums are fixed trees, and
// cuBLASLt's plans are chosen once per shape).
TEST_F(GpuTrainTest, TwoBf16GptRunsGiveTheSameBits) {
  Strategy strategy;
  strategy.mutable_mixed_precision()->set_dtype(BF16);
  auto a = TrainGraphCase("gpt", TinyGptOnFlashKernels(), strategy, true, device_.get(), 1.0);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = TrainGraphCase("gpt", TinyGptOnFlashKernels(), strategy, true, device_.get(), 1.0);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->steps.size(), b->steps.size());
  for (size_t i = 0; i < a->steps.size(); ++i) EXPECT_EQ(a->steps[i].loss, b->steps[i].loss) << "step " << i + 1;
  EXPECT_EQ(a->final_state, b->final_state);
}

TEST_F(GpuTrainTest, CudaGraphStepsWithF16LossScalingTrainTheEagerBits) {
  Strategy strategy;
  strategy.mutable_mixed_precision()->set_dtype(F16);
  ExpectGraphsTrainTheEagerBits("gpt", TinyGpt("F32"), strategy, 1, device_.get());
}

TEST_F(GpuTrainTest, CudaGraphStepsWithF16LossScalingOnTheFlashKernelsWithClippingTrainTheEagerBits) {
  Strategy strategy;
  strategy.mutable_mixed_precision()->set_dtype(F16);
  ExpectGraphsTrainTheEagerBits("gpt", TinyGptOnFlashKernels(), strategy, 1, device_.get(), /*clip_global_norm=*/1.0);
}

// Several ranks on the one GPU (issue 18, section 4): each rank a CudaDevice
// on GPU 0, tensors between ranks over Gloo staged through pinned host
// memory. References: the same layout on the CPU, and (`single_gpu`, if
// given) the program on one GPU, one rank (the issue's "match the
// single-GPU run"); float64 keeps summation order out of the comparison
// (1e-9).
ParityRun TrainOnGpuAndCpu(const Program& program, const Strategy& strategy, ParityOptions options, ParityRun* cpu,
                           ParityRun* single_gpu = nullptr) {
  auto on_cpu = TrainParallel(program, strategy, options);
  EXPECT_TRUE(on_cpu.ok()) << on_cpu.status();
  if (on_cpu.ok()) *cpu = *on_cpu;
  options.device_kind = DEVICE_CUDA;
  options.make_device = [](int) -> absl::StatusOr<std::unique_ptr<Device>> {
    absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(0);
    if (!device.ok()) return device.status();
    return std::unique_ptr<Device>(*std::move(device));
  };
  auto on_gpu = TrainParallel(program, strategy, options);
  EXPECT_TRUE(on_gpu.ok()) << on_gpu.status();
  if (single_gpu != nullptr) {
    auto one = TrainParallel(program, Strategy(), options);
    EXPECT_TRUE(one.ok()) << one.status();
    if (one.ok()) *single_gpu = *one;
  }
  return on_gpu.ok() ? *on_gpu : ParityRun();
}

ParityRun TrainLayoutOnGpuAndCpu(const Strategy& strategy, int stages, ParityRun* cpu, ParityRun* single_gpu) {
  GenOptions gen;
  gen.dtype = "F64";
  gen.stages = stages;
  auto program = GenerateModel("mlp", gen);
  EXPECT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.data = "synthetic:classes=10,size=512";
  options.steps = 10;
  options.batch_size = 16;
  return TrainOnGpuAndCpu(program.ok() ? *program : Program(), strategy, options, cpu, single_gpu);
}

TEST_F(GpuTrainTest, TwoPipelineStagesSharingTheGpuTrainLikeTheCpu) {
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(4);
  strategy.mutable_pipeline()->set_accumulate_steps(4);
  strategy.mutable_pipeline()->set_schedule(ONE_F_ONE_B);
  ParityRun cpu, single_gpu;
  const ParityRun gpu = TrainLayoutOnGpuAndCpu(strategy, 2, &cpu, &single_gpu);
  EXPECT_LE(MaxLossDifference(gpu, cpu), 1e-9);
  EXPECT_LE(MaxWeightDifference(gpu, cpu), 1e-9);
  ASSERT_EQ(single_gpu.losses.size(), gpu.losses.size());
  EXPECT_LE(MaxLossDifference(gpu, single_gpu), 1e-9);
  EXPECT_LE(MaxWeightDifference(gpu, single_gpu), 1e-9);
}

TEST_F(GpuTrainTest, TwoDataParallelReplicasSharingTheGpuTrainLikeTheCpu) {
  Strategy strategy;
  strategy.mutable_data_parallel()->set_degree(2);
  ParityRun cpu, single_gpu;
  const ParityRun gpu = TrainLayoutOnGpuAndCpu(strategy, 1, &cpu, &single_gpu);
  EXPECT_LE(MaxLossDifference(gpu, cpu), 1e-9);
  EXPECT_LE(MaxWeightDifference(gpu, cpu), 1e-9);
  ASSERT_EQ(single_gpu.losses.size(), gpu.losses.size());
  EXPECT_LE(MaxLossDifference(gpu, single_gpu), 1e-9);
  EXPECT_LE(MaxWeightDifference(gpu, single_gpu), 1e-9);
}

// The tiny GPT over two stages sharing the GPU, its token embedding tied
// across them, under 1F1B and gradient merge: each stage sums its part of
// the tied gradient over the update's steps and the parts cross once an
// update, in the optimizer action (written 2026-11-28, not yet run on a
// GPU). Float32 against the same layout on the CPU: losses within 1e-4
// relative a step (issue 18's bar for a GPU run against the CPU's).
TEST_F(GpuTrainTest, ATiedGptPipelineUnderGradientMergeSharingTheGpuTrainsLikeTheCpu) {
  auto program = GenerateModel("gpt", TinyGpt("F32", 2));
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(2);
  strategy.mutable_pipeline()->set_accumulate_steps(2);
  strategy.mutable_pipeline()->set_schedule(ONE_F_ONE_B);
  strategy.mutable_gradient_merge()->set_k_steps(2);
  strategy.mutable_gradient_merge()->set_average(true);
  ParityOptions options;
  options.data = "synthetic:vocab=256,size=512";
  options.steps = 8;
  ParityRun cpu;
  const ParityRun gpu = TrainOnGpuAndCpu(*program, strategy, options, &cpu);
  ASSERT_EQ(gpu.losses.size(), 8u);
  EXPECT_LE(MaxLossDifference(gpu, cpu), 1e-4);
  std::string worst;
  std::cout << "largest relative weight difference " << MaxWeightDifference(gpu, cpu, &worst) << " (" << worst << ")\n";
}

}  // namespace
}  // namespace strata
