#ifndef STRATA_COMPILER_GRAPH_INDEX_H_
#define STRATA_COMPILER_GRAPH_INDEX_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "proto/program.pb.h"
#include "runtime/kernel.h"

namespace strata {

// Producer and consumers of every var, and declared var types; rebuilt by a
// pass when it needs one (cheap: one walk over the program).
class GraphIndex {
 public:
  explicit GraphIndex(const Program& program);

  // Index of the first op writing `var`, or -1 (feeds, params, undefined).
  int producer(const std::string& var) const;
  // Indices of ops reading `var`, in program order.
  const std::vector<int>& consumers(const std::string& var) const;
  // The declared var, or nullptr.
  const Var* var(const std::string& name) const;
  TensorType type(const std::string& name) const;  // DT_INVALID when undeclared

 private:
  absl::flat_hash_map<std::string, int> producer_;
  absl::flat_hash_map<std::string, std::vector<int>> consumers_;
  absl::flat_hash_map<std::string, const Var*> vars_;
  std::vector<int> empty_;
};

TensorType TypeOf(const Var& var);
bool IsPersistent(const Var& var);  // PARAM or STATE

}  // namespace strata

#endif  // STRATA_COMPILER_GRAPH_INDEX_H_
