#include "compiler/testing/op_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"
#include "google/protobuf/text_format.h"

namespace strata {

Op ParseOp(const std::string& text) {
  Op op;
  if (!google::protobuf::TextFormat::ParseFromString(text, &op)) {
    std::cerr << "ParseOp: malformed op literal: " << text << std::endl;
    std::abort();
  }
  return op;
}

namespace {

std::string OpLabel(const Op& op) {
  std::string label = absl::StrCat("op '", op.type(), "'");
  if (!op.name().empty()) absl::StrAppend(&label, " (", op.name(), ")");
  if (op.output_size() > 0) absl::StrAppend(&label, " -> ", op.output(0));
  return label;
}

absl::Status Prefixed(const std::string& prefix, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}

std::string DtypeList(const std::vector<DataType>& dtypes) {
  if (dtypes.empty()) return "none";
  std::vector<std::string> names;
  for (DataType d : dtypes) names.push_back(DataTypeName(d));
  return absl::StrJoin(names, ", ");
}

}  // namespace

absl::Status RunOp(const Op& forward, std::map<std::string, Tensor>* env, const RunContext& run) {
  const OpSchema* schema = OpRegistry::Global().Find(forward.type());
  if (schema == nullptr) return absl::NotFoundError(absl::StrCat("unknown op type '", forward.type(), "'"));
  Op op = forward;
  const std::string label = OpLabel(op);
  if (absl::Status s = CanonicalizeOp(*schema, &op); !s.ok()) return Prefixed(label, s);

  std::vector<const Tensor*> inputs;
  std::vector<TensorType> input_types;
  for (int i = 0; i < op.input_size(); ++i) {
    auto it = env->find(op.input(i));
    if (it == env->end() || !it->second.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": input ", i, " '", op.input(i), "' is not defined"));
    }
    inputs.push_back(&it->second);
    input_types.push_back(TypeOf(it->second));
  }
  auto types = InferOutputTypes(*schema, op, input_types);
  if (!types.ok()) {
    std::vector<std::string> in;
    for (const auto& t : input_types) in.push_back(t.ToString());
    return Prefixed(absl::StrCat(label, " on inputs (", absl::StrJoin(in, ", "), ")"), types.status());
  }

  KernelDef def{&op, input_types, *types};
  DataType dtype = KernelDtype(def);
  const DeviceKind device = run.device->kind();
  const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), device, dtype);
  if (factory == nullptr) {
    return absl::NotFoundError(absl::StrCat(label, ": no ", DeviceKindLabel(device), " kernel for dtype ",
                                            DataTypeName(dtype), " (registered: ",
                                            DtypeList(KernelRegistry::Global().DtypesFor(op.type(), device)), ")"));
  }
  auto kernel = (*factory)(def);
  if (!kernel.ok()) return Prefixed(absl::StrCat(label, ": building the kernel"), kernel.status());

  std::vector<Tensor> outputs(op.output_size());
  KernelContext ctx(&run, absl::MakeConstSpan(inputs), absl::MakeSpan(outputs));
  if (absl::Status s = (*kernel)->Compute(ctx); !s.ok()) return Prefixed(label, s);

  // The kernel must produce what the shape function promised.
  for (int i = 0; i < op.output_size(); ++i) {
    const Tensor& t = outputs[i];
    const TensorType& want = (*types)[i];
    if (!t.defined()) {
      return absl::InternalError(absl::StrCat(label, ": kernel left output ", i, " '", op.output(i), "' unset"));
    }
    bool match = t.dtype() == want.dtype && t.rank() == static_cast<int>(want.shape.size());
    for (int d = 0; match && d < t.rank(); ++d) match = want.shape[d] < 0 || want.shape[d] == t.dim(d);
    if (!match) {
      return absl::InternalError(absl::StrCat(label, ": kernel output ", i, " '", op.output(i), "' is ",
                                              TypeOf(t).ToString(), " but the shape function inferred ",
                                              want.ToString()));
    }
  }
  for (int i = 0; i < op.output_size(); ++i) (*env)[op.output(i)] = std::move(outputs[i]);
  return absl::OkStatus();
}

