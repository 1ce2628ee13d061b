#include "compiler/autodiff.h"

#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "compiler/graph_index.h"
#include "compiler/op_registry.h"
#include "compiler/program_text.h"

namespace strata {
namespace {

// Appends ops and typed vars to the program on behalf of gradient makers.
// Names are interned in a copy of the forward index's table, so the forward
// vars keep their ids and types come from the index; vars the pass adds are
// looked up in the program (they are recent).
class BackwardEmitter {
 public:
  BackwardEmitter(Program* program, const GraphIndex& index)
      : program_(program), index_(index), names_(index.names()), entries_(index.num_ids()) {
    names_.Reserve(3 * index.num_ids());
    for (int id = 0; id < index.num_ids(); ++id) entries_[id].declared = index.declared(id);
  }

  // hint, else hint@2, hint@3, ...: the first free one. Each hint remembers
  // where its search stopped, so a hint used N times costs O(N), not O(N^2).
  std::string FreshName(const std::string& hint) {
    std::string name = hint;
    int& k = next_suffix_[hint];
    if (k == 0) k = 2;
    else name = absl::StrCat(hint, "@", k++);
    while (names_.Find(name) >= 0) name = absl::StrCat(hint, "@", k++);
    Intern(name);
    return name;
  }

  absl::Status Emit(const Op& like, const std::string& type, std::vector<std::string> inputs,
                    std::vector<std::string> outputs, const std::map<std::string, AttrValue>& attrs) {
    const std::string what = absl::StrCat("gradient of op #", like.uid(), " '", like.type(), "' emits '", type, "'");
    const OpSchema* schema = OpRegistry::Global().Find(type);
    if (schema == nullptr) return absl::InternalError(absl::StrCat(what, ": unregistered op"));
    // Built in place (no copy into the program, which may live on an arena);
    // taken out again if it turns out invalid.
    Op& op = *program_->add_op();
    auto fail = [&](absl::Status s) {
      program_->mutable_op()->RemoveLast();
      return s;
    };
    op.set_type(type);
    for (auto& in : inputs) op.add_input(std::move(in));
    for (auto& out : outputs) op.add_output(std::move(out));
    for (const auto& [k, v] : attrs) (*op.mutable_attr())[k] = v;
    op.set_device(like.device());
    op.set_stage(like.stage());
    op.set_uid(like.uid());
    op.set_line(like.line());
    op.set_role(BACKWARD);
    if (auto s = CanonicalizeOp(*schema, &op); !s.ok()) return fail(absl::InternalError(absl::StrCat(what, ": ", s.message())));
    std::vector<TensorType> input_types;
    input_types.reserve(op.input_size());
    for (const auto& in : op.input()) {
      const int id = names_.Find(in);
      if (id < 0 || !entries_[id].declared) {
        return fail(absl::InternalError(absl::StrCat(what, ": input '", in, "' is undefined")));
      }
      input_types.push_back(entries_[id].var != nullptr ? TypeOf(*entries_[id].var) : index_.type(id));
    }
    auto out_types = InferOutputTypes(*schema, op, std::move(input_types));
    if (!out_types.ok()) return fail(absl::InternalError(absl::StrCat(what, ": ", out_types.status().message())));
    for (int k = 0; k < op.output_size(); ++k) {
      const std::string& out = op.output(k);
      const int id = names_.Find(out);
      bool exists = id >= 0 && entries_[id].declared;
      for (int j = 0; j < k && !exists; ++j) exists = op.output(j) == out;
      if (exists) return fail(absl::InternalError(absl::StrCat(what, ": output '", out, "' already exists")));
    }
    for (int k = 0; k < op.output_size(); ++k) {
      Var* v = program_->add_var();
      v->set_name(op.output(k));
      v->set_dtype((*out_types)[k].dtype);
      for (int64_t d : (*out_types)[k].shape) v->add_shape(d);
      v->set_kind(ACTIVATION);
      Entry& e = entries_[Intern(v->name())];
      e = Entry{v, &op, true};
    }
    return absl::OkStatus();
  }

  // The backward op that emitted `var`, or nullptr (a forward var).
  const Op* producer(const std::string& var) const {
    const int id = names_.Find(var);
    return id < 0 ? nullptr : entries_[id].producer;
  }

