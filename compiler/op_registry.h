#ifndef STRATA_COMPILER_OP_REGISTRY_H_
#define STRATA_COMPILER_OP_REGISTRY_H_

// One registry entry per op: its schema (inputs, outputs, attrs with types and
// defaults), shape and dtype inference, cost function and gradient maker. Kernels live in
// kernels/<device>/ and register separately (runtime/kernel.h).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/program.pb.h"
#include "proto/shape_rules.h"
#include "proto/types.h"

namespace strata {

enum class AttrType { kInt, kFloat, kString, kBool, kInts, kFloats, kStrings };
std::string AttrTypeName(AttrType type);

struct AttrSpec {
  std::string name;
  AttrType type;
  std::optional<AttrValue> default_value;  // absent: the attr is required
};

struct ArgSpec {
  std::string name;
  bool variadic = false;  // one or more tensors (only as the last argument)
  bool optional = false;  // zero or one tensor (only as the last input), as Paddle's SkipUpdate
};

struct OpSchema;

// Shape and dtype inference for one op. Input types are known; the function
// sets every output type or returns an error (the caller adds the op's
// location). -1 in a shape is the batch dimension and propagates like a size.
// Errors name inputs by their schema role ('a', 'x'); InferOutputTypes appends
// which var each role is bound to, so no shape function needs to.
class ShapeContext {
 public:
  ShapeContext(const Op& op, std::vector<TensorType> inputs, const OpSchema* schema = nullptr)
      : op_(op), schema_(schema), inputs_(std::move(inputs)), outputs_(op.output_size()) {}
  const Op& op() const { return op_; }
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  const TensorType& input(int i) const { return inputs_[i]; }
  const std::vector<TensorType>& inputs() const { return inputs_; }
  // The schema's role of input i ("a", "xs[2]"), or "#i" without a schema.
  std::string input_role(int i) const;
  void set_output(int i, TensorType t) { outputs_[i] = std::move(t); }
  const std::vector<TensorType>& outputs() const { return outputs_; }

  // Attr values (defaults already filled in by validation).
  int64_t attr_int(const std::string& name) const;
  double attr_float(const std::string& name) const;
  bool attr_bool(const std::string& name) const;
  std::string attr_string(const std::string& name) const;
  std::vector<int64_t> attr_ints(const std::string& name) const;

 private:
  const Op& op_;
  const OpSchema* schema_;
  std::vector<TensorType> inputs_;
  std::vector<TensorType> outputs_;
};

using ShapeFn = std::function<absl::Status(ShapeContext&)>;

// What an op's cost function sees: the op (its attrs, defaults filled in) and
// the types of its inputs and outputs, as many as the schema names, with the
// batch dimension resolved: every dim is a size.
class CostContext {
 public:
  CostContext(const Op& op, std::vector<TensorType> inputs, std::vector<TensorType> outputs)
      : op_(op), inputs_(std::move(inputs)), outputs_(std::move(outputs)) {}
  const Op& op() const { return op_; }
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  const TensorType& input(int i) const { return inputs_[i]; }
  const TensorType& output(int i) const { return outputs_[i]; }

