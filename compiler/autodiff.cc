#include "compiler/autodiff.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/graph.h"
#include "compiler/op_registry.h"
#include "compiler/program_text.h"

namespace strata {
namespace {

// Appends ops and typed vars to the graph on behalf of gradient makers, and
// remembers which backward op wrote each var it added.
class BackwardEmitter {
 public:
  explicit BackwardEmitter(Graph* graph) : graph_(graph), producer_(graph->num_vars(), -1) {}

  // hint, else hint@2, hint@3, ...: the first free one. Each hint remembers
  // where its search stopped, so a hint used N times costs O(N), not O(N^2).
  std::string FreshName(const std::string& hint) {
    std::string name = hint;
    const auto [h, added] = hints_.Intern(hint);
    if (added)
      next_suffix_.push_back(2);
    else
      name = absl::StrCat(hint, "@", next_suffix_[h]++);
    while (graph_->FindVar(name) >= 0 || fresh_.Find(name) >= 0) name = absl::StrCat(hint, "@", next_suffix_[h]++);
    fresh_.Intern(name);
    return name;
  }

  // Appends a backward op placed like graph op `like`.
  absl::Status Emit(int like, const std::string& type, std::vector<std::string> inputs,
                    std::vector<std::string> outputs, const std::map<std::string, AttrValue>& attrs) {
    const std::string what =
        absl::StrCat("gradient of ", graph_->OpLocation(like), " emits '", type, "'");
    const OpSchema* schema = OpRegistry::Global().Find(type);
    if (schema == nullptr) return absl::InternalError(absl::StrCat(what, ": unregistered op"));
    op_.Clear();
    op_.set_type(type);
    for (auto& in : inputs) op_.add_input(std::move(in));
    for (auto& out : outputs) op_.add_output(std::move(out));
    for (const auto& [k, v] : attrs) (*op_.mutable_attr())[k] = v;
    const absl::string_view device = graph_->device(like);
    op_.set_device(device.data(), device.size());
    op_.set_stage(graph_->stage(like));
    op_.set_uid(graph_->uid(like));
    op_.set_line(graph_->line(like));
    op_.set_role(BACKWARD);
    if (auto s = CanonicalizeOp(*schema, &op_); !s.ok())
      return absl::InternalError(absl::StrCat(what, ": ", s.message()));
    std::vector<TensorType> input_types;
    input_types.reserve(op_.input_size());
    for (const auto& in : op_.input()) {
      const int v = graph_->FindVar(in);
      if (v < 0) return absl::InternalError(absl::StrCat(what, ": input '", in, "' is undefined"));
      input_types.push_back(graph_->type(v));
    }
    auto out_types = InferOutputTypes(*schema, op_, std::move(input_types));
    if (!out_types.ok()) return absl::InternalError(absl::StrCat(what, ": ", out_types.status().message()));
    for (int k = 0; k < op_.output_size(); ++k) {
      const std::string& out = op_.output(k);
      bool exists = graph_->FindVar(out) >= 0;
      for (int j = 0; j < k && !exists; ++j) exists = op_.output(j) == out;
      if (exists) return absl::InternalError(absl::StrCat(what, ": output '", out, "' already exists"));
    }
    std::vector<int> outs;
    for (int k = 0; k < op_.output_size(); ++k) {
      const TensorType& t = (*out_types)[k];
      outs.push_back(
          graph_->AddVar(op_.output(k), t.dtype, absl::MakeConstSpan(t.shape.data(), t.shape.size()), ACTIVATION));
    }
    absl::StatusOr<int> id = graph_->AppendOp(op_);
    if (!id.ok()) return id.status();
    producer_.resize(graph_->num_vars(), -1);
    for (int v : outs) producer_[v] = *id;
    return absl::OkStatus();
  }

  int stage(int op) const { return graph_->stage(op); }

  // The backward op that emitted `var`, or -1 (a forward var).
  int producer(const std::string& var) const {
    const int v = graph_->FindVar(var);
    return v < 0 || v >= static_cast<int>(producer_.size()) ? -1 : producer_[v];
  }

