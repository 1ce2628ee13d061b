#include "passes/compile.h"

#include <algorithm>
#include <string>
#include <vector>

#include "compiler/program_text.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "passes/pipeline_builder.h"

namespace strata {
namespace {

constexpr char kProgram[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "w" dtype: F32 shape: [4, 4] kind: PARAM }
  op { type: "matmul" input: ["x", "w"] output: ["h"] }
  op { type: "reduce_mean" input: ["h"] output: ["loss"] }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

TEST(CompileTest, FingerprintDependsOnTheProgramNotWhereItWasRead) {
  auto a = ParseProgramText(kProgram, "/home/alice/model.pbtxt");
  auto b = ParseProgramText(kProgram, "/mnt/other/machine/model.pbtxt");
  ASSERT_TRUE(a.ok() && b.ok());
  auto ca = Compile(*a, Strategy(), CompileOptions());
  auto cb = Compile(*b, Strategy(), CompileOptions());
  ASSERT_TRUE(ca.ok() && cb.ok());
  EXPECT_EQ(ca->plans[0].fingerprint(), cb->plans[0].fingerprint());

  // Nor on where in the file things are: a comment moves every line down.
  auto moved = ParseProgramText(std::string("# a comment\n\n") + kProgram, "/home/alice/model.pbtxt");
  ASSERT_TRUE(moved.ok());
  auto cm = Compile(*moved, Strategy(), CompileOptions());
  ASSERT_TRUE(cm.ok());
  EXPECT_EQ(ca->plans[0].fingerprint(), cm->plans[0].fingerprint());
  // The lines are still there for messages.
  EXPECT_EQ(cm->plans[0].program().op(0).line(), ca->plans[0].program().op(0).line() + 2);

  // A different program is a different fingerprint.
  auto c = ParseProgramText(std::string(kProgram) + "seed: 3\n", "/home/alice/model.pbtxt");
  ASSERT_TRUE(c.ok());
  auto cc = Compile(*c, Strategy(), CompileOptions());
  ASSERT_TRUE(cc.ok());
  EXPECT_NE(ca->plans[0].fingerprint(), cc->plans[0].fingerprint());
}

// A recompute checkpoint must cut the forward graph: one a residual
// branch bypasses is refused, naming it and the way around it.
TEST(CompileTest, RefusesARecomputeCheckpointThatDoesNotCutTheGraph) {
  auto p = ParseProgramText(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "w" dtype: F32 shape: [4, 4] kind: PARAM }
    op { type: "matmul" input: ["x", "w"] output: ["a"] }
    op { type: "relu" input: ["a"] output: ["b"] }
    op { type: "add" input: ["a", "b"] output: ["c"] }
    op { type: "reduce_mean" input: ["c"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb", "m.pbtxt");
  ASSERT_TRUE(p.ok()) << p.status();
  Strategy s;
  s.mutable_recompute()->add_checkpoints("b");
  auto r = Compile(*p, s, CompileOptions(), "rc.pbtxt");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "rc.pbtxt: recompute.checkpoints: var 'b' does not cut the graph: the loss 'loss' is reached from feed "
            "'x' without it (through 'c')");
  s.mutable_recompute()->set_checkpoints(0, "a");
  EXPECT_TRUE(Compile(*p, s, CompileOptions(), "rc.pbtxt").ok());
}

// strata compile checks --dump_after against CompilePassNames before
// compiling: it must list exactly the passes a compile runs.
TEST(CompileTest, PassNamesKnownBeforeCompilingAreThoseACompileRuns) {
  auto p = ParseProgramText(kProgram, "m.pbtxt");
  ASSERT_TRUE(p.ok());
  Strategy pipeline;
  pipeline.mutable_pipeline()->set_micro_batch_size(2);
  pipeline.mutable_pipeline()->set_accumulate_steps(3);
  Strategy data_parallel = pipeline;
  data_parallel.mutable_data_parallel()->set_degree(2);
  Strategy merged = data_parallel;
  merged.mutable_gradient_merge()->set_k_steps(2);
  Strategy recomputed = merged;
  recomputed.mutable_recompute()->add_checkpoints("h");
  for (const Strategy& s : {Strategy(), pipeline, data_parallel, merged, recomputed}) {
    auto r = Compile(*p, s, CompileOptions());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(CompilePassNames(s), r->pass_names) << s.ShortDebugString();
  }
}

// A pass this strategy and device do not run is named with the fewest
// settings that run it, on top of those the strategy has: what the
// --dump_after and --disable_passes errors say.
TEST(CompileTest, APassThatDoesNotRunHereIsNamedWithTheSettingsThatRunIt) {
  Strategy none;
  EXPECT_EQ(WherePassRuns("gradient-merge", none), "gradient_merge { k_steps: 2 or more } in the strategy");
  EXPECT_EQ(WherePassRuns("data-parallel", none), "data_parallel { degree: 2 or more } in the strategy");
  EXPECT_EQ(WherePassRuns("recompute", none), "recompute { checkpoints: ... } in the strategy");
  EXPECT_EQ(WherePassRuns("mixed-precision", none), "mixed_precision in the strategy");
  EXPECT_EQ(WherePassRuns("loss-scaling", none), "mixed_precision { dtype: F16 } (or loss_scaling {}) in the strategy");
  EXPECT_EQ(WherePassRuns("fuse-optimizer", none), "--device gpu");
  EXPECT_EQ(WherePassRuns("commute-casts-backward", none), "--device gpu and mixed_precision in the strategy");
  EXPECT_EQ(WherePassRuns("tf32", none), "--device gpu and allow_tf32: true in the strategy");
  EXPECT_EQ(WherePassRuns("no-such-pass", none), "");
  // What the strategy has already is not asked for again.
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  EXPECT_EQ(WherePassRuns("commute-casts-backward", bf16), "--device gpu");
  EXPECT_EQ(WherePassRuns("loss-scaling", bf16), "mixed_precision { dtype: F16 } (or loss_scaling {}) in the strategy");
  EXPECT_EQ(WherePassRuns("tf32", bf16, DEVICE_CUDA), "allow_tf32: true in the strategy");
  // None of these runs without settings, and each is named with some.
  for (const char* name : {"gradient-merge", "data-parallel", "recompute", "mixed-precision", "loss-scaling",
                            "fuse-optimizer", "commute-casts-backward", "tf32", "host-transfers"}) {
    const std::vector<std::string> here = CompilePassNames(none);
    EXPECT_EQ(std::find(here.begin(), here.end(), name), here.end()) << name;
    EXPECT_NE(WherePassRuns(name, none), "") << name;
  }
}

// A pass that runs per rank leaves one program per rank; each is that rank's
// (its own stage's ops), not rank 0's for all.
TEST(CompileTest, DumpAfterAPerRankPassKeepsEveryRanksProgram) {
  auto p = ParseProgramText(R"pb(
    var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
    var { name: "w0" dtype: F32 shape: [4, 4] kind: PARAM }
    var { name: "w1" dtype: F32 shape: [4, 4] kind: PARAM }
    op { type: "matmul" input: ["x", "w0"] output: ["h"] device: "gpu:0" }
    op { type: "matmul" input: ["h", "w1"] output: ["y"] device: "gpu:1" }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb", "two_stages.pbtxt");
  ASSERT_TRUE(p.ok()) << p.status();
  Strategy pipeline;
  pipeline.mutable_pipeline()->set_micro_batch_size(2);
  pipeline.mutable_pipeline()->set_accumulate_steps(2);
  auto has_param = [](const Program& program, const std::string& name) {
    for (const Op& op : program.op()) {
      for (const std::string& in : op.input()) {
        if (in == name) return true;
      }
    }
    return false;
  };
  for (const char* pass : {"pipeline-split", "micro-batch"}) {
    SCOPED_TRACE(pass);
    CompileOptions options;
    options.dump_after = pass;
    auto r = Compile(*p, pipeline, options);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->dumped_ranks.size(), 2u);
    EXPECT_TRUE(has_param(r->dumped_ranks[0], "w0"));
    EXPECT_FALSE(has_param(r->dumped_ranks[0], "w1"));
    EXPECT_TRUE(has_param(r->dumped_ranks[1], "w1"));
    EXPECT_FALSE(has_param(r->dumped_ranks[1], "w0"));
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(r->dumped, r->dumped_ranks[0]));
  }
  // A whole-program pass leaves one program and no per-rank ones.
  CompileOptions options;
  options.dump_after = "autodiff";
  auto r = Compile(*p, pipeline, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->dumped_ranks.empty());
  EXPECT_TRUE(has_param(r->dumped, "w0") && has_param(r->dumped, "w1"));
}

}  // namespace
}  // namespace strata
