#include "compiler/graph.h"

#include <memory>
#include <string>
#include <vector>

#include "compiler/pass.h"
#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

TEST(GraphTest, RejectsNamesThatAreNotVarsAndUnknownTypes) {
  const std::string feed = R"(var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED } )";
  const std::pair<std::string, std::string> cases[] = {
      {R"(op { type: "relu" input: ["x"] output: ["y"] })", "op #0 'relu': output 'y' is not a var"},
      {R"(op { type: "frobnicate" input: ["x"] output: ["x"] })", "op #0 'frobnicate': unknown op type"},
      {R"(var { name: "x" dtype: F32 shape: [1] kind: FEED })", "var 'x' is declared twice"},
  };
  for (const auto& [body, message] : cases) {
    auto program = ParseProgramText(feed + body, "g.pbtxt");
    ASSERT_TRUE(program.ok()) << program.status();
    auto graph = Graph::FromProgram(*program);
    ASSERT_FALSE(graph.ok()) << body;
    EXPECT_THAT(graph.status().message(), HasSubstr(message));
  }
}

// A pass that appends an op whose output var is recorded with the wrong type.
class BreakingPass : public Pass {
 public:
  std::string name() const override { return "breaking"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext&) override {
    graph.AddVar("bad", F32, {7}, ACTIVATION);
    Op op;
    op.set_type("relu");
    op.add_input("h");
    op.add_output("bad");
    op.set_name("broken");
    op.set_line(42);
    if (auto s = graph.AddOp(op); !s.ok()) return s;
    return true;
  }
};

// A finding after a pass names the file, line and op as the Program
// verifier does: "file:line: op #i 'type' (name)".
TEST(GraphTest, VerifierFindingAfterAPassKeepsFileLineAndOpName) {
  const char text[] = R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "w" dtype: F32 shape: [4, 4] kind: PARAM }
    op { type: "matmul" input: ["x", "w"] output: ["h"] }
    op { type: "reduce_mean" input: ["h"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  auto p = ParseProgramText(text, "m.pbtxt");
  ASSERT_TRUE(p.ok()) << p.status();
  { const absl::Status v = ValidateAndInferProgram(&*p); ASSERT_TRUE(v.ok()) << v; }
  auto g = Graph::FromProgram(*p);
  ASSERT_TRUE(g.ok()) << g.status();
  PassPipeline pipeline("test");
  pipeline.AddPass<BreakingPass>();
  const absl::Status got = pipeline.Run(**g, CompileContext()).status();
  ASSERT_FALSE(got.ok());

  // What the protobuf verifier says of the same program.
  Program after = *p;
  ASSERT_TRUE(RunOnProgram(BreakingPass(), after, CompileContext()).ok());
  auto want = VerifyAndIndexProgram(after);
  ASSERT_FALSE(want.ok());
  EXPECT_EQ(std::string(got.message()),
            absl::StrCat("program invalid after pass 'breaking': ", want.status().message()));
  EXPECT_THAT(std::string(got.message()), ::testing::HasSubstr("m.pbtxt:42: op #2 'relu' (broken)"));
}

// A small program to mutate: x -> relu -> h -> relu -> y -> reduce_mean -> loss.
std::unique_ptr<Graph> Chain() {
  auto program = ParseProgramText(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "h" dtype: F32 shape: [-1, 4] }
    var { name: "h2" dtype: F32 shape: [-1, 4] }
    var { name: "y" dtype: F32 shape: [-1, 4] }
    var { name: "loss" dtype: F32 shape: [] }
    op { type: "relu" input: ["x"] output: ["h"] name: "first" }
    op { type: "relu" input: ["h"] output: ["y"] name: "second" }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] name: "mean" }
    loss: "loss"
  )pb", "chain.pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  auto graph = Graph::FromProgram(*program);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return *std::move(graph);
}

std::vector<std::string> OpNames(const Graph& g) {
  std::vector<std::string> names;
  for (int op : g.ops()) names.emplace_back(g.op_name(op));
  return names;
}

Op Relu(const std::string& in, const std::string& out, const std::string& name) {
  Op op;
  op.set_type("relu");
  op.add_input(in);
  op.add_output(out);
  op.set_name(name);
  return op;
}

