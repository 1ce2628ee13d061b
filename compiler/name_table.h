#ifndef STRATA_COMPILER_NAME_TABLE_H_
#define STRATA_COMPILER_NAME_TABLE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"

namespace strata {

// Interns names as dense ids 0, 1, 2, ... in the order they are first seen.
// The table keeps its own copy of every name in one buffer and a hash set of
// 4-byte ids, so lookups touch a compact structure that stays in the core's
// cache; a table keyed by views into a large program sends every probe's key
// comparison out to memory. Views returned by name() are valid until the
// next Intern. A copy (or move) rebuilds its set, whose functors point back
// at the table that owns it.
class NameTable {
 public:
  NameTable() = default;
  NameTable(const NameTable& other) { *this = other; }
  NameTable& operator=(const NameTable& other);

  int size() const { return static_cast<int>(begin_.size()) - 1; }
  void Reserve(int names);
  // The id of `name`, or -1.
  int Find(absl::string_view name) const {
    auto it = ids_.find(name);
    return it == ids_.end() ? -1 : *it;
  }
  // Adds `name` if new; returns its id and whether it was added.
  std::pair<int, bool> Intern(absl::string_view name);
  absl::string_view name(int id) const {
    return absl::string_view(bytes_.data() + begin_[id], begin_[id + 1] - begin_[id]);
  }

 private:
  struct Hash {
    using is_transparent = void;
    const NameTable* table;
    size_t operator()(absl::string_view name) const { return absl::HashOf(name); }
    size_t operator()(int32_t id) const { return absl::HashOf(table->name(id)); }
  };
  struct Eq {
    using is_transparent = void;
    const NameTable* table;
    bool operator()(int32_t a, int32_t b) const { return a == b; }
    bool operator()(int32_t id, absl::string_view name) const { return table->name(id) == name; }
    bool operator()(absl::string_view name, int32_t id) const { return table->name(id) == name; }
  };
  absl::flat_hash_set<int32_t, Hash, Eq> ids_{0, Hash{this}, Eq{this}};
  std::vector<char> bytes_;
  std::vector<uint32_t> begin_{0};  // id -> offset into bytes_; size() + 1 entries
};

}  // namespace strata

#endif  // STRATA_COMPILER_NAME_TABLE_H_
