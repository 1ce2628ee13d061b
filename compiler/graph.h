#ifndef STRATA_COMPILER_GRAPH_H_
#define STRATA_COMPILER_GRAPH_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "compiler/name_table.h"
#include "compiler/op_registry.h"
#include "proto/program.pb.h"
#include "proto/types.h"

namespace strata {

// The compiler's compact in-memory IR: vars and ops by dense id, every name
// interned once, attribute sets stored once and shared by the ops that have
// them (every adam_update of a model has the same five). About 100 bytes per
// op and var against about 730 for the protobuf Program, so the passes' walks
// stay in the cache at sizes where the protobuf's do not (bench/README.md,
// compile time scaling). Protobuf is read once (FromProgram) and written once
// (ToProgram); docs/design-notes.md has the migration of the passes onto it.
class Graph {
 public:
  // Every op input and output must be a declared var and every op type a
  // registered one; otherwise an error naming the op.
  static absl::StatusOr<std::unique_ptr<Graph>> FromProgram(const Program& program);
  // The program again, field for field.
  Program ToProgram() const;

  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  // Vars, in declaration order.
  int num_vars() const { return static_cast<int>(vars_.size()); }
  int FindVar(absl::string_view name) const { return names_.Find(name); }  // -1 when undeclared
  absl::string_view var_name(int v) const { return names_.name(v); }
  DataType dtype(int v) const { return vars_[v].dtype; }
  VarKind kind(int v) const { return vars_[v].kind; }
  void set_kind(int v, VarKind kind) { vars_[v].kind = kind; }
  absl::Span<const int64_t> shape(int v) const {
    return absl::MakeConstSpan(dims_.data() + vars_[v].dims_begin, vars_[v].rank);
  }
  TensorType type(int v) const;
  bool frozen(int v) const { return vars_[v].frozen; }
  // Var.host_memory: lives in host memory on an accelerator's plan.
  bool host_memory(int v) const { return vars_[v].host_memory; }
  void set_host_memory(int v, bool host) { vars_[v].host_memory = host; }
  // Adds a var; -1 when the name is taken.
  int AddVar(absl::string_view name, DataType dtype, absl::Span<const int64_t> shape, VarKind kind);
  // The var's initial value (a compiler STATE var's constant, such as the
  // loss scale); the executor initialises a var without one to zeros.
  void SetInit(int v, const Initializer& init);

  // Ops have stable ids: an op keeps its id while others are inserted or
  // erased around it, and ids are never reused. ops() lists the live ones in
  // program order; a pass that mutates the graph while walking it walks a
  // copy (the reference is invalidated by the next mutation).
  int num_ops() const { return num_live_ops_; }
  const std::vector<int>& ops() const;
  // Every op id is below this (for side tables indexed by op id).
  int op_id_bound() const { return static_cast<int>(ops_.size()); }
  bool erased(int op) const { return ops_[op].erased; }
  // The op's index in program order (what messages call op #i).
  int position(int op) const;
  // Whether op a comes before op b in program order. Unlike comparing
  // positions, it stays cheap while ops are erased (an erase keeps the
  // others' order; only an insertion makes the next call walk the list).
  bool Precedes(int a, int b) const;
  const OpSchema& schema(int op) const { return *ops_[op].schema; }
  absl::Span<const int> inputs(int op) const {
    return absl::MakeConstSpan(io_.data() + ops_[op].io_begin, ops_[op].num_inputs);
  }
  absl::Span<const int> outputs(int op) const {
    return absl::MakeConstSpan(io_.data() + ops_[op].io_begin + ops_[op].num_inputs, ops_[op].num_outputs);
  }
  // A send's or recv's channel, or nullptr; a collective's communication
  // group, or -1.
  const Channel* channel(int op) const { return ops_[op].channel >= 0 ? &channels_[ops_[op].channel] : nullptr; }
  int group(int op) const { return ops_[op].group; }
  int stage(int op) const { return ops_[op].stage; }
  void set_stage(int op, int stage) { ops_[op].stage = stage; }
  OpRole role(int op) const { return ops_[op].role; }
  void set_role(int op, OpRole role) { ops_[op].role = role; }
  int64_t uid(int op) const { return ops_[op].uid; }
  int32_t line(int op) const { return ops_[op].line; }
  absl::string_view device(int op) const { return strings_.name(ops_[op].device); }
  absl::string_view op_name(int op) const { return strings_.name(ops_[op].name); }
  // "file:line: op #i 'type' (name)", as OpLocation says it of a Program.
  std::string OpLocation(int op) const;
  // The op's attrs, shared with every op of the same type and attrs.
  const google::protobuf::Map<std::string, AttrValue>& attrs(int op) const { return attr_sets_[ops_[op].attrs].attr(); }
  // The op as a protobuf message, every field as ToProgram writes it, for the
  // registry's shape functions and gradient makers. A scratch message shared
  // by the ops of one attribute set: valid until the next AsOp call, and not
  // for two threads at once (so neither is VerifyGraph on one Graph).
  const Op& AsOp(int op) const;
  // By var id: the first op that writes it / reads it, or -1.
  std::vector<int> FirstWriters() const;
  std::vector<int> FirstReaders() const;
  // By var id: the live ops that read it, in program order, each once.
  std::vector<std::vector<int>> Readers() const;
  // Appends `op` (its names resolved to vars, its attrs interned); the error
  // names the op when a name is not a var or the type is not registered.
  absl::Status AddOp(const Op& op);
  // The same, returning the new op's id.
  absl::StatusOr<int> AppendOp(const Op& op);
  // Inserts `op` just before / after the live op `anchor`; returns its id.
  absl::StatusOr<int> InsertOpBefore(int anchor, const Op& op);
  absl::StatusOr<int> InsertOpAfter(int anchor, const Op& op);
  // Gives op `id` the type, names, attrs and fields of `op`, in place (its
  // id and position stay).
  absl::Status ReplaceOp(int id, const Op& op);
  // Removes a live op; its id is never reused.
  void EraseOp(int op);
  // Copies of the live ops `ops` (in the order given), inserted before the
  // live op `before` (at the end when -1), each input and output var
  // renamed through `rename` (by var id; vars not in it stay). Returns the
  // copies' ids, in the same order.
  absl::StatusOr<std::vector<int>> CloneOps(absl::Span<const int> ops, int before,
                                            const absl::flat_hash_map<int, int>& rename);
  // Input k of op `op` reads var `var`, which must have the type of the var
  // it read before.
  absl::Status SetInput(int op, int k, int var);
  // Every read of var `from` by a live op for which `filter` is true (every
  // live op without one) reads `to` instead; both vars must have one type.
  // Returns how many inputs changed.
  absl::StatusOr<int> ReplaceAllUsesWith(int from, int to, const std::function<bool(int op)>& filter = nullptr);
  // Drops the vars for which keep[v] is false, keeping the others' order.
  // Var ids are renumbered (the next ids in order), so ids held before are
  // stale. An error, changing nothing, if a live op reads or writes a var
  // being dropped.
  absl::Status RetainVars(const std::vector<bool>& keep);

