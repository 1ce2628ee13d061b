// A program with multi-head causal attention compiles, differentiates and
// trains: x [N, T*C] is split into T positions, projected to q, k, v, split
// into heads with reshape and transpose, attended, merged back and
// classified. The loss falls over the steps, on one device and under data
// parallelism (the same losses as the single device). passes/attention_layout
// drops the transposes around attention (its "bthd" layout): the tiny GPT
// trains the same bits with and without it.

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "kernels/attention_budget.h"
#include "passes/compile.h"
#include "proto/strategy.pb.h"
#include "tests/parity_util.h"

namespace strata {
namespace {

// T = 8 positions of C = 16 channels, H = 2 heads of D = 8.
constexpr char kAttentionProgram[] = R"pb(
  name: "tiny_attention"
  var { name: "x" dtype: F32 shape: [-1, 128] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "wq" dtype: F32 shape: [16, 16] kind: PARAM init { uniform { low: -0.25 high: 0.25 } } }
  var { name: "wk" dtype: F32 shape: [16, 16] kind: PARAM init { uniform { low: -0.25 high: 0.25 } } }
  var { name: "wv" dtype: F32 shape: [16, 16] kind: PARAM init { uniform { low: -0.25 high: 0.25 } } }
  var { name: "wo" dtype: F32 shape: [128, 10] kind: PARAM init { uniform { low: -0.09 high: 0.09 } } }
  var { name: "bo" dtype: F32 shape: [10] kind: PARAM init { uniform { low: -0.09 high: 0.09 } } }
  op { type: "reshape" input: "x" output: "xt" attr { key: "shape" value { list { i: [-1, 8, 16] } } } }
  op { type: "matmul" input: ["xt", "wq"] output: "q2" }
  op { type: "matmul" input: ["xt", "wk"] output: "k2" }
  op { type: "matmul" input: ["xt", "wv"] output: "v2" }
  op { type: "reshape" input: "q2" output: "q3" attr { key: "shape" value { list { i: [-1, 8, 2, 8] } } } }
  op { type: "reshape" input: "k2" output: "k3" attr { key: "shape" value { list { i: [-1, 8, 2, 8] } } } }
  op { type: "reshape" input: "v2" output: "v3" attr { key: "shape" value { list { i: [-1, 8, 2, 8] } } } }
  op { type: "transpose" input: "q3" output: "q" attr { key: "perm" value { list { i: [0, 2, 1, 3] } } } }
  op { type: "transpose" input: "k3" output: "k" attr { key: "perm" value { list { i: [0, 2, 1, 3] } } } }
  op { type: "transpose" input: "v3" output: "v" attr { key: "perm" value { list { i: [0, 2, 1, 3] } } } }
  op { type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["att", "att_lse"] }
  op { type: "transpose" input: "att" output: "att_t" attr { key: "perm" value { list { i: [0, 2, 1, 3] } } } }
  op { type: "reshape" input: "att_t" output: "h" attr { key: "shape" value { list { i: [-1, 128] } } } }
  op { type: "matmul" input: ["h", "wo"] output: "hw" }
  op { type: "add" input: ["hw", "bo"] output: "logits" }
  op { type: "softmax_cross_entropy" input: ["logits", "label"] output: "loss" }
  loss: "loss"
  optimizer { adam { learning_rate: 0.01 } }
)pb";

double Mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / static_cast<double>(to - from);
}

TEST(AttentionTrainTest, MultiHeadCausalAttentionTrains) {
  auto program = ParseProgramText(kAttentionProgram, "tiny_attention.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.data = "synthetic:classes=10,size=1024";
  options.steps = 60;
  auto run = TrainSingleDevice(*program, 32, options);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->losses.size(), 60u);
  for (double l : run->losses) ASSERT_TRUE(std::isfinite(l));
  const double first = Mean(run->losses, 0, 5), last = Mean(run->losses, 55, 60);
  EXPECT_LT(last, 0.85 * first) << "first five steps " << first << ", last five " << last;
  for (const char* w : {"wq", "wk", "wv"}) {
    EXPECT_NE(run->weights.at(w), run->initial_weights.at(w)) << w << " did not move";
  }
}

