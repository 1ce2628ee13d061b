#include "proto/shape_rules.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The error text of a rule that must fail (InvalidArgument).
template <typename T>
std::string ErrorOf(const absl::StatusOr<T>& result) {
  EXPECT_FALSE(result.ok());
  if (result.ok()) return "";
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(result.status().message());
}

// ---- axes -------------------------------------------------------------------

TEST(NormalizeAxisTest, CountsNegativeAxesFromTheEnd) {
  EXPECT_EQ(*NormalizeAxis(0, 3, "attr 'axis'"), 0);
  EXPECT_EQ(*NormalizeAxis(2, 3, "attr 'axis'"), 2);
  EXPECT_EQ(*NormalizeAxis(-1, 3, "attr 'axis'"), 2);
  EXPECT_EQ(*NormalizeAxis(-3, 3, "attr 'axis'"), 0);
}

TEST(NormalizeAxisTest, NamesTheAttrAndTheRangeWhenOutOfRange) {
  EXPECT_EQ(ErrorOf(NormalizeAxis(3, 3, "attr 'start_axis'")),
            "attr 'start_axis' = 3 is out of range for rank 3 (expected -3 to 2)");
  EXPECT_EQ(ErrorOf(NormalizeAxis(-4, 3, "attr 'axis'")),
            "attr 'axis' = -4 is out of range for rank 3 (expected -3 to 2)");
  EXPECT_THAT(ErrorOf(NormalizeAxis(0, 0, "attr 'axis'")), HasSubstr("out of range for rank 0"));
}

TEST(NormalizeInputAxisTest, NamesTheInputAndRefusesScalars) {
  EXPECT_EQ(*NormalizeInputAxis(-1, 2, "x"), 1);
  EXPECT_EQ(*NormalizeInputAxis(0, 2, "x"), 0);
  EXPECT_EQ(ErrorOf(NormalizeInputAxis(2, 2, "x")),
            "attr 'axis' is 2, out of range for input 'x' of rank 2 (expected -2..1)");
  EXPECT_EQ(ErrorOf(NormalizeInputAxis(-3, 2, "y")),
            "attr 'axis' is -3, out of range for input 'y' of rank 2 (expected -2..1)");
  EXPECT_EQ(ErrorOf(NormalizeInputAxis(0, 0, "x")), "input 'x' must have rank >= 1, got a scalar");
}

// ---- reductions -------------------------------------------------------------

TEST(ReducedAxesTest, EmptyListReducesAllDims) {
  EXPECT_THAT(*ReducedAxes({}, 3, "x"), ElementsAre(true, true, true));
  EXPECT_THAT(*ReducedAxes({}, 0, "x"), ElementsAre());
}

TEST(ReducedAxesTest, NegativeAxesCountFromTheEnd) {
  EXPECT_THAT(*ReducedAxes({-1}, 3, "x"), ElementsAre(false, false, true));
  EXPECT_THAT(*ReducedAxes({0, -2}, 3, "x"), ElementsAre(true, true, false));
  EXPECT_THAT(*ReducedAxes({2, 0}, 3, "x"), ElementsAre(true, false, true));
}

TEST(ReducedAxesTest, RefusesOutOfRangeAndRepeatedAxes) {
  EXPECT_EQ(ErrorOf(ReducedAxes({2}, 2, "x")),
            "attr 'axis' has 2, out of range for input 'x' of rank 2 (expected -2..1)");
  EXPECT_EQ(ErrorOf(ReducedAxes({-3}, 2, "x")),
            "attr 'axis' has -3, out of range for input 'x' of rank 2 (expected -2..1)");
  // 0 and -2 name the same dim of a rank-2 input.
  EXPECT_EQ(ErrorOf(ReducedAxes({0, -2}, 2, "x")), "attr 'axis' names dim 0 twice");
  EXPECT_EQ(ErrorOf(ReducedAxes({1, 1}, 2, "x")), "attr 'axis' names dim 1 twice");
  // A scalar has no axis to name.
  EXPECT_THAT(ErrorOf(ReducedAxes({0}, 0, "x")), HasSubstr("out of range for input 'x' of rank 0"));
}

TEST(ReduceShapeTest, RemovesOrKeepsReducedDims) {
  const std::vector<bool> middle = {false, true, false};
  EXPECT_THAT(ReduceShape({2, 3, 4}, middle, false), ElementsAre(2, 4));
  EXPECT_THAT(ReduceShape({2, 3, 4}, middle, true), ElementsAre(2, 1, 4));
  const std::vector<bool> all = {true, true, true};
  EXPECT_THAT(ReduceShape({2, 3, 4}, all, false), ElementsAre());
  EXPECT_THAT(ReduceShape({2, 3, 4}, all, true), ElementsAre(1, 1, 1));
}