TEST(GraphMutationTest, InsertsBeforeAndAfterKeepingEveryOpsId) {
  std::unique_ptr<Graph> g = Chain();
  const std::vector<int> before = g->ops();
  ASSERT_EQ(before.size(), 3u);
  absl::StatusOr<int> mid = g->InsertOpAfter(before[0], Relu("h", "h2", "inserted-after"));
  ASSERT_TRUE(mid.ok()) << mid.status();
  absl::StatusOr<int> head = g->InsertOpBefore(before[0], Relu("x", "h2", "inserted-first"));
  ASSERT_TRUE(head.ok()) << head.status();
  absl::StatusOr<int> last = g->InsertOpAfter(before[2], Relu("y", "h2", "inserted-last"));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(OpNames(*g), (std::vector<std::string>{"inserted-first", "first", "inserted-after", "second", "mean",
                                                   "inserted-last"}));
  EXPECT_EQ(g->num_ops(), 6);
  // The old ops keep their ids; positions follow the order.
  EXPECT_EQ(g->op_name(before[1]), "second");
  EXPECT_EQ(g->position(before[1]), 3);
  EXPECT_EQ(g->position(*head), 0);
  // Messages number ops by position.
  EXPECT_THAT(g->OpLocation(before[1]), HasSubstr("op #3 'relu' (second)"));
  // The program comes out in the new order.
  const Program out = g->ToProgram();
  ASSERT_EQ(out.op_size(), 6);
  EXPECT_EQ(out.op(2).name(), "inserted-after");
  EXPECT_EQ(out.op(2).input(0), "h");
}

// Precedes follows program order through erases (which keep the others'
// order without a walk of the list) and insertions (which need one), and a
// replaced op's error still names its position after an erase.
TEST(GraphMutationTest, PrecedesFollowsTheOrderThroughErasesAndInsertions) {
  std::unique_ptr<Graph> g = Chain();
  const std::vector<int> ids = g->ops();
  EXPECT_TRUE(g->Precedes(ids[0], ids[2]));
  EXPECT_FALSE(g->Precedes(ids[2], ids[0]));
  EXPECT_FALSE(g->Precedes(ids[1], ids[1]));
  g->EraseOp(ids[1]);
  EXPECT_TRUE(g->Precedes(ids[0], ids[2]));
  absl::StatusOr<int> before_first = g->InsertOpBefore(ids[0], Relu("x", "h2", "new-first"));
  ASSERT_TRUE(before_first.ok()) << before_first.status();
  EXPECT_TRUE(g->Precedes(*before_first, ids[0]));
  EXPECT_FALSE(g->Precedes(ids[2], *before_first));
  g->EraseOp(ids[0]);
  absl::Status bad = g->ReplaceOp(ids[2], Relu("no_such_var", "y", "bad"));
  EXPECT_THAT(bad.message(), HasSubstr("op #1"));  // new-first, then this one
}

TEST(GraphMutationTest, ErasedOpsLeaveTheOrderAndTheirIdsAreNotReused) {
  std::unique_ptr<Graph> g = Chain();
  const std::vector<int> ids = g->ops();
  g->EraseOp(ids[1]);
  EXPECT_TRUE(g->erased(ids[1]));
  EXPECT_EQ(OpNames(*g), (std::vector<std::string>{"first", "mean"}));
  EXPECT_EQ(g->num_ops(), 2);
  absl::StatusOr<int> again = g->InsertOpAfter(ids[0], Relu("h", "y", "replacement"));
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, ids[1]);
  EXPECT_EQ(OpNames(*g), (std::vector<std::string>{"first", "replacement", "mean"}));
  EXPECT_TRUE(VerifyGraph(*g).ok()) << VerifyGraph(*g);
  // Erasing the head and the tail.
  g->EraseOp(ids[0]);
  g->EraseOp(ids[2]);
  EXPECT_EQ(OpNames(*g), (std::vector<std::string>{"replacement"}));
  // Inserting next to an erased op is an error, not a corruption.
  EXPECT_FALSE(g->InsertOpBefore(ids[0], Relu("x", "h", "nowhere")).ok());
}

TEST(GraphMutationTest, TheVerifierSeesUseBeforeDefinitionAfterAMove) {
  std::unique_ptr<Graph> g = Chain();
  const std::vector<int> ids = g->ops();
  // A second reader of y before y's producer.
  ASSERT_TRUE(g->InsertOpBefore(ids[1], Relu("y", "h2", "too-early")).ok());
  absl::Status s = VerifyGraph(*g);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("op #1 'relu' (too-early): input 'y' used before definition"));
}

TEST(GraphMutationTest, ReplaceAllUsesWithRewritesReadsOnly) {
  std::unique_ptr<Graph> g = Chain();
  const std::vector<int> ids = g->ops();
  const int h = g->FindVar("h"), h2 = g->FindVar("h2"), x = g->FindVar("x");
  ASSERT_TRUE(g->InsertOpAfter(ids[0], Relu("h", "h2", "copy")).ok());
  // Only ops after the copy read h2 instead of h (the copy itself keeps h).
  absl::StatusOr<int> changed =
      g->ReplaceAllUsesWith(h, h2, [&](int op) { return op == ids[1] || op == ids[2]; });
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(*changed, 1);
  EXPECT_EQ(g->inputs(ids[1])[0], h2);
  EXPECT_EQ(g->outputs(ids[0])[0], h);  // writes are untouched
  EXPECT_TRUE(VerifyGraph(*g).ok()) << VerifyGraph(*g);
  // Types must agree: x is [-1, 4] like h, loss is a scalar.
  EXPECT_FALSE(g->ReplaceAllUsesWith(x, g->FindVar("loss")).ok());
}