absl::Status RunKernelOnly(const Op& forward, const std::map<std::string, Tensor>& env, const RunContext& run) {
  const OpSchema* schema = OpRegistry::Global().Find(forward.type());
  if (schema == nullptr) return absl::NotFoundError(absl::StrCat("unknown op type '", forward.type(), "'"));
  Op op = forward;
  if (absl::Status s = CanonicalizeOp(*schema, &op); !s.ok()) return s;
  std::vector<const Tensor*> inputs;
  std::vector<TensorType> input_types;
  for (int i = 0; i < op.input_size(); ++i) {
    auto it = env.find(op.input(i));
    if (it == env.end()) return absl::NotFoundError(absl::StrCat("input '", op.input(i), "' is not in env"));
    inputs.push_back(&it->second);
    input_types.push_back(TypeOf(it->second));
  }
  KernelDef def{&op, input_types, {}};
  const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), run.device->kind(), KernelDtype(def));
  if (factory == nullptr) return absl::NotFoundError(absl::StrCat("no kernel for op '", op.type(), "'"));
  auto kernel = (*factory)(def);
  if (!kernel.ok()) return kernel.status();
  std::vector<Tensor> outputs(op.output_size());
  KernelContext ctx(&run, absl::MakeConstSpan(inputs), absl::MakeSpan(outputs));
  return (*kernel)->Compute(ctx);
}

absl::Status RunOps(const std::vector<Op>& ops, std::map<std::string, Tensor>* env, const RunContext& run) {
  for (size_t k = 0; k < ops.size(); ++k) {
    if (absl::Status s = RunOp(ops[k], env, run); !s.ok()) {
      return Prefixed(absl::StrCat("op #", k), s);
    }
  }
  return absl::OkStatus();
}

namespace {

class TestGradBuilder : public GradBuilder {
 public:
  TestGradBuilder(const Op& op, std::vector<TensorType> input_types, std::vector<TensorType> output_types,
                  std::vector<std::string> output_grads, std::vector<bool> needs_input_grad)
      : op_(op),
        input_types_(std::move(input_types)),
        output_types_(std::move(output_types)),
        output_grads_(std::move(output_grads)),
        needs_input_grad_(std::move(needs_input_grad)),
        input_grads_(op.input_size()) {}

  const Op& op() const override { return op_; }
  const TensorType& input_type(int i) const override { return input_types_.at(i); }
  const TensorType& output_type(int i) const override { return output_types_.at(i); }
  std::string output_grad(int i) const override { return output_grads_.at(i); }
  bool needs_input_grad(int i) const override { return needs_input_grad_.at(i); }

  std::string input_grad(int i) override {
    if (!input_grads_.at(i).empty()) return input_grads_[i];
    // One name per position, so an input used twice gets both contributions.
    bool repeated = false;
    for (int j = 0; j < i; ++j) repeated |= op_.input(j) == op_.input(i);
    std::string name = absl::StrCat(op_.input(i), "@grad");
    if (repeated) absl::StrAppend(&name, ".", i);
    if (!needs_input_grad_[i]) name = absl::StrCat(op_.input(i), "@unwanted_grad.", i);
    input_grads_[i] = name;
    return name;
  }

  void PassGrad(int i, const std::string& grad) override { input_grads_.at(i) = grad; }

  std::string Temp(const std::string& hint) override { return absl::StrCat("@tmp", temps_++, "/", hint); }

  void Emit(const std::string& type, std::vector<std::string> inputs, std::vector<std::string> outputs,
            std::map<std::string, AttrValue> attrs) override {
    Op e;
    e.set_type(type);
    for (auto& in : inputs) e.add_input(std::move(in));
    for (auto& out : outputs) e.add_output(std::move(out));
    for (auto& [k, v] : attrs) (*e.mutable_attr())[k] = v;
    e.set_device(op_.device());
    e.set_stage(op_.stage());
    e.set_uid(op_.uid());
    e.set_role(BACKWARD);
    emitted_.push_back(std::move(e));
  }

  std::vector<Op>& emitted() { return emitted_; }
  std::vector<std::string> wanted_input_grads() const {
    std::vector<std::string> names(op_.input_size());
    for (int i = 0; i < op_.input_size(); ++i) {
      if (needs_input_grad_[i]) names[i] = input_grads_[i];
    }
    return names;
  }

