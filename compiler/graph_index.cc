#include "compiler/graph_index.h"

#include <algorithm>

namespace strata {

bool GraphIndex::StartFrom(const Program& program, const GraphIndex& previous) {
  // Every name the previous index knew must be a var declared at the same
  // place now (a pass that only appended); otherwise start afresh.
  const int n = previous.num_ids();
  if (n > program.var_size()) return false;
  for (int j = 0; j < n; ++j) {
    if (!previous.declared(j) || program.var(j).name() != previous.name(j)) return false;
  }
  names_ = previous.names_;
  names_.Reserve(program.var_size());
  return true;
}

GraphIndex::GraphIndex(const Program& program, const GraphIndex* previous) {
  const int num_vars = program.var_size();
  if (previous == nullptr || !StartFrom(program, *previous)) {
    names_.Reserve(num_vars);
  }
  const int known = names_.size();  // the previous index's names, declared at vars [0, known)
  var_of_.reserve(num_vars);
  meta_.reserve(num_vars);
  dims_.reserve(num_vars * 2);
  auto add_var = [&](const Var& v) {
    var_of_.push_back(&v);
    Meta m;
    m.dims_begin = static_cast<int32_t>(dims_.size());
    m.rank = v.shape_size();
    m.kind = v.kind();
    m.dtype = v.dtype();
    dims_.insert(dims_.end(), v.shape().begin(), v.shape().end());
    meta_.push_back(m);
  };
  for (int j = 0; j < known; ++j) add_var(program.var(j));
  for (int j = known; j < num_vars; ++j) {
    const Var& v = program.var(j);
    if (names_.Intern(v.name()).second) add_var(v);
  }
  auto intern_use = [&](const std::string& name) {
    auto [id, inserted] = names_.Intern(name);
    if (inserted) {
      var_of_.push_back(nullptr);
      meta_.push_back(Meta{});
    }
    return id;
  };
  // The previous index resolved the ops it covered: an op that still reads
  // and writes the same names keeps its ids, checked by comparing the names
  // (a walk in program order, where hashing would probe all over the table).
  const bool same_ops = known > 0;
  auto resolve = [&](const std::string& name, int i, int pos) {
    if (same_ops && i < previous->num_ops()) {
      const int candidate = previous->op_ids_[pos];
      if (candidate < known && name == this->name(candidate)) return candidate;
    }
    return intern_use(name);
  };
  // One walk interns every name; consumer lists come later, when asked for.
  op_input_begin_.reserve(program.op_size() + 1);
  op_output_begin_.reserve(program.op_size());
  for (int i = 0; i < program.op_size(); ++i) {
    const Op& op = program.op(i);
    // Positions in the previous index's op_ids_, valid while op i has the same arity there.
    int prev_in = -1, prev_out = -1;
    if (same_ops && i < previous->num_ops() && previous->input_ids(i).size() == static_cast<size_t>(op.input_size()) &&
        previous->output_ids(i).size() == static_cast<size_t>(op.output_size())) {
      prev_in = previous->op_input_begin_[i];
      prev_out = previous->op_output_begin_[i];
    }
    op_input_begin_.push_back(static_cast<int>(op_ids_.size()));
    for (int k = 0; k < op.input_size(); ++k) {
      op_ids_.push_back(prev_in >= 0 ? resolve(op.input(k), i, prev_in + k) : intern_use(op.input(k)));
    }
    op_output_begin_.push_back(static_cast<int>(op_ids_.size()));
    for (int k = 0; k < op.output_size(); ++k) {
      const int id = prev_out >= 0 ? resolve(op.output(k), i, prev_out + k) : intern_use(op.output(k));
      op_ids_.push_back(id);
      if (static_cast<size_t>(id) >= producer_.size()) producer_.resize(var_of_.size(), -1);
      if (producer_[id] < 0) producer_[id] = i;
    }
  }
  op_input_begin_.push_back(static_cast<int>(op_ids_.size()));
  producer_.resize(var_of_.size(), -1);
}

void GraphIndex::BuildConsumers() const {
  // Counts each op's distinct readers, then fills them in: the same walk twice.
  const size_t n = var_of_.size();
  std::vector<int> last_reader(n, -1);
  auto for_each_reader = [&](auto&& fn) {
    std::fill(last_reader.begin(), last_reader.end(), -1);
    for (int i = 0; i < num_ops(); ++i) {
      for (int id : input_ids(i)) {
        if (last_reader[id] == i) continue;
        last_reader[id] = i;
        fn(id, i);
      }
    }
  };
  std::vector<int> count(n, 0);
  for_each_reader([&](int id, int) { ++count[id]; });
  consumer_begin_.assign(n + 1, 0);
  for (size_t id = 0; id < n; ++id) consumer_begin_[id + 1] = consumer_begin_[id] + count[id];
  consumer_list_.resize(consumer_begin_[n]);
  std::vector<int> fill(consumer_begin_.begin(), consumer_begin_.end() - 1);
  for_each_reader([&](int id, int op) { consumer_list_[fill[id]++] = op; });
}

int GraphIndex::id(absl::string_view name) const { return names_.Find(name); }

int GraphIndex::producer(absl::string_view var) const {
  const int i = id(var);
  return i < 0 ? -1 : producer_[i];
}

absl::Span<const int> GraphIndex::consumers(absl::string_view var) const {
  const int i = id(var);
  return i < 0 ? absl::Span<const int>() : consumers(i);
}

const Var* GraphIndex::var(absl::string_view name) const {
  const int i = id(name);
  return i < 0 ? nullptr : var_of_[i];
}

TensorType GraphIndex::type(absl::string_view name) const {
  const Var* v = var(name);
  return v ? TypeOf(*v) : TensorType{};
}

const GraphIndex& IndexFor(const Program& program, const GraphIndex* given, std::optional<GraphIndex>* own) {
  if (given != nullptr && given->num_ops() == program.op_size()) return *given;
  own->emplace(program);
  return **own;
}

TensorType GraphIndex::type(int id) const {
  const Meta& m = meta_[id];
  if (m.rank < 0) return TensorType{};
  return TensorType{m.dtype, Shape(dims_.begin() + m.dims_begin, dims_.begin() + m.dims_begin + m.rank)};
}

bool GraphIndex::HasType(int id, const TensorType& type) const {
  const Meta& m = meta_[id];
  return m.rank >= 0 && m.dtype == type.dtype &&
         std::equal(dims_.begin() + m.dims_begin, dims_.begin() + m.dims_begin + m.rank, type.shape.begin(),
                    type.shape.end());
}

TensorType TypeOf(const Var& var) { return TensorType{var.dtype(), Shape(var.shape().begin(), var.shape().end())}; }

bool IsPersistent(const Var& var) { return var.kind() == PARAM || var.kind() == STATE; }

bool HasType(const Var& var, const TensorType& type) {
  return var.dtype() == type.dtype &&
         std::equal(var.shape().begin(), var.shape().end(), type.shape.begin(), type.shape.end());
}

}  // namespace strata
