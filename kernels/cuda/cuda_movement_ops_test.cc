// The CUDA kernels of the reductions and data-movement ops
// (kernels/cuda/cuda_movement_ops.cc) against the CPU kernels, run through
// the kernel registry on a CudaDevice. Copies and the fixed-block sums must
// equal the CPU bit for bit; reduce_sum and reduce_mean add in another order
// and are held to a summation's error bound. Tagged gpu: without a CUDA
// device every test FAILS (never skips).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_op_test_util.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

using testing::BitEqual;
using testing::CudaOpsTest;
using testing::RandomTensor;
using testing::RunKernel;
using testing::Uniform;

STRATA_CUDA_OPS_TESTED(cuda_movement_ops_test, {
                                                   {"reduce_sum", {F32, F64, I64}},
                                                   {"reduce_mean", {F32, F64}},
                                                   {"broadcast_like", {F32, F64}},
                                                   {"transpose", {F32, F64, I64, BF16, F16}},
                                                   {"concat", {F32, F64, I64, BF16, F16}},
                                                   {"concat_grad", {F32, F64, I64, BF16, F16}},
                                                   {"split", {F32, F64, I64, BF16, F16}},
                                                   {"split_grad", {F32, F64, I64, BF16, F16}},
                                                   {"slice", {F32, F64, I64, BF16, F16}},
                                                   {"slice_grad", {F32, F64, I64, BF16, F16}},
                                                   {"pad", {F32, F64, I64, BF16, F16}},
                                                   {"sum_squares", {F32, F64}},
                                                   {"sum_squares_grad", {F32, F64}},
                                                   {"clip_coefficient", {F32, F64}},
                                                   {"mse_loss", {F32, F64}},
                                                   {"mse_loss_grad", {F32, F64}},
                                               });

constexpr DataType kAllDtypes[] = {F32, F64, I64};
// The moves a mixed-precision program also makes in its 16-bit dtype.
constexpr DataType kMoveDtypes[] = {F32, F64, I64, BF16, F16};
constexpr DataType kFloatDtypes[] = {F32, F64};

