// Gradient checks for the shape ops (compiler/ops/shape_ops.cc). Shape ops
// are linear, so any input values work; ranges are the harness defaults.

#include "compiler/testing/grad_check.h"

namespace strata {
namespace {

STRATA_REGISTER_GRAD_CHECKS({
    GradCheckCase{"reshape/copy_and_infer",
                  R"pb(type: "reshape" input: "x" output: "y"
                       attr { key: "shape" value { list { i: [0, -1, 2] } } })pb",
                  {{"x", F64, {2, 3, 4}}}},
    GradCheckCase{"reshape/to_vector",
                  R"pb(type: "reshape" input: "x" output: "y"
                       attr { key: "shape" value { list { i: [-1] } } })pb",
                  {{"x", F64, {3, 4}}}},
    GradCheckCase{"flatten/default_axes",
                  R"pb(type: "flatten" input: "x" output: "y")pb",
                  {{"x", F64, {2, 3, 2, 2}}}},
    GradCheckCase{"flatten/middle_axes",
                  R"pb(type: "flatten" input: "x" output: "y"
                       attr { key: "start_axis" value { i: 1 } }
                       attr { key: "end_axis" value { i: -2 } })pb",
                  {{"x", F64, {2, 3, 4, 2}}}},
    GradCheckCase{"transpose/matrix",
                  R"pb(type: "transpose" input: "x" output: "y"
                       attr { key: "perm" value { list { i: [1, 0] } } })pb",
                  {{"x", F64, {3, 5}}}},
    GradCheckCase{"transpose/rank4_rotate",
                  R"pb(type: "transpose" input: "x" output: "y"
                       attr { key: "perm" value { list { i: [2, 0, 3, 1] } } })pb",
                  {{"x", F64, {2, 3, 4, 2}}}},
    GradCheckCase{"concat/axis1_three_inputs",
                  R"pb(type: "concat" input: ["a", "b", "c"] output: "y"
                       attr { key: "axis" value { i: 1 } })pb",
                  {{"a", F64, {2, 3}}, {"b", F64, {2, 1}}, {"c", F64, {2, 2}}}},
    GradCheckCase{"concat/negative_axis_one_input_frozen",
                  R"pb(type: "concat" input: ["a", "b"] output: "y"
                       attr { key: "axis" value { i: -3 } })pb",
                  {{"a", F64, {1, 2, 3}}, {"b", F64, {2, 2, 3}, -1, 1, {}, /*check_grad=*/false}}},
    GradCheckCase{"concat/same_input_twice",
                  R"pb(type: "concat" input: ["x", "x"] output: "y")pb",
                  {{"x", F64, {2, 3}}}},
    GradCheckCase{"split/equal_parts",
                  R"pb(type: "split" input: "x" output: ["y0", "y1", "y2"])pb",
                  {{"x", F64, {6, 4}}}},
    GradCheckCase{"split/sections_with_rest",
                  R"pb(type: "split" input: "x" output: ["y0", "y1", "y2"]
                       attr { key: "axis" value { i: 1 } }
                       attr { key: "sections" value { list { i: [2, -1, 1] } } })pb",
                  {{"x", F64, {2, 7}}}},
    GradCheckCase{"split/middle_output_without_grad",
                  R"pb(type: "split" input: "x" output: ["y0", "y1", "y2"]
                       attr { key: "axis" value { i: 1 } }
                       attr { key: "sections" value { list { i: [1, 2, 2] } } })pb",
                  {{"x", F64, {3, 5, 2}}},
                  1e-6,
                  /*outputs_without_grad=*/{1}},
    GradCheckCase{"split/only_middle_output_has_grad",
                  R"pb(type: "split" input: "x" output: ["y0", "y1", "y2"]
                       attr { key: "axis" value { i: -1 } })pb",
                  {{"x", F64, {2, 6}}},
                  1e-6,
                  /*outputs_without_grad=*/{0, 2}},
    GradCheckCase{"slice/two_axes_negative_start_clamped_end",
                  R"pb(type: "slice" input: "x" output: "y"
                       attr { key: "axes" value { list { i: [0, 1] } } }
                       attr { key: "starts" value { list { i: [1, -3] } } }
                       attr { key: "ends" value { list { i: [3, 100] } } })pb",
                  {{"x", F64, {4, 5}}}},
    GradCheckCase{"slice/negative_axis_and_end",
                  R"pb(type: "slice" input: "x" output: "y"
                       attr { key: "axes" value { list { i: [-1] } } }
                       attr { key: "starts" value { list { i: [0] } } }
                       attr { key: "ends" value { list { i: [-1] } } })pb",
                  {{"x", F64, {2, 3, 4}}}},
    GradCheckCase{"pad/rows",
                  R"pb(type: "pad" input: "x" output: "y"
                       attr { key: "after" value { i: 3 } })pb",
                  {{"x", F64, {5, 4}}}},
    GradCheckCase{"pad/last_axis",
                  R"pb(type: "pad" input: "x" output: "y"
                       attr { key: "axis" value { i: -1 } }
                       attr { key: "after" value { i: 2 } })pb",
                  {{"x", F64, {2, 3, 4}}}},
    GradCheckCase{"slice/empty_window",
                  R"pb(type: "slice" input: "x" output: "y"
                       attr { key: "axes" value { list { i: [1] } } }
                       attr { key: "starts" value { list { i: [3] } } }
                       attr { key: "ends" value { list { i: [1] } } })pb",
                  {{"x", F64, {2, 4}}}},
});

}  // namespace
}  // namespace strata
