// Recompute halves the activation peak: a residual MLP of 8 blocks with a
// checkpoint every 2 blocks keeps at most half the activation bytes of the
// same run without recompute (measured peak minus parameters and optimizer
// state, same batch), and trains the same losses bit for bit.

#include <string>

#include "gtest/gtest.h"
#include "passes/compile.h"
#include "tests/parity_util.h"

namespace strata {
namespace {

TEST(RecomputeMemoryTest, CheckpointEveryTwoBlocksHalvesTheActivationPeak) {
  GenOptions gen;
  gen.layers = {64, 64, 10};
  gen.blocks = 8;
  gen.dropout = 0.1;
  gen.optimizer = "adam";
  auto program = GenerateModel("resmlp", gen);
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.data = "synthetic:classes=10,size=2048";
  options.steps = 5;
  options.batch_size = 256;
  Strategy plain;
  Strategy recompute;
  for (const char* v : {"h2", "h4", "h6"}) recompute.mutable_recompute()->add_checkpoints(v);

  // Parameters and optimizer state are the same under both: the plan's own counts.
  CompileOptions copts;
  copts.batch_size = options.batch_size;
  auto compiled = Compile(*program, plain, copts);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const int64_t persistent = compiled->plans[0].memory().param_bytes() + compiled->plans[0].memory().state_bytes();

  auto without = TrainParallel(*program, plain, options);
  ASSERT_TRUE(without.ok()) << without.status();
  auto with = TrainParallel(*program, recompute, options);
  ASSERT_TRUE(with.ok()) << with.status();
  const int64_t activations_without = without->measured_peak_bytes.at(0) - persistent;
  const int64_t activations_with = with->measured_peak_bytes.at(0) - persistent;
  RecordProperty("activation_peak_without", std::to_string(activations_without));
  RecordProperty("activation_peak_with", std::to_string(activations_with));
  EXPECT_GT(activations_without, 0);
  EXPECT_LE(2 * activations_with, activations_without)
      << "with recompute " << activations_with << " B, without " << activations_without << " B";
  // The plan's prediction bounds the measured peak under recompute too.
  EXPECT_LE(with->measured_peak_bytes.at(0), with->predicted_peak_bytes.at(0));
  EXPECT_LE(with->predicted_peak_bytes.at(0), with->measured_peak_bytes.at(0) * 1.1);
  ASSERT_EQ(with->losses.size(), without->losses.size());
  for (size_t i = 0; i < with->losses.size(); ++i) EXPECT_EQ(with->losses[i], without->losses[i]) << "step " << i + 1;
  EXPECT_EQ(with->weights, without->weights);
}

}  // namespace
}  // namespace strata
