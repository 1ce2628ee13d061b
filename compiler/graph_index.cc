#include "compiler/graph_index.h"

#include <algorithm>

namespace strata {

GraphIndex::GraphIndex(const Program& program) {
  const int num_vars = program.var_size();
  ids_.reserve(num_vars);
  var_of_.reserve(num_vars);
  for (const Var& v : program.var()) {
    if (ids_.emplace(v.name(), static_cast<int>(var_of_.size())).second) var_of_.push_back(&v);
  }
  auto intern = [&](const std::string& name) {
    auto [it, inserted] = ids_.emplace(name, static_cast<int>(var_of_.size()));
    if (inserted) var_of_.push_back(nullptr);
    return it->second;
  };
  // One pass interns every name and counts consumers; a second fills them in.
  std::vector<int> input_ids;
  std::vector<int> last_reader;
  std::vector<int> count;
  for (int i = 0; i < program.op_size(); ++i) {
    const Op& op = program.op(i);
    for (const auto& in : op.input()) {
      const int id = intern(in);
      input_ids.push_back(id);
      if (static_cast<size_t>(id) >= count.size()) {
        count.resize(var_of_.size(), 0);
        last_reader.resize(var_of_.size(), -1);
      }
      if (last_reader[id] != i) {
        last_reader[id] = i;
        ++count[id];
      }
    }
    for (const auto& out : op.output()) {
      const int id = intern(out);
      if (static_cast<size_t>(id) >= producer_.size()) producer_.resize(var_of_.size(), -1);
      if (producer_[id] < 0) producer_[id] = i;
    }
  }
  const size_t n = var_of_.size();
  producer_.resize(n, -1);
  count.resize(n, 0);
  consumer_begin_.assign(n + 1, 0);
  for (size_t id = 0; id < n; ++id) consumer_begin_[id + 1] = consumer_begin_[id] + count[id];
  consumer_list_.resize(consumer_begin_[n]);
  std::vector<int> fill(consumer_begin_.begin(), consumer_begin_.end() - 1);
  std::fill(last_reader.begin(), last_reader.end(), -1);
  size_t k = 0;
  for (int i = 0; i < program.op_size(); ++i) {
    for (int j = 0; j < program.op(i).input_size(); ++j) {
      const int id = input_ids[k++];
      if (last_reader[id] == i) continue;
      last_reader[id] = i;
      consumer_list_[fill[id]++] = i;
    }
  }
}

int GraphIndex::id(absl::string_view name) const {
  auto it = ids_.find(name);
  return it == ids_.end() ? -1 : it->second;
}

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

TensorType TypeOf(const Var& var) {
  return TensorType{var.dtype(), Shape(var.shape().begin(), var.shape().end())};
}

bool IsPersistent(const Var& var) { return var.kind() == PARAM || var.kind() == STATE; }

bool HasType(const Var& var, const TensorType& type) {
  return var.dtype() == type.dtype &&
         std::equal(var.shape().begin(), var.shape().end(), type.shape.begin(), type.shape.end());
}

}  // namespace strata
