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

#define STRATA_GC_CONCAT_INNER(a, b) a##b
#define STRATA_GC_CONCAT(a, b) STRATA_GC_CONCAT_INNER(a, b)
// STRATA_REGISTER_GRAD_CHECKS({ GradCheckCase{...}, ... });
#define STRATA_REGISTER_GRAD_CHECKS(...) \
  static ::strata::GradCheckRegistrar STRATA_GC_CONCAT(strata_grad_checks_, __LINE__)(__VA_ARGS__)

}  // namespace strata

#endif  // STRATA_COMPILER_TESTING_GRAD_CHECK_H_
