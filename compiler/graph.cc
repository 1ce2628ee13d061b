#include "compiler/graph.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compiler/program_text.h"
#include "google/protobuf/field_mask.pb.h"
#include "google/protobuf/util/field_mask_util.h"

namespace strata {
namespace {

// The file messages name: the source file, else the program's name.
absl::string_view FileOf(const Program& fields) {
  return fields.source_file().empty() ? fields.name() : fields.source_file();
}

// Where an op about to be added is, as OpLocation says it of a Program.
std::string OpWhere(const Program& fields, int i, const Op& op) {
  return OpLocation(FileOf(fields), i, op.type(), op.line(), op.name());
}

// The Program's own fields, without its vars and ops (copied apart, not
// copied and cleared).
const google::protobuf::FieldMask& ProgramFieldsMask() {
  static const google::protobuf::FieldMask* mask = [] {
    auto* m = new google::protobuf::FieldMask;
    const google::protobuf::Descriptor* d = Program::descriptor();
    for (int f = 0; f < d->field_count(); ++f) {
      if (d->field(f)->name() != "var" && d->field(f)->name() != "op") m->add_paths(d->field(f)->name());
    }
    return m;
  }();
  return *mask;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Graph>> Graph::FromProgram(const Program& program) {
  auto graph = std::make_unique<Graph>();
  Graph& g = *graph;
  google::protobuf::util::FieldMaskUtil::MergeMessageTo(
      program, ProgramFieldsMask(), google::protobuf::util::FieldMaskUtil::MergeOptions(), &g.program_fields_);
  g.names_.Reserve(program.var_size());
  g.vars_.reserve(program.var_size());
  for (const Var& v : program.var()) {
    const int id = g.AddVar(v.name(), v.dtype(), v.shape(), v.kind());
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("var '", v.name(), "' is declared twice"));
    VarRec& r = g.vars_[id];
    r.line = v.line();
    r.frozen = v.frozen();
    r.host_memory = v.host_memory();
    if (v.has_init()) {
      r.init = static_cast<int32_t>(g.inits_.size());
      g.inits_.push_back(v.init());
    }
  }
  g.ops_.reserve(program.op_size());
  for (const Op& op : program.op()) {
    if (auto s = g.AddOp(op); !s.ok()) return s;
  }
  return graph;
}

int Graph::AddVar(absl::string_view name, DataType dtype, absl::Span<const int64_t> shape, VarKind kind) {
  if (!names_.Intern(name).second) return -1;
  VarRec r;
  r.dims_begin = static_cast<int32_t>(dims_.size());
  r.rank = static_cast<int32_t>(shape.size());
  r.dtype = dtype;
  r.kind = kind;
  dims_.insert(dims_.end(), shape.begin(), shape.end());
  vars_.push_back(r);
  return num_vars() - 1;
}

void Graph::SetInit(int v, const Initializer& init) {
  vars_[v].init = static_cast<int32_t>(inits_.size());
  inits_.push_back(init);
}

std::string Graph::OpLocation(int op) const {
  return strata::OpLocation(FileOf(program_fields_), position(op), schema(op).type, line(op), op_name(op));
}

const std::vector<int>& Graph::ops() const {
  if (!order_valid_) {
    order_.clear();
    order_.reserve(num_live_ops_);
    position_.assign(ops_.size(), -1);
    for (int id = head_; id >= 0; id = next_[id]) {
      position_[id] = static_cast<int32_t>(order_.size());
      order_.push_back(id);
    }
    order_valid_ = true;
    ranks_valid_ = true;
  }
  return order_;
}

int Graph::position(int op) const {
  ops();
  return position_[op];
}

bool Graph::Precedes(int a, int b) const {
  if (!ranks_valid_) ops();
  return position_[a] < position_[b];
}

void Graph::LinkAfter(int id, int prev) {
  prev_[id] = prev;
  next_[id] = prev >= 0 ? next_[prev] : head_;
  if (prev >= 0) {
    next_[prev] = id;
  } else {
    head_ = id;
  }
  if (next_[id] >= 0) {
    prev_[next_[id]] = id;
  } else {
    tail_ = id;
  }
  ++num_live_ops_;
}

TensorType Graph::type(int v) const {
  const absl::Span<const int64_t> s = shape(v);
  return TensorType{vars_[v].dtype, Shape(s.begin(), s.end())};
}

int Graph::InternAttrs(const Op& op) {
  // The type, then the attrs by name with their deterministic encodings.
  std::vector<const google::protobuf::MapPair<std::string, AttrValue>*> entries;
  entries.reserve(op.attr_size());
  for (const auto& entry : op.attr()) entries.push_back(&entry);
  std::sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
  std::string key = op.type();
  for (const auto* e : entries) {
    absl::StrAppend(&key, "\n", e->first.size(), ":", e->first, "=");
    std::string value;
    e->second.SerializeToString(&value);
    absl::StrAppend(&key, value.size(), ":", value);
  }
  auto [it, added] = attr_set_of_.emplace(std::move(key), static_cast<int>(attr_sets_.size()));
  if (added) {
    Op& set = attr_sets_.emplace_back();
    set.set_type(op.type());
    *set.mutable_attr() = op.attr();
  }
  return it->second;
}

absl::StatusOr<Graph::OpRec> Graph::MakeOpRec(const Op& op, int index) {
  OpRec r;
  r.schema = OpRegistry::Global().Find(op.type());
  if (r.schema == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(OpWhere(program_fields_, index, op), ": unknown op type"));
  r.io_begin = static_cast<int32_t>(io_.size());
  r.num_inputs = op.input_size();
  r.num_outputs = op.output_size();
  auto resolve = [&](const std::string& name, const char* what) -> absl::Status {
    const int v = names_.Find(name);
    if (v < 0) {
      io_.resize(r.io_begin);
      return absl::InvalidArgumentError(
          absl::StrCat(OpWhere(program_fields_, index, op), ": ", what, " '", name, "' is not a var"));
    }
    io_.push_back(v);
    return absl::OkStatus();
  };
  for (const auto& in : op.input()) {
    if (auto s = resolve(in, "input"); !s.ok()) return s;
  }
  for (const auto& out : op.output()) {
    if (auto s = resolve(out, "output"); !s.ok()) return s;
  }
  r.attrs = InternAttrs(op);
  r.device = strings_.Intern(op.device()).first;
  r.name = strings_.Intern(op.name()).first;
  if (op.has_channel()) {
    r.channel = static_cast<int32_t>(channels_.size());
    channels_.push_back(op.channel());
  }
  r.group = op.has_group() ? op.group() : -1;
  r.stage = op.stage();
  r.line = op.line();
  r.uid = op.uid();
  r.role = op.role();
  return r;
}

absl::Status Graph::AddOp(const Op& op) { return AppendOp(op).status(); }

absl::StatusOr<int> Graph::AppendOp(const Op& op) { return InsertAfterLinked(tail_, op, num_live_ops_); }

absl::StatusOr<int> Graph::InsertOpBefore(int anchor, const Op& op) {
  if (anchor < 0 || anchor >= op_id_bound() || erased(anchor)) {
    return absl::InternalError(absl::StrCat("insert before op ", anchor, ": no such live op"));
  }
  return InsertAfterLinked(prev_[anchor], op, position(anchor));
}

absl::StatusOr<int> Graph::InsertOpAfter(int anchor, const Op& op) {
  if (anchor < 0 || anchor >= op_id_bound() || erased(anchor)) {
    return absl::InternalError(absl::StrCat("insert after op ", anchor, ": no such live op"));
  }
  return InsertAfterLinked(anchor, op, position(anchor) + 1);
}

absl::StatusOr<int> Graph::InsertAfterLinked(int prev, const Op& op, int position) {
  absl::StatusOr<OpRec> r = MakeOpRec(op, position);
  if (!r.ok()) return r.status();
  const int id = op_id_bound();
  const bool appended = prev == tail_;
  ops_.push_back(*r);
  next_.push_back(-1);
  prev_.push_back(-1);
  LinkAfter(id, prev);
  if (appended && order_valid_) {  // appending keeps the dense order valid: the common case, FromProgram
    position_.push_back(static_cast<int32_t>(order_.size()));
    order_.push_back(id);
  } else {
    order_valid_ = false;
    ranks_valid_ = false;
  }
  return id;
}

absl::Status Graph::ReplaceOp(int id, const Op& op) {
  if (id < 0 || id >= op_id_bound() || erased(id)) {
    return absl::InternalError(absl::StrCat("replace op ", id, ": no such live op"));
  }
  // The op's position names it only in an error: after an erase, finding
  // it walks the whole list, which a pass replacing op after op would pay
  // each time (quadratic), so the walk waits for an error.
  absl::StatusOr<OpRec> r = MakeOpRec(op, order_valid_ ? position_[id] : -1);
  if (!r.ok() && !order_valid_) r = MakeOpRec(op, position(id));
  if (!r.ok()) return r.status();
  ops_[id] = *r;
  return absl::OkStatus();
}

void Graph::EraseOp(int op) {
  if (op < 0 || op >= op_id_bound() || erased(op)) return;
  ops_[op].erased = true;
  if (prev_[op] >= 0) {
    next_[prev_[op]] = next_[op];
  } else {
    head_ = next_[op];
  }
  if (next_[op] >= 0) {
    prev_[next_[op]] = prev_[op];
  } else {
    tail_ = prev_[op];
  }
  --num_live_ops_;
  order_valid_ = false;
}

absl::StatusOr<std::vector<int>> Graph::CloneOps(absl::Span<const int> ops, int before,
                                                 const absl::flat_hash_map<int, int>& rename) {
  std::vector<int> ids;
  ids.reserve(ops.size());
  for (int op : ops) {
    if (op < 0 || op >= op_id_bound() || erased(op)) {
      return absl::InternalError(absl::StrCat("clone op ", op, ": no such live op"));
    }
    Op copy = AsOp(op);  // a copy: AsOp's message is scratch
    auto renamed = [&](google::protobuf::RepeatedPtrField<std::string>* names, absl::Span<const int> vars) {
      for (size_t k = 0; k < vars.size(); ++k) {
        auto it = rename.find(vars[k]);
        if (it != rename.end()) {
          const absl::string_view name = var_name(it->second);
          names->Mutable(static_cast<int>(k))->assign(name.data(), name.size());
        }
      }
    };
    renamed(copy.mutable_input(), inputs(op));
    renamed(copy.mutable_output(), outputs(op));
    absl::StatusOr<int> id = before >= 0 ? InsertOpBefore(before, copy) : AppendOp(copy);
    if (!id.ok()) return id.status();
    ids.push_back(*id);
  }
  return ids;
}

absl::Status Graph::SetInput(int op, int k, int var) {
  if (op < 0 || op >= op_id_bound() || erased(op) || k < 0 || k >= ops_[op].num_inputs || var < 0 ||
      var >= num_vars()) {
    return absl::InternalError(absl::StrCat("set input ", k, " of op ", op, " to var ", var, ": out of range"));
  }
  int32_t& in = io_[ops_[op].io_begin + k];
  if (type(in) != type(var)) {
    return absl::InternalError(absl::StrCat(OpLocation(op), ": input ", k, " '", var_name(in), "' (", type(in).ToString(),
                                            ") cannot become '", var_name(var), "' (", type(var).ToString(), ")"));
  }
  in = var;
  return absl::OkStatus();
}

absl::StatusOr<int> Graph::ReplaceAllUsesWith(int from, int to, const std::function<bool(int op)>& filter) {
  if (from < 0 || from >= num_vars() || to < 0 || to >= num_vars()) {
    return absl::InternalError(absl::StrCat("replace uses: var ", from, " or ", to, " does not exist"));
  }
  if (type(from) != type(to)) {
    return absl::InternalError(absl::StrCat("replace uses of '", var_name(from), "' (", type(from).ToString(),
                                            ") with '", var_name(to), "' (", type(to).ToString(), "): types differ"));
  }
  int changed = 0;
  for (int op = head_; op >= 0; op = next_[op]) {
    if (filter && !filter(op)) continue;
    const OpRec& r = ops_[op];
    for (int k = 0; k < r.num_inputs; ++k) {
      int32_t& v = io_[r.io_begin + k];
      if (v == from) {
        v = to;
        ++changed;
      }
    }
  }
  return changed;
}

absl::Status Graph::RetainVars(const std::vector<bool>& keep) {
  if (static_cast<int>(keep.size()) != num_vars()) {
    return absl::InternalError(absl::StrCat("retain vars: ", keep.size(), " flags for ", num_vars(), " vars"));
  }
  for (int op = head_; op >= 0; op = next_[op]) {
    const OpRec& r = ops_[op];
    for (int k = 0; k < r.num_inputs + r.num_outputs; ++k) {
      const int v = io_[r.io_begin + k];
      if (!keep[v]) {
        return absl::InternalError(absl::StrCat(OpLocation(op), ": uses var '", var_name(v), "', which is being dropped"));
      }
    }
  }
  NameTable names;
  std::vector<VarRec> vars;
  std::vector<int64_t> dims;
  std::vector<Initializer> inits;
  std::vector<int32_t> new_id(num_vars(), -1);
  for (int v = 0; v < num_vars(); ++v) {
    if (!keep[v]) continue;
    new_id[v] = names.Intern(var_name(v)).first;
    VarRec r = vars_[v];
    r.dims_begin = static_cast<int32_t>(dims.size());
    const absl::Span<const int64_t> s = shape(v);
    dims.insert(dims.end(), s.begin(), s.end());
    if (r.init >= 0) {
      inits.push_back(std::move(inits_[r.init]));
      r.init = static_cast<int32_t>(inits.size()) - 1;
    }
    vars.push_back(r);
  }
  // Erased ops keep stale ids; nothing reads them.
  for (int op = head_; op >= 0; op = next_[op]) {
    const OpRec& r = ops_[op];
    for (int k = 0; k < r.num_inputs + r.num_outputs; ++k) io_[r.io_begin + k] = new_id[io_[r.io_begin + k]];
  }
  names_ = std::move(names);
  vars_ = std::move(vars);
  dims_ = std::move(dims);
  inits_ = std::move(inits);
  return absl::OkStatus();
}

const Op& Graph::AsOp(int op) const {
  Op& scratch = attr_sets_[ops_[op].attrs];
  auto fill = [&](google::protobuf::RepeatedPtrField<std::string>* names, absl::Span<const int> ids) {
    while (names->size() > static_cast<int>(ids.size())) names->RemoveLast();
    for (size_t k = 0; k < ids.size(); ++k) {
      const absl::string_view name = var_name(ids[k]);
      if (static_cast<int>(k) < names->size()) {
        names->Mutable(static_cast<int>(k))->assign(name.data(), name.size());
      } else {
        names->Add()->assign(name.data(), name.size());
      }
    }
  };
  fill(scratch.mutable_input(), inputs(op));
  fill(scratch.mutable_output(), outputs(op));
  const OpRec& r = ops_[op];
  const absl::string_view device = strings_.name(r.device), name = strings_.name(r.name);
  scratch.set_device(device.data(), device.size());
  scratch.set_name(name.data(), name.size());
  scratch.set_role(r.role);
  scratch.set_stage(r.stage);
  scratch.set_uid(r.uid);
  scratch.set_line(r.line);
  if (r.channel >= 0) {
    *scratch.mutable_channel() = channels_[r.channel];
  } else {
    scratch.clear_channel();
  }
  if (r.group >= 0) {
    scratch.set_group(r.group);
  } else {
    scratch.clear_group();
  }
  return scratch;
}

Program Graph::ToProgram() const {
  Program p = program_fields_;
  p.mutable_var()->Reserve(num_vars());
  for (int v = 0; v < num_vars(); ++v) {
    const VarRec& r = vars_[v];
    Var* out = p.add_var();
    const absl::string_view name = var_name(v);
    out->set_name(name.data(), name.size());
    out->set_dtype(r.dtype);
    for (int64_t d : shape(v)) out->add_shape(d);
    out->set_kind(r.kind);
    if (r.init >= 0) *out->mutable_init() = inits_[r.init];
    out->set_frozen(r.frozen);
    out->set_host_memory(r.host_memory);
    out->set_line(r.line);
  }
  p.mutable_op()->Reserve(num_ops());
  for (int i : ops()) *p.add_op() = AsOp(i);
  return p;
}

std::vector<int> Graph::FirstWriters() const {
  std::vector<int> first(num_vars(), -1);
  for (int i = tail_; i >= 0; i = prev_[i]) {
    for (int v : outputs(i)) first[v] = i;
  }
  return first;
}

std::vector<int> Graph::FirstReaders() const {
  std::vector<int> first(num_vars(), -1);
  for (int i = tail_; i >= 0; i = prev_[i]) {
    for (int v : inputs(i)) first[v] = i;
  }
  return first;
}

std::vector<std::vector<int>> Graph::Readers() const {
  std::vector<std::vector<int>> readers(num_vars());
  for (int i = head_; i >= 0; i = next_[i]) {
    for (int v : inputs(i)) {
      if (readers[v].empty() || readers[v].back() != i) readers[v].push_back(i);
    }
  }
  return readers;
}

absl::Status VerifyGraph(const Graph& graph) {
  const std::vector<int> producer = graph.FirstWriters();
  std::vector<TensorType> input_types;
  for (int i : graph.ops()) {
    const OpSchema& schema = graph.schema(i);
    auto where = [&] { return graph.OpLocation(i); };
    const Op& op = graph.AsOp(i);
    if (auto s = CheckArity(schema, op); !s.ok()) return absl::InternalError(absl::StrCat(where(), ": ", s.message()));
    input_types.clear();
    for (int v : graph.inputs(i)) {
      if (graph.kind(v) == ACTIVATION && (producer[v] < 0 || graph.position(producer[v]) >= graph.position(i))) {
        return absl::InternalError(absl::StrCat(where(), ": input '", graph.var_name(v), "' used before definition"));
      }
      input_types.push_back(graph.type(v));
    }
    auto inferred = InferOutputTypes(schema, op, std::move(input_types));
    input_types = {};
    if (!inferred.ok()) return absl::InternalError(absl::StrCat(where(), ": ", inferred.status().message()));
    const absl::Span<const int> outs = graph.outputs(i);
    for (size_t k = 0; k < outs.size(); ++k) {
      const absl::Span<const int64_t> shape = graph.shape(outs[k]);
      const TensorType& want = (*inferred)[k];
      if (graph.dtype(outs[k]) != want.dtype ||
          !std::equal(shape.begin(), shape.end(), want.shape.begin(), want.shape.end())) {
        return absl::InternalError(absl::StrCat(where(), ": output '", graph.var_name(outs[k]), "' is recorded as ",
                                                graph.type(outs[k]).ToString(), " but inferred as ", want.ToString()));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