 private:
  const Op& op_;
  std::vector<TensorType> inputs_;
  std::vector<TensorType> outputs_;
};

// The op's floating-point operations for one run (2 per multiply-add); the
// cost model (analysis/cost_model.h) adds the bytes it reads and writes. An op
// without one counts 0 FLOPs: elementwise ops cost their bytes.
using CostFn = std::function<double(const CostContext&)>;
// Elements of a type whose dims are all sizes, as a double: a product of large
// dims fits, as it might not in an int64.
double ElementCount(const TensorType& type);

// Handed to a gradient maker: names the forward op's vars and their gradients
// and appends backward ops. Emitted ops inherit the forward op's stage, device
// and uid, and get role BACKWARD.
class GradBuilder {
 public:
  virtual ~GradBuilder() = default;
  virtual const Op& op() const = 0;
  const std::string& input(int i) const { return op().input(i); }
  const std::string& output(int i) const { return op().output(i); }
  virtual const TensorType& input_type(int i) const = 0;
  virtual const TensorType& output_type(int i) const = 0;
  // Name of dL/d(output i), or "" when no gradient flows into that output.
  virtual std::string output_grad(int i) const = 0;
  // Whether dL/d(input i) is wanted (it leads to a trainable parameter).
  virtual bool needs_input_grad(int i) const = 0;
  // Name the gradient maker writes dL/d(input i) to. Only when needs_input_grad(i).
  virtual std::string input_grad(int i) = 0;
  // dL/d(input i) is exactly the existing var `grad` (a gradient passed
  // through unchanged, as by add): the var is shared, no op is emitted (the
  // compiler still copies it when `grad` is made on another pipeline stage).
  // Instead of input_grad(i), only when needs_input_grad(i).
  virtual void PassGrad(int i, const std::string& grad) = 0;
  // A fresh intermediate var name.
  virtual std::string Temp(const std::string& hint) = 0;
  // Appends a backward op. Attrs not given take their schema defaults.
  virtual void Emit(const std::string& type, std::vector<std::string> inputs, std::vector<std::string> outputs,
                    std::map<std::string, AttrValue> attrs = {}) = 0;
  // Copies of the forward op's attrs, for grad ops that take the same ones.
  std::map<std::string, AttrValue> ForwardAttrs() const {
    return std::map<std::string, AttrValue>(op().attr().begin(), op().attr().end());
  }
};

using GradFn = std::function<absl::Status(GradBuilder&)>;

struct OpSchema {
  std::string type;
  std::vector<ArgSpec> inputs;
  std::vector<ArgSpec> outputs;
  std::vector<AttrSpec> attrs;
  ShapeFn shape_fn;
  CostFn cost_fn;          // empty: 0 FLOPs (the op costs only its bytes)
  GradFn grad_fn;          // empty: not differentiable
  bool differentiable = false;
  bool stateful = false;   // writes persistent vars in place (optimizer updates)
  bool output_aliases_input = false;  // output 0 shares input 0's buffer (reshape, identity)
  // Acts once per optimizer update: in the backward of the last micro-batch
  // of a step the optimizer runs at the end of (bucket_allreduce); in the
  // other backward actions its kernel does nothing. The schedule verifier
  // and the memory plan count it there only.
  bool once_per_update = false;
  // Placed by a pass (transfers, collectives, host copies), never by a user:
  // they take fields only the compiler fills in (channels, groups, host
  // memory), so a program that writes one is refused at validation.
  bool compiler_only = false;
  std::string doc;

  const AttrSpec* FindAttr(const std::string& name) const;
};

class OpRegistry {
 public:
  static OpRegistry& Global();
  void Register(OpSchema schema);
  const OpSchema* Find(const std::string& type) const;
  std::vector<std::string> Names() const;
  // Up to three registered names closest to `type` (edit distance).
  std::vector<std::string> Suggest(const std::string& type) const;

 private:
  std::map<std::string, OpSchema> schemas_;
};

// Declarative schema builder, registered at static-initialization time:
//
//   STRATA_REGISTER_OP(OpDef("relu").Input("x").Output("y")
//       .Shape(SameAsInput(0)).Grad(ReluGrad).Doc("max(x, 0)"));
class OpDef {
 public:
  explicit OpDef(std::string type) { schema_.type = std::move(type); }
  OpDef& Input(std::string name) { schema_.inputs.push_back({std::move(name), false}); return *this; }
  OpDef& VariadicInput(std::string name) { schema_.inputs.push_back({std::move(name), true}); return *this; }
  // A last input an op may be given or not (ctx.num_inputs() tells).
  OpDef& OptionalInput(std::string name) { schema_.inputs.push_back({std::move(name), false, true}); return *this; }
  OpDef& Output(std::string name) { schema_.outputs.push_back({std::move(name), false}); return *this; }
  // A last output an op may write or not (ctx.num_outputs() tells).
  OpDef& OptionalOutput(std::string name) { schema_.outputs.push_back({std::move(name), false, true}); return *this; }
  OpDef& VariadicOutput(std::string name) { schema_.outputs.push_back({std::move(name), true}); return *this; }
  OpDef& Attr(std::string name, AttrType type);  // required
  OpDef& Attr(std::string name, int64_t default_value);
  OpDef& Attr(std::string name, int default_value) { return Attr(std::move(name), static_cast<int64_t>(default_value)); }
  OpDef& Attr(std::string name, double default_value);
  OpDef& Attr(std::string name, bool default_value);
  OpDef& Attr(std::string name, const char* default_value);
  OpDef& Attr(std::string name, std::vector<int64_t> default_value);
  OpDef& Shape(ShapeFn fn) { schema_.shape_fn = std::move(fn); return *this; }
  OpDef& Cost(CostFn fn) { schema_.cost_fn = std::move(fn); return *this; }
  OpDef& Grad(GradFn fn) { schema_.grad_fn = std::move(fn); schema_.differentiable = true; return *this; }
  OpDef& NotDifferentiable() { schema_.differentiable = false; return *this; }
  OpDef& Stateful() { schema_.stateful = true; return *this; }
  // Output 0 shares input 0's buffer; the memory plan counts no new bytes for it.
  OpDef& AliasesInput() { schema_.output_aliases_input = true; return *this; }
  OpDef& OncePerUpdate() { schema_.once_per_update = true; return *this; }
  OpDef& CompilerOnly() { schema_.compiler_only = true; return *this; }
  OpDef& Doc(std::string doc) { schema_.doc = std::move(doc); return *this; }
  OpSchema Build() && { return std::move(schema_); }