// Bit for bit, except that a NaN matches any NaN: the CPU's 0 / 0 is x86's
// negative default NaN, the GPU's its canonical positive one, and a NaN
// operand's payload survives on the CPU but not on the GPU.
::testing::AssertionResult SameBitsOrBothNan(const Tensor& gpu, const Tensor& cpu) {
  if (gpu.dtype() != cpu.dtype() || gpu.shape() != cpu.shape()) return BitEqual(gpu, cpu);
  const std::vector<double> g = TensorValues(gpu), c = TensorValues(cpu);
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) && std::isnan(c[i])) continue;
    if (std::isnan(g[i]) != std::isnan(c[i]) || std::memcmp(&g[i], &c[i], sizeof(double)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": gpu " << g[i] << " cpu " << c[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::string Ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&s, i ? ", " : "", v[i]);
  return s + "]";
}

// ---- reduce_sum, reduce_mean -------------------------------------------------

struct ReduceCase {
  Shape x;
  std::vector<int64_t> axis;
  bool keepdim;
};

std::string ReduceOp(const char* type, const ReduceCase& c) {
  // Plain strings: clang-format reformats R"pb(...)pb" fragments as text protos.
  return absl::StrCat("type: \"", type, "\" input: \"x\" output: \"y\" attr { key: \"axis\" value { list { i: ",
                      Ints(c.axis), " } } } attr { key: \"keepdim\" value { b: ", c.keepdim ? "true" : "false",
                      " } }");
}

const ReduceCase kReduceCases[] = {
    {{64, 10}, {0}, false},
    {{64, 10}, {1}, true},
    {{4, 3, 5}, {1}, false},
    {{4, 3, 5}, {0, 2}, false},
    {{4, 3, 5}, {}, false},
    {{4, 3, 5}, {-1}, true},
    {{}, {}, false},
    {{7}, {0}, false},
    {{3000, 7}, {0}, false},
    {{3, 70000}, {1}, false},
    {{2, 40, 3, 50}, {0, 2}, false},
    {{2, 40, 3, 50}, {1, 3}, true},
    {{0, 4}, {0}, false},
    {{4, 0}, {0}, false},
    {{1, 5, 1}, {0, 2}, false},
};

// Both sides add the same K terms in double, in different orders: each is
// within (K - 1) u sum|terms| of the exact sum (u = 2^-53), so they differ by
// at most 2 K u S, S = scale * sum|terms|, plus the final rounding of each to
// the output type (2^-24 of the value in F32, 2^-53 in F64) and of the mean's
// scale multiplication. I64 is exact.
TEST_F(CudaOpsTest, ReduceSumAndMeanMatchTheCpuWithinTheSummationBound) {
  for (const char* type : {"reduce_sum", "reduce_mean"}) {
    const bool mean = std::string(type) == "reduce_mean";
    for (DataType dtype : kAllDtypes) {
      if (mean && dtype == I64) continue;
      for (const ReduceCase& c : kReduceCases) {
        SCOPED_TRACE(absl::StrCat(type, " ", DataTypeName(dtype), " x", ShapeString(c.x), " axis ", Ints(c.axis),
                                  c.keepdim ? " keepdim" : ""));
        const Tensor x = RandomTensor(dtype, c.x, 101);
        auto [y_cpu, y_gpu] = RunBoth(ReduceOp(type, c), {{"x", x}});
        if (dtype == I64) {
          EXPECT_TRUE(BitEqual(y_gpu, y_cpu));
          continue;
        }
        ASSERT_EQ(y_gpu.shape(), y_cpu.shape());
        // S per output: the CPU's reduce of |x| in F64.
        std::vector<double> abs_x = TensorValues(x);
        for (double& v : abs_x) v = std::abs(v);
        std::map<std::string, Tensor> env = {{"x", MakeTensor(F64, c.x, abs_x)}};
        ASSERT_TRUE(RunOp(ParseOp(ReduceOp(type, c)), &env).ok());
        const std::vector<double> scale = TensorValues(env.at("y"));
        const int64_t terms = y_cpu.num_elements() == 0 ? 0 : x.num_elements() / y_cpu.num_elements();
        const double u = std::ldexp(1.0, -53), out_u = dtype == F32 ? std::ldexp(1.0, -24) : u;
        const std::vector<double> got = TensorValues(y_gpu), want = TensorValues(y_cpu);
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::isnan(want[i])) {  // the mean of no terms
            EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
            continue;
          }
          const double bar = 2.0 * static_cast<double>(terms + 1) * u * scale[i] +
                             2.0 * out_u * (std::abs(got[i]) + std::abs(want[i]));
          EXPECT_LE(std::abs(got[i] - want[i]), bar) << "element " << i << ": gpu " << got[i] << " cpu " << want[i];
        }
      }
    }
  }
}

TEST_F(CudaOpsTest, ReduceSumAndMeanAreBitForBitDeterministic) {
  for (DataType dtype : kFloatDtypes) {
    for (const ReduceCase& c : {ReduceCase{{3, 70000}, {1}, false}, ReduceCase{{3000, 7}, {0}, false},
                                ReduceCase{{2, 40, 3, 50}, {0, 2}, false}}) {
      for (const char* type : {"reduce_sum", "reduce_mean"}) {
        SCOPED_TRACE(absl::StrCat(type, " ", DataTypeName(dtype), " x", ShapeString(c.x)));
        const std::map<std::string, Tensor> in = {{"x", RandomTensor(dtype, c.x, 102)}};
        const Tensor first = RunGpu(ReduceOp(type, c), in), second = RunGpu(ReduceOp(type, c), in);
        EXPECT_TRUE(BitEqual(first, second));
      }
    }
  }
}

// ---- broadcast_like ------------------------------------------------------------

std::string BroadcastLikeOp(const ReduceCase& c, bool mean) {
  return absl::StrCat(R"pb(type: "broadcast_like"
                           input: [ "dy", "x" ]
                           output: "y"
                           attr { key: "axis"
                                  value { list { i:)pb",
                      Ints(c.axis), R"pb(}
                                         } } attr { key: "keepdim" value { b: )pb",
                      c.keepdim ? "true" : "false", R"pb(}
                                                         } attr { key: "mean" value { b: )pb",
                      mean ? "true" : "false", " } }");
}

// One multiplication by the same factor per element on both sides.
TEST_F(CudaOpsTest, BroadcastLikeEqualsTheCpuBitForBit) {
  std::vector<ReduceCase> cases(std::begin(kReduceCases), std::end(kReduceCases));
  cases.push_back({{4100, 4100}, {1}, false});  // more elements than one pass of the grid
  for (DataType dtype : kFloatDtypes) {
    for (const ReduceCase& c : cases) {
      for (bool mean : {false, true}) {
        if (NumElements(c.x) > 1000000 && (dtype == F64 || !mean)) continue;
        SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " x", ShapeString(c.x), " axis ", Ints(c.axis),
                                  c.keepdim ? " keepdim" : "", mean ? " mean" : ""));
        const Tensor x = RandomTensor(dtype, c.x, 111);
        std::map<std::string, Tensor> env = {{"x", x}};
        ASSERT_TRUE(RunOp(ParseOp(ReduceOp("reduce_sum", c)), &env).ok());
        const Tensor dy = RandomTensor(dtype, env.at("y").shape(), 112);
        auto [dx_cpu, dx_gpu] = RunBoth(BroadcastLikeOp(c, mean), {{"dy", dy}, {"x", x}});
        EXPECT_TRUE(BitEqual(dx_gpu, dx_cpu));
      }
    }
  }
}