 private:
  const Op& op_;
  std::vector<TensorType> input_types_, output_types_;
  std::vector<std::string> output_grads_;
  std::vector<bool> needs_input_grad_;
  std::vector<std::string> input_grads_;
  std::vector<Op> emitted_;
  int temps_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<Op>> MakeGradOps(const Op& forward, const std::map<std::string, TensorType>& types,
                                            const std::vector<bool>& needs_input_grad,
                                            std::vector<std::string>* input_grad_names,
                                            const std::vector<bool>& output_has_grad) {
  const OpSchema* schema = OpRegistry::Global().Find(forward.type());
  if (schema == nullptr) return absl::NotFoundError(absl::StrCat("unknown op type '", forward.type(), "'"));
  Op op = forward;
  const std::string label = OpLabel(op);
  if (absl::Status s = CanonicalizeOp(*schema, &op); !s.ok()) return Prefixed(label, s);
  if (!schema->differentiable || !schema->grad_fn) {
    return absl::InvalidArgumentError(absl::StrCat(label, " is not differentiable"));
  }
  if (static_cast<int>(needs_input_grad.size()) != op.input_size()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": needs_input_grad has ", needs_input_grad.size(),
                                                   " entries for ", op.input_size(), " inputs"));
  }
  if (!output_has_grad.empty() && static_cast<int>(output_has_grad.size()) != op.output_size()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": output_has_grad has ", output_has_grad.size(),
                                                   " entries for ", op.output_size(), " outputs"));
  }
  auto type_of = [&](const std::string& var) -> absl::StatusOr<TensorType> {
    auto it = types.find(var);
    if (it == types.end()) return absl::InvalidArgumentError(absl::StrCat(label, ": no type given for '", var, "'"));
    return it->second;
  };
  std::vector<TensorType> input_types, output_types;
  for (const auto& in : op.input()) {
    auto t = type_of(in);
    if (!t.ok()) return t.status();
    input_types.push_back(*t);
  }
  std::vector<std::string> output_grads;
  for (int i = 0; i < op.output_size(); ++i) {
    auto t = type_of(op.output(i));
    if (!t.ok()) return t.status();
    output_types.push_back(*t);
    bool has = output_has_grad.empty() ? IsFloating(t->dtype) : output_has_grad[i];
    output_grads.push_back(has ? absl::StrCat(op.output(i), "@grad") : "");
  }

  TestGradBuilder builder(op, input_types, output_types, output_grads, needs_input_grad);
  if (absl::Status s = schema->grad_fn(builder); !s.ok()) return Prefixed(absl::StrCat("gradient of ", label), s);
  std::vector<Op> ops = std::move(builder.emitted());
  for (Op& e : ops) {
    const OpSchema* es = OpRegistry::Global().Find(e.type());
    if (es == nullptr) {
      return absl::NotFoundError(absl::StrCat("gradient of ", label, " emits unknown op type '", e.type(), "'"));
    }
    if (absl::Status s = CanonicalizeOp(*es, &e); !s.ok()) {
      return Prefixed(absl::StrCat("gradient of ", label, " emits ", OpLabel(e)), s);
    }
  }
  if (input_grad_names != nullptr) *input_grad_names = builder.wanted_input_grads();
  return ops;
}

Tensor MakeTensor(DataType dtype, Shape shape, const std::vector<double>& values) {
  Tensor t = Tensor::Empty(dtype, std::move(shape));
  if (t.num_elements() != static_cast<int64_t>(values.size())) {
    std::cerr << "MakeTensor: " << values.size() << " values for shape " << ShapeString(t.shape()) << std::endl;
    std::abort();
  }
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case F32: t.data<float>()[i] = static_cast<float>(values[i]); break;
      case F64: t.data<double>()[i] = values[i]; break;
      case I64: t.data<int64_t>()[i] = static_cast<int64_t>(values[i]); break;
      case I32: t.data<int32_t>()[i] = static_cast<int32_t>(values[i]); break;
      case BOOL: t.data<bool>()[i] = values[i] != 0; break;
      case BF16: t.data<bfloat16>()[i] = ToBfloat16(static_cast<float>(values[i])); break;
      case F16: t.data<float16>()[i] = ToFloat16(static_cast<float>(values[i])); break;
      default:
        std::cerr << "MakeTensor: unsupported dtype " << DataTypeName(dtype) << std::endl;
        std::abort();
    }
  }
  return t;
}

