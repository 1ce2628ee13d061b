#include "compiler/op_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata {

std::string AttrTypeName(AttrType type) {
  switch (type) {
    case AttrType::kInt: return "int";
    case AttrType::kFloat: return "float";
    case AttrType::kString: return "string";
    case AttrType::kBool: return "bool";
    case AttrType::kInts: return "list of ints";
    case AttrType::kFloats: return "list of floats";
    case AttrType::kStrings: return "list of strings";
  }
  return "?";
}

namespace {
const AttrValue* Lookup(const Op& op, const std::string& name) {
  auto it = op.attr().find(name);
  return it == op.attr().end() ? nullptr : &it->second;
}
}  // namespace

std::string ShapeContext::input_role(int i) const {
  return schema_ != nullptr ? InputRole(*schema_, i) : absl::StrCat("#", i);
}

int64_t ShapeContext::attr_int(const std::string& name) const {
  const AttrValue* a = Lookup(op_, name);
  return a ? a->i() : 0;
}
double ShapeContext::attr_float(const std::string& name) const {
  const AttrValue* a = Lookup(op_, name);
  if (!a) return 0;
  return a->value_case() == AttrValue::kI ? static_cast<double>(a->i()) : a->f();
}
bool ShapeContext::attr_bool(const std::string& name) const {
  const AttrValue* a = Lookup(op_, name);
  return a ? a->b() : false;
}
std::string ShapeContext::attr_string(const std::string& name) const {
  const AttrValue* a = Lookup(op_, name);
  return a ? a->s() : "";
}
std::vector<int64_t> ShapeContext::attr_ints(const std::string& name) const {
  const AttrValue* a = Lookup(op_, name);
  if (!a) return {};
  return std::vector<int64_t>(a->list().i().begin(), a->list().i().end());
}

double ElementCount(const TensorType& type) {
  double n = 1;
  for (int64_t d : type.shape) n *= static_cast<double>(d);
  return n;
}

const AttrSpec* OpSchema::FindAttr(const std::string& name) const {
  for (const auto& a : attrs) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

OpRegistry& OpRegistry::Global() {
  static OpRegistry* registry = new OpRegistry();
  return *registry;
}

void OpRegistry::Register(OpSchema schema) {
  std::string type = schema.type;
  schemas_[type] = std::move(schema);
}

const OpSchema* OpRegistry::Find(const std::string& type) const {
  auto it = schemas_.find(type);
  return it == schemas_.end() ? nullptr : &it->second;
}

std::vector<std::string> OpRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, schema] : schemas_) names.push_back(name);
  return names;
}

namespace {
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::vector<std::string> OpRegistry::Suggest(const std::string& type) const {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& [name, schema] : schemas_) {
    size_t d = EditDistance(type, name);
    bool substring = name.find(type) != std::string::npos || type.find(name) != std::string::npos;
    if (d <= std::max<size_t>(2, type.size() / 3) || substring) scored.push_back({substring ? 0 : d, name});
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) out.push_back(scored[i].second);
  return out;
}

OpDef& OpDef::Attr(std::string name, AttrType type) {
  schema_.attrs.push_back({std::move(name), type, std::nullopt});
  return *this;
}
OpDef& OpDef::Attr(std::string name, int64_t default_value) {
  schema_.attrs.push_back({std::move(name), AttrType::kInt, IntAttr(default_value)});
  return *this;
}
OpDef& OpDef::Attr(std::string name, double default_value) {
  schema_.attrs.push_back({std::move(name), AttrType::kFloat, FloatAttr(default_value)});
  return *this;
}
OpDef& OpDef::Attr(std::string name, bool default_value) {
  schema_.attrs.push_back({std::move(name), AttrType::kBool, BoolAttr(default_value)});
  return *this;
}
OpDef& OpDef::Attr(std::string name, const char* default_value) {
  schema_.attrs.push_back({std::move(name), AttrType::kString, StringAttr(default_value)});
  return *this;
}
OpDef& OpDef::Attr(std::string name, std::vector<int64_t> default_value) {
  schema_.attrs.push_back({std::move(name), AttrType::kInts, IntsAttr(default_value)});
  return *this;
}