TEST(GraphMutationTest, ClonesARangeWithItsVarsRenamed) {
  std::unique_ptr<Graph> g = Chain();
  const std::vector<int> ids = g->ops();
  // Recompute's shape: the forward relu again, into a fresh var, before the reader.
  const int h = g->FindVar("h"), h_again = g->AddVar("h@recompute", F32, {-1, 4}, ACTIVATION);
  ASSERT_GE(h_again, 0);
  absl::StatusOr<std::vector<int>> clones = g->CloneOps({ids[0]}, ids[1], {{h, h_again}});
  ASSERT_TRUE(clones.ok()) << clones.status();
  ASSERT_EQ(clones->size(), 1u);
  EXPECT_EQ(g->op_name((*clones)[0]), "first");
  EXPECT_EQ(g->schema((*clones)[0]).type, "relu");
  EXPECT_EQ(g->inputs((*clones)[0])[0], g->FindVar("x"));
  EXPECT_EQ(g->outputs((*clones)[0])[0], h_again);
  EXPECT_EQ(g->position((*clones)[0]), 1);
  ASSERT_TRUE(g->ReplaceAllUsesWith(h, h_again, [&](int op) { return op == ids[1]; }).ok());
  EXPECT_TRUE(VerifyGraph(*g).ok()) << VerifyGraph(*g);
  EXPECT_EQ(g->ToProgram().op(2).input(0), "h@recompute");
}

TEST(GraphMutationTest, ReplaceOpChangesTypeAndArityInPlace) {
  std::unique_ptr<Graph> g = Chain();
  const std::vector<int> ids = g->ops();
  Op add;
  add.set_type("add");
  add.add_input("h");
  add.add_input("h");
  add.add_output("y");
  add.set_name("doubled");
  ASSERT_TRUE(g->ReplaceOp(ids[1], add).ok());
  EXPECT_EQ(g->ops(), ids);
  EXPECT_EQ(g->schema(ids[1]).type, "add");
  EXPECT_EQ(g->inputs(ids[1]).size(), 2u);
  EXPECT_TRUE(VerifyGraph(*g).ok()) << VerifyGraph(*g);
  add.set_input(1, "no-such-var");
  absl::Status s = g->ReplaceOp(ids[1], add);
  EXPECT_THAT(s.message(), HasSubstr("op #1 'add' (doubled): input 'no-such-var' is not a var"));
}

TEST(GraphMutationTest, RetainVarsDropsUnusedVarsAndRenumbersTheRest) {
  std::unique_ptr<Graph> g = Chain();
  std::vector<bool> keep(g->num_vars(), true);
  keep[g->FindVar("h2")] = false;
  ASSERT_TRUE(g->RetainVars(keep).ok());
  EXPECT_EQ(g->num_vars(), 4);
  EXPECT_EQ(g->FindVar("h2"), -1);
  EXPECT_EQ(g->var_name(2), "y");  // after x and h, in declaration order
  EXPECT_EQ(g->type(g->FindVar("loss")).shape.size(), 0u);
  EXPECT_TRUE(VerifyGraph(*g).ok()) << VerifyGraph(*g);
  const Program out = g->ToProgram();
  ASSERT_EQ(out.var_size(), 4);
  EXPECT_EQ(out.op(1).input(0), "h");
  EXPECT_EQ(out.op(1).output(0), "y");
  // A var an op still uses cannot go.
  std::vector<bool> drop_h(g->num_vars(), true);
  drop_h[g->FindVar("h")] = false;
  absl::Status s = g->RetainVars(drop_h);
  EXPECT_THAT(s.message(), HasSubstr("uses var 'h', which is being dropped"));
  EXPECT_EQ(g->num_vars(), 4);
}

// Inserts link into a list (O(1) each, the dense order rebuilt once when
// next asked for), so a pass may insert next to every op of a large graph.
TEST(GraphMutationTest, ManyInsertsInTheMiddleKeepTheOrder) {
  std::unique_ptr<Graph> g = Chain();
  const int anchor = g->ops()[1];
  for (int i = 0; i < 20000; ++i) {
    ASSERT_TRUE(g->InsertOpBefore(anchor, Relu("h", "h2", "")).ok());
  }
  EXPECT_EQ(g->num_ops(), 20003);
  EXPECT_EQ(g->position(anchor), 20001);
  EXPECT_TRUE(VerifyGraph(*g).ok());
}

}  // namespace
}  // namespace strata
