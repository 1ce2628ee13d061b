// A program with multi-head causal attention compiles, differentiates and
// trains: x [N, T*C] is split into T positions, projected to q, k, v, split
// into heads with reshape and transpose, attended, merged back and
// classified. The loss falls over the steps, on one device and under data
// parallelism (the same losses as the single device).

#include <cmath>
#include <string>

#include "compiler/program_text.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace strata