namespace {
bool AttrMatches(const AttrValue& v, AttrType type) {
  switch (type) {
    case AttrType::kInt: return v.value_case() == AttrValue::kI;
    case AttrType::kFloat: return v.value_case() == AttrValue::kF || v.value_case() == AttrValue::kI;
    case AttrType::kString: return v.value_case() == AttrValue::kS;
    case AttrType::kBool: return v.value_case() == AttrValue::kB;
    case AttrType::kInts: return v.value_case() == AttrValue::kList && v.list().f_size() == 0 && v.list().s_size() == 0;
    case AttrType::kFloats: return v.value_case() == AttrValue::kList && v.list().s_size() == 0;
    case AttrType::kStrings: return v.value_case() == AttrValue::kList && v.list().i_size() == 0 && v.list().f_size() == 0;
  }
  return false;
}

absl::Status CheckArgCount(const std::vector<ArgSpec>& specs, int count, const char* what) {
  bool variadic = !specs.empty() && specs.back().variadic;
  int fixed = static_cast<int>(specs.size()) - (variadic ? 1 : 0);
  // Optional last arguments (the op's shape function says which are there):
  // `fixed`, or down to one for each of them fewer.
  int optional = 0;
  while (optional < static_cast<int>(specs.size()) && specs[specs.size() - 1 - optional].optional) ++optional;
  if (optional > 0 && count >= fixed - optional && count < fixed) return absl::OkStatus();
  if (variadic ? count < fixed + 1 : count != fixed) {
    std::string names;
    for (const auto& s : specs) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", s.name, s.variadic ? "..." : "", s.optional ? "?" : "");
    }
    std::string fewer;
    if (optional == 1) fewer = absl::StrCat(fixed - 1, " or ");
    if (optional > 1) fewer = absl::StrCat(fixed - optional, " to ");
    return absl::InvalidArgumentError(absl::StrCat("expects ", variadic ? "at least " : "", fewer,
                                                   variadic ? fixed + 1 : fixed, " ", what, "s (", names, "), got ",
                                                   count));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status CheckArity(const OpSchema& schema, const Op& op) {
  if (auto s = CheckArgCount(schema.inputs, op.input_size(), "input"); !s.ok()) return s;
  return CheckArgCount(schema.outputs, op.output_size(), "output");
}

absl::Status CanonicalizeOp(const OpSchema& schema, Op* op) {
  if (auto s = CheckArity(schema, *op); !s.ok()) return s;
  for (const auto& [name, value] : op->attr()) {
    const AttrSpec* spec = schema.FindAttr(name);
    if (spec == nullptr) {
      std::string known;
      for (const auto& a : schema.attrs) absl::StrAppend(&known, known.empty() ? "" : ", ", a.name);
      return absl::InvalidArgumentError(absl::StrCat("unknown attr '", name, "' (", op->type(), " takes ",
                                                     known.empty() ? "no attrs" : known, ")"));
    }
    if (!AttrMatches(value, spec->type)) {
      return absl::InvalidArgumentError(
          absl::StrCat("attr '", name, "' must be ", AttrTypeName(spec->type)));
    }
  }
  for (const auto& spec : schema.attrs) {
    if (op->attr().count(spec.name)) {
      // Normalize an int written for a float attr.
      AttrValue& v = (*op->mutable_attr())[spec.name];
      if (spec.type == AttrType::kFloat && v.value_case() == AttrValue::kI) v.set_f(static_cast<double>(v.i()));
      if (spec.type == AttrType::kFloats && v.list().i_size() > 0) {
        for (int64_t x : v.list().i()) v.mutable_list()->add_f(static_cast<double>(x));
        v.mutable_list()->clear_i();
      }
      continue;
    }
    if (!spec.default_value.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("missing required attr '", spec.name, "' (",
                                                     AttrTypeName(spec.type), ")"));
    }
    (*op->mutable_attr())[spec.name] = *spec.default_value;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TensorType>> InferOutputTypes(const OpSchema& schema, const Op& op,
                                                         std::vector<TensorType> input_types) {
  ShapeContext ctx(op, std::move(input_types), &schema);
  if (!schema.shape_fn) return absl::InternalError(absl::StrCat("op '", op.type(), "' has no shape function"));
  if (absl::Status s = schema.shape_fn(ctx); !s.ok()) {
    // Shape functions speak of roles; the reader knows their vars.
    std::string bound = DescribeInputs(schema, op, ctx.inputs());
    if (bound.empty()) return s;
    return absl::Status(s.code(), absl::StrCat(s.message(), " (where ", bound, ")"));
  }
  for (int i = 0; i < ctx.num_outputs(); ++i) {
    if (ctx.outputs()[i].dtype == DT_INVALID) {
      return absl::InternalError(absl::StrCat("shape function of '", op.type(), "' left output ", i, " untyped"));
    }
  }
  return ctx.outputs();
}

std::string InputRole(const OpSchema& schema, int i, int count) {
  const int fixed = static_cast<int>(schema.inputs.size()) - (!schema.inputs.empty() && schema.inputs.back().variadic);
  // Several trailing optional inputs, not all given: which one sits at i
  // the op's attrs say (an update's grad_scale, then found_inf), not its
  // position; name the candidates.
  int first_optional = fixed;
  while (first_optional > 0 && schema.inputs[first_optional - 1].optional) --first_optional;
  if (count >= 0 && count < fixed && fixed - first_optional > 1 && i >= first_optional && i < fixed) {
    std::vector<std::string> names;
    for (int k = first_optional; k < fixed; ++k) names.push_back(schema.inputs[k].name);
    return absl::StrJoin(names, " or ");
  }
  if (i < fixed) return schema.inputs[i].name;
  if (fixed < static_cast<int>(schema.inputs.size())) return absl::StrCat(schema.inputs.back().name, "[", i - fixed, "]");
  return absl::StrCat("#", i);
}

std::string DescribeInputs(const OpSchema& schema, const Op& op, absl::Span<const TensorType> input_types) {
  const int n = static_cast<int>(input_types.size());
  if (op.input_size() != n) return "";
  for (const std::string& name : op.input()) {
    if (name.empty()) return "";
  }
  std::string out;
  const int shown = std::min(n, kMaxDescribedInputs);
  for (int i = 0; i < shown; ++i) {
    const bool last = i == shown - 1 && shown == n;
    absl::StrAppend(&out,
                    i == 0 ? ""
                    : last ? " and "
                           : ", ",
                    "input '", InputRole(schema, i, n), "' is var '", op.input(i), "' ", input_types[i].ToString());
  }
  if (n > shown) absl::StrAppend(&out, " and ", n - shown, " more inputs");
  return out;
}

AttrValue IntAttr(int64_t v) { AttrValue a; a.set_i(v); return a; }
AttrValue FloatAttr(double v) { AttrValue a; a.set_f(v); return a; }
AttrValue BoolAttr(bool v) { AttrValue a; a.set_b(v); return a; }
AttrValue StringAttr(const std::string& v) { AttrValue a; a.set_s(v); return a; }
AttrValue IntsAttr(absl::Span<const int64_t> v) {
  AttrValue a;
  auto* list = a.mutable_list();
  for (int64_t x : v) list->add_i(x);
  return a;
}

ShapeFn SameAsInput(int i) {
  return [i](ShapeContext& ctx) -> absl::Status {
    ctx.set_output(0, ctx.input(i));
    return absl::OkStatus();
  };
}

absl::Status SameDtype(const ShapeContext& ctx, int a, int b) {
  if (ctx.input(a).dtype != ctx.input(b).dtype) {
    return absl::InvalidArgumentError(absl::StrCat("input '", ctx.input_role(a), "' is ",
                                                   DataTypeName(ctx.input(a).dtype), " but input '",
                                                   ctx.input_role(b), "' is ", DataTypeName(ctx.input(b).dtype)));
  }
  return absl::OkStatus();
}

absl::Status ExpectRank(const ShapeContext& ctx, int input, int rank) {
  if (static_cast<int>(ctx.input(input).shape.size()) != rank) {
    return absl::InvalidArgumentError(absl::StrCat("input '", ctx.input_role(input), "' must have rank ", rank,
                                                   ", got ", ctx.input(input).ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectFloating(const ShapeContext& ctx, int input) {
  if (!IsFloating(ctx.input(input).dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("input '", ctx.input_role(input), "' must be F32 or F64, got ",
                                                   DataTypeName(ctx.input(input).dtype)));
  }
  return absl::OkStatus();
}

ShapeFn BroadcastInputs() {
  return [](ShapeContext& ctx) -> absl::Status {
    Shape shape = ctx.input(0).shape;
    for (int i = 1; i < ctx.num_inputs(); ++i) {
      if (absl::Status s = SameDtype(ctx, 0, i); !s.ok()) return s;
      auto b = BroadcastShapes(shape, ctx.input(i).shape);
      if (!b.ok()) return b.status();
      shape = *b;
    }
    ctx.set_output(0, TensorType{ctx.input(0).dtype, shape});
    return absl::OkStatus();
  };
}

}  // namespace strata
