// Gradient checks for the math family: broadcasting arithmetic, activations,
// softmax, reductions and utility ops. Inputs stay away from kinks (relu at 0)
// and singularities (log, sqrt and div near 0).

#include "compiler/testing/grad_check.h"

namespace strata {
namespace {

STRATA_REGISTER_GRAD_CHECKS({
    // Binary arithmetic, same shape and broadcast both ways.
    GradCheckCase{"add/same_shape", R"pb(type: "add" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {2, 3}}, GradCheckInput{"y", F64, {2, 3}}}},
    GradCheckCase{"add/row_bias", R"pb(type: "add" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {3, 4}}, GradCheckInput{"y", F64, {4}}}},
    GradCheckCase{"add/both_broadcast", R"pb(type: "add" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {2, 1, 4}}, GradCheckInput{"y", F64, {3, 1}}}},
    GradCheckCase{"add/same_var_twice", R"pb(type: "add" input: ["x", "x"] output: "z")pb",
                  {GradCheckInput{"x", F64, {3}}}},
    GradCheckCase{"sub/row_bias", R"pb(type: "sub" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {3, 4}}, GradCheckInput{"y", F64, {4}}}},
    GradCheckCase{"sub/outer", R"pb(type: "sub" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {3, 1}}, GradCheckInput{"y", F64, {1, 4}}}},
    GradCheckCase{"mul/same_shape", R"pb(type: "mul" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {2, 3}}, GradCheckInput{"y", F64, {2, 3}}}},
    GradCheckCase{"mul/broadcast_middle", R"pb(type: "mul" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {2, 3, 4}}, GradCheckInput{"y", F64, {3, 1}}}},
    GradCheckCase{"mul/only_y", R"pb(type: "mul" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {2, 3}, -1.0, 1.0, {}, /*check_grad=*/false},
                   GradCheckInput{"y", F64, {3}}}},
    GradCheckCase{"div/same_shape", R"pb(type: "div" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {2, 3}}, GradCheckInput{"y", F64, {2, 3}, 0.5, 2.0}}},
    GradCheckCase{"div/scalar_divisor", R"pb(type: "div" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {3, 4}}, GradCheckInput{"y", F64, {}, 0.5, 2.0}}},
    GradCheckCase{"div/scalar_dividend", R"pb(type: "div" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {}}, GradCheckInput{"y", F64, {2, 3}, 0.5, 2.0}}},
    GradCheckCase{"div/broadcast_both", R"pb(type: "div" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {4}}, GradCheckInput{"y", F64, {3, 1}, -2.0, -0.5}}},
    GradCheckCase{"div/only_x", R"pb(type: "div" input: ["x", "y"] output: "z")pb",
                  {GradCheckInput{"x", F64, {2, 3}},
                   GradCheckInput{"y", F64, {3}, 0.5, 2.0, {}, /*check_grad=*/false}}},

    GradCheckCase{"scale/attrs",
                  R"pb(type: "scale" input: "x" output: "y"
                       attr { key: "scale" value { f: 2.5 } }
                       attr { key: "bias" value { f: -0.5 } })pb",
                  {GradCheckInput{"x", F64, {3, 4}}}},

    // Activations; relu's values keep clear of the kink at 0.
    GradCheckCase{"relu/away_from_zero", R"pb(type: "relu" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 4}, 0.0, 0.0, {-1.5, 0.3, 2.0, -0.2, 0.7, -0.9, 1.1, 0.05}}}},
    GradCheckCase{"gelu/wide_range", R"pb(type: "gelu" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {3, 4}, -4.0, 4.0}}},
    GradCheckCase{"gelu/tanh_form", R"pb(type: "gelu" input: "x" output: "y"
                                         attr { key: "approximate" value { s: "tanh" } })pb",
                  {GradCheckInput{"x", F64, {3, 4}, -4.0, 4.0}}},
    GradCheckCase{"gelu/tanh_form_near_zero", R"pb(type: "gelu" input: "x" output: "y"
                                                   attr { key: "approximate" value { s: "tanh" } })pb",
                  {GradCheckInput{"x", F64, {2, 4}, 0.0, 0.0, {-0.5, -0.1, -0.01, 0.0, 0.02, 0.3, 1.2, -2.5}}}},
    GradCheckCase{"tanh/wide_range", R"pb(type: "tanh" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {3, 4}, -3.0, 3.0}}},
    GradCheckCase{"sigmoid/wide_range", R"pb(type: "sigmoid" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {3, 4}, -6.0, 6.0}}},
    GradCheckCase{"exp/basic", R"pb(type: "exp" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 3}, -2.0, 2.0}}},
    GradCheckCase{"log/positive", R"pb(type: "log" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 3}, 0.5, 3.0}}},
    GradCheckCase{"sqrt/positive", R"pb(type: "sqrt" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 3}, 0.5, 3.0}}},
    GradCheckCase{"square/basic", R"pb(type: "square" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 3}, -2.0, 2.0}}},
    GradCheckCase{"neg/basic", R"pb(type: "neg" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {5}}}},

    // Softmax over the last axis, the first axis and a middle axis.
    GradCheckCase{"softmax/last_axis", R"pb(type: "softmax" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 5}, -2.0, 2.0}}},
    GradCheckCase{"softmax/axis0",
                  R"pb(type: "softmax" input: "x" output: "y" attr { key: "axis" value { i: 0 } })pb",
                  {GradCheckInput{"x", F64, {3, 4}, -2.0, 2.0}}},
    GradCheckCase{"softmax/middle_axis",
                  R"pb(type: "softmax" input: "x" output: "y" attr { key: "axis" value { i: 1 } })pb",
                  {GradCheckInput{"x", F64, {2, 3, 4}, -2.0, 2.0}}},
    GradCheckCase{"log_softmax/last_axis",
                  R"pb(type: "log_softmax" input: "x" output: "y" attr { key: "axis" value { i: -1 } })pb",
                  {GradCheckInput{"x", F64, {3, 4}, -2.0, 2.0}}},
    GradCheckCase{"log_softmax/axis0",
                  R"pb(type: "log_softmax" input: "x" output: "y" attr { key: "axis" value { i: 0 } })pb",
                  {GradCheckInput{"x", F64, {3, 2, 2}, -2.0, 2.0}}},

    // Reductions: all dims, single axes, several (non-adjacent) axes, keepdim.
    GradCheckCase{"reduce_sum/all", R"pb(type: "reduce_sum" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 3, 4}}}},
    GradCheckCase{"reduce_sum/last_keepdim",
                  R"pb(type: "reduce_sum" input: "x" output: "y"
                       attr { key: "axis" value { list { i: [-1] } } }
                       attr { key: "keepdim" value { b: true } })pb",
                  {GradCheckInput{"x", F64, {3, 4}}}},
    GradCheckCase{"reduce_sum/axis0",
                  R"pb(type: "reduce_sum" input: "x" output: "y"
                       attr { key: "axis" value { list { i: [0] } } })pb",
                  {GradCheckInput{"x", F64, {3, 4}}}},
    GradCheckCase{"reduce_mean/all", R"pb(type: "reduce_mean" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {2, 3, 4}}}},
    GradCheckCase{"reduce_mean/axes_0_2",
                  R"pb(type: "reduce_mean" input: "x" output: "y"
                       attr { key: "axis" value { list { i: [0, 2] } } })pb",
                  {GradCheckInput{"x", F64, {2, 3, 4}}}},
    GradCheckCase{"reduce_mean/axes_0_2_keepdim",
                  R"pb(type: "reduce_mean" input: "x" output: "y"
                       attr { key: "axis" value { list { i: [0, -1] } } }
                       attr { key: "keepdim" value { b: true } })pb",
                  {GradCheckInput{"x", F64, {2, 3, 4}}}},
    GradCheckCase{"reduce_mean/middle_axis",
                  R"pb(type: "reduce_mean" input: "x" output: "y"
                       attr { key: "axis" value { list { i: [1] } } })pb",
                  {GradCheckInput{"x", F64, {2, 3, 4}}}},

    // Utility ops.
    GradCheckCase{"cast/f64_to_f64",
                  R"pb(type: "cast" input: "x" output: "y" attr { key: "dtype" value { s: "F64" } })pb",
                  {GradCheckInput{"x", F64, {2, 3}}}},
    GradCheckCase{"add_n/three_inputs", R"pb(type: "add_n" input: ["a", "b", "c"] output: "y")pb",
                  {GradCheckInput{"a", F64, {2, 3}}, GradCheckInput{"b", F64, {2, 3}},
                   GradCheckInput{"c", F64, {2, 3}}}},
    GradCheckCase{"add_n/one_input", R"pb(type: "add_n" input: ["a"] output: "y")pb",
                  {GradCheckInput{"a", F64, {4}}}},
    GradCheckCase{"identity/basic", R"pb(type: "identity" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {3, 2}}}},
});

}  // namespace
}  // namespace strata
