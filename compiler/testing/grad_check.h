#ifndef STRATA_COMPILER_TESTING_GRAD_CHECK_H_
#define STRATA_COMPILER_TESTING_GRAD_CHECK_H_

// Finite-difference gradient checks. Every differentiable op registers at
// least one case (in compiler/ops/<family>_gradcheck.cc); the registry-walking
// test compiler/ops/gradient_check_test.cc fails for any differentiable op
// without one, so no op can be added without a checked gradient.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/program.pb.h"

namespace strata {

struct GradCheckInput {
  std::string name;
  DataType dtype = F64;          // F64 for real inputs; I64 for ids and labels
  std::vector<int64_t> shape;
  double low = -1.0, high = 1.0; // uniform range (integers: [low, high) )
  std::vector<double> values;    // explicit values instead of random ones
  bool check_grad = true;        // false: no gradient wanted (labels, ids)
};

struct GradCheckCase {
  std::string label;   // e.g. "matmul/transpose_b"
  std::string op_text; // the op in program text form: type: "matmul" input: ["a", "b"] output: ["y"] ...
  std::vector<GradCheckInput> inputs;
  double tolerance = 1e-6;  // max relative error
  // Outputs that get no gradient (the maker sees output_grad(i) == ""), to
  // check the zero-gradient path of multi-output ops.
  std::vector<int> outputs_without_grad = {};
};

class GradCheckRegistry {
 public:
  static GradCheckRegistry& Global();
  void Add(GradCheckCase c) { cases_.push_back(std::move(c)); }
  const std::vector<GradCheckCase>& cases() const { return cases_; }

 private:
  std::vector<GradCheckCase> cases_;
};

struct GradCheckRegistrar {
  explicit GradCheckRegistrar(std::vector<GradCheckCase> cases) {
    for (auto& c : cases) GradCheckRegistry::Global().Add(std::move(c));
  }
};

// Runs one case: the op forward on the case's inputs, then the ops its
// gradient maker emits with dL/d(output i) = R_i for the objective
// L = sum_i sum(output_i * R_i) (R_i fixed random weights on every floating
// output), and compares each checked input's analytic gradient with central
// finite differences of L in float64. Per element the error is
// |analytic - numeric| / max(|analytic|, |numeric|, 1): relative for
// gradients of magnitude 1 or more, absolute below (where the finite
// difference's own rounding noise, about 1e-10 * |L| here, is absolute).
// The status names the case, input, element, both values and the error.
absl::Status CheckGradient(const GradCheckCase& c);

#define STRATA_GC_CONCAT_INNER(a, b) a##b
#define STRATA_GC_CONCAT(a, b) STRATA_GC_CONCAT_INNER(a, b)
// STRATA_REGISTER_GRAD_CHECKS({ GradCheckCase{...}, ... });
#define STRATA_REGISTER_GRAD_CHECKS(...) \
  static ::strata::GradCheckRegistrar STRATA_GC_CONCAT(strata_grad_checks_, __LINE__)(__VA_ARGS__)

}  // namespace strata

#endif  // STRATA_COMPILER_TESTING_GRAD_CHECK_H_
