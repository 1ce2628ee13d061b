// Gradient checks for the optimizer family: only sum_squares (the global-norm
// reduction of gradient clipping) is differentiable.

#include "compiler/testing/grad_check.h"

namespace strata {
namespace {

STRATA_REGISTER_GRAD_CHECKS({
    GradCheckCase{"sum_squares/one_input",
                  R"pb(type: "sum_squares" input: "x" output: "y")pb",
                  {GradCheckInput{"x", F64, {3, 4}}}},
    GradCheckCase{"sum_squares/mixed_shapes",
                  R"pb(type: "sum_squares" input: ["a", "b", "c"] output: "y")pb",
                  {GradCheckInput{"a", F64, {2, 3}, -2.0, 2.0},
                   GradCheckInput{"b", F64, {}, 0.0, 0.0, {0.75}},
                   GradCheckInput{"c", F64, {5}, -1.0, 1.0}}},
    // No gradient wanted for one input: the maker must skip it.
    GradCheckCase{"sum_squares/partial_grads",
                  R"pb(type: "sum_squares" input: ["a", "b"] output: "y")pb",
                  {GradCheckInput{"a", F64, {4}},
                   GradCheckInput{"b", F64, {2, 2}, -1.0, 1.0, {}, /*check_grad=*/false}}},
});

}  // namespace
}  // namespace strata
