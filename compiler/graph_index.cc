#include "compiler/graph_index.h"

namespace strata {

GraphIndex::GraphIndex(const Program& program) {
  for (const Var& v : program.var()) vars_.emplace(v.name(), &v);
  for (int i = 0; i < program.op_size(); ++i) {
    const Op& op = program.op(i);
    for (const auto& in : op.input()) {
      auto& c = consumers_[in];
      if (c.empty() || c.back() != i) c.push_back(i);
    }
    for (const auto& out : op.output()) producer_.emplace(out, i);
  }
}

int GraphIndex::producer(const std::string& var) const {
  auto it = producer_.find(var);
  return it == producer_.end() ? -1 : it->second;
}

const std::vector<int>& GraphIndex::consumers(const std::string& var) const {
  auto it = consumers_.find(var);
  return it == consumers_.end() ? empty_ : it->second;
}

const Var* GraphIndex::var(const std::string& name) const {
  auto it = vars_.find(name);
  return it == vars_.end() ? nullptr : it->second;
}

TensorType GraphIndex::type(const std::string& name) const {
  const Var* v = var(name);
  return v ? TypeOf(*v) : TensorType{};
}

TensorType TypeOf(const Var& var) {
  return TensorType{var.dtype(), std::vector<int64_t>(var.shape().begin(), var.shape().end())};
}

bool IsPersistent(const Var& var) { return var.kind() == PARAM || var.kind() == STATE; }

}  // namespace strata
