#ifndef STRATA_COMPILER_GRAPH_INDEX_H_
#define STRATA_COMPILER_GRAPH_INDEX_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "compiler/name_table.h"
#include "proto/program.pb.h"
#include "proto/roles.h"
#include "proto/types.h"

namespace strata {

// Producer and consumers of every var, and declared var types; rebuilt by a
// pass when it needs one (one walk over the program). It points at the
// program's vars, so it must not outlive the program or see its vars and
// ops change; every name gets a dense integer id. Not copyable or movable;
// hold it by pointer.
class GraphIndex {
 public:
  explicit GraphIndex(const Program& program);
  GraphIndex(const GraphIndex&) = delete;
  GraphIndex& operator=(const GraphIndex&) = delete;

  // Index of the first op writing `var`, or -1 (feeds, params, undefined).
  int producer(absl::string_view var) const;
  // Indices of ops reading `var`, in program order, each once.
  absl::Span<const int> consumers(absl::string_view var) const;
  // The declared var, or nullptr.
  const Var* var(absl::string_view name) const;
  TensorType type(absl::string_view name) const;  // DT_INVALID when undeclared
  // The declared type and kind of id's var, from the index's own dense copy
  // (no access to the Var message); DT_INVALID / ACTIVATION when undeclared.
  TensorType type(int id) const;
  DataType dtype(int id) const { return meta_[id].dtype; }
  VarKind kind(int id) const { return meta_[id].kind; }
  bool declared(int id) const { return meta_[id].rank >= 0; }
  bool HasType(int id, const TensorType& type) const;

  // Dense ids: declared vars first (in declaration order), then names that
  // ops use without a var entry. -1 when the name appears nowhere.
  int id(absl::string_view name) const;
  int num_ids() const { return static_cast<int>(var_of_.size()); }
  absl::string_view name(int id) const { return names_.name(id); }  // a view into the index's own copy
  const Var* var(int id) const { return var_of_[id]; }
  int producer(int id) const { return producer_[id]; }
  // The ids of op i's inputs and outputs, in order (the ops the index was
  // built over: num_ops() of them).
  int num_ops() const { return static_cast<int>(op_input_begin_.size()) - 1; }
  absl::Span<const int> input_ids(int op) const {
    return absl::MakeConstSpan(op_ids_.data() + op_input_begin_[op], op_output_begin_[op] - op_input_begin_[op]);
  }
  absl::Span<const int> output_ids(int op) const {
    return absl::MakeConstSpan(op_ids_.data() + op_output_begin_[op], op_input_begin_[op + 1] - op_output_begin_[op]);
  }
  absl::Span<const int> consumers(int id) const {
    if (consumer_begin_.empty()) BuildConsumers();
    return absl::MakeConstSpan(consumer_list_.data() + consumer_begin_[id],
                               consumer_begin_[id + 1] - consumer_begin_[id]);
  }

 private:
  NameTable names_;
  struct Meta {
    int32_t dims_begin = 0;
    int32_t rank = -1;  // -1: no var entry
    DataType dtype = DT_INVALID;
    VarKind kind = ACTIVATION;
  };
  std::vector<Meta> meta_;          // id -> declared type, kind
  std::vector<int64_t> dims_;       // meta_[id].dims_begin .. + rank
  std::vector<const Var*> var_of_;  // id -> var, nullptr for undeclared names
  std::vector<int> producer_;       // id -> first producing op, or -1
  // Built on the first consumers() call (the verifier never asks): a second
  // walk over op_ids_. Not thread-safe, like the rest of a pass.
  void BuildConsumers() const;
  mutable std::vector<int> consumer_begin_;  // id -> offset into consumer_list_ (num_ids + 1 entries)
  mutable std::vector<int> consumer_list_;
  // Per op, its input ids then its output ids: op i's inputs are
  // op_ids_[op_input_begin_[i], op_output_begin_[i]), its outputs up to
  // op_input_begin_[i + 1].
  std::vector<int> op_ids_;
  std::vector<int> op_input_begin_;   // num_ops + 1 entries
  std::vector<int> op_output_begin_;  // num_ops entries
};


TensorType TypeOf(const Var& var);
inline bool IsPersistent(const Var& var) { return IsPersistent(var.kind()); }

}  // namespace strata

#endif  // STRATA_COMPILER_GRAPH_INDEX_H_
