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

std::string Graph::OpLocation(int op) const {
  return strata::OpLocation(FileOf(program_fields_), op, schema(op).type, line(op), op_name(op));
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

absl::Status Graph::AddOp(const Op& op) {
  const int index = num_ops();
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
  ops_.push_back(r);
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
    out->set_line(r.line);
  }
  p.mutable_op()->Reserve(num_ops());
  for (int i = 0; i < num_ops(); ++i) *p.add_op() = AsOp(i);
  return p;
}

std::vector<int> Graph::FirstWriters() const {
  std::vector<int> first(num_vars(), -1);
  for (int i = num_ops() - 1; i >= 0; --i) {
    for (int v : outputs(i)) first[v] = i;
  }
  return first;
}

std::vector<int> Graph::FirstReaders() const {
  std::vector<int> first(num_vars(), -1);
  for (int i = num_ops() - 1; i >= 0; --i) {
    for (int v : inputs(i)) first[v] = i;
  }
  return first;
}

absl::Status VerifyGraph(const Graph& graph) {
  const std::vector<int> producer = graph.FirstWriters();
  std::vector<TensorType> input_types;
  for (int i = 0; i < graph.num_ops(); ++i) {
    const OpSchema& schema = graph.schema(i);
    auto where = [&] { return graph.OpLocation(i); };
    const Op& op = graph.AsOp(i);
    if (auto s = CheckArity(schema, op); !s.ok()) return absl::InternalError(absl::StrCat(where(), ": ", s.message()));
    input_types.clear();
    for (int v : graph.inputs(i)) {
      if (graph.kind(v) == ACTIVATION && (producer[v] < 0 || producer[v] >= i)) {
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
