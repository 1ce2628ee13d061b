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

RankPlan CompileResMlp() {
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
  program->mutable_optimizer()->mutable_lr_schedule()->mutable_cosine()->set_decay_steps(20);
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

}  // namespace
}  // namespace strata
