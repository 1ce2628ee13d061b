#include "runtime/executor.h"

#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "passes/compile.h"
#include "compiler/program_text.h"
#include "gtest/gtest.h"
#include "runtime/dataset.h"
#include "runtime/trainer.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

RankPlan CompileMlp(int64_t batch, const std::string& dtype = "F32", const Strategy& strategy = Strategy()) {
  GenOptions gen;
  gen.dtype = dtype;
  auto text = GenerateProgram("mlp", gen);
  EXPECT_TRUE(text.ok());
  auto program = ParseProgramText(*text, "mlp.pbtxt");
  EXPECT_TRUE(program.ok()) << program.status();
  CompileOptions options;
  options.batch_size = batch;
  auto result = Compile(*program, strategy, options);
  EXPECT_TRUE(result.ok()) << result.status();
  return result->plans[0];
}

std::map<std::string, Tensor> Batch(const Executor& e, int64_t n, uint64_t seed) {
  std::vector<FeedSpec> specs;
  for (const Var* v : e.feeds()) specs.push_back({v->name(), v->dtype(), {v->shape().begin(), v->shape().end()}});
  auto data = OpenDataset("synthetic", specs, seed);
  EXPECT_TRUE(data.ok()) << data.status();
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = i;
  std::vector<Tensor> tensors;
  EXPECT_TRUE((*data)->GetBatch(idx, &tensors).ok());
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < specs.size(); ++i) feeds[specs[i].name] = tensors[i];
  return feeds;
}

TEST(ExecutorTest, MeasuredPeakIsWithinTenPercentOfThePlan) {
  for (int64_t batch : {64, 256}) {
    RankPlan plan = CompileMlp(batch);
    auto e = Executor::Create(plan, {});
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE((*e)->InitializeState().ok());
    auto feeds = Batch(**e, batch, 1);
    ASSERT_TRUE((*e)->TrainStep(feeds, 0).ok());  // the first step creates no state lazily, but warm up anyway
    GetCpuAllocator()->ResetPeak();
    auto r = (*e)->TrainStep(feeds, 0);
    ASSERT_TRUE(r.ok()) << r.status();
    const double measured = static_cast<double>(GetCpuAllocator()->peak_bytes());
    const double predicted = static_cast<double>(plan.memory().peak_bytes());
    EXPECT_NEAR(measured / predicted, 1.0, 0.10) << "batch " << batch << ": measured " << measured << " predicted " << predicted;
  }
}

// A device whose memory ends where the state ends: the first activation an
// op allocates fails, and the error names the op, the bytes it asked for,
// what the device held and the plan's prediction for the rank.
class CappedAllocator : public Allocator {
 public:
  explicit CappedAllocator(int64_t cap) : cap_(cap) {}
  std::string name() const override { return "capped"; }

 protected:
  void* RawAllocate(size_t bytes) override {
    if (live_bytes() + static_cast<int64_t>(bytes) > cap_) return nullptr;
    return GetCpuAllocator()->Allocate(bytes);
  }
  void RawFree(void* ptr, size_t bytes) override { GetCpuAllocator()->Free(ptr, bytes); }

 private:
  const int64_t cap_;
};

TEST(ExecutorTest, OutOfMemoryNamesTheOpTheBytesAndThePlan) {
  RankPlan plan = CompileMlp(64);
  const int64_t state = plan.memory().param_bytes() + plan.memory().state_bytes();
  CappedAllocator allocator(state + 1024);
  CpuDevice device(&allocator);
  auto e = Executor::Create(plan, {.device = &device});
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->InitializeState().ok());
  auto r = (*e)->TrainStep(Batch(**e, 64, 1), 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(r.status().message());
  // The first op of the step is fc1's matmul: [64, 256] floats.
  EXPECT_NE(message.find("op #0 'matmul'"), std::string::npos) << message;
  EXPECT_NE(message.find("out of memory allocating F32[64, 256] (65536 bytes) on cpu:0"), std::string::npos) << message;
  EXPECT_NE(message.find(absl::StrCat("the plan predicted a peak of ", plan.memory().peak_bytes(), " bytes for rank 0")),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(absl::StrCat("cpu:0 held ", allocator.live_bytes())), std::string::npos) << message;
}