// Two data-parallel replicas of 16 samples each follow the single device on 32.
TEST(AttentionTrainTest, DataParallelMatchesOneDevice) {
  auto program = ParseProgramText(kAttentionProgram, "tiny_attention.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.data = "synthetic:classes=10,size=1024";
  options.steps = 8;
  options.batch_size = 32;
  auto single = TrainSingleDevice(*program, 32, options);
  ASSERT_TRUE(single.ok()) << single.status();
  Strategy dp;
  dp.mutable_data_parallel()->set_degree(2);
  auto parallel = TrainParallel(*program, dp, options);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  EXPECT_LE(MaxLossDifference(*parallel, *single), 1e-4);
  std::string worst;
  EXPECT_LE(MaxWeightDifference(*parallel, *single, &worst), 1e-4) << "worst parameter: " << worst;
}

// How many ops of `type` the plan of `program` compiled for `device` holds,
// with `disabled` passes left out.
int CountOps(const Program& program, const Strategy& strategy, DeviceKind device,
             const std::vector<std::string>& disabled, const std::string& type) {
  CompileOptions options;
  options.batch_size = 4;
  options.device_kind = device;
  options.disabled_passes = disabled;
  auto compiled = Compile(program, strategy, options);
  EXPECT_TRUE(compiled.ok()) << compiled.status();
  int n = 0;
  if (compiled.ok()) {
    for (const Op& op : compiled->plans[0].program().op()) n += op.type() == type;
  }
  return n;
}

// passes/attention_layout rewrites each block's attention to layout "bthd"
// (q, k, v, y [B, T, H, D]), dropping its four transposes and, through
// autodiff, the backward's four; the "bthd" kernels do the "bhtd" sums in
// the same order, so the tiny GPT (heads of 32), in float32 and under BF16,
// compiled for the CPU and for a GPU (run on the CPU's kernels), trains the
// same bits for 6 steps with and without the pass, and trains. GPU plans
// take the pass where the tensor-core attention is on (the test turns it
// on), and only for the attention those kernels run: 16-bit, so an F32 GPU
// plan keeps its transposes.
TEST(AttentionTrainTest, BthdLayoutTrainsTheSameBitsAsTransposes) {
  const ScopedTensorCoreAttention tensor_core(true);
  GenOptions gen = TinyGpt("F32");
  gen.heads = 2;  // d_model 64: heads of 32, a size the flash kernels take
  const int blocks = gen.blocks;
  auto program = GenerateModel("gpt", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  for (bool bf16 : {false, true}) {
    for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
      SCOPED_TRACE(absl::StrCat(bf16 ? "BF16 " : "F32 ", DeviceKind_Name(device)));
      Strategy strategy;
      if (bf16) strategy.mutable_mixed_precision()->set_dtype(BF16);
      if (device == DEVICE_CUDA && !bf16) {
        EXPECT_EQ(CountOps(*program, strategy, device, {}, "transpose"),
                  CountOps(*program, strategy, device, {"attention-layout"}, "transpose"));
        continue;
      }
      const int without = CountOps(*program, strategy, device, {"attention-layout"}, "transpose");
      const int with = CountOps(*program, strategy, device, {}, "transpose");
      EXPECT_EQ(without - with, 8 * blocks);  // four forward, four backward a block
      EXPECT_EQ(with, 0);

      ParityOptions options;
      options.data = "tokens:path=tests/testdata/license_tokens.u16";
      options.steps = 6;
      options.batch_size = 4;
      options.compile_for = device;
      options.disabled_passes = {"attention-layout"};
      auto transposes = TrainParallel(*program, strategy, options);
      ASSERT_TRUE(transposes.ok()) << transposes.status();
      options.disabled_passes.clear();
      auto bthd = TrainParallel(*program, strategy, options);
      ASSERT_TRUE(bthd.ok()) << bthd.status();
      ASSERT_EQ(bthd->losses.size(), 6u);
      EXPECT_EQ(bthd->losses, transposes->losses);
      std::string worst;
      EXPECT_EQ(MaxWeightDifference(*bthd, *transposes, &worst), 0.0) << worst;
      EXPECT_FALSE(bthd->weights.empty());
      EXPECT_LT(bthd->losses.back(), bthd->losses.front());
      if (device == DEVICE_CPU) {
        EXPECT_LE(bthd->measured_peak_bytes.at(0), bthd->predicted_peak_bytes.at(0));
      }
    }
  }
}

}  // namespace
}  // namespace strata