// ---- transpose -------------------------------------------------------------------

struct TransposeCase {
  Shape x;
  std::vector<int64_t> perm;
};

std::string TransposeOp(const std::vector<int64_t>& perm) {
  return absl::StrCat(R"pb(type: "transpose"
                           input: "x"
                           output: "y"
                           attr { key: "perm"
                                  value { list { i:)pb",
                      Ints(perm), " } } }");
}

// Both paths: tiles (the last two dims swapped, after merging, with and
// without batch dims, sizes not multiples of 32, more tiles than blocks) and
// the strided kernel (any other permutation; more elements than one pass of
// the grid).
TEST_F(CudaOpsTest, TransposeEqualsTheCpuBitForBit) {
  const TransposeCase cases[] = {
      {{37, 29}, {1, 0}},
      {{4, 37, 29}, {0, 2, 1}},
      {{64, 65}, {-1, 0}},
      {{2, 3, 4, 5}, {3, 1, 0, 2}},
      {{5}, {0}},
      {{}, {}},
      {{0, 3}, {1, 0}},
      {{3, 1, 4}, {2, 1, 0}},
      {{2, 3, 4, 5, 6}, {4, 2, 0, 3, 1}},
      {{6, 7, 8}, {1, 2, 0}},
      {{70000, 2, 2}, {0, 2, 1}},
      {{33, 1, 1, 31}, {3, 1, 2, 0}},
      // Heads in and out of attention: the last dim contiguous in both,
      // moved in 16-, 8- or 4-byte chunks (kernels/copy_plan.h).
      {{2, 16, 3, 64}, {0, 2, 1, 3}},
      {{2, 3, 16, 64}, {0, 2, 1, 3}},
      {{2, 5, 3, 4}, {0, 2, 1, 3}},
      {{2, 5, 3, 3}, {0, 2, 1, 3}},
  };
  for (DataType dtype : kMoveDtypes) {
    for (const TransposeCase& c : cases) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " x", ShapeString(c.x), " perm ", Ints(c.perm)));
      const Tensor x = RandomTensor(dtype, c.x, 121);
      auto [y_cpu, y_gpu] = RunBoth(TransposeOp(c.perm), {{"x", x}});
      EXPECT_TRUE(BitEqual(y_gpu, y_cpu));
    }
  }
  for (const TransposeCase& c : {TransposeCase{{2, 2050, 4100}, {1, 0, 2}}, TransposeCase{{4100, 4100}, {1, 0}}}) {
    SCOPED_TRACE(absl::StrCat("F32 x", ShapeString(c.x), " perm ", Ints(c.perm)));
    auto [y_cpu, y_gpu] = RunBoth(TransposeOp(c.perm), {{"x", RandomTensor(F32, c.x, 122)}});
    EXPECT_TRUE(BitEqual(y_gpu, y_cpu));
  }
}

// ---- concat, concat_grad, split, split_grad --------------------------------------

struct PiecesCase {
  std::vector<Shape> pieces;
  int64_t axis;
};

const PiecesCase kPiecesCases[] = {
    {{{2, 2}, {2, 1}}, 1},          {{{1, 2}, {2, 2}, {1, 2}}, 0},
    {{{40, 3000}, {40, 1000}}, -1}, {{{3, 0, 4}, {3, 5, 4}}, 1},
    {{{5}, {0}, {7}}, 0},           {{{2, 3, 4}, {2, 3, 4}, {2, 3, 1}}, 2},
    {{{0, 4}, {0, 4}}, 0},          {{{4, 3, 2, 5}, {4, 1, 2, 5}}, -3},
    // q, k, v out of one projection: column blocks on 16-byte boundaries.
    {{{2, 16, 64}, {2, 16, 64}, {2, 16, 64}}, -1},
};