TEST(ReduceShapeTest, BatchDimStaysUnlessReduced) {
  EXPECT_THAT(ReduceShape({-1, 4}, {false, true}, false), ElementsAre(-1));
  EXPECT_THAT(ReduceShape({-1, 4}, {true, false}, false), ElementsAre(4));
  EXPECT_THAT(ReduceShape({-1, 4}, {true, false}, true), ElementsAre(1, 4));
}

// ---- reshape ----------------------------------------------------------------

TEST(ResolveReshapeTest, ConcreteShapes) {
  EXPECT_THAT(*ResolveReshape({2, 6}, {4, -1}), ElementsAre(4, 3));
  EXPECT_THAT(*ResolveReshape({2, 6}, {3, 4}), ElementsAre(3, 4));
  EXPECT_THAT(*ResolveReshape({2, 6}, {-1}), ElementsAre(12));
  // 0 copies the input dim at its position.
  EXPECT_THAT(*ResolveReshape({2, 3, 4}, {0, -1}), ElementsAre(2, 12));
  EXPECT_THAT(*ResolveReshape({2, 3, 4}, {0, 0, 2, 2}), ElementsAre(2, 3, 2, 2));
  // Empty tensors: a -1 next to nonzero dims infers 0.
  EXPECT_THAT(*ResolveReshape({0, 4}, {-1, 2}), ElementsAre(0, 2));
  EXPECT_THAT(*ResolveReshape({}, {1, 1}), ElementsAre(1, 1));
  EXPECT_THAT(*ResolveReshape({1, 1}, {}), ElementsAre());
}

TEST(ResolveReshapeTest, BatchDimGoesToTheMinusOneOrAZero) {
  EXPECT_THAT(*ResolveReshape({-1, 784}, {-1, 28, 28}), ElementsAre(-1, 28, 28));
  EXPECT_THAT(*ResolveReshape({-1, 28, 28}, {0, 784}), ElementsAre(-1, 784));
  EXPECT_THAT(*ResolveReshape({-1, 28, 28}, {0, -1}), ElementsAre(-1, 784));
  EXPECT_THAT(*ResolveReshape({4, -1}, {-1, 2, 2}), ElementsAre(-1, 2, 2));
}

TEST(ResolveReshapeTest, AgreesWithTheBatchDimOnceItIsKnown) {
  // What the kernel computes at run time for a batch of 32 is what the
  // compile-time shape says, with 32 in place of -1.
  EXPECT_THAT(*ResolveReshape({32, 784}, {-1, 28, 28}), ElementsAre(32, 28, 28));
  EXPECT_THAT(*ResolveReshape({32, 28, 28}, {0, 784}), ElementsAre(32, 784));
  EXPECT_THAT(*ResolveReshape({32, 28, 28}, {0, -1}), ElementsAre(32, 784));
}

TEST(ResolveReshapeTest, RefusesBadSpecs) {
  EXPECT_EQ(ErrorOf(ResolveReshape({2, 3}, {-1, -1})), "attr 'shape' [-1, -1] has more than one -1");
  EXPECT_EQ(ErrorOf(ResolveReshape({2, 3}, {-2, 3})),
            "attr 'shape' [-2, 3]: entry 0 is -2; expected a size, 0 (copy the input dim) or -1 (infer)");
  EXPECT_EQ(ErrorOf(ResolveReshape({6}, {2, 3, 0})),
            "attr 'shape' [2, 3, 0]: entry 2 is 0 (copy input dim 2) but the input has rank 1");
  EXPECT_EQ(ErrorOf(ResolveReshape({2, 3}, {5})), "cannot reshape [2, 3] to [5]: 6 elements into 5");
  EXPECT_EQ(ErrorOf(ResolveReshape({6}, {-1, 4})),
            "cannot reshape [6] to [-1, 4]: 6 elements do not divide into dims of 4");
  EXPECT_EQ(ErrorOf(ResolveReshape({0, 4}, {0, -1})),
            "cannot reshape [0, 4] to [0, -1]: 0 elements do not divide into dims of 0");
}

