#include "passes/cast_bias.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/pipeline_builder.h"
#include "passes/testing/pass_test_util.h"

namespace strata {
namespace {

constexpr int kBlocks = kTinyGptBlocks;

std::vector<RankPlan> Plans(const std::string& text, const Strategy& strategy, std::vector<std::string> disabled = {},
                            DeviceKind device = DEVICE_CUDA) {
  CompileOptions options;
  if (!strategy.has_pipeline()) options.batch_size = 4;
  options.device_kind = device;
  options.disabled_passes = std::move(disabled);
  auto r = Compile(ParseProgramOrFail(text), strategy, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::move(r->plans) : std::vector<RankPlan>{};
}

bool HasAttr(const Op& op, const std::string& key) {
  auto it = op.attr().find(key);
  return it != op.attr().end() && !it->second.s().empty();
}

TEST(CastBiasTest, RunsAfterFoldCastsOnGpuPlansUnderMixedPrecisionOnly) {
  const std::vector<std::string> names = CompilePassNames(Mixed(BF16), DEVICE_CUDA);
  auto at = [&](const std::string& name) { return std::find(names.begin(), names.end(), name) - names.begin(); };
  ASSERT_LT(at("cast-bias"), static_cast<long>(names.size()));
  EXPECT_LT(at("fold-casts"), at("cast-bias"));
  EXPECT_LT(at("cast-bias"), at("pipeline-split"));
  const std::vector<std::string> optional = OptionalPassNames(Mixed(BF16), DEVICE_CUDA);
  EXPECT_NE(std::find(optional.begin(), optional.end(), "cast-bias"), optional.end());
  for (const auto& [strategy, device] :
       {std::pair{Mixed(BF16), DEVICE_CPU}, std::pair{Strategy(), DEVICE_CUDA}, std::pair{Strategy(), DEVICE_CPU}}) {
    const std::vector<std::string> other = CompilePassNames(strategy, device);
    EXPECT_EQ(std::find(other.begin(), other.end(), "cast-bias"), other.end()) << DeviceKind_Name(device);
  }
}

// The qkv projection's matmul_bias (a 16-bit store, out_dtype) and the
// MLP's matmul_bias_gelu (16-bit y and z) read their bias cast to the
// operands' type, with those attrs gone and the outputs' types unchanged;
// the output projections (float sums with a residual) keep their float
// bias. One cast per bias, each of a float PARAM, right before its reader;
// the backward is untouched (the biases' gradients are the same float ops).
TEST(CastBiasTest, GptGemmsThatStore16BitsReadA16BitBias) {
  for (DataType low : {BF16, F16}) {
    SCOPED_TRACE(DataTypeName(low));
    const std::string suffix = low == BF16 ? "@bf16" : "@f16";
    // Where this pass leaves them (hoist-param-casts off: it moves the
    // casts into the updates, PipelineStagesHoistTheBiasCasts below).
    const std::vector<RankPlan> on = Plans(TinyGptText(), Mixed(low), {"hoist-param-casts"});
    const std::vector<RankPlan> off = Plans(TinyGptText(), Mixed(low), {"cast-bias", "hoist-param-casts"});
    ASSERT_EQ(on.size(), 1u);
    ASSERT_EQ(off.size(), 1u);
    const Program& p = on[0].program();
    const Program& q = off[0].program();
    EXPECT_EQ(p.op_size(), q.op_size() + 2 * kBlocks);
    int low_bias = 0, float_bias = 0;
    std::set<std::string> biases;
    for (const Op& op : p.op()) {
      if (op.type() != "matmul_bias" && op.type() != "matmul_bias_gelu") continue;
      const Var* bias = FindVar(p, op.input(2));
      ASSERT_NE(bias, nullptr) << op.input(2);
      if (op.input_size() == 4) {  // a residual: the float sum
        ++float_bias;
        EXPECT_EQ(bias->dtype(), F32) << op.input(2);
        continue;
      }
      ++low_bias;
      biases.insert(op.input(2));
      EXPECT_EQ(bias->dtype(), low) << op.input(2);
      EXPECT_TRUE(absl::EndsWith(op.input(2), suffix)) << op.input(2);
      EXPECT_FALSE(HasAttr(op, "out_dtype")) << op.output(0);
      EXPECT_FALSE(HasAttr(op, "z_dtype")) << op.output(0);
      for (const std::string& out : op.output()) EXPECT_EQ(FindVar(p, out)->dtype(), low) << out;
      EXPECT_TRUE(op.type() == "matmul_bias_gelu" || absl::StrContains(op.output(0), ".attn.qkv.")) << op.output(0);
      // Written once, by a cast of the float PARAM just before the GEMM.
      const std::vector<const Op*> writers = OpsWriting(p, op.input(2));
      ASSERT_EQ(writers.size(), 1u) << op.input(2);
      EXPECT_EQ(writers[0]->type(), "cast");
      EXPECT_EQ(IndexOf(p, writers[0]) + 1, IndexOf(p, &op)) << op.input(2);
      const Var* master = FindVar(p, writers[0]->input(0));
      ASSERT_NE(master, nullptr);
      EXPECT_EQ(master->kind(), PARAM);
      EXPECT_EQ(master->dtype(), F32);
      EXPECT_EQ(writers[0]->role(), op.role());
    }
    EXPECT_EQ(low_bias, 2 * kBlocks);
    EXPECT_EQ(float_bias, 2 * kBlocks);
    EXPECT_EQ(biases.size(), static_cast<size_t>(2 * kBlocks));
    // Without the pass: the float biases beside the 16-bit stores.
    int stored = 0;
    for (const Op& op : q.op()) {
      if ((op.type() == "matmul_bias" || op.type() == "matmul_bias_gelu") && HasAttr(op, "out_dtype")) {
        ++stored;
        EXPECT_EQ(FindVar(q, op.input(2))->dtype(), F32) << op.input(2);
      }
    }
    EXPECT_EQ(stored, 2 * kBlocks);
    // The backward is the same ops.
    std::multiset<std::string> backward_on, backward_off;
    for (const Op& op : p.op()) {
      if (op.role() == BACKWARD) backward_on.insert(absl::StrCat(op.type(), " ", op.output(0)));
    }
    for (const Op& op : q.op()) {
      if (op.role() == BACKWARD) backward_off.insert(absl::StrCat(op.type(), " ", op.output(0)));
    }
    EXPECT_EQ(backward_on, backward_off);
  }
}

// Under recompute the backward's copy of block 1's GEMMs reads the bias the
// forward cast: one cast a bias still.
TEST(CastBiasTest, ARecomputedGemmReadsTheForwardsCast) {
  Strategy strategy = Mixed(BF16);
  strategy.mutable_recompute()->add_checkpoints("h1");
  const std::vector<RankPlan> plans = Plans(TinyGptText(), strategy);
  ASSERT_EQ(plans.size(), 1u);
  const Program& p = plans[0].program();
  std::map<std::string, int> readers;  // bias copy -> GEMMs reading it
  int casts_of_biases = 0;
  for (const Op& op : p.op()) {
    if ((op.type() == "matmul_bias" || op.type() == "matmul_bias_gelu") && op.input_size() == 3) {
      ++readers[op.input(2)];
    }
    casts_of_biases += op.type() == "cast" && absl::EndsWith(op.output(0), ".b@bf16");
  }
  EXPECT_EQ(casts_of_biases, 2 * kBlocks);
  ASSERT_EQ(readers.size(), static_cast<size_t>(2 * kBlocks));
  int read_twice = 0;
  for (const auto& [bias, n] : readers) read_twice += n == 2;
  EXPECT_EQ(read_twice, 2) << "block 1's qkv and MLP GEMMs, forward and recomputed";
}

// Over pipeline micro-batches hoist-param-casts moves the bias casts, as it
// moves the weights', to the update's end: one 16-bit copy a bias per
// stage, written once an update, by the bias's update (its cast kept to
// refresh it).
TEST(CastBiasTest, PipelineStagesHoistTheBiasCasts) {
  Strategy strategy = PipelineStrategy(4);
  strategy.mutable_mixed_precision()->set_dtype(BF16);
  const std::vector<RankPlan> plans = Plans(TinyGptText(16, 2), strategy);
  ASSERT_EQ(plans.size(), 2u);
  int copies = 0;
  for (const RankPlan& plan : plans) {
    SCOPED_TRACE(plan.rank());
    const Program& p = plan.program();
    for (const Var& v : p.var()) {
      if (!absl::EndsWith(v.name(), ".b@bf16")) continue;
      ++copies;
      EXPECT_EQ(v.kind(), PARAM_COPY) << v.name();
      const std::vector<const Op*> writers = OpsWriting(p, v.name());
      ASSERT_EQ(writers.size(), 2u) << v.name();
      EXPECT_EQ(writers[0]->role(), OPTIMIZE) << v.name();
      EXPECT_TRUE(absl::StartsWith(writers[0]->type(), "adam_update")) << v.name();  // the multi op on a GPU plan
      EXPECT_EQ(writers[1]->role(), REFRESH) << v.name();
      EXPECT_EQ(writers[1]->type(), "cast") << v.name();
    }
  }
  EXPECT_EQ(copies, 2 * kBlocks);
}

// Nothing to do where no GEMM stores 16 bits: a float32 GPU plan. Without
// fold-casts the qkv GEMM writes a float sum and keeps its float bias;
// the MLP's gelu GEMM, which fuse-epilogues makes store 16 bits itself
// (mixed precision's gelu runs in 16 bits), still reads a 16-bit bias.
TEST(CastBiasTest, LeavesFloatSumsAlone) {
  const std::vector<RankPlan> f32 = Plans(TinyGptText(), Strategy());
  ASSERT_EQ(f32.size(), 1u);
  int gemms = 0;
  for (const Op& op : f32[0].program().op()) {
    if (op.type() == "matmul_bias" || op.type() == "matmul_bias_gelu") {
      ++gemms;
      EXPECT_EQ(FindVar(f32[0].program(), op.input(2))->dtype(), F32) << op.input(2);
    }
  }
  EXPECT_EQ(gemms, 4 * kBlocks);  // qkv, MLP (with its gelu), and the two output projections
  const std::vector<RankPlan> unfolded = Plans(TinyGptText(), Mixed(BF16), {"fold-casts"});
  ASSERT_EQ(unfolded.size(), 1u);
  const Program& p = unfolded[0].program();
  int low = 0, high = 0;
  for (const Op& op : p.op()) {
    if (op.type() != "matmul_bias" && op.type() != "matmul_bias_gelu") continue;
    const bool low_bias = FindVar(p, op.input(2))->dtype() == BF16;
    EXPECT_EQ(low_bias, op.type() == "matmul_bias_gelu") << op.output(0);
    (low_bias ? low : high) += 1;
  }
  EXPECT_EQ(low, kBlocks);
  EXPECT_EQ(high, 3 * kBlocks);
}

}  // namespace
}  // namespace strata
