#include "tools/model_gen.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// The stage of the op writing each var, from its device "gpu:N".
std::map<std::string, int> StageOfOutputs(const std::string& model, const GenOptions& options) {
  auto text = GenerateProgram(model, options);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return {};
  auto program = ParseProgramText(*text, model + ".pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  if (!program.ok()) return {};
  std::map<std::string, int> stage;
  int last = 0;
  for (const Op& op : program->op()) {
    EXPECT_TRUE(absl::StartsWith(op.device(), "gpu:")) << op.ShortDebugString();
    const int s = std::stoi(op.device().substr(4));
    EXPECT_GE(s, last) << "stages go backwards at " << op.output(0);  // contiguous, in order
    last = s;
    for (const auto& out : op.output()) stage[out] = s;
  }
  EXPECT_EQ(last, options.stages - 1) << "the last stage is empty";
  return stage;
}

TEST(ModelGenTest, AlexNetSplitsItsConvolutionsByWork) {
  GenOptions o;
  o.stages = 2;
  auto stage = StageOfOutputs("alexnet", o);
  // conv1-3 hold about 40% of the multiply-adds, conv4-5 and the classifier 60%;
  // with conv4 the first stage would hold 79%.
  EXPECT_EQ(stage["conv3.r"], 0);
  EXPECT_EQ(stage["conv4.xw"], 1);
  EXPECT_EQ(stage["loss"], 1);
}

TEST(ModelGenTest, MlpPutsTheWideFirstLayerAlone) {
  GenOptions o;  // 784-256-128-100-10: fc1 is 80% of the multiply-adds
  o.stages = 2;
  auto two = StageOfOutputs("mlp", o);
  EXPECT_EQ(two["fc1.y"], 0);
  EXPECT_EQ(two["fc2.xw"], 1);
  o.stages = 4;
  auto four = StageOfOutputs("mlp", o);
  EXPECT_EQ(four["fc1.y"], 0);
  EXPECT_EQ(four["fc2.y"], 1);
  EXPECT_EQ(four["fc3.y"], 2);
  EXPECT_EQ(four["fc4.y"], 3);
}

TEST(ModelGenTest, ResMlpGivesEveryStageTheSameBlocks) {
  GenOptions o;
  o.layers = {16, 256, 10};
  o.blocks = 8;
  o.stages = 4;
  auto stage = StageOfOutputs("resmlp", o);
  // The embedding and the head are cheap: they join the first and last stage.
  EXPECT_EQ(stage["h0"], 0);
  for (int b = 0; b < 8; ++b) EXPECT_EQ(stage["h" + std::to_string(b + 1)], b / 2) << "block " << b;
  EXPECT_EQ(stage["logits"], 3);
}

TEST(ModelGenTest, AsManyStagesAsLayersLeavesNoStageEmpty) {
  GenOptions o;
  o.layers = {16, 256, 10};
  o.blocks = 1;  // embedding, one block, head: three layers of very different cost
  o.stages = 3;
  auto stage = StageOfOutputs("resmlp", o);
  EXPECT_EQ(stage["h0"], 0);
  EXPECT_EQ(stage["h1"], 1);
  EXPECT_EQ(stage["logits"], 2);
}

TEST(ModelGenTest, MoreStagesThanLayersIsAnError) {
  GenOptions o;
  o.stages = 5;  // the default MLP has 4 layers
  EXPECT_FALSE(GenerateProgram("mlp", o).ok());
  o.stages = 7;  // the convnet has 2 conv + 2 fc layers
  auto convnet = GenerateProgram("convnet", o);
  ASSERT_FALSE(convnet.ok());
  EXPECT_TRUE(absl::StrContains(convnet.status().message(), "exceeds")) << convnet.status();
  o.blocks = 2;
  o.stages = 5;
  EXPECT_FALSE(GenerateProgram("resmlp", o).ok());
}

}  // namespace
}  // namespace strata