// Vars a checkpoint will give are left unset by InitializeState (no draws,
// no bytes); the load sets them, and the result trains as a load over a
// fully initialized state does, bit for bit.
TEST(ExecutorTest, InitializeLeavesWhatALoadGivesUnset) {
  RankPlan plan = CompileMlp(16);
  auto full = Executor::Create(plan, {});
  auto partial = Executor::Create(plan, {});
  ASSERT_TRUE(full.ok() && partial.ok());
  ASSERT_TRUE((*full)->InitializeState().ok());
  std::map<std::string, Tensor> saved = (*full)->PersistentState();
  ASSERT_TRUE(saved.count("fc1.w"));
  std::set<std::string> names;
  for (const auto& [name, t] : saved) names.insert(name);
  ASSERT_TRUE((*partial)->InitializeState(names).ok());
  for (const auto& [name, t] : (*partial)->PersistentState()) EXPECT_FALSE(t.defined()) << name;
  // A var the checkpoint does not hold is initialized as before.
  names.erase("fc1.w");
  ASSERT_TRUE((*partial)->InitializeState(names).ok());
  const Tensor& w = (*partial)->PersistentState().at("fc1.w");
  ASSERT_TRUE(w.defined());
  EXPECT_EQ(std::memcmp(w.raw_data(), saved.at("fc1.w").raw_data(), w.bytes()), 0);
  ASSERT_TRUE((*partial)->LoadPersistentState(saved).ok());
  auto feeds = Batch(**full, 16, 3);
  auto a = (*full)->TrainStep(feeds, 0);
  auto b = (*partial)->TrainStep(feeds, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->loss, b->loss);

  // Weights alone (an evaluation): missing optimizer state keeps its initial
  // value; a training load refuses it, and weights are never optional.
  std::map<std::string, Tensor> weights;
  for (const auto& [name, t] : saved) {
    if (name.find('@') == std::string::npos) weights[name] = t;
  }
  ASSERT_LT(weights.size(), saved.size());
  ASSERT_TRUE((*partial)->InitializeState().ok());
  EXPECT_TRUE((*partial)->LoadPersistentState(weights, /*weights_only=*/true).ok());
  EXPECT_FALSE((*partial)->LoadPersistentState(weights).ok());
  weights.erase("fc1.w");
  EXPECT_FALSE((*partial)->LoadPersistentState(weights, /*weights_only=*/true).ok());
}

// A load given its tensors (a checkpoint just read) takes the ones nothing
// else shares as they are, no second copy; a tensor another handle shares
// (the caller's, or two names on one buffer) is copied, so training never
// writes into someone else's bytes. A load given const tensors copies all.
TEST(ExecutorTest, ALoadAdoptsTheTensorsNoOneElseHolds) {
  RankPlan plan = CompileMlp(16);
  auto source = Executor::Create(plan, {});
  auto e = Executor::Create(plan, {});
  ASSERT_TRUE(source.ok() && e.ok());
  ASSERT_TRUE((*source)->InitializeState().ok());
  std::map<std::string, Tensor> fresh;
  for (const auto& [name, t] : (*source)->PersistentState()) fresh[name] = t.Clone();
  const void* w = fresh.at("fc1.w").raw_data();
  Tensor kept = fresh.at("fc1.b");  // the caller holds this one too
  const void* b = kept.raw_data();
  ASSERT_TRUE((*e)->InitializeState().ok());
  ASSERT_TRUE((*e)->LoadPersistentState(std::move(fresh)).ok());
  std::map<std::string, Tensor> state = (*e)->PersistentState();
  EXPECT_EQ(state.at("fc1.w").raw_data(), w);
  EXPECT_NE(state.at("fc1.b").raw_data(), b);
  EXPECT_EQ(std::memcmp(state.at("fc1.b").raw_data(), b, kept.bytes()), 0);
  const std::map<std::string, Tensor> held = (*source)->PersistentState();
  ASSERT_TRUE((*e)->LoadPersistentState(held).ok());
  EXPECT_NE((*e)->PersistentState().at("fc1.w").raw_data(), held.at("fc1.w").raw_data());
}

