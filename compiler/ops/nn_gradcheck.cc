// Gradient checks for the nn family: matmul (every transpose, batched both
// ways), conv2d, pooling, layer_norm, losses, dropout and embedding. Max-pool
// inputs are spread-out distinct values so that no window has a near-tie the
// finite difference could flip.

#include <cstdint>
#include <vector>

#include "compiler/testing/grad_check.h"

namespace strata {
namespace {

// n distinct values in [-1, 1), 2/n apart, in a scrambled order (37 is coprime to n).
std::vector<double> DistinctValues(int64_t n) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = -1.0 + 2.0 * static_cast<double>((i * 37) % n) / static_cast<double>(n);
  return v;
}

STRATA_REGISTER_GRAD_CHECKS({
    // matmul, 2-D, every transpose combination.
    GradCheckCase{"matmul_bias/batched",
                  R"pb(type: "matmul_bias" input: ["a", "b", "bias"] output: "y")pb",
                  {GradCheckInput{"a", F64, {2, 3, 4}}, GradCheckInput{"b", F64, {4, 5}},
                   GradCheckInput{"bias", F64, {5}}}},
    GradCheckCase{"matmul_bias/transpose_b",
                  R"pb(type: "matmul_bias" input: ["a", "b", "bias"] output: "y"
                       attr { key: "transpose_b" value { b: true } })pb",
                  {GradCheckInput{"a", F64, {3, 4}}, GradCheckInput{"b", F64, {5, 4}},
                   GradCheckInput{"bias", F64, {5}}}},
    GradCheckCase{"matmul/2d", R"pb(type: "matmul" input: ["a", "b"] output: "y")pb",
                  {GradCheckInput{"a", F64, {3, 4}}, GradCheckInput{"b", F64, {4, 5}}}},
    GradCheckCase{"matmul/2d_transpose_a",
                  R"pb(type: "matmul" input: ["a", "b"] output: "y"
                       attr { key: "transpose_a" value { b: true } })pb",
                  {GradCheckInput{"a", F64, {4, 3}}, GradCheckInput{"b", F64, {4, 5}}}},
    GradCheckCase{"matmul/2d_transpose_b",
                  R"pb(type: "matmul" input: ["a", "b"] output: "y"
                       attr { key: "transpose_b" value { b: true } })pb",
                  {GradCheckInput{"a", F64, {3, 4}}, GradCheckInput{"b", F64, {5, 4}}}},
    GradCheckCase{"matmul/2d_transpose_both",
                  R"pb(type: "matmul" input: ["a", "b"] output: "y"
                       attr { key: "transpose_a" value { b: true } }
                       attr { key: "transpose_b" value { b: true } })pb",
                  {GradCheckInput{"a", F64, {4, 3}}, GradCheckInput{"b", F64, {5, 4}}}},
    GradCheckCase{"matmul/same_var_twice", R"pb(type: "matmul" input: ["a", "a"] output: "y")pb",
                  {GradCheckInput{"a", F64, {3, 3}}}},
    GradCheckCase{"matmul/only_b", R"pb(type: "matmul" input: ["a", "b"] output: "y")pb",
                  {GradCheckInput{"a", F64, {3, 4}, -1.0, 1.0, {}, /*check_grad=*/false},
                   GradCheckInput{"b", F64, {4, 2}}}},

    // matmul, batched a with a shared 2-D weight (x @ W), every transpose combination.
    GradCheckCase{"matmul/shared_weight", R"pb(type: "matmul" input: ["a", "b"] output: "y")pb",
                  {GradCheckInput{"a", F64, {2, 3, 4}}, GradCheckInput{"b", F64, {4, 5}}}},
    GradCheckCase{"matmul/shared_weight_transpose_a",
                  R"pb(type: "matmul" input: ["a", "b"] output: "y"
                       attr { key: "transpose_a" value { b: true } })pb",
                  {GradCheckInput{"a", F64, {2, 4, 3}}, GradCheckInput{"b", F64, {4, 5}}}},
    GradCheckCase{"matmul/shared_weight_transpose_b",
                  R"pb(type: "matmul" input: ["a", "b"] output: "y"
                       attr { key: "transpose_b" value { b: true } })pb",
                  {GradCheckInput{"a", F64, {2, 2, 3, 4}}, GradCheckInput{"b", F64, {5, 4}}}},
    GradCheckCase{"matmul/shared_weight_transpose_both",
                  R"pb(type: "matmul" input: ["a", "b"] output: "y"
                       attr { key: "transpose_a" value { b: true } }
                       attr { key: "transpose_b" value { b: true } })pb",
                  {GradCheckInput{"a", F64, {2, 4, 3}}, GradCheckInput{"b", F64, {5, 4}}}},

    // matmul, batched times batched (attention-style).
    GradCheckCase{"matmul/batched", R"pb(type: "matmul" input: ["a", "b"] output: "y")pb",
                  {GradCheckInput{"a", F64, {2, 3, 4}}, GradCheckInput{"b", F64, {2, 4, 2}}}},
    GradCheckCase{"matmul/batched_transpose_b",
                  R"pb(type: "matmul" input: ["a", "b"] output: "y"
                       attr { key: "transpose_b" value { b: true } })pb",
                  {GradCheckInput{"a", F64, {2, 2, 3, 4}}, GradCheckInput{"b", F64, {2, 2, 5, 4}}}},
    GradCheckCase{"matmul/batched_transpose_both",
                  R"pb(type: "matmul" input: ["a", "b"] output: "y"
                       attr { key: "transpose_a" value { b: true } }
                       attr { key: "transpose_b" value { b: true } })pb",
                  {GradCheckInput{"a", F64, {2, 4, 3}}, GradCheckInput{"b", F64, {2, 2, 4}}}},

    // conv2d
    GradCheckCase{"conv2d/defaults", R"pb(type: "conv2d" input: ["x", "w"] output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 3, 5, 5}}, GradCheckInput{"w", F64, {2, 3, 3, 3}}}},
    GradCheckCase{"conv2d/stride2_padding1",
                  R"pb(type: "conv2d" input: ["x", "w"] output: "y"
                       attr { key: "strides" value { list { i: [2, 2] } } }
                       attr { key: "paddings" value { list { i: [1, 1] } } })pb",
                  {GradCheckInput{"x", F64, {2, 2, 6, 7}}, GradCheckInput{"w", F64, {3, 2, 3, 3}}}},
    GradCheckCase{"conv2d/dilation2",
                  R"pb(type: "conv2d" input: ["x", "w"] output: "y"
                       attr { key: "dilations" value { list { i: [2, 2] } } }
                       attr { key: "paddings" value { list { i: [1, 2] } } })pb",
                  {GradCheckInput{"x", F64, {1, 2, 7, 6}}, GradCheckInput{"w", F64, {2, 2, 3, 2}}}},
    GradCheckCase{"conv2d/groups2",
                  R"pb(type: "conv2d" input: ["x", "w"] output: "y"
                       attr { key: "groups" value { i: 2 } }
                       attr { key: "strides" value { list { i: [1, 2] } } })pb",
                  {GradCheckInput{"x", F64, {2, 4, 5, 6}}, GradCheckInput{"w", F64, {4, 2, 2, 3}}}},
    GradCheckCase{"conv2d/everything",
                  R"pb(type: "conv2d" input: ["x", "w"] output: "y"
                       attr { key: "strides" value { list { i: [2, 2] } } }
                       attr { key: "paddings" value { list { i: [1, 1] } } }
                       attr { key: "dilations" value { list { i: [2, 2] } } }
                       attr { key: "groups" value { i: 2 } })pb",
                  {GradCheckInput{"x", F64, {2, 4, 7, 7}}, GradCheckInput{"w", F64, {2, 2, 2, 2}}}},
    GradCheckCase{"conv2d/only_filter", R"pb(type: "conv2d" input: ["x", "w"] output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 1, 4, 4}, -1.0, 1.0, {}, /*check_grad=*/false},
                   GradCheckInput{"w", F64, {2, 1, 2, 2}}}},

    // Pooling: overlapping windows and padding; max-pool values spread apart.
    GradCheckCase{"max_pool2d/non_overlapping",
                  R"pb(type: "max_pool2d" input: "x" output: "y"
                       attr { key: "kernel_size" value { list { i: [2, 2] } } })pb",
                  {GradCheckInput{"x", F64, {2, 2, 4, 4}, 0, 0, DistinctValues(64)}}},
    GradCheckCase{"max_pool2d/overlapping_padded",
                  R"pb(type: "max_pool2d" input: "x" output: "y"
                       attr { key: "kernel_size" value { list { i: [3, 3] } } }
                       attr { key: "strides" value { list { i: [2, 1] } } }
                       attr { key: "paddings" value { list { i: [1, 1] } } })pb",
                  {GradCheckInput{"x", F64, {2, 2, 5, 5}, 0, 0, DistinctValues(100)}}},
    GradCheckCase{"avg_pool2d/overlapping_padded",
                  R"pb(type: "avg_pool2d" input: "x" output: "y"
                       attr { key: "kernel_size" value { list { i: [3, 2] } } }
                       attr { key: "strides" value { list { i: [2, 1] } } }
                       attr { key: "paddings" value { list { i: [1, 1] } } })pb",
                  {GradCheckInput{"x", F64, {2, 2, 5, 4}}}},
    GradCheckCase{"avg_pool2d/exclusive_padded",
                  R"pb(type: "avg_pool2d" input: "x" output: "y"
                       attr { key: "kernel_size" value { list { i: [3, 3] } } }
                       attr { key: "strides" value { list { i: [2, 2] } } }
                       attr { key: "paddings" value { list { i: [1, 1] } } }
                       attr { key: "exclusive" value { b: true } })pb",
                  {GradCheckInput{"x", F64, {1, 3, 6, 5}}}},

    // layer_norm
    GradCheckCase{"layer_norm/all_inputs",
                  R"pb(type: "layer_norm" input: ["x", "gamma", "beta"] output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 3, 5}, -2.0, 2.0}, GradCheckInput{"gamma", F64, {5}, 0.5, 1.5},
                   GradCheckInput{"beta", F64, {5}}}},
    GradCheckCase{"layer_norm/only_x_large_epsilon",
                  R"pb(type: "layer_norm" input: ["x", "gamma", "beta"] output: "y"
                       attr { key: "epsilon" value { f: 0.1 } })pb",
                  {GradCheckInput{"x", F64, {4, 6}}, GradCheckInput{"gamma", F64, {6}, 0.5, 1.5, {}, false},
                   GradCheckInput{"beta", F64, {6}, -1.0, 1.0, {}, false}}},
    GradCheckCase{"layer_norm/only_gamma_beta",
                  R"pb(type: "layer_norm" input: ["x", "gamma", "beta"] output: "y")pb",
                  {GradCheckInput{"x", F64, {3, 4}, -1.0, 1.0, {}, false}, GradCheckInput{"gamma", F64, {4}},
                   GradCheckInput{"beta", F64, {4}}}},

    // Losses.
    GradCheckCase{"softmax_cross_entropy/basic",
                  R"pb(type: "softmax_cross_entropy" input: ["logits", "label"] output: "loss")pb",
                  {GradCheckInput{"logits", F64, {4, 5}, -3.0, 3.0},
                   GradCheckInput{"label", I64, {4}, 0.0, 0.0, {0, 4, 2, 2}, /*check_grad=*/false}}},
    GradCheckCase{"softmax_cross_entropy/large_logits",
                  R"pb(type: "softmax_cross_entropy" input: ["logits", "label"] output: "loss")pb",
                  {GradCheckInput{"logits", F64, {3, 4}, 0.0, 0.0,
                                  {500.0, 501.0, 499.5, 500.2, -300.0, -299.0, -301.0, -300.5, 0.1, 0.2, 0.3, 0.4}},
                   GradCheckInput{"label", I64, {3}, 0.0, 0.0, {1, 3, 0}, /*check_grad=*/false}}},
    // A row-aligned LM head's padded logits (passes/pad_vocab): the last 3
    // of 8 columns are padding, whose gradient is zero.
    GradCheckCase{"softmax_cross_entropy/padded_classes",
                  R"pb(type: "softmax_cross_entropy" input: ["logits", "label"] output: "loss"
                       attr { key: "classes" value { i: 5 } })pb",
                  {GradCheckInput{"logits", F64, {4, 8}, -3.0, 3.0},
                   GradCheckInput{"label", I64, {4}, 0.0, 0.0, {0, 4, 2, 2}, /*check_grad=*/false}}},
    GradCheckCase{"mse_loss/both_inputs", R"pb(type: "mse_loss" input: ["pred", "target"] output: "loss")pb",
                  {GradCheckInput{"pred", F64, {3, 4}}, GradCheckInput{"target", F64, {3, 4}}}},
    GradCheckCase{"mse_loss/only_pred", R"pb(type: "mse_loss" input: ["pred", "target"] output: "loss")pb",
                  {GradCheckInput{"pred", F64, {5}}, GradCheckInput{"target", F64, {5}, -1.0, 1.0, {}, false}}},

    // dropout: the harness runs every evaluation under one RunContext, so the mask is fixed.
    GradCheckCase{"dropout/p0.3",
                  R"pb(type: "dropout" input: "x" output: "y" uid: 7
                       attr { key: "p" value { f: 0.3 } })pb",
                  {GradCheckInput{"x", F64, {4, 5}}}},

    // embedding: repeated ids accumulate into the same table row.
    GradCheckCase{"embedding/repeated_ids", R"pb(type: "embedding" input: ["ids", "table"] output: "y")pb",
                  {GradCheckInput{"ids", I64, {2, 3}, 0.0, 0.0, {1, 3, 1, 0, 3, 1}, /*check_grad=*/false},
                   GradCheckInput{"table", F64, {5, 4}}}},
});

}  // namespace
}  // namespace strata