std::vector<std::string> Names(const char* prefix, size_t n) {
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) names.push_back(absl::StrCat(prefix, i));
  return names;
}

std::string NameList(const std::vector<std::string>& names) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) absl::StrAppend(&s, i ? ", \"" : "\"", names[i], "\"");
  return s + "]";
}

TEST_F(CudaOpsTest, ConcatAndSplitAndTheirGradientsEqualTheCpuBitForBit) {
  for (DataType dtype : kMoveDtypes) {
    for (const PiecesCase& c : kPiecesCases) {
      std::string trace = absl::StrCat(DataTypeName(dtype), " axis ", c.axis);
      for (const Shape& p : c.pieces) absl::StrAppend(&trace, " ", ShapeString(p));
      SCOPED_TRACE(trace);
      const std::vector<std::string> xs = Names("x", c.pieces.size()), dxs = Names("dx", c.pieces.size());
      std::map<std::string, Tensor> in;
      for (size_t i = 0; i < xs.size(); ++i) in[xs[i]] = RandomTensor(dtype, c.pieces[i], 131 + i);
      const std::string axis = absl::StrCat(R"pb(attr { key: "axis"
                                                        value { i:)pb", c.axis, " } }");

      auto [y_cpu, y_gpu] =
          RunBoth(absl::StrCat(R"pb(type: "concat" input:)pb", NameList(xs), R"pb(output: "y")pb", axis), in);
      EXPECT_TRUE(BitEqual(y_gpu, y_cpu)) << "concat";

      std::map<std::string, Tensor> grad_in = in;
      grad_in["dy"] = RandomTensor(dtype, y_cpu.shape(), 141);
      std::vector<std::string> grad_inputs = {"dy"};
      grad_inputs.insert(grad_inputs.end(), xs.begin(), xs.end());
      for (const auto& [cpu, gpu] : RunBothNamed(absl::StrCat(R"pb(type: "concat_grad" input:)pb",
                                                              NameList(grad_inputs), " output: ", NameList(dxs), axis),
                                                 grad_in, dxs)) {
        EXPECT_TRUE(BitEqual(gpu, cpu)) << "concat_grad";
      }

      // split of y back into the pieces, by explicit sections.
      const int rank = static_cast<int>(y_cpu.rank());
      const int64_t a = c.axis < 0 ? c.axis + rank : c.axis;
      std::vector<int64_t> sections;
      for (const Shape& p : c.pieces) sections.push_back(p[a]);
      const std::string split_attrs = absl::StrCat(axis, R"pb(attr { key: "sections"
                                                                     value { list { i:)pb",
                                                   Ints(sections), " } } }");
      const std::vector<std::string> ys = Names("y", c.pieces.size());
      auto split = RunBothNamed(absl::StrCat(R"pb(type: "split" input: "whole" output:)pb", NameList(ys), split_attrs),
                                {{"whole", grad_in["dy"]}}, ys);
      for (const auto& [cpu, gpu] : split) EXPECT_TRUE(BitEqual(gpu, cpu)) << "split";

      // split_grad with the gradients of every other piece only.
      std::vector<int64_t> present;
      std::vector<std::string> dys = {"whole"};
      std::map<std::string, Tensor> split_grad_in = {{"whole", grad_in["dy"]}};
      for (size_t i = 0; i < c.pieces.size(); i += 2) {
        present.push_back(static_cast<int64_t>(i));
        dys.push_back(absl::StrCat("dy", i));
        split_grad_in[dys.back()] = RandomTensor(dtype, c.pieces[i], 151 + i);
      }
      auto [dx_cpu, dx_gpu] =
          RunBoth(absl::StrCat(R"pb(type: "split_grad" input:)pb", NameList(dys), R"pb(output: "y")pb", split_attrs,
                               R"pb(attr { key: "grad_outputs"
                                           value { list { i:)pb",
                               Ints(present), " } } }"),
                  split_grad_in);
      EXPECT_TRUE(BitEqual(dx_gpu, dx_cpu)) << "split_grad";
    }
  }
}

// Equal parts (no sections) and pieces larger than one pass of the grid.
TEST_F(CudaOpsTest, ConcatAndSplitCoverTensorsLargerThanTheGrid) {
  const Tensor a = RandomTensor(F32, {4100, 2050}, 161), b = RandomTensor(F32, {4100, 2050}, 162);
  auto [y_cpu, y_gpu] = RunBoth(R"pb(type: "concat"
                                     input: [ "a", "b" ]
                                     output: "y"
                                     attr {
                                       key: "axis"
                                       value { i: 1 }
                                     })pb",
                                {{"a", a}, {"b", b}});
  EXPECT_TRUE(BitEqual(y_gpu, y_cpu));
  auto split = RunBothNamed(R"pb(type: "split"
                                 input: "x"
                                 output: [ "p", "q" ])pb", {{"x", y_cpu}}, {"p", "q"});
  for (const auto& [cpu, gpu] : split) EXPECT_TRUE(BitEqual(gpu, cpu));
}

