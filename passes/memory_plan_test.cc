#include "passes/memory_plan.h"

#include "passes/compile.h"
#include "compiler/program_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::Contains;

constexpr char kProgram[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "w" dtype: F32 shape: [4, 4] kind: PARAM }
  op { type: "matmul" input: ["x", "w"] output: ["h"] }
  op { type: "relu" input: ["h"] output: ["r"] }
  op { type: "reshape" input: ["r"] output: ["flat"] attr { key: "shape" value { list { i: [-1, 4] } } } }
  op { type: "reduce_mean" input: ["flat"] output: ["loss"] }
  loss: "loss"
  optimizer { momentum { learning_rate: 0.1 momentum: 0.9 } }
)pb";

TEST(MemoryPlanTest, FreesEachActivationAtItsLastUse) {
  auto program = ParseProgramText(kProgram, "m.pbtxt");
  ASSERT_TRUE(program.ok());
  CompileOptions options;
  options.batch_size = 10;
  auto result = Compile(*program, Strategy(), options);
  ASSERT_TRUE(result.ok()) << result.status();
  const RankPlan& plan = result->plans[0];
  const Program& p = plan.program();
  // h is read by relu (forward) and, for relu's gradient only through r; find its last reader.
  int last_reader = -1;
  for (int i = 0; i < p.op_size(); ++i) {
    for (const auto& in : p.op(i).input()) {
      if (in == "h") last_reader = i;
    }
  }
  ASSERT_GE(last_reader, 0);
  EXPECT_THAT(plan.memory().frees_after_op(last_reader).var(), Contains("h"));
  // Parameters, optimizer state and the loss are never freed.
  for (const auto& frees : plan.memory().frees_after_op()) {
    for (const auto& v : frees.var()) {
      EXPECT_NE(v, "w");
      EXPECT_NE(v, "w@velocity");
      EXPECT_NE(v, "loss");
    }
  }
  EXPECT_EQ(plan.memory().param_bytes(), 4 * 4 * 4);
  EXPECT_EQ(plan.memory().state_bytes(), 4 * 4 * 4 + 8);  // velocity + the I64 step counter
  EXPECT_GT(plan.memory().activation_peak_bytes(), 0);
  EXPECT_EQ(plan.memory().peak_bytes(),
            plan.memory().param_bytes() + plan.memory().state_bytes() + plan.memory().activation_peak_bytes());
}

TEST(MemoryPlanTest, PeakGrowsWithTheBatch) {
  auto program = ParseProgramText(kProgram, "m.pbtxt");
  ASSERT_TRUE(program.ok());
  CompileOptions small, large;
  small.batch_size = 10;
  large.batch_size = 1000;
  auto a = Compile(*program, Strategy(), small);
  auto b = Compile(*program, Strategy(), large);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(b->plans[0].memory().activation_peak_bytes(), 50 * a->plans[0].memory().activation_peak_bytes());
}

}  // namespace
}  // namespace strata
