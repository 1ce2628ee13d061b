// The tiny GPT of `strata gen gpt --stages 2` (its token embedding tied to
// the logits across the first and the last stage) trains under a two-stage
// 1F1B pipeline exactly what one device trains: per-step losses and final
// weights within 1e-5 relative over 10 steps of the license corpus, float64.

#include <iostream>
#include <string>

#include "gtest/gtest.h"
#include "tests/parity_util.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

constexpr double kTolerance = 1e-5;

TEST(GptPipelineParityTest, TwoStages1F1BMatchesSingleDevice) {
  auto program = GenerateModel("gpt", TinyGpt("F64", 2));
  ASSERT_TRUE(program.ok()) << program.status();
  ParityOptions options;
  options.data = "tokens:path=tests/testdata/license_tokens.u16";
  options.steps = 10;
  constexpr int kMicroBatchSize = 2, kMicroBatches = 3;
  Strategy strategy;
  strategy.mutable_pipeline()->set_micro_batch_size(kMicroBatchSize);
  strategy.mutable_pipeline()->set_accumulate_steps(kMicroBatches);
  strategy.mutable_pipeline()->set_schedule(ONE_F_ONE_B);
  auto single = TrainSingleDevice(*program, kMicroBatchSize * kMicroBatches, options);
  ASSERT_TRUE(single.ok()) << single.status();
  auto parallel = TrainParallel(*program, strategy, options);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  ASSERT_EQ(parallel->losses.size(), static_cast<size_t>(options.steps));
  const double loss_diff = MaxLossDifference(*parallel, *single);
  std::string worst;
  const double weight_diff = MaxWeightDifference(*parallel, *single, &worst);
  std::cout << "losses " << single->losses.front() << " -> " << single->losses.back()
            << "; largest relative difference: " << loss_diff << " in the losses, " << weight_diff
            << " in the weights (" << worst << ")\n";
  EXPECT_LE(loss_diff, kTolerance);
  EXPECT_LE(weight_diff, kTolerance) << "worst parameter: " << worst;
  // Training moved the weights (the tied wte included), so equal weights mean equal training.
  EXPECT_GT(MaxWeightDifference(single->weights, single->initial_weights), 100 * kTolerance);
  EXPECT_LT(single->losses.back(), single->losses.front());
}

}  // namespace
}  // namespace strata