// ---- slice, slice_grad -------------------------------------------------------------

struct SliceCase {
  Shape x;
  std::vector<int64_t> axes, starts, ends;
};

std::string SliceAttrs(const SliceCase& c) {
  return absl::StrCat(R"pb(attr { key: "axes"
                                  value { list { i:)pb",
                      Ints(c.axes), R"pb(}
                                         } } attr { key: "starts" value { list { i: )pb",
                      Ints(c.starts), R"pb(}
                                           } } attr { key: "ends" value { list { i: )pb",
                      Ints(c.ends), " } } }");
}

TEST_F(CudaOpsTest, SliceAndItsGradientEqualTheCpuBitForBit) {
  const SliceCase cases[] = {
      {{10, 8}, {0}, {2}, {7}},   {{10, 8}, {1, 0}, {-5, 1}, {2147483647, -1}},
      {{4, 5, 6}, {2}, {1}, {4}}, {{4, 5, 6}, {0, 1, 2}, {1, 0, 5}, {3, 5, 6}},
      {{4, 5, 6}, {1}, {3}, {3}},                                    // empty window
      {{7}, {0}, {-100}, {100}},                                     // clamped to the whole
      {{}, {}, {}, {}},                                              // rank 0
      {{0, 3}, {1}, {1}, {2}},    {{4100, 4100}, {1}, {1}, {4100}},  // more elements than one pass of the grid
  };
  for (DataType dtype : {F32, F64, I64, BF16, F16}) {
    for (const SliceCase& c : cases) {
      if (NumElements(c.x) > 1000000 && dtype != F32) continue;
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " x", ShapeString(c.x), SliceAttrs(c)));
      const Tensor x = RandomTensor(dtype, c.x, 171);
      auto [y_cpu, y_gpu] =
          RunBoth(absl::StrCat(R"pb(type: "slice" input: "x" output: "y")pb", SliceAttrs(c)), {{"x", x}});
      EXPECT_TRUE(BitEqual(y_gpu, y_cpu)) << "slice";
      const Tensor dy = RandomTensor(dtype, y_cpu.shape(), 172);
      auto [dx_cpu, dx_gpu] = RunBoth(absl::StrCat(R"pb(type: "slice_grad"
                                                        input: [ "dy", "x" ]
                                                        output: "y")pb",
                                                   SliceAttrs(c)),
                                      {{"dy", dy}, {"x", x}});
      EXPECT_TRUE(BitEqual(dx_gpu, dx_cpu)) << "slice_grad";
    }
  }
}

// pad (passes/pad_vocab's LM-head weight): every dtype, a leading, middle
// and last axis, nothing to add, and an empty x.
TEST_F(CudaOpsTest, PadEqualsTheCpuBitForBit) {
  struct PadCase {
    Shape x;
    int64_t axis, after;
  };
  const PadCase cases[] = {{{37, 16}, 0, 27}, {{4, 5, 6}, 1, 3}, {{4, 5, 6}, -1, 2},
                           {{9, 3}, 0, 0},    {{0, 3}, 1, 5},    {{257, 64}, 0, 63}};
  for (DataType dtype : {F32, F64, I64, BF16, F16}) {
    for (const PadCase& c : cases) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " x", ShapeString(c.x), " axis ", c.axis, " after ", c.after));
      const Tensor x = RandomTensor(dtype, c.x, 181);
      auto [y_cpu, y_gpu] = RunBoth(absl::StrCat(R"pb(type: "pad" input: "x" output: "y")pb",
                                                 " attr { key: \"axis\" value { i: ", c.axis,
                                                 " } } attr { key: \"after\" value { i: ", c.after, " } }"),
                                    {{"x", x}});
      EXPECT_TRUE(BitEqual(y_gpu, y_cpu));
    }
  }
}