  // The program's own fields. loss and fetch keep their names (a fetch need
  // not be a var until validation says so).
  const std::string& loss() const { return program_fields_.loss(); }
  // Records parameter -> gradient var (autodiff).
  void SetParamGrad(absl::string_view param, absl::string_view grad) {
    (*program_fields_.mutable_param_grad())[std::string(param)] = std::string(grad);
  }
  const Program& program_fields() const { return program_fields_; }
  // loss, fetch, param_grad, tied_replica and the rest, for passes that change them.
  Program& mutable_program_fields() { return program_fields_; }

  // Vars a later pass looks up by name (the strategy's recompute
  // checkpoints, until the recompute pass has found them): like the loss
  // and the fetches, no rewrite may fold them away (passes/pass_helpers.h,
  // IsUnreportedActivation). By name, so the pins outlast RetainVars'
  // renumbering; a Graph made from a Program has none.
  void Pin(absl::string_view name) { pinned_.insert(std::string(name)); }
  bool pinned(absl::string_view name) const { return pinned_.contains(name); }
  void ClearPins() { pinned_.clear(); }

 private:
  struct VarRec {
    int32_t dims_begin = 0;
    int32_t rank = 0;
    DataType dtype = DT_INVALID;
    VarKind kind = ACTIVATION;
    int32_t line = 0;
    int32_t init = -1;  // index into inits_
    bool frozen = false;
    bool host_memory = false;
  };
  struct OpRec {
    const OpSchema* schema = nullptr;
    int32_t io_begin = 0;
    int32_t num_inputs = 0;
    int32_t num_outputs = 0;
    int32_t attrs = 0;     // index into attr_sets_
    int32_t device = 0;    // index into strings_
    int32_t name = 0;      // index into strings_ ("" when unnamed)
    int32_t channel = -1;  // index into channels_
    int32_t group = -1;    // a collective's communication group; -1: none
    int32_t stage = 0;
    int32_t line = 0;
    int64_t uid = 0;
    OpRole role = ROLE_UNSPECIFIED;
    bool erased = false;
  };
  int InternAttrs(const Op& op);
  // The record of `op` with its names resolved (appended to io_); the error
  // names the op, as at program position `index`.
  absl::StatusOr<OpRec> MakeOpRec(const Op& op, int index);
  // Links op `id` into the program order after `prev` (-1: first).
  void LinkAfter(int id, int prev);
  // Adds `op` after the live op `prev` (-1: first); it will be at `position`.
  absl::StatusOr<int> InsertAfterLinked(int prev, const Op& op, int position);

  NameTable names_;  // var names; a var's id is its name's id
  std::vector<VarRec> vars_;
  std::vector<int64_t> dims_;
  std::vector<Initializer> inits_;
  std::vector<OpRec> ops_;
  std::vector<int32_t> io_;  // per op: input var ids, then output var ids
  // Distinct (type, attrs) as Op messages without names: AsOp fills the names in.
  mutable std::deque<Op> attr_sets_;                   // a deque: AsOp references stay valid as sets are added
  absl::flat_hash_map<std::string, int> attr_set_of_;  // canonical encoding -> index
  NameTable strings_;                                  // devices and op names
  std::vector<Channel> channels_;
  // Program order: a doubly linked list over op ids, and its dense form
  // (and each op's position in it), rebuilt on demand after a mutation.
  std::vector<int32_t> next_, prev_;
  int head_ = -1, tail_ = -1;
  int num_live_ops_ = 0;
  mutable std::vector<int> order_;
  mutable std::vector<int32_t> position_;
  mutable bool order_valid_ = true;
  // position_ still orders the live ops (with gaps where ops were erased).
  mutable bool ranks_valid_ = true;
  // Everything of the Program but its vars and ops.
  Program program_fields_;
  absl::flat_hash_set<std::string> pinned_;
};

// The verifier's checks over a Graph: every op's arity, every input defined
// before use (a feed, parameter or state var, or written by an earlier op),
// and every output's var typed as the op's shape function infers it.
absl::Status VerifyGraph(const Graph& graph);

}  // namespace strata

#endif  // STRATA_COMPILER_GRAPH_H_
