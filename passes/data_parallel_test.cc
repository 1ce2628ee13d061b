#include "passes/data_parallel.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/pass.h"
#include "gtest/gtest.h"
#include "passes/compile.h"
#include "passes/testing/pass_test_util.h"
#include "proto/mesh.h"
#include "proto/types.h"

namespace strata {
namespace {

// One device: a.w, a.b (F32) near the input, then a cast to F64 and the
// head z.w, z.b (F64). Backward finishes the head first; the names sort the
// other way, so an order taken from the param_grad map (by name, or by hash)
// would be caught.
constexpr char kMixedDtypes[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "a.w" dtype: F32 shape: [4, 8] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "a.b" dtype: F32 shape: [8] kind: PARAM }
  var { name: "z.w" dtype: F64 shape: [8, 3] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "z.b" dtype: F64 shape: [3] kind: PARAM }
  op { type: "matmul" input: ["x", "a.w"] output: ["xw"] }
  op { type: "add" input: ["xw", "a.b"] output: ["h"] }
  op { type: "cast" input: ["h"] output: ["h64"] attr { key: "dtype" value { s: "F64" } } }
  op { type: "matmul" input: ["h64", "z.w"] output: ["hz"] }
  op { type: "add" input: ["hz", "z.b"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// A layer norm whose gamma and beta gradients are both finished by one
// layer_norm_grad (outputs dx, dgamma, dbeta); beta's name sorts first.
constexpr char kLayerNorm[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "ln.gamma" dtype: F64 shape: [4] kind: PARAM init { constant { value: 1 } } }
  var { name: "ln.beta" dtype: F64 shape: [4] kind: PARAM }
  var { name: "head" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w"] output: ["h"] }
  op { type: "layer_norm" input: ["h", "ln.gamma", "ln.beta"] output: ["n"] }
  op { type: "matmul" input: ["n", "head"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// A bucket cap of `bytes` (exact for the small counts used here).
double BucketMbOf(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

Strategy DataParallel(int degree, double bucket_mb = 0, int micro_batches = 0) {
  Strategy strategy;
  if (micro_batches > 0) strategy = PipelineStrategy(micro_batches);
  strategy.mutable_data_parallel()->set_degree(degree);
  strategy.mutable_data_parallel()->set_bucket_mb(bucket_mb);
  return strategy;
}

CompileResult CompileOrFail(const std::string& text, const Strategy& strategy, const std::string& dump_after = "") {
  CompileOptions options;
  if (!strategy.has_pipeline()) options.batch_size = 8;
  options.dump_after = dump_after;
  auto result = Compile(ParseProgramOrFail(text), strategy, options);
  if (!result.ok()) {
    ADD_FAILURE() << result.status();
    return CompileResult();
  }
  return *std::move(result);
}

std::vector<RankPlan> Plans(const std::string& text, const Strategy& strategy) {
  return CompileOrFail(text, strategy).plans;
}

// The value the seed of dL/dloss is filled with, or -1 when the program has
// no loss gradient (not the loss's stage).
double SeedValue(const Program& p) {
  if (p.loss_grad().empty()) return -1;
  std::vector<const Op*> seed = OpsWriting(p, p.loss_grad());
  if (seed.size() != 1 || !seed[0]->attr().contains("value")) {
    ADD_FAILURE() << "no single seed op writes " << p.loss_grad();
    return 0;
  }
  return seed[0]->attr().at("value").f();
}

// A posted bucket as the program holds it.
struct Posted {
  int index;                       // of its bucket_allreduce
  const Op* op;
  std::vector<std::string> grads;  // the op's inputs after the bucket
};

std::vector<Posted> PostedBuckets(const Program& p) {
  std::vector<Posted> posted;
  for (const Op* op : OpsOfType(p, "bucket_allreduce")) {
    Posted b{IndexOf(p, op), op, {}};
    for (int i = 1; i < op->input_size(); ++i) b.grads.push_back(op->input(i));
    posted.push_back(std::move(b));
  }
  return posted;
}

int64_t SizeBytes(const Var& v) {
  int64_t n = DataTypeSize(v.dtype());
  for (int64_t d : v.shape()) n *= d;
  return n;
}

bool Reads(const Op& op, const std::string& var) {
  for (const std::string& in : op.input()) {
    if (in == var) return true;
  }
  return false;
}

bool Writes(const Op& op, const std::string& var) {
  for (const std::string& out : op.output()) {
    if (out == var) return true;
  }
  return false;
}

bool IsUpdate(const Op& op) { return op.role() == OPTIMIZE || op.role() == LR_SCHEDULE; }

// The grads (names) of the buckets, bucket by bucket.
std::vector<std::vector<std::string>> BucketGrads(const Program& p) {
  std::vector<std::vector<std::string>> out;
  for (const Posted& b : PostedBuckets(p)) out.push_back(b.grads);
  return out;
}

// The id of the rank's group along the dp axis in its plan's topology.
int DpGroupId(const RankPlan& plan) {
  for (const CommGroup& g : plan.topology().group()) {
    if (g.axis_size() == 1 && g.axis(0) == "dp") return g.id();
  }
  ADD_FAILURE() << "rank " << plan.rank() << " has no dp group";
  return -1;
}

TEST(DataParallelPassTest, SeedIsScaledByOneOverTheDegree) {
  for (int degree : {1, 2, 4}) {
    std::vector<RankPlan> plans = Plans(kMixedDtypes, DataParallel(degree));
    ASSERT_EQ(plans.size(), static_cast<size_t>(degree));
    for (const RankPlan& plan : plans) {
      EXPECT_DOUBLE_EQ(SeedValue(plan.program()), 1.0 / degree) << "degree " << degree << ", rank " << plan.rank();
    }
  }
}

TEST(DataParallelPassTest, SeedIsScaledOnlyOnTheLossStage) {
  // micro-batch has already divided the seed by the 2 micro-batches.
  std::vector<RankPlan> single = CompilePipeline(TwoStagesProgram(), 2);
  ASSERT_EQ(single.size(), 2u);
  EXPECT_DOUBLE_EQ(SeedValue(single[1].program()), 0.5);
  std::vector<RankPlan> plans = Plans(TwoStagesProgram(), DataParallel(2, 0, 2));
  ASSERT_EQ(plans.size(), 4u);
  for (const RankPlan& plan : plans) {
    if (plan.topology().stage() == 1) {
      EXPECT_DOUBLE_EQ(SeedValue(plan.program()), 0.25) << "rank " << plan.rank();
    } else {
      EXPECT_TRUE(plan.program().loss_grad().empty()) << "rank " << plan.rank();
      EXPECT_EQ(SeedValue(plan.program()), -1) << "rank " << plan.rank();
    }
  }
}

TEST(DataParallelPassTest, ASumOverSamplesKeepsItsSeedSoThePartsAddUp) {
  // The loss sums over the batch: replicas and micro-batches add their
  // gradients up as they are, with no 1/parts (analysis/sample_forms.h).
  constexpr char kSumLoss[] = R"pb(
    var { name: "x" dtype: F64 shape: [-1, 4] kind: FEED }
    var { name: "w1" dtype: F64 shape: [4, 4] kind: PARAM init { xavier_uniform {} } }
    var { name: "w2" dtype: F64 shape: [4, 3] kind: PARAM init { xavier_uniform {} } }
    op { type: "matmul" input: ["x", "w1"] output: ["h"] device: "gpu:0" }
    op { type: "matmul" input: ["h", "w2"] output: ["y"] device: "gpu:1" }
    op { type: "square" input: ["y"] output: ["sq"] device: "gpu:1" }
    op { type: "reduce_sum" input: ["sq"] output: ["loss"] device: "gpu:1" }
    loss: "loss"
    optimizer { sgd { learning_rate: 0.1 } }
  )pb";
  std::vector<RankPlan> plans = Plans(kSumLoss, DataParallel(2, 0, 2));
  ASSERT_EQ(plans.size(), 4u);
  for (const RankPlan& plan : plans) {
    EXPECT_TRUE(plan.summed_loss()) << "rank " << plan.rank();
    if (plan.topology().stage() == 1) EXPECT_DOUBLE_EQ(SeedValue(plan.program()), 1.0) << "rank " << plan.rank();
  }
  for (const RankPlan& plan : Plans(TwoStagesProgram(), DataParallel(2, 0, 2))) EXPECT_FALSE(plan.summed_loss());
}

TEST(DataParallelPassTest, BucketCapBytesDefaultsTo25MiB) {
  EXPECT_EQ(BucketCapBytes(0), int64_t{25} << 20);
  EXPECT_EQ(BucketCapBytes(1), int64_t{1} << 20);
  EXPECT_EQ(BucketCapBytes(0.5), int64_t{1} << 19);
  EXPECT_EQ(BucketCapBytes(BucketMbOf(200)), 200);
}

TEST(DataParallelPassTest, BucketsNeverMixDtypes) {
  // A cap far above the model: still one bucket per dtype, the F64 head's
  // (finished first) before the F32 input layer's.
  std::vector<RankPlan> plans = Plans(kMixedDtypes, DataParallel(2, 1));
  ASSERT_EQ(plans.size(), 2u);
  const Program& p = plans[0].program();
  EXPECT_EQ(BucketGrads(p), (std::vector<std::vector<std::string>>{{"z.b@grad", "z.w@grad"},
                                                                     {"a.b@grad", "a.w@grad"}}));
  const Var* b0 = FindVar(p, "@dp_bucket.0");
  const Var* b1 = FindVar(p, "@dp_bucket.1");
  ASSERT_NE(b0, nullptr);
  ASSERT_NE(b1, nullptr);
  EXPECT_EQ(b0->dtype(), F64);
  EXPECT_EQ(b0->shape(0), 3 + 8 * 3);
  EXPECT_EQ(b0->kind(), SCRATCH);
  EXPECT_EQ(b1->dtype(), F32);
  EXPECT_EQ(b1->shape(0), 8 + 4 * 8);
  EXPECT_EQ(b1->kind(), SCRATCH);
  // Every rank forms the same buckets.
  EXPECT_EQ(BucketGrads(plans[1].program()), BucketGrads(p));
}

// Gradients of two dtypes finishing in turn (F64, F32, F64, F32 in
// backward's order): one open bucket per dtype, as DDP forms them, not a
// bucket cut at every change of dtype.
constexpr char kInterleavedDtypes[] = R"pb(
  var { name: "x" dtype: F32 shape: [-1, 4] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "w1" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w2" dtype: F64 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w3" dtype: F32 shape: [4, 4] kind: PARAM init { normal { std: 0.5 } } }
  var { name: "w4" dtype: F64 shape: [4, 3] kind: PARAM init { normal { std: 0.5 } } }
  op { type: "matmul" input: ["x", "w1"] output: ["h1"] }
  op { type: "cast" input: ["h1"] output: ["h1d"] attr { key: "dtype" value { s: "F64" } } }
  op { type: "matmul" input: ["h1d", "w2"] output: ["h2"] }
  op { type: "cast" input: ["h2"] output: ["h2f"] attr { key: "dtype" value { s: "F32" } } }
  op { type: "matmul" input: ["h2f", "w3"] output: ["h3"] }
  op { type: "cast" input: ["h3"] output: ["h3d"] attr { key: "dtype" value { s: "F64" } } }
  op { type: "matmul" input: ["h3d", "w4"] output: ["z"] }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

TEST(DataParallelPassTest, OneOpenBucketPerDtype) {
  const Program p = Plans(kInterleavedDtypes, DataParallel(2, 1)).at(0).program();
  EXPECT_EQ(BucketGrads(p), (std::vector<std::vector<std::string>>{{"w4@grad", "w2@grad"}, {"w3@grad", "w1@grad"}}));
  // A cap of one gradient: each dtype's buckets still hold only that dtype.
  const Program q = Plans(kInterleavedDtypes, DataParallel(2, BucketMbOf(64))).at(0).program();
  EXPECT_EQ(BucketGrads(q), (std::vector<std::vector<std::string>>{{"w4@grad"}, {"w3@grad"}, {"w2@grad"}, {"w1@grad"}}));
}

TEST(DataParallelPassTest, BucketsCloseBeforePassingTheCap) {
  // Sizes: z.b 24 B, z.w 192 B (F64); a.b 32 B, a.w 128 B (F32).
  struct Case {
    int64_t cap;
    std::vector<std::vector<std::string>> buckets;
  };
  const std::vector<Case> cases = {
      // 24 + 192 > 200: z.w starts a bucket; a.b + a.w = 160 fit one.
      {200, {{"z.b@grad"}, {"z.w@grad"}, {"a.b@grad", "a.w@grad"}}},
      // Exactly at the cap still fits.
      {216, {{"z.b@grad", "z.w@grad"}, {"a.b@grad", "a.w@grad"}}},
      // A gradient larger than the cap gets a bucket of its own.
      {100, {{"z.b@grad"}, {"z.w@grad"}, {"a.b@grad"}, {"a.w@grad"}}},
      {1, {{"z.b@grad"}, {"z.w@grad"}, {"a.b@grad"}, {"a.w@grad"}}},
  };
  for (const Case& c : cases) {
    std::vector<RankPlan> plans = Plans(kMixedDtypes, DataParallel(2, BucketMbOf(c.cap)));
    ASSERT_EQ(plans.size(), 2u);
    const Program& p = plans[0].program();
    EXPECT_EQ(BucketGrads(p), c.buckets) << "cap " << c.cap;
    for (const Posted& b : PostedBuckets(p)) {
      const Var* bucket = FindVar(p, b.op->input(0));
      ASSERT_NE(bucket, nullptr);
      int64_t bytes = 0;
      for (const std::string& g : b.grads) bytes += SizeBytes(*FindVar(p, g));
      EXPECT_EQ(SizeBytes(*bucket), bytes) << b.op->input(0);
      if (b.grads.size() > 1) {
        EXPECT_LE(bytes, c.cap) << b.op->input(0);
      }
    }
  }
}

TEST(DataParallelPassTest, OneOpsGradientsKeepItsOutputOrder) {
  // layer_norm_grad writes dgamma before dbeta: one bucket lists them so,
  // and with a bucket per gradient gamma's is posted first.
  std::vector<RankPlan> plans = Plans(kLayerNorm, DataParallel(2, 1));
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(BucketGrads(plans[0].program()),
            (std::vector<std::vector<std::string>>{{"head@grad", "ln.gamma@grad", "ln.beta@grad", "w@grad"}}));

  plans = Plans(kLayerNorm, DataParallel(2, BucketMbOf(1)));
  ASSERT_EQ(plans.size(), 2u);
  const Program& p = plans[0].program();
  EXPECT_EQ(BucketGrads(p),
            (std::vector<std::vector<std::string>>{{"head@grad"}, {"ln.gamma@grad"}, {"ln.beta@grad"}, {"w@grad"}}));
  // Both posted right after the layer_norm_grad, gamma's bucket first.
  std::vector<const Op*> ln = OpsOfType(p, "layer_norm_grad");
  ASSERT_EQ(ln.size(), 1u);
  const int at = IndexOf(p, ln[0]);
  ASSERT_LT(at + 2, p.op_size());
  EXPECT_EQ(p.op(at + 1).type(), "bucket_allreduce");
  EXPECT_EQ(p.op(at + 1).attr().at("bucket").i(), 1);
  EXPECT_EQ(p.op(at + 1).input(1), "ln.gamma@grad");
  EXPECT_EQ(p.op(at + 2).type(), "bucket_allreduce");
  EXPECT_EQ(p.op(at + 2).attr().at("bucket").i(), 2);
  EXPECT_EQ(p.op(at + 2).input(1), "ln.beta@grad");
}

// Checks every bucket of every plan: its post comes right after the op that
// finishes its last gradient (other posts anchored there aside), after every
// gradient is finished, over the rank's dp group; its wait right before the
// first update op that reads one of its sums, with one output per gradient.
void ExpectPostsAndWaitsInPlace(const std::vector<RankPlan>& plans) {
  for (const RankPlan& plan : plans) {
    const Program& p = plan.program();
    const int dp_group = DpGroupId(plan);
    std::vector<Posted> posted = PostedBuckets(p);
    ASSERT_FALSE(posted.empty()) << "rank " << plan.rank();
    for (size_t k = 0; k < posted.size(); ++k) {
      const Posted& b = posted[k];
      SCOPED_TRACE(absl::StrCat("rank ", plan.rank(), ", bucket ", k));
      EXPECT_EQ(b.op->attr().at("bucket").i(), static_cast<int64_t>(k));
      EXPECT_EQ(b.op->input(0), absl::StrCat("@dp_bucket.", k));
      ASSERT_TRUE(b.op->has_group());
      EXPECT_EQ(b.op->group(), dp_group);
      EXPECT_EQ(b.op->role(), BACKWARD);
      // The last non-update writer of each gradient, and of the last one.
      int finisher = -1, last_finished = -1;
      for (const std::string& g : b.grads) {
        int writer = -1;
        for (int i = 0; i < p.op_size(); ++i) {
          if (!IsUpdate(p.op(i)) && p.op(i).type() != "bucket_allreduce" && Writes(p.op(i), g)) writer = i;
        }
        ASSERT_GE(writer, 0) << g;
        EXPECT_LT(writer, b.index) << g << " is written after its bucket is posted";
        last_finished = std::max(last_finished, writer);
        if (g == b.grads.back()) finisher = writer;
      }
      EXPECT_EQ(finisher, last_finished) << "the last gradient is not the last finished";
      for (int i = finisher + 1; i < b.index; ++i) {
        EXPECT_EQ(p.op(i).type(), "bucket_allreduce") << "op #" << i << " between the finisher and the post";
      }
      EXPECT_EQ(p.op(b.index).device(), p.op(finisher).device());

      // The wait with the same bucket id.
      const Op* wait = nullptr;
      for (const Op* w : OpsOfType(p, "bucket_wait")) {
        if (w->attr().at("bucket").i() == static_cast<int64_t>(k)) wait = w;
      }
      ASSERT_NE(wait, nullptr);
      EXPECT_FALSE(wait->has_group());
      EXPECT_EQ(wait->role(), OPTIMIZE);
      ASSERT_EQ(wait->input_size(), 1);
      EXPECT_EQ(wait->input(0), b.op->input(0));
      ASSERT_EQ(wait->output_size(), static_cast<int>(b.grads.size()));
      for (size_t i = 0; i < b.grads.size(); ++i) EXPECT_EQ(wait->output(i), b.grads[i] + "@dp");
      const int w = IndexOf(p, wait);
      EXPECT_GT(w, b.index);
      int first_reader = -1;
      for (int i = 0; i < p.op_size() && first_reader < 0; ++i) {
        if (!IsUpdate(p.op(i)) || p.op(i).type() == "bucket_wait") continue;
        for (const std::string& g : b.grads) {
          // No update reads the unsummed gradient; the first that reads a sum
          // follows the wait, with only other waits between.
          EXPECT_FALSE(Reads(p.op(i), g) && !Writes(p.op(i), g)) << "op #" << i << " reads " << g;
          if (Reads(p.op(i), g + "@dp")) first_reader = i;
        }
      }
      ASSERT_GT(first_reader, w);
      for (int i = w + 1; i < first_reader; ++i) {
        EXPECT_EQ(p.op(i).type(), "bucket_wait") << "op #" << i << " between the wait and its first reader";
      }
    }
  }
}

TEST(DataParallelPassTest, PostsFollowTheirFinisherAndWaitsPrecedeTheirFirstReader) {
  {
    SCOPED_TRACE("dp2, a bucket per gradient");
    ExpectPostsAndWaitsInPlace(Plans(kLayerNorm, DataParallel(2, BucketMbOf(1))));
  }
  {
    SCOPED_TRACE("dp2, mixed dtypes");
    ExpectPostsAndWaitsInPlace(Plans(kMixedDtypes, DataParallel(2, BucketMbOf(200))));
  }
  {
    SCOPED_TRACE("dp4, one bucket");
    ExpectPostsAndWaitsInPlace(Plans(kLayerNorm, DataParallel(4)));
  }
  {
    // The global norm's ops read every gradient first: all waits precede them.
    SCOPED_TRACE("pp2 x dp2 with clipping, 3 micro-batches");
    std::vector<RankPlan> plans = Plans(
        TwoStagesProgram(R"pb(optimizer { sgd { learning_rate: 0.1 } clip_global_norm: 1 })pb"),
        DataParallel(2, BucketMbOf(8), 3));
    ASSERT_EQ(plans.size(), 4u);
    ExpectPostsAndWaitsInPlace(plans);
    // Ranks 0 and 2 hold stage 0, 1 and 3 stage 1; a group per stage.
    EXPECT_EQ(DpGroupId(plans[0]), DpGroupId(plans[2]));
    EXPECT_EQ(DpGroupId(plans[1]), DpGroupId(plans[3]));
    EXPECT_NE(DpGroupId(plans[0]), DpGroupId(plans[1]));
    EXPECT_EQ(PostedBuckets(plans[1].program())[0].op->group(), DpGroupId(plans[1]));
  }
}

TEST(DataParallelPassTest, UpdatesReadTheSumsWhileFillZeroZeroesTheAccumulator) {
  std::vector<RankPlan> plans = Plans(TwoStagesProgram(), DataParallel(2, 0, 3));
  ASSERT_EQ(plans.size(), 4u);
  const Program& p = plans[0].program();  // stage 0: w (fused into its GEMM) and b
  EXPECT_EQ(BucketGrads(p), (std::vector<std::vector<std::string>>{{"b@grad@acc", "w@grad@acc"}}));
  for (const std::string param : {"w", "b"}) {
    const std::string acc = param + "@grad@acc";
    SCOPED_TRACE(acc);
    const Op* update = nullptr;
    for (const Op* op : OpsOfType(p, "sgd_update")) {
      if (op->input(0) == param) update = op;
    }
    ASSERT_NE(update, nullptr);
    EXPECT_EQ(update->input(1), acc + "@dp");
    // The accumulator is zeroed itself, after the update read the sum.
    std::vector<const Op*> writers = OpsWriting(p, acc);
    ASSERT_FALSE(writers.empty());
    const Op* zero = writers.back();
    EXPECT_EQ(zero->type(), "fill_zero");
    EXPECT_EQ(zero->role(), OPTIMIZE);
    EXPECT_EQ(zero->input(0), acc);
    EXPECT_EQ(zero->output(0), acc);
    EXPECT_GT(IndexOf(p, zero), IndexOf(p, update));
    EXPECT_EQ(OpsWriting(p, acc + "@dp").size(), 1u);
    EXPECT_EQ(OpsWriting(p, acc + "@dp")[0]->type(), "bucket_wait");
    EXPECT_EQ(p.param_grad().at(param), acc + "@dp");
    EXPECT_EQ(FindVar(p, acc)->kind(), SCRATCH);
  }
}

TEST(DataParallelPassTest, DegreeOneLeavesTheGraphUnchanged) {
  for (const std::string& text : {std::string(kMixedDtypes), std::string(kLayerNorm)}) {
    // The program as the pass would get it, after micro-batch.
    CompileResult before = CompileOrFail(text, Strategy(), "micro-batch");
    ASSERT_EQ(before.dumped_ranks.size(), 1u);
    Program program = before.dumped_ranks[0];
    const std::string original = program.SerializeAsString();
    CompileContext ctx;
    auto mesh = Mesh::Create({{"dp", 1}, {"pp", 1}});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    ctx.mesh = *mesh;
    ctx.strategy = DataParallel(1);
    auto changed = RunOnProgram(DataParallelPass(), program, ctx);
    ASSERT_TRUE(changed.ok()) << changed.status();
    EXPECT_FALSE(*changed);
    EXPECT_EQ(program.SerializeAsString(), original);
    // Compiled with degree 1, the pass does not run and the seed stays 1.
    CompileResult dp1 = CompileOrFail(text, DataParallel(1));
    ASSERT_EQ(dp1.plans.size(), 1u);
    EXPECT_TRUE(OpsOfType(dp1.plans[0].program(), "bucket_allreduce").empty());
    EXPECT_TRUE(OpsOfType(dp1.plans[0].program(), "bucket_wait").empty());
    EXPECT_DOUBLE_EQ(SeedValue(dp1.plans[0].program()), 1.0);
    EXPECT_EQ(dp1.plans[0].program().op_size(), program.op_size());
  }
}

TEST(DataParallelPassTest, RunOnItsOwnMatchesTheCompiledPlan) {
  // The program before the pass, run through it directly with rank 1's
  // context, gives rank 1's compiled program.
  const Strategy strategy = DataParallel(2, BucketMbOf(200));
  CompileResult before = CompileOrFail(kMixedDtypes, strategy, "micro-batch");
  ASSERT_EQ(before.dumped_ranks.size(), 2u);
  Program program = before.dumped_ranks[1];
  CompileContext ctx;
  auto mesh = Mesh::Create({{"dp", 2}, {"pp", 1}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ctx.mesh = *mesh;
  ctx.strategy = strategy;
  ctx.rank = 1;
  auto changed = RunOnProgram(DataParallelPass(), program, ctx);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  const Program& compiled = before.plans[1].program();
  ASSERT_EQ(program.op_size(), compiled.op_size());
  for (int i = 0; i < program.op_size(); ++i) {
    EXPECT_EQ(program.op(i).type(), compiled.op(i).type()) << "op #" << i;
    EXPECT_EQ(std::vector<std::string>(program.op(i).input().begin(), program.op(i).input().end()),
              std::vector<std::string>(compiled.op(i).input().begin(), compiled.op(i).input().end()))
        << "op #" << i;
  }
  EXPECT_EQ(BucketGrads(program).size(), 3u);
}

}  // namespace
}  // namespace strata