// ---- refusals ----------------------------------------------------------------------

TEST_F(CudaOpsTest, MovementOpsRefuseWhatTheCpuRefusesWithTheSameWords) {
  using testing::ExpectSameRefusal;
  const Tensor x23 = RandomTensor(F32, {2, 3}, 181), x33 = RandomTensor(F32, {3, 3}, 182);
  const Tensor x23_f64 = RandomTensor(F64, {2, 3}, 183), s = RandomTensor(F32, {}, 184);
  const Tensor v2 = RandomTensor(F32, {2}, 185), x4 = RandomTensor(F32, {4}, 186);
  ExpectSameRefusal(R"pb(type: "transpose"
                         input: "x"
                         output: "y"
                         attr {
                           key: "perm"
                           value { list { i: [ 1, -1 ] } }
                         })pb",
                    F32, {x23}, gpu_);
  ExpectSameRefusal(R"pb(type: "transpose"
                         input: "x"
                         output: "y"
                         attr {
                           key: "perm"
                           value { list { i: [ 1, 0 ] } }
                         })pb",
                    F32, {x23_f64}, gpu_);
  ExpectSameRefusal(R"pb(type: "concat"
                         input: [ "a", "b" ]
                         output: "y"
                         attr {
                           key: "axis"
                           value { i: 1 }
                         })pb",
                    F32, {x23, x33}, gpu_);
  ExpectSameRefusal(R"pb(type: "concat"
                         input: [ "a", "b" ]
                         output: "y"
                         attr {
                           key: "axis"
                           value { i: 2 }
                         })pb",
                    F32, {x23, x23}, gpu_);
  ExpectSameRefusal(R"pb(type: "concat_grad"
                         input: [ "dy", "a", "b" ]
                         output: "da"
                         attr {
                           key: "axis"
                           value { i: 0 }
                         })pb",
                    F32, {x33, x23, x23}, gpu_);
  ExpectSameRefusal(R"pb(type: "split"
                         input: "x"
                         output: "y"
                         attr {
                           key: "axis"
                           value { i: 1 }
                         }
                         attr {
                           key: "sections"
                           value { list { i: [ 1, 1 ] } }
                         })pb",
                    F32, {x23}, gpu_);
  ExpectSameRefusal(R"pb(type: "split_grad"
                         input: [ "x", "dy" ]
                         output: "y"
                         attr {
                           key: "axis"
                           value { i: 1 }
                         }
                         attr {
                           key: "sections"
                           value { list { i: [ 1, 2 ] } }
                         }
                         attr {
                           key: "grad_outputs"
                           value { list { i: [ 0 ] } }
                         })pb",
                    F32, {x23, x23}, gpu_);
  ExpectSameRefusal(R"pb(type: "slice"
                         input: "x"
                         output: "y"
                         attr {
                           key: "axes"
                           value { list { i: [ 1, -1 ] } }
                         }
                         attr {
                           key: "starts"
                           value { list { i: [ 0, 0 ] } }
                         }
                         attr {
                           key: "ends"
                           value { list { i: [ 1, 1 ] } }
                         })pb",
                    F32, {x23}, gpu_);
  ExpectSameRefusal(R"pb(type: "slice_grad"
                         input: [ "dy", "x" ]
                         output: "y"
                         attr {
                           key: "axes"
                           value { list { i: [ 0 ] } }
                         }
                         attr {
                           key: "starts"
                           value { list { i: [ 0 ] } }
                         }
                         attr {
                           key: "ends"
                           value { list { i: [ 1 ] } }
                         })pb",
                    F32, {x23, x23}, gpu_);
  ExpectSameRefusal(R"pb(type: "reduce_sum"
                         input: "x"
                         output: "y"
                         attr {
                           key: "axis"
                           value { list { i: [ 0, 0 ] } }
                         }
                         attr {
                           key: "keepdim"
                           value { b: false }
                         })pb",
                    F32, {x23}, gpu_);
  ExpectSameRefusal(R"pb(type: "broadcast_like"
                         input: [ "dy", "x" ]
                         output: "y"
                         attr {
                           key: "axis"
                           value { list { i: [ 0 ] } }
                         }
                         attr {
                           key: "keepdim"
                           value { b: false }
                         }
                         attr {
                           key: "mean"
                           value { b: true }
                         })pb",
                    F32, {v2, x23}, gpu_);
  ExpectSameRefusal(R"pb(type: "sum_squares"
                         input: [ "a", "b" ]
                         output: "y")pb", F32, {x23, x23_f64}, gpu_);
  ExpectSameRefusal(R"pb(type: "sum_squares_grad"
                         input: [ "x", "dy" ]
                         output: "y")pb", F32, {x23, v2}, gpu_);
  ExpectSameRefusal(R"pb(type: "clip_coefficient"
                         input: [ "a", "b" ]
                         output: "y"
                         attr {
                           key: "max_norm"
                           value { f: 1 }
                         })pb",
                    F32, {s, v2}, gpu_);
  ExpectSameRefusal(R"pb(type: "mse_loss"
                         input: [ "p", "t" ]
                         output: "y")pb", F32, {x23, x33}, gpu_);
  ExpectSameRefusal(R"pb(type: "mse_loss_grad"
                         input: [ "p", "t", "d" ]
                         output: "y")pb", F32, {x23, x23, v2}, gpu_);
  ExpectSameRefusal(R"pb(type: "mse_loss_grad"
                         input: [ "p", "t", "d" ]
                         output: "y")pb", F32, {x4, x23, s}, gpu_);
}

