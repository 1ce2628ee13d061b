#include "compiler/name_table.h"

namespace strata {

NameTable& NameTable::operator=(const NameTable& other) {
  if (this == &other) return *this;
  bytes_ = other.bytes_;
  begin_ = other.begin_;
  // The set is rebuilt rather than copied: a copy would keep functors that
  // read the other table's names.
  ids_ = absl::flat_hash_set<int32_t, Hash, Eq>(other.ids_.bucket_count(), Hash{this}, Eq{this});
  for (int id = 0; id < size(); ++id) ids_.insert(id);
  return *this;
}

void NameTable::Reserve(int names) {
  ids_.reserve(names);
  begin_.reserve(names + 1);
}

std::pair<int, bool> NameTable::Intern(absl::string_view name) {
  bool added = false;
  auto it = ids_.lazy_emplace(name, [&](const auto& construct) {
    added = true;
    const int id = size();
    bytes_.insert(bytes_.end(), name.begin(), name.end());
    begin_.push_back(static_cast<uint32_t>(bytes_.size()));
    construct(id);
  });
  return {*it, added};
}

}  // namespace strata