 private:
  OpSchema schema_;
};

struct OpRegistrar {
  explicit OpRegistrar(OpDef def) { OpRegistry::Global().Register(std::move(def).Build()); }
};

#define STRATA_OP_CONCAT_INNER(a, b) a##b
#define STRATA_OP_CONCAT(a, b) STRATA_OP_CONCAT_INNER(a, b)
#define STRATA_REGISTER_OP(def) \
  static ::strata::OpRegistrar STRATA_OP_CONCAT(strata_op_registrar_, __LINE__)(def)

// Checks the op's input/output counts and attrs against its schema (unknown
// attrs, wrong types, missing required ones) and fills in defaults. Messages
// name the attr or argument but not the op; callers prefix the op's location.
absl::Status CanonicalizeOp(const OpSchema& schema, Op* op);
// The input and output counts alone: the part of CanonicalizeOp the verifier
// repeats after every pass, so a shape function never reads past an op's inputs.
absl::Status CheckArity(const OpSchema& schema, const Op& op);
// Runs the schema's shape function over the op's input types, after checking
// that every output got a type. A shape function's error keeps its code and
// message, followed by DescribeInputs: "inner dims differ: ... (where input
// 'a' is var 'x' F32[-1, 784] and input 'b' is var 'w' F32[256, 128])".
absl::StatusOr<std::vector<TensorType>> InferOutputTypes(const OpSchema& schema, const Op& op,
                                                         std::vector<TensorType> input_types);
// The schema's role of the op's input i: "a", or "xs[2]" for the third tensor
// of the variadic argument xs. Given the op's input count, an input among
// several trailing optional ones not all given is named by the candidates,
// "grad_scale or found_inf" (the op's attrs say which it is).
std::string InputRole(const OpSchema& schema, int i, int count = -1);
// Binds every input role to the op's var and its type, for messages about
// roles: "input 'a' is var 'x' F32[-1, 784] and input 'b' is var 'w' F32[256, 128]"
// (the first kMaxDescribedInputs, then how many more). Empty when the op
// names no var for some input (ops built by hand in tests).
inline constexpr int kMaxDescribedInputs = 8;
std::string DescribeInputs(const OpSchema& schema, const Op& op, absl::Span<const TensorType> input_types);

// Attr value helpers for gradient makers.
AttrValue IntAttr(int64_t v);
AttrValue FloatAttr(double v);
AttrValue BoolAttr(bool v);
AttrValue StringAttr(const std::string& v);
AttrValue IntsAttr(absl::Span<const int64_t> v);

// Shared shape functions.
ShapeFn SameAsInput(int i);  // output 0 has input i's type
// Numpy broadcasting of all inputs into output 0 (BroadcastShapes,
// proto/shape_rules.h); dtypes must agree.
ShapeFn BroadcastInputs();
// Errors if two inputs' dtypes differ.
absl::Status SameDtype(const ShapeContext& ctx, int a, int b);
absl::Status ExpectRank(const ShapeContext& ctx, int input, int rank);
absl::Status ExpectFloating(const ShapeContext& ctx, int input);

}  // namespace strata

#endif  // STRATA_COMPILER_OP_REGISTRY_H_