// ---- sum_squares, clip_coefficient, mse_loss -----------------------------------------

// Tensors of the given shapes, named x0, x1, ...
std::map<std::string, Tensor> NamedTensors(DataType dtype, const std::vector<Shape>& shapes, uint32_t seed) {
  std::map<std::string, Tensor> in;
  for (size_t i = 0; i < shapes.size(); ++i) in[absl::StrCat("x", i)] = RandomTensor(dtype, shapes[i], seed + i);
  return in;
}

// More tensors than one launch takes (32), of mixed sizes.
std::vector<Shape> ManyShapes() {
  std::vector<Shape> shapes;
  for (int i = 0; i < 40; ++i) shapes.push_back(i % 3 == 0 ? Shape{37, 29} : i % 3 == 1 ? Shape{20000} : Shape{});
  return shapes;
}

// The same blocks, each summed in index order in double, the blocks' and the
// tensors' sums added in order: bit for bit.
TEST_F(CudaOpsTest, SumSquaresAndClipCoefficientEqualTheCpuBitForBit) {
  const std::vector<std::vector<Shape>> cases = {
      {{37, 29}}, {{5}, {0}, {}, {3, 4}}, {{5000, 100}}, {{16384}}, {{16385, 2}}, ManyShapes(),
  };
  for (DataType dtype : kFloatDtypes) {
    for (const std::vector<Shape>& shapes : cases) {
      SCOPED_TRACE(
          absl::StrCat(DataTypeName(dtype), " ", shapes.size(), " tensors, the first ", ShapeString(shapes[0])));
      const std::map<std::string, Tensor> in = NamedTensors(dtype, shapes, 191);
      const std::vector<std::string> names = Names("x", shapes.size());
      const std::string op = absl::StrCat(R"pb(type: "sum_squares" input:)pb", NameList(names), R"pb(output: "y")pb");
      auto [y_cpu, y_gpu] = RunBoth(op, in);
      EXPECT_TRUE(BitEqual(y_gpu, y_cpu)) << "sum_squares";
      EXPECT_TRUE(BitEqual(RunGpu(op, in), y_gpu)) << "sum_squares twice";

      // clip_coefficient over per-tensor sums (as one per pipeline stage).
      std::map<std::string, Tensor> sums;
      for (size_t i = 0; i < names.size(); ++i) {
        std::map<std::string, Tensor> env = {{"x", in.at(names[i])}};
        ASSERT_TRUE(RunOp(ParseOp(R"pb(type: "sum_squares" input: "x" output: "y")pb"), &env).ok());
        sums[absl::StrCat("s", i)] = env.at("y");
      }
      for (const char* max_norm : {"1", "1e6", "0.5"}) {
        auto [c_cpu, c_gpu] = RunBoth(absl::StrCat(R"pb(type: "clip_coefficient" input:)pb",
                                                   NameList(Names("s", names.size())), R"pb(output: "y"
                                                                                            attr { key: "max_norm"
                                                                                                   value { f:)pb",
                                                   max_norm, " } }"),
                                      sums);
        EXPECT_TRUE(BitEqual(c_gpu, c_cpu)) << "clip_coefficient max_norm " << max_norm;
      }
    }
  }
}

// A NaN or infinite norm, and a zero one.
TEST_F(CudaOpsTest, ClipCoefficientKeepsANanNormAsTheCpuDoes) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DataType dtype : kFloatDtypes) {
    for (const std::vector<double>& values : {std::vector<double>{1, nan}, std::vector<double>{inf, 2},
                                              std::vector<double>{0, 0}, std::vector<double>{1e-30, 0}}) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", values[0], " ", values[1]));
      auto [c_cpu, c_gpu] =
          RunBoth(R"pb(type: "clip_coefficient"
                       input: [ "a", "b" ]
                       output: "y"
                       attr {
                         key: "max_norm"
                         value { f: 1 }
                       })pb",
                  {{"a", MakeTensor(dtype, {}, {values[0]})}, {"b", MakeTensor(dtype, {}, {values[1]})}});
      EXPECT_TRUE(SameBitsOrBothNan(c_gpu, c_cpu));
    }
  }
}