std::vector<double> TensorValues(const Tensor& t) {
  // A device tensor is read through one copy to the host.
  const Tensor host = t.on_host() ? t : t.Clone(GetCpuAllocator());
  std::vector<double> v(host.defined() ? host.num_elements() : 0);
  for (size_t i = 0; i < v.size(); ++i) v[i] = DataTypeSize(host.dtype()) == 0 ? NAN : host.ValueAt(i);
  return v;
}

TensorType TypeOf(const Tensor& t) {
  return TensorType{t.dtype(), Shape(t.shape().begin(), t.shape().end())};
}

namespace {

::testing::AssertionResult ValuesNear(const TensorType& actual_type, const std::vector<double>& actual,
                                      const TensorType& expected_type, const std::vector<double>& expected,
                                      double rel_tol) {
  if (actual_type != expected_type) {
    return ::testing::AssertionFailure() << "type " << actual_type.ToString() << ", expected "
                                         << expected_type.ToString();
  }
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << actual.size() << " elements, expected " << expected.size();
  }
  int bad = 0;
  ::testing::AssertionResult result = ::testing::AssertionFailure();
  for (size_t i = 0; i < actual.size(); ++i) {
    double a = actual[i], e = expected[i];
    bool ok = (std::isnan(a) && std::isnan(e)) || a == e ||
              std::abs(a - e) <= rel_tol * std::max({std::abs(a), std::abs(e), 1.0});
    if (!ok) {
      if (bad < 10) result << "\n  element " << i << ": " << a << ", expected " << e;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return result << "\n  " << bad << " of " << actual.size() << " elements differ (rel_tol " << rel_tol
                << ") in " << actual_type.ToString();
}

}  // namespace

::testing::AssertionResult SameBits(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << "got " << DataTypeName(got.dtype()) << ShapeString(got.shape())
                                         << ", want " << DataTypeName(want.dtype()) << ShapeString(want.shape());
  }
  if (std::memcmp(got.raw_data(), want.raw_data(), got.bytes()) != 0) {
    const std::vector<double> g = TensorValues(got), w = TensorValues(want);
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i] != w[i]) return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << w[i];
    }
    return ::testing::AssertionFailure() << "bytes differ";
  }
  return ::testing::AssertionSuccess();
}

Tensor As(DataType dtype, const Tensor& t) { return MakeTensor(dtype, t.shape(), TensorValues(t)); }

::testing::AssertionResult TensorNear(const Tensor& actual, const Tensor& expected, double rel_tol) {
  if (!actual.defined()) return ::testing::AssertionFailure() << "actual tensor is undefined";
  if (!expected.defined()) return ::testing::AssertionFailure() << "expected tensor is undefined";
  return ValuesNear(TypeOf(actual), TensorValues(actual), TypeOf(expected), TensorValues(expected), rel_tol);
}

::testing::AssertionResult TensorNear(const Tensor& actual, const std::vector<int64_t>& shape,
                                      const std::vector<double>& expected, double rel_tol) {
  if (!actual.defined()) return ::testing::AssertionFailure() << "actual tensor is undefined";
  return ValuesNear(TypeOf(actual), TensorValues(actual), TensorType{actual.dtype(), Shape(shape.begin(), shape.end())}, expected, rel_tol);
}

absl::StatusOr<std::vector<TensorType>> InferTypes(const std::string& op_text, std::vector<TensorType> inputs) {
  Op op = ParseOp(op_text);
  const OpSchema* schema = OpRegistry::Global().Find(op.type());
  if (schema == nullptr) return absl::NotFoundError(op.type());
  if (auto s = CanonicalizeOp(*schema, &op); !s.ok()) return s;
  return InferOutputTypes(*schema, op, std::move(inputs));
}

}  // namespace strata
