#ifndef STRATA_COMPILER_TESTING_OP_TEST_UTIL_H_
#define STRATA_COMPILER_TESTING_OP_TEST_UTIL_H_

// Runs ops on concrete tensors the way the executor will: schema lookup,
// attr defaults, the shape function, then the registered CPU kernel. For
// kernel tests and gradient checks; not for production code (ParseOp aborts).

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "proto/program.pb.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {

// Parses one op in program text form (the body of `op { ... }`), e.g.
//   ParseOp(R"pb(type: "relu" input: "x" output: "y")pb")
// CHECK-fails on a malformed literal: test code only.
Op ParseOp(const std::string& text);

// Runs `ops` in order. Each op reads its inputs from `env` by var name and
// writes its outputs there. Before running, the op is canonicalized (attr
// defaults), its shape function is run on the concrete input types, and the
// kernel's outputs are checked against the inferred types. Errors name the op.
absl::Status RunOps(const std::vector<Op>& ops, std::map<std::string, Tensor>* env, const RunContext& run = {});
absl::Status RunOp(const Op& op, std::map<std::string, Tensor>* env, const RunContext& run = {});

// Runs only `op`'s kernel on `env`'s tensors (attr defaults filled in), as a
// plan the compiler never checked would: no shape function first, outputs
// dropped. Returns the kernel's own status unprefixed, so tests can check that
// a kernel refuses what its schema refuses, with the schema's words.
absl::Status RunKernelOnly(const Op& op, const std::map<std::string, Tensor>& env, const RunContext& run = {});

// The backward ops that `op`'s gradient maker emits. `types` maps (at least)
// the op's input and output var names to their types. dL/d(output i) is named
// "<output>@grad" when output_has_grad[i] (empty: every floating output has
// one), else "" (no gradient flows into it). The name the maker writes
// dL/d(input i) to is returned in (*input_grad_names)[i] ("" when not
// needs_input_grad[i]); an input used twice gets one name per position.
// Emitted ops are canonicalized and copy the forward op's uid, stage and device.
absl::StatusOr<std::vector<Op>> MakeGradOps(const Op& op, const std::map<std::string, TensorType>& types,
                                            const std::vector<bool>& needs_input_grad,
                                            std::vector<std::string>* input_grad_names,
                                            const std::vector<bool>& output_has_grad = {});

// A tensor of `dtype` and `shape` holding `values` (converted; row-major).
// CHECK-fails if the count does not match the shape.
Tensor MakeTensor(DataType dtype, Shape shape, const std::vector<double>& values);

// The output types of the op in `op_text` (its schema's defaults filled in)
// for `inputs`, straight through the registry: what shape tests check.
absl::StatusOr<std::vector<TensorType>> InferTypes(const std::string& op_text, std::vector<TensorType> inputs);
// A tensor's elements as doubles, whatever its dtype.
std::vector<double> TensorValues(const Tensor& t);
// The concrete type of a tensor.
TensorType TypeOf(const Tensor& t);

// Same dtype, same shape, and every element within
// |a - e| <= rel_tol * max(|a|, |e|, 1). Integers compare exactly when rel_tol is 0.
::testing::AssertionResult TensorNear(const Tensor& actual, const Tensor& expected, double rel_tol);
// Same as TensorNear against values of the given shape (actual's dtype).
::testing::AssertionResult TensorNear(const Tensor& actual, const std::vector<int64_t>& shape,
                                      const std::vector<double>& expected, double rel_tol);

// Same dtype, same shape and the same bytes (the first differing element
// named otherwise).
::testing::AssertionResult SameBits(const Tensor& got, const Tensor& want);

// The same values in another dtype (exact where representable, else rounded
// to nearest even).
Tensor As(DataType dtype, const Tensor& t);

#define EXPECT_TENSOR_NEAR(actual, expected, rel_tol) \
  EXPECT_TRUE(::strata::TensorNear((actual), (expected), (rel_tol)))

}  // namespace strata

#endif  // STRATA_COMPILER_TESTING_OP_TEST_UTIL_H_