// dx = (2 dy) x: one multiplication per element on both sides; more elements
// than one pass of the grid.
TEST_F(CudaOpsTest, SumSquaresGradEqualsTheCpuBitForBit) {
  for (DataType dtype : kFloatDtypes) {
    for (const Shape& shape : {Shape{37, 29}, Shape{}, Shape{0, 3}, Shape{4100, 4100}}) {
      if (NumElements(shape) > 1000000 && dtype != F32) continue;
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape)));
      auto [dx_cpu, dx_gpu] = RunBoth(R"pb(type: "sum_squares_grad"
                                           input: [ "x", "dy" ]
                                           output: "y")pb",
                                      {{"x", RandomTensor(dtype, shape, 201)}, {"dy", MakeTensor(dtype, {}, {0.37})}});
      EXPECT_TRUE(BitEqual(dx_gpu, dx_cpu));
    }
  }
}

// mse_loss: the CPU's blocks and order, bit for bit (NaN for no elements on
// both); mse_loss_grad: one subtraction and one multiplication per element.
TEST_F(CudaOpsTest, MseLossAndItsGradientEqualTheCpuBitForBit) {
  for (DataType dtype : kFloatDtypes) {
    for (const Shape& shape : {Shape{37, 29}, Shape{}, Shape{0}, Shape{16384}, Shape{5000, 100}, Shape{4100, 4100}}) {
      if (NumElements(shape) > 1000000 && dtype != F32) continue;
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape)));
      const std::map<std::string, Tensor> in = {{"p", RandomTensor(dtype, shape, 211)},
                                                {"t", RandomTensor(dtype, shape, 212)},
                                                {"d", MakeTensor(dtype, {}, {0.7})}};
      const char* loss_op = R"pb(type: "mse_loss"
                                 input: [ "p", "t" ]
                                 output: "y")pb";
      auto [l_cpu, l_gpu] = RunBoth(loss_op, in);
      EXPECT_TRUE(SameBitsOrBothNan(l_gpu, l_cpu)) << "mse_loss";
      EXPECT_TRUE(SameBitsOrBothNan(RunGpu(loss_op, in), l_gpu)) << "mse_loss twice";
      auto [g_cpu, g_gpu] = RunBoth(R"pb(type: "mse_loss_grad"
                                         input: [ "p", "t", "d" ]
                                         output: "y")pb", in);
      EXPECT_TRUE(BitEqual(g_gpu, g_cpu)) << "mse_loss_grad";
    }
  }
}

// The scratch the sums draw is in the memory plan.
TEST_F(CudaOpsTest, TheSumsScratchIsInTheMemoryPlan) {
  KernelDef def;
  def.input_types = {TensorType{F32, {16385, 2}}, TensorType{F32, {3}}};
  const WorkspaceFn* ws = KernelRegistry::Global().FindWorkspace("sum_squares", DEVICE_CUDA);
  ASSERT_NE(ws, nullptr);
  absl::StatusOr<int64_t> bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, (1 + 3 + 1) * 8);  // the total, 3 blocks, 1 block
  ws = KernelRegistry::Global().FindWorkspace("mse_loss", DEVICE_CUDA);
  ASSERT_NE(ws, nullptr);
  bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 3 * 8);
  ws = KernelRegistry::Global().FindWorkspace("clip_coefficient", DEVICE_CUDA);
  ASSERT_NE(ws, nullptr);
  bytes = (*ws)(def, 1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 8);
}

}  // namespace
}  // namespace strata
