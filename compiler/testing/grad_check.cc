#include "compiler/testing/grad_check.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "google/protobuf/text_format.h"
#include "runtime/tensor.h"

namespace strata {

GradCheckRegistry& GradCheckRegistry::Global() {
  static GradCheckRegistry* registry = new GradCheckRegistry();
  return *registry;
}

namespace {

// Fixed so that every run checks the same points.
constexpr uint64_t kGradCheckSeed = 0x5eed5eedULL;
// Central-difference step relative to max(1, |x|): the truncation error is
// O(step^2) and the rounding noise O(1e-16 / step), both far below 1e-6.
constexpr double kRelativeStep = 1e-6;

// Uniform in [0, 1) from the top 53 bits: the same on every platform, unlike
// std::uniform_real_distribution.
double Uniform01(std::mt19937_64& gen) { return static_cast<double>(gen() >> 11) * 0x1.0p-53; }

Tensor RandomTensor(DataType dtype, absl::Span<const int64_t> shape, double low, double high,
                    std::mt19937_64& gen) {
  std::vector<double> values(NumElements(shape));
  for (double& v : values) {
    double u = low + (high - low) * Uniform01(gen);
    v = IsFloating(dtype) ? u : std::floor(u);
  }
  return MakeTensor(dtype, Shape(shape.begin(), shape.end()), values);
}

// L = sum_i sum(output_i * R_i) over the outputs that have weights.
double Objective(const Op& op, const std::map<std::string, Tensor>& env,
                 const std::map<std::string, std::vector<double>>& weights) {
  double loss = 0;
  for (const auto& out : op.output()) {
    auto w = weights.find(out);
    if (w == weights.end()) continue;
    std::vector<double> y = TensorValues(env.at(out));
    for (size_t j = 0; j < y.size(); ++j) loss += y[j] * w->second[j];
  }
  return loss;
}

std::string IndexString(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    index[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return absl::StrCat("[", absl::StrJoin(index, ", "), "]");
}

}  // namespace

absl::Status CheckGradient(const GradCheckCase& c) {
  const std::string where = absl::StrCat("grad check '", c.label, "'");
  auto error = [&](const std::string& msg) { return absl::InvalidArgumentError(absl::StrCat(where, ": ", msg)); };
  auto prefixed = [&](const absl::Status& s) { return absl::Status(s.code(), absl::StrCat(where, ": ", s.message())); };

  Op op;
  if (!google::protobuf::TextFormat::ParseFromString(c.op_text, &op)) {
    return error(absl::StrCat("cannot parse op_text: ", c.op_text));
  }

  // Inputs: the given values, or uniform random ones from the fixed seed.
  std::mt19937_64 gen(kGradCheckSeed);
  std::map<std::string, Tensor> inputs;
  std::map<std::string, bool> check;
  for (const GradCheckInput& in : c.inputs) {
    if (inputs.count(in.name)) return error(absl::StrCat("input '", in.name, "' listed twice"));
    for (int64_t d : in.shape) {
      if (d < 0) return error(absl::StrCat("input '", in.name, "' needs a concrete shape, got ", ShapeString(in.shape)));
    }
    if (in.check_grad && in.dtype != F64) {
      return error(absl::StrCat("input '", in.name, "' is checked but is ", DataTypeName(in.dtype),
                                "; gradients are checked in F64 (set check_grad = false for ids and labels)"));
    }
    if (!in.values.empty()) {
      if (static_cast<int64_t>(in.values.size()) != NumElements(in.shape)) {
        return error(absl::StrCat("input '", in.name, "' has ", in.values.size(), " values for shape ",
                                  ShapeString(in.shape)));
      }
      inputs[in.name] = MakeTensor(in.dtype, Shape(in.shape.begin(), in.shape.end()), in.values);
    } else {
      if (!(in.low < in.high)) return error(absl::StrCat("input '", in.name, "' has an empty range [low, high)"));
      inputs[in.name] = RandomTensor(in.dtype, in.shape, in.low, in.high, gen);
    }
    check[in.name] = in.check_grad;
  }
  std::set<std::string> used(op.input().begin(), op.input().end());
  for (const auto& in : op.input()) {
    if (!inputs.count(in)) return error(absl::StrCat("op input '", in, "' has no entry in the case's inputs"));
  }
  for (const auto& [name, t] : inputs) {
    if (!used.count(name)) return error(absl::StrCat("case input '", name, "' is not an input of the op"));
  }

  // Forward, then fixed random weights on every floating output.
  const RunContext run{/*seed=*/1234};
  std::map<std::string, Tensor> env = inputs;
  if (absl::Status s = RunOp(op, &env, run); !s.ok()) return prefixed(s);
  std::map<std::string, TensorType> types;
  for (const auto& [name, t] : env) types[name] = TypeOf(t);
  std::map<std::string, std::vector<double>> weights;
  std::map<std::string, Tensor> output_grads;
  std::vector<bool> output_has_grad(op.output_size());
  for (int i : c.outputs_without_grad) {
    if (i < 0 || i >= op.output_size()) return error(absl::StrCat("outputs_without_grad has ", i, ", out of range"));
  }
  for (int i = 0; i < op.output_size(); ++i) {
    const std::string& out = op.output(i);
    const Tensor& y = env.at(out);
    bool skip = std::count(c.outputs_without_grad.begin(), c.outputs_without_grad.end(), i) > 0;
    if (!IsFloating(y.dtype()) || skip || weights.count(out)) continue;
    output_has_grad[i] = true;
    Tensor r = RandomTensor(y.dtype(), types[out].shape, -1.0, 1.0, gen);
    weights[out] = TensorValues(r);
    output_grads[absl::StrCat(out, "@grad")] = r;
  }
  if (weights.empty()) return error("the op has no floating output to differentiate");

  // Analytic gradients from the ops the gradient maker emits.
  std::vector<bool> needs(op.input_size());
  bool any = false;
  for (int i = 0; i < op.input_size(); ++i) any |= needs[i] = check[op.input(i)];
  if (!any) return error("no input has check_grad set");
  std::vector<std::string> grad_names;
  auto grad_ops = MakeGradOps(op, types, needs, &grad_names, output_has_grad);
  if (!grad_ops.ok()) return prefixed(grad_ops.status());
  std::map<std::string, Tensor> grad_env = env;
  for (const auto& [name, t] : output_grads) grad_env[name] = t;
  if (absl::Status s = RunOps(*grad_ops, &grad_env, run); !s.ok()) {
    return prefixed(absl::Status(s.code(), absl::StrCat("running the gradient ops: ", s.message())));
  }
  // An input used at several positions gets the sum of its gradients.
  std::map<std::string, std::vector<double>> analytic;
  for (int i = 0; i < op.input_size(); ++i) {
    if (!needs[i]) continue;
    const std::string& x = op.input(i);
    auto it = grad_env.find(grad_names[i]);
    if (grad_names[i].empty() || it == grad_env.end() || !it->second.defined()) {
      return error(absl::StrCat("the gradient maker did not produce dL/d(input ", i, " '", x, "')"));
    }
    if (TypeOf(it->second) != types[x]) {
      return error(absl::StrCat("gradient of input ", i, " '", x, "' is ", TypeOf(it->second).ToString(),
                                " but the input is ", types[x].ToString()));
    }
    std::vector<double> g = TensorValues(it->second);
    auto& sum = analytic[x];
    if (sum.empty()) sum.assign(g.size(), 0.0);
    for (size_t j = 0; j < g.size(); ++j) sum[j] += g[j];
  }

  // Central differences of L, one element at a time.
  struct Worst {
    double error = -1;
    std::string input;
    int64_t index = 0;
    double analytic = 0, numeric = 0;
  } worst;
  int64_t failures = 0;
  for (const auto& [x, grad] : analytic) {
    const Tensor& base = inputs.at(x);
    for (int64_t j = 0; j < base.num_elements(); ++j) {
      double value = base.data<double>()[j];
      double step = kRelativeStep * std::max(1.0, std::abs(value));
      double plus_x = value + step, minus_x = value - step;
      double l[2];
      for (int side = 0; side < 2; ++side) {
        std::map<std::string, Tensor> e = inputs;
        Tensor perturbed = base.Clone();
        perturbed.data<double>()[j] = side == 0 ? plus_x : minus_x;
        e[x] = perturbed;
        if (absl::Status s = RunOp(op, &e, run); !s.ok()) return prefixed(s);
        l[side] = Objective(op, e, weights);
      }
      // Divide by the step actually taken (plus_x - minus_x is exact here).
      double numeric = (l[0] - l[1]) / (plus_x - minus_x);
      double a = grad[j];
      double err = std::abs(a - numeric) / std::max({std::abs(a), std::abs(numeric), 1.0});
      if (std::isnan(err)) err = INFINITY;
      if (err > c.tolerance) ++failures;
      if (err > worst.error) worst = {err, x, j, a, numeric};
    }
  }
  if (failures > 0) {
    return error(absl::StrCat(failures, " gradient element(s) off; worst: input '", worst.input, "' element ",
                              IndexString(worst.index, inputs.at(worst.input).shape()), " (of ",
                              ShapeString(inputs.at(worst.input).shape()), "): analytic ", worst.analytic,
                              ", numeric ", worst.numeric, ", error ", worst.error, " > ", c.tolerance));
  }
  return absl::OkStatus();
}

}  // namespace strata
