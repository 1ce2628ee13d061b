#include "passes/placement.h"

#include <memory>
#include <string>
#include <vector>

#include "compiler/graph.h"
#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr char kHeader[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w1" dtype: F32 shape: [4, 8] kind: PARAM }
  var { name: "w2" dtype: F32 shape: [8, 3] kind: PARAM }
  optimizer { sgd { learning_rate: 0.1 } }
  loss: "loss"
)pb";

// The program validated, as a Graph, placed: what the stages and errors are.
absl::StatusOr<std::unique_ptr<Graph>> Place(const std::string& body) {
  auto program = ParseProgramText(std::string(kHeader) + body, "test.pbtxt");
  if (!program.ok()) return program.status();
  if (auto s = ValidateAndInferProgram(&*program); !s.ok()) return s;
  auto graph = Graph::FromProgram(*program);
  if (!graph.ok()) return graph.status();
  if (auto s = PlacementPass().Run(**graph, CompileContext()); !s.ok()) return s.status();
  return graph;
}

// An unplaced op takes the stage of the producer of its first produced input.
TEST(PlacementTest, UnplacedOpsInheritTheirProducersStage) {
  auto p = Place(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] device: "gpu:0" }
    op { type: "relu" input: ["h"] output: ["r"] }
    op { type: "matmul" input: ["r", "w2"] output: ["logits"] device: "gpu:1" }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  ASSERT_TRUE(p.ok()) << p.status();
  const Graph& g = **p;
  const std::vector<int>& ops = g.ops();
  EXPECT_EQ(g.stage(ops[1]), 0);
  EXPECT_EQ(g.stage(ops[3]), 1);
  EXPECT_EQ(NumStages(g), 2);
}

TEST(PlacementTest, AProgramThatPlacesNothingIsOneStage) {
  auto p = Place(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] }
    op { type: "matmul" input: ["h", "w2"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  ASSERT_TRUE(p.ok()) << p.status();
  for (int op : (*p)->ops()) EXPECT_EQ((*p)->stage(op), 0);
  EXPECT_EQ(NumStages(**p), 1);
}

TEST(PlacementTest, AnUnplacedOpReadingOnlyFeedsNeedsADevice) {
  auto p = Place(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] }
    op { type: "matmul" input: ["h", "w2"] output: ["logits"] device: "gpu:0" }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("test.pbtxt:9: op #0 'matmul': has no device and reads no var produced by a placed op"));
}

TEST(PlacementTest, RejectsDataFlowingBackToAnEarlierStage) {
  auto p = Place(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] device: "gpu:1" }
    op { type: "matmul" input: ["h", "w2"] output: ["logits"] device: "gpu:0" }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] device: "gpu:1" }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("op #1 'matmul'"));
  EXPECT_THAT(p.status().message(), HasSubstr("later stage 1"));
}

TEST(PlacementTest, RejectsSkippedStage) {
  auto p = Place(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] device: "gpu:0" }
    op { type: "matmul" input: ["h", "w2"] output: ["logits"] device: "gpu:2" }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("stage 1 has no ops"));
}

TEST(PlacementTest, RejectsMalformedDevice) {
  auto p = Place(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] device: "gpu:one" }
    op { type: "matmul" input: ["h", "w2"] output: ["logits"] }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("malformed device 'gpu:one'"));
  EXPECT_THAT(p.status().message(), HasSubstr("test.pbtxt:"));
}

// A malformed device on a later op is the error named, not the unplaced
// ops before it (which a program that places ops must place too).
TEST(PlacementTest, NamesAMalformedDeviceBeforeAnUnplacedOp) {
  auto p = Place(R"pb(
    op { type: "matmul" input: ["x", "w1"] output: ["h"] }
    op { type: "matmul" input: ["h", "w2"] output: ["logits"] device: "tpu:x" }
    op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] }
  )pb");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("op #1 'matmul': malformed device 'tpu:x'"));
}

TEST(PlacementTest, ParsesStages) {
  EXPECT_EQ(*ParseDeviceStage("gpu:3"), 3);
  EXPECT_EQ(*ParseDeviceStage("cpu:0"), 0);
  EXPECT_EQ(*ParseDeviceStage("gpu"), 0);
  EXPECT_FALSE(ParseDeviceStage("tpu:1").ok());
  EXPECT_FALSE(ParseDeviceStage("gpu:-1").ok());
  EXPECT_FALSE(ParseDeviceStage("gpu:").ok());
  EXPECT_FALSE(ParseDeviceStage("gpu:1x").ok());
}

}  // namespace
}  // namespace strata
