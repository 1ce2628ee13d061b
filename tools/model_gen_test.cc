#include "tools/model_gen.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
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

// GPT-2 124M: V*D + T*D + L*(12*D*D + 13*D) + 2*D with V 50257, T 1024,
// D 768, L 12 (the output projection is wte itself, so it adds nothing).
TEST(ModelGenTest, GptHasGpt2SmallsParameterCount) {
  GenOptions o;
  o.blocks = 12;
  auto text = GenerateProgram("gpt", o);
  ASSERT_TRUE(text.ok()) << text.status();
  auto program = ParseProgramText(*text, "gpt.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  int64_t params = 0;
  for (const Var& v : program->var()) {
    if (v.kind() != PARAM) continue;
    int64_t n = 1;
    for (int64_t d : v.shape()) n *= d;
    params += n;
  }
  EXPECT_EQ(params, int64_t{50257} * 768 + 1024 * 768 + 12 * (12 * 768 * 768 + 13 * 768) + 2 * 768);
  EXPECT_EQ(params, 124439808);
  EXPECT_TRUE(absl::StrContains(*text, "adamw { learning_rate: 0.0006 } weight_decay: 0.1")) << *text;
  EXPECT_TRUE(absl::StrContains(*text, "attr { key: \"transpose_b\" value { b: true } }"));
}

TEST(ModelGenTest, GptTiesWteAcrossTheFirstAndLastStage) {
  GenOptions o;
  o.blocks = 12;
  o.stages = 4;
  auto stage = StageOfOutputs("gpt", o);
  // The logits (v d per token) weigh about five blocks: they get a stage of
  // their own and the blocks split 4/4/4 over the others.
  EXPECT_EQ(stage["tok_emb"], 0);
  for (int b = 0; b < 12; ++b) EXPECT_EQ(stage["h" + std::to_string(b + 1)], b / 4) << "block " << b;
  EXPECT_EQ(stage["ln_f.y"], 3);
  EXPECT_EQ(stage["logits"], 3);
  EXPECT_EQ(stage["loss"], 3);
  auto text = GenerateProgram("gpt", o);
  ASSERT_TRUE(text.ok());
  auto program = ParseProgramText(*text, "gpt.pbtxt");
  ASSERT_TRUE(program.ok());
  std::set<std::string> wte_devices;
  for (const Op& op : program->op()) {
    for (const auto& in : op.input()) {
      if (in == "wte") wte_devices.insert(op.device());
    }
  }
  EXPECT_EQ(wte_devices, (std::set<std::string>{"gpu:0", "gpu:3"}));
}

TEST(ModelGenTest, GptGeluIsTheTanhFormUnlessAskedForErf) {
  GenOptions o;
  o.blocks = 2;
  o.d_model = 64;
  o.heads = 4;
  o.seq = 32;
  o.vocab = 256;
  for (const std::string form : {"tanh", "erf"}) {
    SCOPED_TRACE(form);
    o.gelu = form;
    auto text = GenerateProgram("gpt", o);
    ASSERT_TRUE(text.ok()) << text.status();
    auto program = ParseProgramText(*text, "gpt.pbtxt");
    ASSERT_TRUE(program.ok()) << program.status();
    int gelus = 0;
    for (const Op& op : program->op()) {
      if (op.type() != "gelu") continue;
      ++gelus;
      auto it = op.attr().find("approximate");
      if (form == "tanh") {
        ASSERT_TRUE(it != op.attr().end());
        EXPECT_EQ(it->second.s(), "tanh");
      } else {
        EXPECT_TRUE(it == op.attr().end());  // the default: the erf form
      }
    }
    EXPECT_EQ(gelus, 2);
  }
  o.gelu = "relu";
  auto bad = GenerateProgram("gpt", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "--gelu 'relu'")) << bad.status();
}

TEST(ModelGenTest, GptRejectsBadSizes) {
  GenOptions o;
  o.blocks = 2;
  o.heads = 5;  // does not divide 768
  auto heads = GenerateProgram("gpt", o);
  ASSERT_FALSE(heads.ok());
  EXPECT_TRUE(absl::StrContains(heads.status().message(), "divide")) << heads.status();
  o.heads = 12;
  o.vocab = 70000;  // past uint16 token ids
  EXPECT_FALSE(GenerateProgram("gpt", o).ok());
  o.vocab = 256;
  o.stages = 5;  // embeddings, 2 blocks, head
  EXPECT_FALSE(GenerateProgram("gpt", o).ok());
}

// What gen refuses it refuses itself, not through a program that check
// then rejects: resmlp's widths as mlp's, and a dropout that its six
// written digits would round up to 1.
TEST(ModelGenTest, BadWidthsAndDropoutsAreRefusedByGen) {
  for (const std::string model : {"mlp", "resmlp"}) {
    for (const std::vector<int64_t>& layers : std::vector<std::vector<int64_t>>{{784, 0, 10}, {784, -1, 10}, {784}}) {
      GenOptions o;
      o.layers = layers;
      auto text = GenerateProgram(model, o);
      EXPECT_FALSE(text.ok()) << model << " " << absl::StrJoin(layers, ",");
      if (!text.ok()) {
        EXPECT_TRUE(absl::StrContains(text.status().message(), "--layers")) << text.status();
      }
    }
  }
  GenOptions o;
  o.dropout = 0.9999999999999999;
  auto rounded = GenerateProgram("mlp", o);
  ASSERT_FALSE(rounded.ok());
  EXPECT_TRUE(absl::StrContains(rounded.status().message(), "--dropout")) << rounded.status();
  o.dropout = 0.5;
  EXPECT_TRUE(GenerateProgram("mlp", o).ok());
}

}  // namespace
}  // namespace strata
