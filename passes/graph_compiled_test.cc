#include <string>
#include <vector>

#include "compiler/graph.h"
#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "tools/model_gen.h"

// The Graph IR over compiled plans (every pass's output, pipeline ranks with
// their channels): here, above Compile, since compiler/ does not include
// passes/.

namespace strata {
namespace {

// Every rank's compiled program of a generated model.
std::vector<Program> CompiledPrograms(const std::string& model, GenOptions gen, const Strategy& strategy) {
  auto text = GenerateProgram(model, gen);
  EXPECT_TRUE(text.ok()) << text.status();
  auto program = ParseProgramText(*text, model + ".pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  auto result = Compile(*program, strategy, CompileOptions());
  EXPECT_TRUE(result.ok()) << result.status();
  std::vector<Program> out;
  if (result.ok()) {
    for (const RankPlan& plan : result->plans) out.push_back(plan.program());
  }
  return out;
}

Strategy TwoStages() {
  Strategy s;
  s.mutable_pipeline()->set_micro_batch_size(8);
  s.mutable_pipeline()->set_accumulate_steps(2);
  return s;
}

std::vector<Program> Corpus() {
  std::vector<Program> all;
  GenOptions resmlp;
  resmlp.blocks = 3;
  resmlp.dropout = 0.1;
  GenOptions two;
  two.stages = 2;
  GenOptions mlp_sgd;
  mlp_sgd.optimizer = "momentum";
  for (auto programs :
       {CompiledPrograms("resmlp", resmlp, Strategy()), CompiledPrograms("convnet", GenOptions(), Strategy()),
        CompiledPrograms("alexnet", two, TwoStages()), CompiledPrograms("mlp", mlp_sgd, Strategy())}) {
    for (auto& p : programs) all.push_back(std::move(p));
  }
  return all;
}

TEST(GraphTest, RoundTripsCompiledProgramsFieldForField) {
  const std::vector<Program> corpus = Corpus();
  ASSERT_EQ(corpus.size(), 5u);
  for (const Program& p : corpus) {
    auto graph = Graph::FromProgram(p);
    ASSERT_TRUE(graph.ok()) << graph.status();
    std::string diff;
    google::protobuf::util::MessageDifferencer differ;
    differ.ReportDifferencesToString(&diff);
    EXPECT_TRUE(differ.Compare(p, (*graph)->ToProgram())) << p.name() << ": " << diff;
    for (int i = 0; i < p.op_size(); ++i) {
      ASSERT_TRUE(google::protobuf::util::MessageDifferencer::Equals((*graph)->AsOp(i), p.op(i)))
          << p.name() << " " << i;
    }
  }
}

TEST(GraphTest, SharesAttributeSetsAndGivesOpsTheirNames) {
  GenOptions gen;
  gen.blocks = 5;
  const Program p = CompiledPrograms("resmlp", gen, Strategy()).at(0);
  auto graph = Graph::FromProgram(p);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Graph& g = **graph;
  std::vector<int> adam;
  for (int i = 0; i < g.num_ops(); ++i) {
    if (g.schema(i).type == "adam_update") adam.push_back(i);
  }
  ASSERT_GT(adam.size(), 10u);
  for (int i : adam) EXPECT_EQ(&g.attrs(i), &g.attrs(adam[0]));
  // AsOp writes each op's own names and fields over the shared set.
  for (int i : {adam[0], adam[3], 0}) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(g.AsOp(i), p.op(i))) << i;
  }
}

// The Graph verifier reaches the protobuf verifier's verdict, message included.
TEST(GraphTest, VerifiesAsTheProgramVerifierDoes) {
  for (const Program& p : Corpus()) {
    auto graph = Graph::FromProgram(p);
    ASSERT_TRUE(graph.ok()) << graph.status();
    EXPECT_TRUE(VerifyGraph(**graph).ok()) << VerifyGraph(**graph);
  }
  const Program good = Corpus().at(0);
  std::vector<Program> broken;
  {
    Program p = good;  // an output recorded with the wrong shape
    for (Var& v : *p.mutable_var()) {
      if (v.kind() == ACTIVATION && v.shape_size() == 2) {
        v.set_shape(1, v.shape(1) + 1);
        break;
      }
    }
    broken.push_back(p);
  }
  {
    Program p = good;  // a read moved before the write
    std::swap(*p.mutable_op(1), *p.mutable_op(2));
    broken.push_back(p);
  }
  {
    Program p = good;  // an op that lost an input
    for (Op& op : *p.mutable_op()) {
      if (op.type() == "add") {
        op.mutable_input()->RemoveLast();
        break;
      }
    }
    broken.push_back(p);
  }
  for (const Program& p : broken) {
    auto want = VerifyAndIndexProgram(p);
    ASSERT_FALSE(want.ok());
    auto graph = Graph::FromProgram(p);
    ASSERT_TRUE(graph.ok()) << graph.status();
    const absl::Status got = VerifyGraph(**graph);
    ASSERT_FALSE(got.ok()) << want.status();
    EXPECT_EQ(got.message(), want.status().message());
  }
}

}  // namespace
}  // namespace strata