 private:
  Graph* graph_;
  std::vector<int> producer_;  // by var id: the backward op that wrote it, or -1
  Op op_;                      // the op being emitted (reused)
  // Compact tables (NameTable), not hash maps of strings: a backward pass
  // interns about one hint and one fresh name per op.
  NameTable hints_;
  std::vector<int> next_suffix_;  // by hint id: the next @k to try
  NameTable fresh_;               // names handed out (most become vars)
};

// Gradient contributions flowing into each forward var (by its var id in the
// Graph), summed when the producer is reached.
struct GradAccumulator {
  explicit GradAccumulator(int num_ids) : expected(num_ids, 0), parts(num_ids) {}
  std::vector<int> expected;  // contributions still to come
  std::vector<std::vector<std::string>> parts;
};

class GradBuilderImpl : public GradBuilder {
 public:
  // `op` is forward op `op_index` of `graph` (a copy: the graph grows while
  // the gradient maker runs).
  GradBuilderImpl(const Op& op, const Graph& graph, int op_index, BackwardEmitter* emitter, GradAccumulator* acc,
                  std::vector<std::string> output_grads, std::vector<bool> needs)
      : op_(op),
        op_index_(op_index),
        input_ids_(graph.inputs(op_index).begin(), graph.inputs(op_index).end()),
        emitter_(emitter),
        acc_(acc),
        output_grads_(std::move(output_grads)),
        needs_(std::move(needs)) {
    for (int v : graph.inputs(op_index)) input_types_.push_back(graph.type(v));
    for (int v : graph.outputs(op_index)) output_types_.push_back(graph.type(v));
    given_.assign(op.input_size(), false);
  }

  const Op& op() const override { return op_; }
  const TensorType& input_type(int i) const override { return input_types_[i]; }
  const TensorType& output_type(int i) const override { return output_types_[i]; }
  std::string output_grad(int i) const override { return output_grads_[i]; }
  bool needs_input_grad(int i) const override { return needs_[i]; }

  std::string input_grad(int i) override {
    const std::string& var = op_.input(i);
    if (given_[i]) return names_[i];
    given_[i] = true;
    // A var with one contribution gets its gradient name directly; several
    // are named apart and summed when the producer is reached.
    const int id = input_ids_[i];
    std::string name = acc_->expected[id] == 1 && acc_->parts[id].empty()
                           ? emitter_->FreshName(absl::StrCat(var, "@grad"))
                           : emitter_->FreshName(absl::StrCat(var, "@grad@part"));
    acc_->parts[id].push_back(name);
    if (names_.size() <= static_cast<size_t>(i)) names_.resize(op_.input_size());
    names_[i] = name;
    return name;
  }

  void PassGrad(int i, const std::string& grad) override {
    // Shared only when made on this op's stage. A gradient made on a later
    // stage and shared would be made away from the input's stage: a
    // parameter's gradient would then live where the parameter is not read
    // (the split sends a var only to its readers), and a residual's would
    // cross the cut once more. There the copy stays.
    const int producer = emitter_->producer(grad);
    if (!given_[i] && (producer < 0 || emitter_->stage(producer) != op_.stage())) {
      Emit("identity", {grad}, {input_grad(i)}, {});
      return;
    }
    if (given_[i]) {
      if (status_.ok())
        status_ = absl::InternalError(
            absl::StrCat("gradient maker of '", op_.type(), "' names input ", i, "'s gradient twice"));
      return;
    }
    given_[i] = true;
    acc_->parts[input_ids_[i]].push_back(grad);
    if (names_.size() <= static_cast<size_t>(i)) names_.resize(op_.input_size());
    names_[i] = grad;
  }

  std::string Temp(const std::string& hint) override { return emitter_->FreshName(absl::StrCat(hint, "@tmp")); }

  void Emit(const std::string& type, std::vector<std::string> inputs, std::vector<std::string> outputs,
            std::map<std::string, AttrValue> attrs) override {
    if (!status_.ok()) return;
    status_ = emitter_->Emit(op_index_, type, std::move(inputs), std::move(outputs), attrs);
  }

  absl::Status status() const { return status_; }
  bool given(int i) const { return given_[i]; }