TEST(ExecutorTest, FreesActivationsAfterTheStep) {
  RankPlan plan = CompileMlp(32);
  auto e = Executor::Create(plan, {});
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE((*e)->InitializeState().ok());
  auto feeds = Batch(**e, 32, 1);
  const int64_t before = GetCpuAllocator()->live_bytes();
  ASSERT_TRUE((*e)->TrainStep(feeds, 0).ok());
  EXPECT_EQ(GetCpuAllocator()->live_bytes(), before);
}

// An evaluation over a run of micro-batches of different sizes gives each
// the loss and fetches of its own one-batch evaluation, bit for bit; a
// micro-batch of the wrong size fails the run naming it, and leaves nothing
// behind (the next evaluation gives the same numbers, no memory held).
TEST(ExecutorTest, AnEvaluationOverMicroBatchesGivesEachItsOwnNumbers) {
  RankPlan plan = CompileMlp(64, "F64");
  auto e = Executor::Create(plan, {});
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE((*e)->InitializeState().ok());
  const std::vector<int64_t> rows = {5, 7, 3};
  std::vector<std::map<std::string, Tensor>> feeds;
  std::vector<Executor::EvalMicroBatch> micro_batches;
  for (size_t m = 0; m < rows.size(); ++m) {
    feeds.push_back(Batch(**e, rows[m], 10 + m));
    micro_batches.push_back({static_cast<int64_t>(100 * m), rows[m]});
  }
  auto load = [&](int m) -> absl::StatusOr<std::map<std::string, Tensor>> { return feeds[m]; };
  const int64_t before = GetCpuAllocator()->live_bytes();
  auto all = (*e)->Evaluate(micro_batches, load);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(GetCpuAllocator()->live_bytes(), before);
  ASSERT_EQ(all->size(), rows.size());
  for (size_t m = 0; m < rows.size(); ++m) {
    auto one = (*e)->Evaluate(feeds[m], micro_batches[m].first_sample);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_TRUE((*all)[m].has_loss);
    EXPECT_EQ((*all)[m].loss, one->loss) << "micro-batch " << m;
    EXPECT_EQ((*all)[m].fetches, one->fetches) << "micro-batch " << m;
  }
  micro_batches[1].rows = 6;
  auto wrong = (*e)->Evaluate(micro_batches, load);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong.status().message(), "evaluation micro-batch 1 has 7 rows, expected 6");
  EXPECT_EQ(GetCpuAllocator()->live_bytes(), before);
  micro_batches[1].rows = 7;
  auto again = (*e)->Evaluate(micro_batches, load);
  ASSERT_TRUE(again.ok()) << again.status();
  for (size_t m = 0; m < rows.size(); ++m) EXPECT_EQ((*again)[m].loss, (*all)[m].loss);
}

// An evaluation frees by the plan's eval_frees_after_op (each activation
// after its last forward use): its peak is the plan's evaluation
// prediction, under what the step's frees hold; a plan without the list
// evaluates with the step's frees, to the same numbers.
TEST(ExecutorTest, AnEvaluationFreesByItsOwnList) {
  RankPlan plan = CompileMlp(64, "F64");
  ASSERT_EQ(plan.memory().eval_frees_after_op_size(), plan.program().op_size());
  RankPlan without = plan;
  without.mutable_memory()->clear_eval_frees_after_op();
  std::vector<std::pair<double, int64_t>> runs;  // loss, peak over the state
  for (const RankPlan* p : {&plan, &without}) {
    auto e = Executor::Create(*p, {});
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE((*e)->InitializeState().ok());
    auto feeds = Batch(**e, 64, 5);
    const int64_t before = GetCpuAllocator()->live_bytes();
    GetCpuAllocator()->ResetPeak();
    auto r = (*e)->Evaluate(feeds, 0);
    ASSERT_TRUE(r.ok()) << r.status();
    runs.push_back({r->loss, GetCpuAllocator()->peak_bytes() - before});
  }
  EXPECT_EQ(runs[0].first, runs[1].first);
  EXPECT_LT(runs[0].second, runs[1].second);
  // The feeds were made before the peak was reset: the prediction's
  // activations less them.
  const MemoryPlan& m = plan.memory();
  const int64_t persistent = m.param_bytes() + m.param_copy_bytes() + m.state_bytes();
  EXPECT_LE(runs[0].second, m.eval_peak_bytes() - persistent);
}