TEST(ResolveReshapeTest, RefusesToFoldTheBatchDim) {
  EXPECT_EQ(ErrorOf(ResolveReshape({-1, 784}, {784})),
            "cannot reshape [-1, 784] to [784]: the input's batch dim (-1) must go to a -1 or 0 entry");
  EXPECT_EQ(ErrorOf(ResolveReshape({-1, 784}, {-1, 100})),
            "cannot reshape [-1, 784] to [-1, 100]: the -1 stands for the batch dim, so the other dims must hold "
            "784 elements per batch entry, not 100");
  EXPECT_THAT(ErrorOf(ResolveReshape({-1, 4, 8}, {-1, 8})), HasSubstr("must hold 32 elements"));
  EXPECT_EQ(ErrorOf(ResolveReshape({-1, -1}, {-1})),
            "cannot reshape [-1, -1] to [-1]: it would merge 2 unknown dims into one");
}

// ---- flatten, transpose -----------------------------------------------------

TEST(FlattenShapeTest, MergesTheAxesInclusive) {
  EXPECT_THAT(*FlattenShape({2, 3, 4}, 1, -1), ElementsAre(2, 12));
  EXPECT_THAT(*FlattenShape({2, 3, 4}, 0, 1), ElementsAre(6, 4));
  EXPECT_THAT(*FlattenShape({2, 3, 4}, -2, -2), ElementsAre(2, 3, 4));
  EXPECT_THAT(*FlattenShape({2, 3, 4}, 0, -1), ElementsAre(24));
}

TEST(FlattenShapeTest, BatchDimMergesOnlyWithOnes) {
  EXPECT_THAT(*FlattenShape({-1, 3, 4}, 1, -1), ElementsAre(-1, 12));
  EXPECT_THAT(*FlattenShape({-1, 1, 4}, 0, 1), ElementsAre(-1, 4));
  EXPECT_EQ(ErrorOf(FlattenShape({-1, 3, 4}, 0, 1)),
            "flattening axes 0 to 1 would merge the batch dim (-1) with other dims");
}

TEST(FlattenShapeTest, RefusesAxesOutOfRangeOrOutOfOrder) {
  EXPECT_EQ(ErrorOf(FlattenShape({2, 3, 4}, 3, -1)),
            "attr 'start_axis' = 3 is out of range for rank 3 (expected -3 to 2)");
  EXPECT_EQ(ErrorOf(FlattenShape({2, 3, 4}, 0, -4)),
            "attr 'end_axis' = -4 is out of range for rank 3 (expected -3 to 2)");
  EXPECT_EQ(ErrorOf(FlattenShape({2, 3, 4}, 2, 1)), "attr 'start_axis' (2) is after 'end_axis' (1)");
  EXPECT_THAT(ErrorOf(FlattenShape({}, 0, -1)), HasSubstr("out of range for rank 0"));
}

TEST(NormalizePermTest, NormalizesAndRefusesNonPermutations) {
  EXPECT_THAT(*NormalizePerm({1, 0, 2}, 3), ElementsAre(1, 0, 2));
  EXPECT_THAT(*NormalizePerm({-1, 0, -2}, 3), ElementsAre(2, 0, 1));
  EXPECT_THAT(*NormalizePerm({}, 0), ElementsAre());
  EXPECT_EQ(ErrorOf(NormalizePerm({0, 1}, 3)), "attr 'perm' [0, 1] must have one entry per input dim (3)");
  EXPECT_EQ(ErrorOf(NormalizePerm({0, 2}, 2)), "attr 'perm'[1] = 2 is out of range for rank 2 (expected -2 to 1)");
  EXPECT_EQ(ErrorOf(NormalizePerm({0, -2}, 2)), "attr 'perm' [0, -2] is not a permutation");
}

// ---- split, slice -------------------------------------------------------------

TEST(SplitSizesTest, EqualPartsOrSections) {
  EXPECT_THAT(*SplitSizes(6, 3, {}), ElementsAre(2, 2, 2));
  EXPECT_THAT(*SplitSizes(6, 2, {1, 5}), ElementsAre(1, 5));
  EXPECT_THAT(*SplitSizes(6, 3, {1, -1, 2}), ElementsAre(1, 3, 2));
  EXPECT_THAT(*SplitSizes(6, 2, {6, -1}), ElementsAre(6, 0));
  EXPECT_THAT(*SplitSizes(-1, 1, {}), ElementsAre(-1));
  EXPECT_THAT(*SplitSizes(-1, 1, {-1}), ElementsAre(-1));
}

