#ifndef STRATA_COMPILER_GRAPH_INDEX_H_
#define STRATA_COMPILER_GRAPH_INDEX_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/program.pb.h"
#include "runtime/kernel.h"

namespace strata {

// Producer and consumers of every var, and declared var types; rebuilt by a
// pass when it needs one (one walk over the program). Names are keyed by
// string_view into the program, so the index must not outlive the program or
// see its vars and ops change; every name gets a dense integer id.
class GraphIndex {
 public:
  explicit GraphIndex(const Program& program);

  // Index of the first op writing `var`, or -1 (feeds, params, undefined).
  int producer(absl::string_view var) const;
  // Indices of ops reading `var`, in program order, each once.
  absl::Span<const int> consumers(absl::string_view var) const;
  // The declared var, or nullptr.
  const Var* var(absl::string_view name) const;
  TensorType type(absl::string_view name) const;  // DT_INVALID when undeclared

  // Dense ids: declared vars first (in declaration order), then names that
  // ops use without a var entry. -1 when the name appears nowhere.
  int id(absl::string_view name) const;
  int num_ids() const { return static_cast<int>(var_of_.size()); }
  const Var* var(int id) const { return var_of_[id]; }
  int producer(int id) const { return producer_[id]; }
  absl::Span<const int> consumers(int id) const {
    return absl::MakeConstSpan(consumer_list_.data() + consumer_begin_[id],
                               consumer_begin_[id + 1] - consumer_begin_[id]);
  }

 private:
  absl::flat_hash_map<absl::string_view, int> ids_;
  std::vector<const Var*> var_of_;     // id -> var, nullptr for undeclared names
  std::vector<int> producer_;          // id -> first producing op, or -1
  std::vector<int> consumer_begin_;    // id -> offset into consumer_list_ (num_ids + 1 entries)
  std::vector<int> consumer_list_;
};

TensorType TypeOf(const Var& var);
bool IsPersistent(const Var& var);  // PARAM or STATE
// Whether the var's declared type is `type`, without building a TensorType.
bool HasType(const Var& var, const TensorType& type);

}  // namespace strata

#endif  // STRATA_COMPILER_GRAPH_INDEX_H_
