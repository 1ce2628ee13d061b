#include "compiler/graph_index.h"

#include <algorithm>

namespace strata {

GraphIndex::GraphIndex(const Program& program) {
  const int num_vars = program.var_size();
  names_.Reserve(num_vars);
  var_of_.reserve(num_vars);
  meta_.reserve(num_vars);
  dims_.reserve(num_vars * 2);
  for (const Var& v : program.var()) {
    if (!names_.Intern(v.name()).second) continue;  // declared twice: the first counts
    var_of_.push_back(&v);
    Meta m;
    m.dims_begin = static_cast<int32_t>(dims_.size());
    m.rank = v.shape_size();
    m.kind = v.kind();
    m.dtype = v.dtype();
    dims_.insert(dims_.end(), v.shape().begin(), v.shape().end());
    meta_.push_back(m);
  }
  auto intern = [&](const std::string& name) {
    auto [id, inserted] = names_.Intern(name);
    if (inserted) {
      var_of_.push_back(nullptr);
      meta_.push_back(Meta{});
    }
    return id;
  };
  // One walk interns every name; consumer lists come later, when asked for.
  op_input_begin_.reserve(program.op_size() + 1);
  op_output_begin_.reserve(program.op_size());
  for (int i = 0; i < program.op_size(); ++i) {
    const Op& op = program.op(i);
    op_input_begin_.push_back(static_cast<int>(op_ids_.size()));
    for (const auto& in : op.input()) op_ids_.push_back(intern(in));
    op_output_begin_.push_back(static_cast<int>(op_ids_.size()));
    for (const auto& out : op.output()) {
      const int id = intern(out);
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



}  // namespace strata