 private:
  int Intern(absl::string_view name) {
    auto [id, added] = names_.Intern(name);
    if (added) entries_.emplace_back();
    return id;
  }

  Program* program_;
  const GraphIndex& index_;
  NameTable names_;  // forward names (the index's ids), then names handed out and vars added here
  struct Entry {
    const Var* var = nullptr;      // a var this pass added; forward vars' types come from the index
    const Op* producer = nullptr;  // the backward op that emitted it (ops stay put), or nullptr
    bool declared = false;         // a var of the program (not only a name handed out)
  };
  std::vector<Entry> entries_;                         // by id
  absl::flat_hash_map<std::string, int> next_suffix_;  // per hint: the next @k to try
};

// Gradient contributions flowing into each forward var (by its id in the
// forward program's GraphIndex), summed when the producer is reached.
struct GradAccumulator {
  explicit GradAccumulator(int num_ids) : expected(num_ids, 0), parts(num_ids) {}
  std::vector<int> expected;  // contributions still to come
  std::vector<std::vector<std::string>> parts;
};

class GradBuilderImpl : public GradBuilder {
 public:
  // `index` is the forward program's; `op_index` the op's place in it.
  GradBuilderImpl(const Op& op, const GraphIndex& index, int op_index, BackwardEmitter* emitter, GradAccumulator* acc,
                  std::vector<std::string> output_grads, std::vector<bool> needs)
      : op_(op), input_ids_(index.input_ids(op_index)), emitter_(emitter), acc_(acc),
        output_grads_(std::move(output_grads)), needs_(std::move(needs)) {
    for (int id : index.input_ids(op_index)) input_types_.push_back(index.type(id));
    for (int id : index.output_ids(op_index)) output_types_.push_back(index.type(id));
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
    const Op* producer = emitter_->producer(grad);
    if (!given_[i] && (producer == nullptr || producer->stage() != op_.stage())) {
      Emit("identity", {grad}, {input_grad(i)}, {});
      return;
    }
    if (given_[i]) {
      if (status_.ok()) status_ = absl::InternalError(absl::StrCat("gradient maker of '", op_.type(), "' names input ", i,
                                                                  "'s gradient twice"));
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
    status_ = emitter_->Emit(op_, type, std::move(inputs), std::move(outputs), attrs);
  }

  absl::Status status() const { return status_; }
  bool given(int i) const { return given_[i]; }

 private:
  const Op& op_;
  absl::Span<const int> input_ids_;
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

absl::Status AppendBackward(Program* program, const GraphIndex* given_index) {
  const int num_forward = program->op_size();
  std::vector<const OpSchema*> schemas(num_forward);
  for (int i = 0; i < num_forward; ++i) {
    schemas[i] = OpRegistry::Global().Find(program->op(i).type());
    if (schemas[i] == nullptr) return absl::InternalError(absl::StrCat("unknown op ", program->op(i).type()));
  }

  // Vars that depend on a trainable parameter through differentiable ops,
  // and vars the loss depends on, flagged by GraphIndex id (forward vars only;
  // the index is built before the program grows).
  std::optional<GraphIndex> own_index;
  const GraphIndex& index = IndexFor(*program, given_index, &own_index);
  std::vector<char> requires_grad(index.num_ids(), 0), reaches_loss(index.num_ids(), 0);
  auto flagged = [&](const std::vector<char>& set, const std::string& name) {
    const int id = index.id(name);
    return id >= 0 && set[id];
  };
  auto any_flagged = [&](const std::vector<char>& set, absl::Span<const int> ids) {
    for (int id : ids) {
      if (set[id]) return true;
    }
    return false;
  };
  for (const Var& v : program->var()) {
    if (v.kind() == PARAM && !v.frozen()) requires_grad[index.id(v.name())] = 1;
  }
  for (int i = 0; i < num_forward; ++i) {
    if (!schemas[i]->differentiable || !any_flagged(requires_grad, index.input_ids(i))) continue;
    for (int id : index.output_ids(i)) {
      if (index.declared(id) && IsFloating(index.dtype(id))) requires_grad[id] = 1;
    }
  }
  if (int id = index.id(program->loss()); id >= 0) reaches_loss[id] = 1;
  std::vector<bool> differentiate(num_forward, false);
  for (int i = num_forward - 1; i >= 0; --i) {
    if (!schemas[i]->differentiable || !any_flagged(reaches_loss, index.output_ids(i)) ||
        !any_flagged(requires_grad, index.input_ids(i))) {
      continue;
    }
    differentiate[i] = true;
    for (int id : index.input_ids(i)) {
      if (requires_grad[id]) reaches_loss[id] = 1;
    }
  }

  GradAccumulator acc(index.num_ids());
  for (int i = 0; i < num_forward; ++i) {
    if (!differentiate[i]) continue;
    const absl::Span<const int> ids = index.input_ids(i);
    for (int k = 0; k < static_cast<int>(ids.size()); ++k) {
      if (requires_grad[ids[k]] && reaches_loss[ids[k]]) ++acc.expected[ids[k]];
    }
  }

  BackwardEmitter emitter(program, index);
  int loss_producer = -1;
  for (int i = 0; i < num_forward; ++i) {
    for (const auto& out : program->op(i).output()) {
      if (out == program->loss()) loss_producer = i;
    }
  }
  if (loss_producer < 0) return absl::InternalError("loss has no producer");
  const Op& loss_op = program->op(loss_producer);  // ops never move as more are added
  std::string loss_grad = emitter.FreshName(absl::StrCat(program->loss(), "@grad"));
  if (auto s = emitter.Emit(loss_op, "fill_like", {program->loss()}, {loss_grad}, {{"value", FloatAttr(1.0)}}); !s.ok()) {
    return s;
  }
  const int loss_id = index.id(program->loss());
  if (loss_id < 0) return absl::InternalError("the loss has no var");
  acc.parts[loss_id].push_back(loss_grad);

  // The final gradient of a var: its single part, or the add_n of all parts.
  // The sum goes where the parts are made when they are all made on one
  // stage, so a pipeline sends one gradient across the cut, not each part.
  auto finalize = [&](int id, const Op& like) -> absl::StatusOr<std::string> {
    std::vector<std::string>& parts = acc.parts[id];
    if (parts.empty()) return std::string();
    if (parts.size() == 1) return parts[0];
    const Op* where = &like;
    const Op* first = emitter.producer(parts[0]);
    bool one_stage = first != nullptr;
    for (const auto& part : parts) {
      const Op* p = emitter.producer(part);
      one_stage = one_stage && p != nullptr && p->stage() == first->stage();
    }
    if (one_stage) where = first;
    std::string sum = emitter.FreshName(absl::StrCat(index.name(id), "@grad"));
    if (auto s = emitter.Emit(*where, "add_n", parts, {sum}, {}); !s.ok()) return s;
    parts = {sum};
    return sum;
  };

  for (int i = num_forward - 1; i >= 0; --i) {
    if (!differentiate[i]) continue;
    const Op& op = program->op(i);  // stays put while the program grows
    std::vector<std::string> output_grads;
    for (int id : index.output_ids(i)) {
      auto g = finalize(id, op);
      if (!g.ok()) return g.status();
      output_grads.push_back(*g);
    }
    std::vector<bool> needs;
    for (int id : index.input_ids(i)) needs.push_back(requires_grad[id] && reaches_loss[id]);
    GradBuilderImpl builder(op, index, i, &emitter, &acc, output_grads, needs);
    if (auto s = schemas[i]->grad_fn(builder); !s.ok()) {
      return absl::InternalError(absl::StrCat("gradient of ", OpLocation(*program, i), ": ", s.message()));
    }
    if (!builder.status().ok()) return builder.status();
    for (int k = 0; k < op.input_size(); ++k) {
      if (needs[k] && !builder.given(k)) {
        return absl::InternalError(absl::StrCat("gradient maker of '", op.type(), "' produced no gradient for input ", k));
      }
    }
  }

  std::vector<std::pair<std::string, int>> params;  // name, first consumer
  for (const Var& v : program->var()) {
    if (v.kind() != PARAM || v.frozen() || !flagged(reaches_loss, v.name())) continue;
    params.push_back({v.name(), index.consumers(v.name()).front()});
  }
  for (const auto& [name, consumer] : params) {
    auto g = finalize(index.id(name), program->op(consumer));
    if (!g.ok()) return g.status();
    if (!g->empty()) (*program->mutable_param_grad())[name] = *g;
  }
  return absl::OkStatus();
}

}  // namespace strata