 private:
  const Op& op_;
  const int op_index_;
  const std::vector<int> input_ids_;
  BackwardEmitter* emitter_;
  GradAccumulator* acc_;
  std::vector<std::string> output_grads_;
  std::vector<bool> needs_;
  std::vector<TensorType> input_types_, output_types_;
  std::vector<bool> given_;
  std::vector<std::string> names_;
  absl::Status status_;
};

}  // namespace

absl::Status AppendBackward(Graph* graph) {
  Graph& g = *graph;
  // The forward ops in program order (ids; the graph grows below).
  const std::vector<int> forward = g.ops();
  const int num_forward = static_cast<int>(forward.size());
  const int num_vars = g.num_vars();

  // Vars that depend on a trainable parameter through differentiable ops,
  // and vars the loss depends on, flagged by forward var id.
  std::vector<char> requires_grad(num_vars, 0), reaches_loss(num_vars, 0);
  auto any_flagged = [&](const std::vector<char>& set, absl::Span<const int> ids) {
    for (int id : ids) {
      if (set[id]) return true;
    }
    return false;
  };
  for (int v = 0; v < num_vars; ++v) {
    if (g.kind(v) == PARAM && !g.frozen(v)) requires_grad[v] = 1;
  }
  for (int i : forward) {
    if (!g.schema(i).differentiable || !any_flagged(requires_grad, g.inputs(i))) continue;
    for (int v : g.outputs(i)) {
      // BF16/F16 values carry gradients too (a cast round trip, as mixed
      // precision makes): only integer outputs stop them.
      if (IsFloating(g.dtype(v)) || IsHalfFloating(g.dtype(v))) requires_grad[v] = 1;
    }
  }
  const int loss_id = g.FindVar(g.loss());
  if (loss_id < 0) return absl::InternalError("the loss has no var");
  reaches_loss[loss_id] = 1;
  std::vector<bool> differentiate(g.op_id_bound(), false);  // by op id
  for (int k = num_forward - 1; k >= 0; --k) {
    const int i = forward[k];
    if (!g.schema(i).differentiable || !any_flagged(reaches_loss, g.outputs(i)) ||
        !any_flagged(requires_grad, g.inputs(i))) {
      continue;
    }
    differentiate[i] = true;
    for (int v : g.inputs(i)) {
      if (requires_grad[v]) reaches_loss[v] = 1;
    }
  }

  GradAccumulator acc(num_vars);
  for (int i : forward) {
    if (!differentiate[i]) continue;
    for (int v : g.inputs(i)) {
      if (requires_grad[v] && reaches_loss[v]) ++acc.expected[v];
    }
  }

  const int loss_producer = g.FirstWriters()[loss_id];
  const std::vector<int> first_reader = g.FirstReaders();  // of the forward ops, before the graph grows
  if (loss_producer < 0) return absl::InternalError("loss has no producer");
  BackwardEmitter emitter(graph);
  const std::string loss_name(g.var_name(loss_id));
  std::string loss_grad = emitter.FreshName(absl::StrCat(loss_name, "@grad"));
  if (auto s = emitter.Emit(loss_producer, "fill_like", {loss_name}, {loss_grad}, {{"value", FloatAttr(1.0)}});
      !s.ok()) {
    return s;
  }
  acc.parts[loss_id].push_back(loss_grad);
  g.mutable_program_fields().set_loss_grad(loss_grad);

  // The final gradient of a var: its single part, or the add_n of all parts.
  // The sum goes where the parts are made when they are all made on one
  // stage, so a pipeline sends one gradient across the cut, not each part.
  auto finalize = [&](int id, int like) -> absl::StatusOr<std::string> {
    std::vector<std::string>& parts = acc.parts[id];
    if (parts.empty()) return std::string();
    if (parts.size() == 1) return parts[0];
    int where = like;
    const int first = emitter.producer(parts[0]);
    bool one_stage = first >= 0;
    for (const auto& part : parts) {
      const int p = emitter.producer(part);
      one_stage = one_stage && p >= 0 && g.stage(p) == g.stage(first);
    }
    if (one_stage) where = first;
    std::string sum = emitter.FreshName(absl::StrCat(g.var_name(id), "@grad"));
    if (auto s = emitter.Emit(where, "add_n", parts, {sum}, {}); !s.ok()) return s;
    parts = {sum};
    return sum;
  };

  for (int k = num_forward - 1; k >= 0; --k) {
    const int i = forward[k];
    if (!differentiate[i]) continue;
    std::vector<std::string> output_grads;
    const std::vector<int> outs(g.outputs(i).begin(), g.outputs(i).end());
    for (int v : outs) {
      auto grad = finalize(v, i);
      if (!grad.ok()) return grad.status();
      output_grads.push_back(*grad);
    }
    std::vector<bool> needs;
    for (int v : g.inputs(i)) needs.push_back(requires_grad[v] && reaches_loss[v]);
    const Op op = g.AsOp(i);  // a copy: the graph grows under the gradient maker
    GradBuilderImpl builder(op, g, i, &emitter, &acc, output_grads, needs);
    if (auto s = g.schema(i).grad_fn(builder); !s.ok()) {
      return absl::InternalError(absl::StrCat("gradient of ", g.OpLocation(i), ": ", s.message()));
    }
    if (!builder.status().ok()) return builder.status();
    for (int k = 0; k < op.input_size(); ++k) {
      if (needs[k] && !builder.given(k)) {
        return absl::InternalError(
            absl::StrCat("gradient maker of '", op.type(), "' produced no gradient for input ", k));
      }
    }
  }

  for (int v = 0; v < num_vars; ++v) {
    if (g.kind(v) != PARAM || g.frozen(v) || !reaches_loss[v]) continue;
    auto grad = finalize(v, first_reader[v]);
    if (!grad.ok()) return grad.status();
    if (!grad->empty()) g.SetParamGrad(g.var_name(v), *grad);
  }
  return absl::OkStatus();
}

absl::Status AppendBackward(Program* program) {
  auto graph = Graph::FromProgram(*program);
  if (!graph.ok()) return graph.status();
  if (auto s = AppendBackward(graph->get()); !s.ok()) return s;
  *program = (*graph)->ToProgram();
  return absl::OkStatus();
}

}  // namespace strata