TEST(SplitSizesTest, RefusesWhatDoesNotAddUp) {
  EXPECT_EQ(ErrorOf(SplitSizes(7, 2, {})),
            "cannot split a dim of 7 into 2 equal parts; give the sizes in attr 'sections'");
  EXPECT_EQ(ErrorOf(SplitSizes(6, 0, {})), "cannot split a dim into 0 parts");
  EXPECT_EQ(ErrorOf(SplitSizes(6, 2, {1, 2, 3})), "attr 'sections' [1, 2, 3] has 3 entries for 2 outputs");
  EXPECT_EQ(ErrorOf(SplitSizes(6, 2, {-1, -1})),
            "attr 'sections' [-1, -1]: sizes must be 0 or more, with at most one -1 (the rest)");
  EXPECT_EQ(ErrorOf(SplitSizes(6, 2, {7, -1})), "attr 'sections' [7, -1] adds up to more than the dim (6)");
  EXPECT_EQ(ErrorOf(SplitSizes(6, 2, {1, 2})), "attr 'sections' [1, 2] adds up to 3, not to the dim (6)");
  EXPECT_EQ(ErrorOf(SplitSizes(-1, 2, {})), "cannot split the batch dim (-1) into 2 parts");
  EXPECT_EQ(ErrorOf(SplitSizes(-1, 2, {1, -1})), "cannot split the batch dim (-1) by attr 'sections' [1, -1]");
}

TEST(ResolveSliceTest, ClampsLikeNumpy) {
  // x[1:3, -3:100] of a [4, 5].
  auto w = ResolveSlice({4, 5}, {0, 1}, {1, -3}, {3, 100});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(w->begin, ElementsAre(1, 2));
  EXPECT_THAT(w->size, ElementsAre(2, 3));
  // An empty window, negative axes, and untouched dims.
  w = ResolveSlice({2, 1, 6}, {-1}, {4}, {2});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(w->begin, ElementsAre(0, 0, 4));
  EXPECT_THAT(w->size, ElementsAre(2, 1, 0));
  w = ResolveSlice({4}, {0}, {-100}, {-1});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(w->begin, ElementsAre(0));
  EXPECT_THAT(w->size, ElementsAre(3));
}

TEST(ResolveSliceTest, BatchDimOnlyWhole) {
  auto w = ResolveSlice({-1, 5}, {0, 1}, {0, 1}, {std::numeric_limits<int64_t>::max(), 3});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(w->size, ElementsAre(-1, 2));
  EXPECT_EQ(ErrorOf(ResolveSlice({-1, 5}, {0}, {0}, {8})),
            "cannot slice axis 0, the batch dim (-1), by [0, 8): only [0, end) is allowed there");
}

TEST(ResolveSliceTest, RefusesBadAttrs) {
  EXPECT_EQ(ErrorOf(ResolveSlice({4, 5}, {0, 1}, {0}, {1, 2})),
            "attrs 'axes' [0, 1], 'starts' [0] and 'ends' [1, 2] must have the same length");
  EXPECT_EQ(ErrorOf(ResolveSlice({4, 5}, {2}, {0}, {1})),
            "attr 'axes'[0] = 2 is out of range for rank 2 (expected -2 to 1)");
  EXPECT_EQ(ErrorOf(ResolveSlice({4, 5}, {1, -1}, {0, 0}, {1, 1})), "attr 'axes' [1, -1] names axis 1 twice");
}

TEST(SumToLikeDimsTest, ReducesLeadingDimsAndBroadcastOnes) {
  bool any = false;
  auto r = SumToLikeDims({4, 3, 5}, {3, 1}, &any);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<bool>{true, false, true}));
  EXPECT_TRUE(any);
  // Only size-1 dims summed away: nothing to add.
  r = SumToLikeDims({1, 3, 4}, {3, 4}, &any);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<bool>{true, false, false}));
  EXPECT_FALSE(any);
  EXPECT_EQ(ErrorOf(SumToLikeDims({3, 4}, {1, 3, 4}, &any)), "like [1, 3, 4] has more dims than x [3, 4]");
  EXPECT_EQ(ErrorOf(SumToLikeDims({3, 4}, {2, 4}, &any)), "like [2, 4] does not broadcast to x [3, 4]");
}

TEST(KnownProductTest, SkipsAndCountsTheUnknownDims) {
  EXPECT_EQ(KnownProduct({-1, 3, 4}), 12);
  EXPECT_EQ(CountUnknown({-1, 3, -1}), 2);
  EXPECT_EQ(KnownProduct({}), 1);
}

}  // namespace
}  // namespace strata