TEST(ExecutorTest, TrainingLowersTheLossAndEvaluationChangesNothing) {
  RankPlan plan = CompileMlp(64, "F64");
  auto e = Executor::Create(plan, {});
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE((*e)->InitializeState().ok());
  auto feeds = Batch(**e, 64, 3);
  auto first = (*e)->Evaluate(feeds, 0);
  ASSERT_TRUE(first.ok());
  auto again = (*e)->Evaluate(feeds, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(first->loss, again->loss);
  EXPECT_EQ((*e)->step(), 0);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE((*e)->TrainStep(feeds, 0).ok());
  auto after = (*e)->Evaluate(feeds, 0);
  ASSERT_TRUE(after.ok());
  EXPECT_LT(after->loss, 0.5 * first->loss);
  EXPECT_EQ((*e)->step(), 30);
  EXPECT_TRUE(after->fetches.count("acc"));
}

// Mixed precision's 16-bit weight copies (PARAM_COPY, cast in the optimizer
// action) follow the weights they cast: through training, and through a load
// of other weights, which the executor casts before it next runs.
TEST(ExecutorTest, ParamCopiesFollowTheWeightsTheyCast) {
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  bf16.mutable_gradient_merge()->set_k_steps(2);  // a weight cast twice an update without the copies
  RankPlan plan = CompileMlp(32, "F32", bf16);
  int copies = 0;
  for (const Var& v : plan.program().var()) copies += v.kind() == PARAM_COPY;
  ASSERT_GT(copies, 0);
  auto e = Executor::Create(plan, {});
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE((*e)->InitializeState().ok());
  std::map<std::string, Tensor> initial = (*e)->PersistentState();
  for (auto& [name, t] : initial) t = t.Clone();  // the executor updates its own in place
  auto feeds = Batch(**e, 32, 3);
  auto first = (*e)->Evaluate(feeds, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE((*e)->TrainStep(feeds, 0).ok());
  EXPECT_EQ((*e)->moved_state(), "");  // the copies rewritten in their buffers
  auto trained = (*e)->Evaluate(feeds, 0);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_LT(trained->loss, first->loss);
  ASSERT_TRUE((*e)->LoadPersistentState(initial).ok());
  auto reloaded = (*e)->Evaluate(feeds, 0);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(reloaded->loss, first->loss);
}

// A plan whose PARAM_COPY nothing refreshes (a hand-edited plan without the
// REFRESH casts of the copies the updates write) is refused before it runs,
// naming the op that reads it; a REFRESH op that writes anything but a
// PARAM_COPY too.
TEST(ExecutorTest, RefusesAParamCopyNoCastWrites) {
  Strategy bf16;
  bf16.mutable_mixed_precision()->set_dtype(BF16);
  bf16.mutable_gradient_merge()->set_k_steps(2);
  RankPlan plan = CompileMlp(32, "F32", bf16);
  Program* program = plan.mutable_program();
  int removed = 0;
  for (int i = program->op_size() - 1; i >= 0; --i) {
    if (program->op(i).type() == "cast" && program->op(i).role() == REFRESH) {
      program->mutable_op()->DeleteSubrange(i, 1);
      ++removed;
    }
  }
  ASSERT_GT(removed, 0);
  plan.mutable_memory()->clear_frees_after_op();
  plan.mutable_memory()->clear_eval_frees_after_op();
  auto e = Executor::Create(plan, {});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("reads PARAM_COPY"), std::string::npos) << e.status();
  EXPECT_NE(e.status().message().find("which no op refreshes"), std::string::npos) << e.status();

  RankPlan refreshing = CompileMlp(32, "F32", bf16);
  for (Op& op : *refreshing.mutable_program()->mutable_op()) {
    if (op.type() == "increment") op.set_role(REFRESH);  // the step counter: STATE
  }
  e = Executor::Create(refreshing, {});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("has role REFRESH but writes"), std::string::npos) << e.status();

  // One micro-batch an update: the updates write the copies. An update that
  // no longer does (its copy output and attr gone) would leave its copy
  // stale after the first step; one whose copy output names a var of
  // another type would write a buffer of its own.
  Strategy one;
  one.mutable_mixed_precision()->set_dtype(BF16);
  const RankPlan writing = CompileMlp(32, "F32", one);
  int updates = 0;
  for (const Op& op : writing.program().op())
    updates += op.attr().count("copy_dtype") > 0 && !op.attr().at("copy_dtype").s().empty();
  ASSERT_GT(updates, 1);
  RankPlan stale = writing;
  for (Op& op : *stale.mutable_program()->mutable_op()) {
    auto copy = op.attr().find("copy_dtype");
    if (copy == op.attr().end() || copy->second.s().empty()) continue;
    op.mutable_attr()->erase("copy_dtype");
    op.mutable_output()->RemoveLast();
    break;
  }
  e = Executor::Create(stale, {});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("which the step updates, but no op of the step writes the copy"),
            std::string::npos)
      << e.status();
  RankPlan crossed = writing;
  std::vector<Op*> writers;
  for (Op& op : *crossed.mutable_program()->mutable_op()) {
    auto copy = op.attr().find("copy_dtype");
    if (copy != op.attr().end() && !copy->second.s().empty()) writers.push_back(&op);
  }
  writers[0]->set_output(writers[0]->output_size() - 1, writers[1]->output(writers[1]->output_size() - 1));
  e = Executor::Create(crossed, {});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("as the BF16 copy of"), std::string::npos) << e.status();
}

