// Resuming from a checkpoint reproduces the uninterrupted run bit for bit:
// 20 steps equal 10 steps, save, load, 10 steps (dropout masks, the cosine
// schedule, Adam's moments and the data order all carry over).
#include <filesystem>

#include "passes/compile.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "runtime/trainer.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

RankPlan CompileResMlp(int64_t decay_steps = 20) {
  GenOptions gen;
  gen.layers = {16, 24, 5};
  gen.blocks = 2;
  gen.dropout = 0.2;
  gen.optimizer = "adamw";
  gen.dtype = "F64";
  auto text = GenerateProgram("resmlp", gen);
  EXPECT_TRUE(text.ok()) << text.status();
  auto program = ParseProgramText(*text, "resmlp.pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  // An explicit decay length: a run-length cosine ("cosine {}") would decay over
  // whatever --steps each invocation is given.
  program->mutable_optimizer()->mutable_lr_schedule()->mutable_cosine()->set_decay_steps(decay_steps);
  program->mutable_optimizer()->mutable_lr_schedule()->set_warmup_steps(3);
  CompileOptions options;
  options.batch_size = 32;
  auto result = Compile(*program, Strategy(), options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result->plans[0];
}

TEST(CheckpointResumeTest, TwentyStepsEqualTenSaveLoadTen) {
  RankPlan plan = CompileResMlp();
  const std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/resume_ckpt";
  std::filesystem::remove_all(dir);

  TrainOptions base;
  base.data = "synthetic:classes=5,size=200";  // 6 steps per epoch: the resume crosses epochs
  base.seed = 7;
  base.progress = false;

  TrainOptions full = base;
  full.steps = 20;
  auto uninterrupted = Train(plan, full);
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();

  TrainOptions first_half = base;
  first_half.steps = 10;
  first_half.save_dir = dir;
  auto a = Train(plan, first_half);
  ASSERT_TRUE(a.ok()) << a.status();
  TrainOptions second_half = base;
  second_half.steps = 20;  // --steps counts the whole run
  second_half.load_dir = dir;
  auto b = Train(plan, second_half);
  ASSERT_TRUE(b.ok()) << b.status();

  ASSERT_EQ(uninterrupted->steps.size(), 20u);
  ASSERT_EQ(a->steps.size(), 10u);
  ASSERT_EQ(b->steps.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a->steps[i].loss, uninterrupted->steps[i].loss) << "step " << i + 1;
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(b->steps[i].step, 11 + i);
    EXPECT_EQ(b->steps[i].loss, uninterrupted->steps[10 + i].loss) << "step " << 11 + i;
  }
  ASSERT_EQ(b->final_state.size(), uninterrupted->final_state.size());
  for (const auto& [name, values] : uninterrupted->final_state) {
    ASSERT_TRUE(b->final_state.count(name)) << name;
    EXPECT_EQ(b->final_state.at(name), values) << name;
  }
}

// A cosine without decay_steps decays over the run's steps, so a run that
// resumes with another --steps would follow another schedule than the one
// it continues: refused naming both lengths (Megatron-LM likewise refuses
// a scheduler whose iterations differ from its checkpoint's). The same
// length resumes the uninterrupted run bit for bit.
TEST(CheckpointResumeTest, ARunLengthScheduleResumesOnlyWithTheSameLength) {
  RankPlan plan = CompileResMlp(/*decay_steps=*/0);
  ASSERT_TRUE(ScheduleSpansRun(plan.program()));
  EXPECT_FALSE(ScheduleSpansRun(CompileResMlp(20).program()));
  const std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/resume_run_length";
  std::filesystem::remove_all(dir);
  TrainOptions base;
  base.data = "synthetic:classes=5,size=200";
  base.seed = 7;
  base.progress = false;
  TrainOptions full = base;
  full.steps = 12;
  auto uninterrupted = Train(plan, full);
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
  TrainOptions first = base;
  first.steps = 12;
  first.save_dir = dir;
  first.save_every = 5;
  first.keep_checkpoints = 0;
  ASSERT_TRUE(Train(plan, first).ok());

  TrainOptions longer = base;
  longer.steps = 20;
  longer.load_dir = dir + "/step-5";
  auto refused = Train(plan, longer);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("saved by a run of 12 steps"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("this run of 20 steps"), std::string::npos) << refused.status();
  // The two ways on: the saved run's 12 updates as a fixed decay, or its length.
  EXPECT_NE(refused.status().message().find("decay_steps: 12"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("--steps 12"), std::string::npos) << refused.status();

  TrainOptions same = base;
  same.steps = 12;
  same.load_dir = dir + "/step-5";
  auto resumed = Train(plan, same);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->steps.size(), 7u);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(resumed->steps[i].loss, uninterrupted->steps[5 + i].loss) << "step " << 6 + i;
}

}  // namespace
}  // namespace strata