TEST(ExecutorTest, RejectsFeedsOfTheWrongShape) {
  RankPlan plan = CompileMlp(8);
  auto e = Executor::Create(plan, {});
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE((*e)->InitializeState().ok());
  auto feeds = Batch(**e, 8, 1);
  feeds["image"] = Tensor::Zeros(F32, {8, 783});
  auto r = (*e)->TrainStep(feeds, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("feed 'image'"), std::string::npos) << r.status();
}

TEST(ExecutorTest, InitialWeightsDependOnlyOnSeedAndName) {
  RankPlan a = CompileMlp(8);
  // The same parameters declared in another order start from the same values.
  RankPlan b = a;
  auto* vars = b.mutable_program()->mutable_var();
  std::reverse(vars->begin(), vars->end());
  auto ea = Executor::Create(a, {.seed = 5});
  auto eb = Executor::Create(b, {.seed = 5});
  ASSERT_TRUE(ea.ok() && eb.ok());
  ASSERT_TRUE((*ea)->InitializeState().ok());
  ASSERT_TRUE((*eb)->InitializeState().ok());
  auto sa = (*ea)->PersistentState(), sb = (*eb)->PersistentState();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [name, t] : sa) {
    const Tensor& u = sb.at(name);
    ASSERT_EQ(t.bytes(), u.bytes());
    EXPECT_EQ(std::memcmp(t.raw_data(), u.raw_data(), t.bytes()), 0) << name;
  }
}

// The rate a step reports is the rate its update used: w's one weight moves
// by lr * mean(x) under SGD, so each update's lr is read off the weight.
// Warm-up, then a cosine over the run's updates, under gradient merge (the
// rate follows updates, not steps), and again after a resume mid-run.
TEST(ExecutorTest, AStepReportsTheLearningRateItsUpdateUsed) {
  auto program = ParseProgramText(R"(
    var { name: "x" dtype: F64 shape: [-1, 1] kind: FEED }
    var { name: "w" dtype: F64 shape: [1, 1] kind: PARAM init { constant { value: 1 } } }
    op { type: "matmul" input: ["x", "w"] output: ["y"] }
    op { type: "reduce_mean" input: ["y"] output: ["loss"] }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } lr_schedule { warmup_steps: 2 cosine { alpha: 0.1 } } }
  )", "lr.pbtxt");
  ASSERT_TRUE(program.ok()) << program.status();
  Strategy strategy;
  strategy.mutable_gradient_merge()->set_k_steps(2);
  strategy.mutable_gradient_merge()->set_average(true);
  CompileOptions options;
  options.batch_size = 2;
  auto compiled = Compile(*program, strategy, options);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  constexpr int kSteps = 12;  // 6 updates: 2 of warm-up, a cosine over the run's 6
  auto make = [&]() {
    auto e = Executor::Create(compiled->plans[0], {});
    EXPECT_TRUE(e.ok()) << e.status();
    (*e)->set_total_steps(kSteps);
    return std::move(*e);
  };
  auto x_of = [](int step) { return 0.5 + 0.25 * step; };  // both rows of a step's batch
  auto weight = [](const Executor& e) { return e.PersistentState().at("w").data<double>()[0]; };
  auto run = [&](Executor& e, int from, int to, std::vector<double>* reported, std::vector<double>* used) {
    for (int step = from; step < to; ++step) {
      std::map<std::string, Tensor> feeds;
      feeds["x"] = Tensor::Empty(F64, {2, 1});
      feeds["x"].data<double>()[0] = feeds["x"].data<double>()[1] = x_of(step);
      const double before = weight(e);
      auto r = e.TrainStep(feeds, step * 2);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->has_lr, step % 2 == 1) << "step " << step + 1;
      if (!r->has_lr) continue;
      reported->push_back(r->lr);
      const double grad = (x_of(step - 1) + x_of(step)) / 2;  // the merged steps' mean
      used->push_back((before - weight(e)) / grad);
    }
  };
  auto whole = make();
  ASSERT_TRUE(whole->InitializeState().ok());
  std::vector<double> reported, used;
  run(*whole, 0, kSteps, &reported, &used);
  ASSERT_EQ(reported.size(), 6u);
  for (size_t i = 0; i < reported.size(); ++i) {
    EXPECT_NEAR(reported[i], used[i], 1e-12) << "update " << i + 1;
  }
  EXPECT_DOUBLE_EQ(reported[0], 0.05);  // warm-up: lr * 1/2, then lr
  EXPECT_DOUBLE_EQ(reported[1], 0.1);
  EXPECT_DOUBLE_EQ(reported[2], 0.1);   // the cosine's start
  EXPECT_LT(reported[5], reported[4]);  // and its decay
  EXPECT_GT(reported[5], 0.01);

  // Resumed after 6 steps (3 updates) from the first run's state.
  auto first = make();
  ASSERT_TRUE(first->InitializeState().ok());
  std::vector<double> first_reported, first_used;
  run(*first, 0, 6, &first_reported, &first_used);
  auto resumed = make();
  ASSERT_TRUE(resumed->InitializeState().ok());
  ASSERT_TRUE(resumed->LoadPersistentState(first->PersistentState()).ok());
  resumed->set_step(6);
  std::vector<double> resumed_reported, resumed_used;
  run(*resumed, 6, kSteps, &resumed_reported, &resumed_used);
  ASSERT_EQ(resumed_reported.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed_reported[i], reported[3 + i]) << "update " << 4 + i;
    EXPECT_NEAR(resumed_used[i], used[3 + i], 1e-12) << "update " << 4 + i;
  }

  // Resumed without gradient merge (an update every step): the schedule
  // goes on from the checkpoint's 3 updates, not from 6 steps' worth.
  auto unmerged = Compile(*program, Strategy(), options);
  ASSERT_TRUE(unmerged.ok()) << unmerged.status();
  auto single = Executor::Create(unmerged->plans[0], {});
  ASSERT_TRUE(single.ok()) << single.status();
  (*single)->set_total_steps(kSteps);
  ASSERT_TRUE((*single)->InitializeState().ok());
  ASSERT_TRUE((*single)->LoadPersistentState(first->PersistentState()).ok());
  (*single)->set_step(6);
  for (int step = 6; step < 9; ++step) {
    std::map<std::string, Tensor> feeds;
    feeds["x"] = Tensor::Empty(F64, {2, 1});
    feeds["x"].data<double>()[0] = feeds["x"].data<double>()[1] = x_of(step);
    const double before = weight(**single);
    auto r = (*single)->TrainStep(feeds, step * 2);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_lr);
    EXPECT_NEAR(r->lr, (before - weight(**single)) / x_of(step), 1e-12) << "step " << step + 1;
  }
}

}  // namespace
}  // namespace strata
