#include "compiler/validate.h"

#include <cmath>
#include <limits>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "compiler/graph_index.h"
#include "compiler/op_registry.h"
#include "compiler/program_text.h"
#include "proto/metrics_keys.h"
#include "proto/status_macros.h"
#include "proto/utf8.h"

namespace strata {
namespace {

std::string FileOf(const Program& program) {
  return program.source_file().empty() ? program.name() : program.source_file();
}

absl::Status Err(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

absl::Status CheckShape(absl::Span<const int64_t> shape, bool allow_batch, std::string* why) {
  int batch_dims = 0;
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (d == -1) {
      ++batch_dims;
      continue;
    }
    if (d <= 0) {
      *why = absl::StrCat("dimension ", d, " in shape ", ShapeString(shape), " must be positive (or -1 for the batch)");
      return absl::InvalidArgumentError(*why);
    }
    if (elements > kMaxTensorElements / d) {
      *why = absl::StrCat("shape ", ShapeString(shape), " is absurdly large (more than 2^40 elements)");
      return absl::InvalidArgumentError(*why);
    }
    elements *= d;
  }
  if (batch_dims > 1) {
    *why = absl::StrCat("shape ", ShapeString(shape), " has more than one batch dimension (-1)");
    return absl::InvalidArgumentError(*why);
  }
  if (batch_dims > 0 && !allow_batch) {
    *why = absl::StrCat("shape ", ShapeString(shape), " has a batch dimension (-1), which a parameter cannot have");
    return absl::InvalidArgumentError(*why);
  }
  return absl::OkStatus();
}

// A value an F32 parameter's init gives or scales by: past float32's
// largest it is an infinity in the weights (the run then "diverges" at its
// first step, blaming the learning rate).
absl::Status CheckFitsParam(const std::string& where, const Var& var, const std::string& field, double value) {
  if (var.dtype() == F32 && std::isfinite(value) && InfiniteAsFloat32(value)) {
    return Err(where, absl::StrFormat("%s %.9g is infinite as a float32 (past %.9g), the parameter's dtype", field, value,
                                      std::numeric_limits<float>::max()));
  }
  return absl::OkStatus();
}

absl::Status CheckInitializer(const Program& program, const Var& var) {
  const Initializer& init = var.init();
  std::string where = VarLocation(program, var);
  switch (init.kind_case()) {
    case Initializer::kUniform:
      if (!std::isfinite(init.uniform().low()) || !std::isfinite(init.uniform().high())) {
        return Err(where, absl::StrCat("uniform init needs finite bounds, got low ", init.uniform().low(), ", high ",
                                       init.uniform().high()));
      }
      STRATA_RETURN_IF_ERROR(CheckFitsParam(where, var, "uniform init's low", init.uniform().low()));
      STRATA_RETURN_IF_ERROR(CheckFitsParam(where, var, "uniform init's high", init.uniform().high()));
      if (!(init.uniform().low() < init.uniform().high())) {
        return Err(where, absl::StrCat("uniform init needs low < high, got low ", init.uniform().low(), ", high ",
                                       init.uniform().high()));
      }
      break;
    case Initializer::kNormal:
    case Initializer::kTruncatedNormal: {
      const auto& n = init.kind_case() == Initializer::kNormal ? init.normal() : init.truncated_normal();
      if (!(n.std() >= 0) || !std::isfinite(n.std())) {
        return Err(where, absl::StrCat("normal init needs a finite std >= 0, got std ", n.std()));
      }
      if (!std::isfinite(n.mean())) return Err(where, absl::StrCat("normal init needs a finite mean, got mean ", n.mean()));
      STRATA_RETURN_IF_ERROR(CheckFitsParam(where, var, "normal init's mean", n.mean()));
      STRATA_RETURN_IF_ERROR(CheckFitsParam(where, var, "normal init's std", n.std()));
      break;
    }
    case Initializer::kXavierUniform:
    case Initializer::kXavierNormal: {
      const auto& x = init.kind_case() == Initializer::kXavierUniform ? init.xavier_uniform() : init.xavier_normal();
      if (x.has_gain() && !(x.gain() > 0 && std::isfinite(x.gain()))) {
        return Err(where, absl::StrCat("xavier init needs gain > 0, got ", x.gain()));
      }
      STRATA_RETURN_IF_ERROR(CheckFitsParam(where, var, "xavier init's gain", x.gain()));
      break;
    }
    case Initializer::kKaimingUniform:
    case Initializer::kKaimingNormal: {
      const auto& k = init.kind_case() == Initializer::kKaimingUniform ? init.kaiming_uniform() : init.kaiming_normal();
      if (!std::isfinite(k.a())) return Err(where, absl::StrCat("kaiming init needs a finite slope a, got ", k.a()));
      break;
    }
    case Initializer::kConstant:
      if (!std::isfinite(init.constant().value())) return Err(where, "constant init must be finite");
      STRATA_RETURN_IF_ERROR(CheckFitsParam(where, var, "constant init's value", init.constant().value()));
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

// A positive optimizer field the F32 parameters' update reads as a float:
// one that rounds to 0 there (a learning rate of 1e-320 trained nothing,
// with exit 0) or past float32's largest value is refused.
absl::Status CheckFloat32Positive(const std::string& where, const std::string& field, double value, bool f32_params) {
  if (!f32_params) return absl::OkStatus();
  // Below half the least float32 subnormal (2^-150), a value rounds to 0.
  const bool zero = std::fabs(value) <= 0x1p-150;
  if (zero || InfiniteAsFloat32(value)) {
    return Err(where, absl::StrFormat("%s %.9g is %s as a float32, the dtype of the program's F32 parameters", field,
                                      value, zero ? "0" : "infinite"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptimizer(const Program& program, bool has_params, bool f32_params) {
  const Optimizer& opt = program.optimizer();
  std::string where = absl::StrCat(FileOf(program), ": optimizer");
  if (opt.kind_case() == Optimizer::KIND_NOT_SET) {
    if (has_params) return Err(where, "missing: the program has trainable parameters; add optimizer { sgd|momentum|adam|adamw { learning_rate: ... } }");
    return absl::OkStatus();
  }
  double lr = 0;
  switch (opt.kind_case()) {
    case Optimizer::kSgd: lr = opt.sgd().learning_rate(); break;
    case Optimizer::kMomentum:
      lr = opt.momentum().learning_rate();
      if (!(opt.momentum().momentum() >= 0 && opt.momentum().momentum() < 1)) {
        return Err(where, absl::StrCat("momentum must be in [0, 1), got ", opt.momentum().momentum()));
      }
      break;
    case Optimizer::kAdam:
    case Optimizer::kAdamw: {
      const auto& a = opt.kind_case() == Optimizer::kAdam ? opt.adam() : opt.adamw();
      lr = a.learning_rate();
      if (a.has_beta1() && !(a.beta1() >= 0 && a.beta1() < 1)) return Err(where, absl::StrCat("beta1 must be in [0, 1), got ", a.beta1()));
      if (a.has_beta2() && !(a.beta2() >= 0 && a.beta2() < 1)) return Err(where, absl::StrCat("beta2 must be in [0, 1), got ", a.beta2()));
      if (a.has_epsilon() && !(a.epsilon() > 0 && std::isfinite(a.epsilon()))) {
        return Err(where, absl::StrCat("epsilon must be finite and > 0, got ", a.epsilon()));
      }
      if (a.has_epsilon()) STRATA_RETURN_IF_ERROR(CheckFloat32Positive(where, "epsilon", a.epsilon(), f32_params));
      break;
    }
    default: break;
  }
  if (!(lr > 0) || !std::isfinite(lr)) return Err(where, absl::StrCat("learning_rate must be > 0, got ", lr));
  STRATA_RETURN_IF_ERROR(CheckFloat32Positive(where, "learning_rate", lr, f32_params));
  if (!(opt.weight_decay() >= 0) || !std::isfinite(opt.weight_decay())) {
    return Err(where, absl::StrCat("weight_decay must be >= 0, got ", opt.weight_decay()));
  }
  if (f32_params && InfiniteAsFloat32(opt.weight_decay())) {
    return Err(where, absl::StrFormat("weight_decay %.9g is infinite as a float32, the dtype of the program's F32 "
                                      "parameters", opt.weight_decay()));
  }
  if (!(opt.clip_global_norm() >= 0) || !std::isfinite(opt.clip_global_norm())) {
    return Err(where, absl::StrCat("clip_global_norm must be >= 0, got ", opt.clip_global_norm()));
  }
  const auto& sched = opt.lr_schedule();
  if (sched.warmup_steps() < 0) return Err(where, absl::StrCat("lr_schedule.warmup_steps must be >= 0, got ", sched.warmup_steps()));
  if (sched.has_cosine()) {
    if (sched.cosine().decay_steps() < 0) return Err(where, "lr_schedule.cosine.decay_steps must be >= 0");
    if (!(sched.cosine().alpha() >= 0 && sched.cosine().alpha() <= 1)) return Err(where, "lr_schedule.cosine.alpha must be in [0, 1]");
  }
  if (sched.has_step_decay()) {
    if (sched.step_decay().step_size() <= 0) return Err(where, "lr_schedule.step_decay.step_size must be > 0");
    if (!(sched.step_decay().gamma() > 0 && std::isfinite(sched.step_decay().gamma()))) {
      return Err(where, absl::StrCat("lr_schedule.step_decay.gamma must be finite and > 0, got ", sched.step_decay().gamma()));
    }
  }
  return absl::OkStatus();
}

// Strings a user writes that errors quote: valid UTF-8 without control
// characters (printed escaped when they have one).
absl::Status CheckPrintable(const std::string& where, const std::string& what, const std::string& name) {
  if (!IsValidUtf8(name)) return Err(where, absl::StrCat(what, " is not valid UTF-8"));
  if (HasControlCharacter(name)) {
    return Err(where, absl::StrCat(what, " '", absl::CHexEscape(name), "' contains a control character"));
  }
  return absl::OkStatus();
}

// Names a user writes: printable, and free of '@', which the compiler's own
// vars (w@grad, @step, w@moment1) use so they can never collide with a user's.
absl::Status CheckUserName(const std::string& where, const std::string& what, const std::string& name) {
  if (auto s = CheckPrintable(where, what, name); !s.ok()) return s;
  if (name.find('@') != std::string::npos) {
    return Err(where, absl::StrCat(what, " '", name, "' contains '@', which is reserved for the compiler's own vars"));
  }
  return absl::OkStatus();
}

// "file:LINE: var #i", for a var whose name cannot name it.
std::string VarIndexLocation(const std::string& file, const Var& var, int i) {
  return absl::StrCat(file, var.line() > 0 ? absl::StrCat(":", var.line()) : "", ": var #", i);
}

// "file:LINE: op #i", for an op whose type cannot name it.
std::string OpIndexLocation(const std::string& file, const Op& op, int i) {
  return absl::StrCat(file, op.line() ? absl::StrCat(":", op.line()) : "", ": op #", i);
}

// What the declared vars tell the ops' checks: each name's index, and whether
// any parameter is trained (then the program needs an optimizer).
struct DeclaredVars {
  absl::flat_hash_map<std::string, int> index;
  bool has_params = false;
  bool f32_params = false;  // a trained parameter is F32
};

// What the ops define, in order: every var's type (the declared feeds and
// parameters from the start) and the op that produces each activation.
struct Definitions {
  absl::flat_hash_map<std::string, int> producer;  // var -> op index
  absl::flat_hash_map<std::string, TensorType> types;
};

// Var #i as the user declared it: a free name, declared once, with a dtype,
// a kind a user may declare and a sane shape; an init only on a PARAM.
absl::Status CheckDeclaredVar(const Program& program, const std::string& file, int i, DeclaredVars* declared) {
  const Var& v = program.var(i);
  std::string where = VarLocation(program, v);
  if (v.name().empty()) return Err(VarIndexLocation(file, v, i), "has no name");
  if (auto s = CheckUserName(VarIndexLocation(file, v, i), "the var name", v.name()); !s.ok()) return s;
  if (!declared->index.emplace(v.name(), i).second) {
    return Err(where, absl::StrCat("declared twice (first at line ", program.var(declared->index[v.name()]).line(), ")"));
  }
  if (v.dtype() == DT_INVALID || !DataType_IsValid(v.dtype())) return Err(where, "has no dtype (F32, F64, I64, I32, BOOL, BF16 or F16)");
  // proto3 enums are open: the text parser accepts `kind: 7`.
  if (!VarKind_IsValid(v.kind())) return Err(where, absl::StrCat("has unknown kind ", static_cast<int>(v.kind()), " (FEED, PARAM or ACTIVATION)"));
  std::vector<int64_t> shape(v.shape().begin(), v.shape().end());
  std::string why;
  if (!CheckShape(shape, !IsPersistent(v.kind()), &why).ok()) return Err(where, why);
  if (v.has_init() && v.kind() != PARAM) return Err(where, "only a PARAM can have an init");
  if (v.kind() == PARAM) {
    if (!IsFloating(v.dtype())) return Err(where, absl::StrCat("a PARAM must be F32 or F64, got ", DataTypeName(v.dtype())));
    if (auto s = CheckInitializer(program, v); !s.ok()) return s;
    if (!v.frozen()) declared->has_params = true;
    if (!v.frozen() && v.dtype() == F32) declared->f32_params = true;
  }
  if (v.frozen() && v.kind() != PARAM) {
    return Err(where, absl::StrCat("frozen applies to a PARAM (a weight the optimizer leaves); this var is ",
                                   VarKind_Name(v.kind())));
  }
  if (v.host_memory()) {
    return Err(where, "host_memory is written by the compiler (host transfers place feeds and fetched scalars); "
                      "leave it out");
  }
  if (v.kind() == STATE || v.kind() == SCRATCH || v.kind() == PARAM_COPY) {
    return Err(where, absl::StrCat("kind ", VarKind_Name(v.kind()),
                                   " is written by the compiler; declare FEED, PARAM or ACTIVATION"));
  }
  return absl::OkStatus();
}

// Fields the compiler writes: a program that sets them would steer the
// optimizer and the pipeline split around autodiff.
absl::Status CheckNoCompilerFields(const Program& program, const std::string& file) {
  if (!program.param_grad().empty()) {
    return Err(file, "param_grad is written by the compiler (autodiff); a program may not set it");
  }
  if (!program.loss_grad().empty()) {
    return Err(file, "loss_grad is written by the compiler (autodiff); a program may not set it");
  }
  if (program.tied_replica_size() > 0) {
    return Err(file, "tied_replica is written by the compiler (pipeline split); a program may not set it");
  }
  if (!program.loss_scale().empty() || !program.skipped_updates().empty()) {
    return Err(file, "loss_scale and skipped_updates are written by the compiler (loss scaling); a program may not set them");
  }
  if (program.merge_buffer_size() > 0 || program.merge_part_size() > 0) {
    return Err(file, "merge_buffer and merge_part are written by the compiler (gradient merge); a program may not set them");
  }
  if (!program.host_copy().empty()) {
    return Err(file, "host_copy is written by the compiler (host transfers); a program may not set it");
  }
  return absl::OkStatus();
}

// The op's schema, if the user may write an op of its type as it stands (no
// optimizer op, no fields the compiler writes); fills in its attr defaults.
absl::StatusOr<const OpSchema*> CheckUserOp(const std::string& file, int i, const std::string& where, Op* op) {
  if (op->type().empty()) return Err(OpIndexLocation(file, *op, i), "has no type");
  const OpSchema* schema = OpRegistry::Global().Find(op->type());
  if (schema == nullptr) {
    auto near = OpRegistry::Global().Suggest(op->type());
    return Err(where, absl::StrCat("unknown op type", near.empty() ? "" : absl::StrCat("; did you mean ", absl::StrJoin(near, ", "), "?")));
  }
  if (schema->compiler_only) {
    return Err(where, "is placed by the compiler (pipeline transfers, data-parallel collectives, host copies); "
                      "remove it from the program");
  }
  if (schema->stateful) return Err(where, "is an optimizer op that the compiler appends itself; remove it from the program");
  if (op->role() != ROLE_UNSPECIFIED) return Err(where, "role is written by the compiler; leave it empty");
  if (op->has_group()) return Err(where, "group is written by the compiler; leave it empty");
  if (op->stage() != 0) {
    return Err(where, "stage is written by the compiler (from device, the placement); give device: \"gpu:N\" instead");
  }
  if (op->has_channel()) return Err(where, "channel is written by the compiler (send/recv only); leave it out");
  for (const auto& [key, value] : op->attr()) {
    if (auto s = CheckPrintable(where, "attr name", key); !s.ok()) return s;
    if (value.value_case() == AttrValue::kS) {
      if (auto s = CheckPrintable(where, absl::StrCat("attr '", key, "' value"), value.s()); !s.ok()) return s;
    }
    for (const std::string& item : value.list().s()) {
      if (auto s = CheckPrintable(where, absl::StrCat("attr '", key, "' value"), item); !s.ok()) return s;
    }
  }
  if (auto in_place = op->attr().find("in_place"); in_place != op->attr().end() && in_place->second.b()) {
    // Only the compiler can prove nothing reads the overwritten input later.
    return Err(where, "attr 'in_place' is written by the compiler (in-place-loss-gradient); leave it out");
  }
  if (auto s = CanonicalizeOp(*schema, op); !s.ok()) return Err(where, std::string(s.message()));
  return schema;
}

// Why op #i cannot read `in`: a later op defines it, or no op does.
absl::Status UndefinedInputError(const Program& program, int i, const std::string& where, const std::string& in,
                                 const DeclaredVars& declared) {
  for (int j = i + 1; j < program.op_size(); ++j) {
    for (const auto& out : program.op(j).output()) {
      if (out == in) return Err(where, absl::StrCat("input '", in, "' is used before its definition by op #", j, " '", program.op(j).type(), "'"));
    }
  }
  if (declared.index.count(in)) return Err(where, absl::StrCat("input '", in, "' is declared as an ACTIVATION but no op produces it"));
  return Err(where, absl::StrCat("input '", in, "' is not defined: declare it as a FEED or PARAM var, or produce it with an earlier op"));
}

// The types of op #i's inputs, each a feed, a parameter or an earlier op's output.
absl::StatusOr<std::vector<TensorType>> InputTypes(const Program& program, int i, const std::string& where,
                                                   const DeclaredVars& declared, const Definitions& defs) {
  const Op& op = program.op(i);
  std::vector<TensorType> input_types;
  for (int k = 0; k < op.input_size(); ++k) {
    const std::string& in = op.input(k);
    if (in.empty()) return Err(where, absl::StrCat("input ", k, " has an empty name"));
    if (auto s = CheckPrintable(where, absl::StrCat("input ", k), in); !s.ok()) return s;
    auto t = defs.types.find(in);
    if (t == defs.types.end()) return UndefinedInputError(program, i, where, in, declared);
    input_types.push_back(t->second);
  }
  return input_types;
}

// The op's outputs name new activations: free names, each written once, by
// this op alone.
absl::Status CheckOutputNames(const Program& program, const Op& op, const std::string& where,
                              const DeclaredVars& declared, const Definitions& defs) {
  absl::flat_hash_set<std::string> outs;
  for (int k = 0; k < op.output_size(); ++k) {
    const std::string& out = op.output(k);
    if (out.empty()) return Err(where, absl::StrCat("output ", k, " has an empty name"));
    if (auto s = CheckUserName(where, absl::StrCat("output ", k), out); !s.ok()) return s;
    if (!outs.insert(out).second) return Err(where, absl::StrCat("writes '", out, "' twice"));
    auto d = declared.index.find(out);
    if (d != declared.index.end() && program.var(d->second).kind() != ACTIVATION) {
      return Err(where, absl::StrCat("output '", out, "' is a ", VarKind_Name(program.var(d->second).kind()),
                                     " var; ops may only produce activations"));
    }
    auto p = defs.producer.find(out);
    if (p != defs.producer.end()) {
      return Err(where, absl::StrCat("var '", out, "' is defined twice (first by op #", p->second, " '",
                                     program.op(p->second).type(), "')"));
    }
  }
  return absl::OkStatus();
}

// Infers op #i's output types, checks them against the declared vars and
// records them as defined by op #i.
absl::Status InferOutputs(const Program& program, int i, const OpSchema& schema, const std::string& where,
                          const std::vector<TensorType>& input_types, const DeclaredVars& declared,
                          Definitions* defs) {
  const Op& op = program.op(i);
  auto inferred = InferOutputTypes(schema, op, input_types);
  if (!inferred.ok()) return Err(where, std::string(inferred.status().message()));
  for (int k = 0; k < op.output_size(); ++k) {
    const std::string& out = op.output(k);
    auto d = declared.index.find(out);
    if (d != declared.index.end()) {
      TensorType want = TypeOf(program.var(d->second));
      if (want != (*inferred)[k]) {
        std::string bound = DescribeInputs(schema, op, input_types);
        return Err(where, absl::StrCat("output '", out, "' is declared ", want.ToString(), " but the op produces ",
                                       (*inferred)[k].ToString(),
                                       bound.empty() ? "" : absl::StrCat(" (where ", bound, ")")));
      }
    }
    std::string why;
    if (!CheckShape((*inferred)[k].shape, true, &why).ok()) return Err(where, absl::StrCat("output '", out, "': ", why));
    defs->types[out] = (*inferred)[k];
    defs->producer[out] = i;
  }
  return absl::OkStatus();
}

// Op #i in order: checks it as the user wrote it, types its outputs from its
// inputs', and marks it a FORWARD op with uid i.
absl::Status ValidateAndInferOp(Program* program, const std::string& file, int i, const DeclaredVars& declared,
                                Definitions* defs) {
  Op* op = program->mutable_op(i);
  if (!IsValidUtf8(op->type()) || !IsValidUtf8(op->device()) || !IsValidUtf8(op->name())) {
    return Err(OpIndexLocation(file, *op, i), "has a type, device or name that is not valid UTF-8");
  }
  for (const auto& [what, text] : {std::pair<const char*, const std::string*>{"type", &op->type()},
                                   {"device", &op->device()},
                                   {"name", &op->name()}}) {
    if (auto s = CheckPrintable(OpIndexLocation(file, *op, i), what, *text); !s.ok()) return s;
  }
  std::string where = OpLocation(*program, i);
  absl::StatusOr<const OpSchema*> schema = CheckUserOp(file, i, where, op);
  if (!schema.ok()) return schema.status();
  absl::StatusOr<std::vector<TensorType>> input_types = InputTypes(*program, i, where, declared, *defs);
  if (!input_types.ok()) return input_types.status();
  if (auto s = CheckOutputNames(*program, *op, where, declared, *defs); !s.ok()) return s;
  if (auto s = InferOutputs(*program, i, **schema, where, *input_types, declared, defs); !s.ok()) return s;
  op->set_uid(i);
  op->set_role(FORWARD);
  return absl::OkStatus();
}

// The loss is a floating scalar some op produces (that op gets role LOSS);
// every fetch is a scalar var.
absl::Status CheckLossAndFetches(Program* program, const std::string& file, const Definitions& defs) {
  if (program->loss().empty()) return Err(file, "no loss: set `loss: \"<scalar var>\"`");
  if (auto s = CheckPrintable(file, "loss", program->loss()); !s.ok()) return s;
  for (const auto& f : program->fetch()) {
    if (auto s = CheckPrintable(file, "fetch", f); !s.ok()) return s;
  }
  auto lt = defs.types.find(program->loss());
  if (lt == defs.types.end()) return Err(file, absl::StrCat("loss '", program->loss(), "' is not a var of the program"));
  if (!lt->second.shape.empty() || !IsFloating(lt->second.dtype)) {
    return Err(file, absl::StrCat("loss '", program->loss(), "' must be a floating scalar (shape []), got ", lt->second.ToString()));
  }
  auto producer = defs.producer.find(program->loss());
  if (producer == defs.producer.end()) return Err(file, absl::StrCat("loss '", program->loss(), "' is not produced by any op"));
  program->mutable_op(producer->second)->set_role(LOSS);
  absl::flat_hash_set<absl::string_view> fetched;
  for (const auto& f : program->fetch()) {
    // (The executor sums a step's values by name: a second entry doubled it.)
    if (!fetched.insert(f).second) return Err(file, absl::StrCat("fetch '", f, "' is listed twice"));
    auto ft = defs.types.find(f);
    if (ft == defs.types.end()) return Err(file, absl::StrCat("fetch '", f, "' is not a var of the program"));
    if (!ft->second.shape.empty()) return Err(file, absl::StrCat("fetch '", f, "' must be a scalar, got ", ft->second.ToString()));
    // (The loss itself may be fetched: it is the line's "loss".)
    if (IsMetricsLineKey(f) && f != program->loss()) {
      return Err(file, absl::StrCat("fetch '", f, "' is named like a key of the --metrics lines (",
                                    absl::StrJoin(kMetricsLineKeys, ", "),
                                    "), which would hide its value or be read as the line's own; rename the var"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckActivationsProduced(const Program& program, const Definitions& defs) {
  for (const Var& v : program.var()) {
    if (v.kind() == ACTIVATION && !defs.producer.count(v.name())) {
      return Err(VarLocation(program, v), "is declared as an ACTIVATION but no op produces it");
    }
  }
  return absl::OkStatus();
}

// Records the inferred intermediates as vars, so the program is self-describing.
void RecordIntermediateVars(Program* program, const DeclaredVars& declared, const Definitions& defs) {
  for (int i = 0; i < program->op_size(); ++i) {
    for (const auto& out : program->op(i).output()) {
      if (declared.index.count(out)) continue;
      const TensorType& type = defs.types.at(out);
      Var* v = program->add_var();
      v->set_name(out);
      v->set_dtype(type.dtype);
      for (int64_t d : type.shape) v->add_shape(d);
      v->set_kind(ACTIVATION);
    }
  }
}

}  // namespace

std::string VarLocation(const Program& program, const Var& var) {
  std::string where = FileOf(program);
  if (var.line() > 0) absl::StrAppend(&where, ":", var.line());
  return absl::StrCat(where, ": var '", var.name(), "'");
}

absl::Status ValidateAndInferProgram(Program* program) {
  // Its name goes into checkpoints' metadata and the rank fingerprint: UTF-8
  // (a protobuf string) without control characters, as every name.
  if (auto s = CheckPrintable(program->source_file().empty() ? "program" : program->source_file(), "the program's name",
                              program->name());
      !s.ok()) {
    return s;
  }
  const std::string file = FileOf(*program);
  DeclaredVars declared;
  for (int i = 0; i < program->var_size(); ++i) {
    if (auto s = CheckDeclaredVar(*program, file, i, &declared); !s.ok()) return s;
  }
  if (program->op_size() == 0) return Err(file, "the program has no ops");
  if (auto s = CheckNoCompilerFields(*program, file); !s.ok()) return s;
  if (auto s = CheckOptimizer(*program, declared.has_params, declared.f32_params); !s.ok()) return s;

  Definitions defs;
  for (const Var& v : program->var()) {
    if (v.kind() != ACTIVATION) defs.types[v.name()] = TypeOf(v);
  }
  for (int i = 0; i < program->op_size(); ++i) {
    if (auto s = ValidateAndInferOp(program, file, i, declared, &defs); !s.ok()) return s;
  }
  if (auto s = CheckLossAndFetches(program, file, defs); !s.ok()) return s;
  if (auto s = CheckActivationsProduced(*program, defs); !s.ok()) return s;
  RecordIntermediateVars(program, declared, defs);
  return absl::OkStatus();
}

absl::Status VerifyProgram(const Program& program) { return VerifyAndIndexProgram(program).status(); }

absl::StatusOr<std::unique_ptr<GraphIndex>> VerifyAndIndexProgram(const Program& program) {
  // Runs after every pass: names are resolved once, by the GraphIndex that
  // the next pass then reuses; an op's location is built only for a message.
  auto index = std::make_unique<GraphIndex>(program);
  std::vector<TensorType> input_types;
  for (int i = 0; i < program.op_size(); ++i) {
    const Op& op = program.op(i);
    auto where = [&] { return OpLocation(program, i); };
    const OpSchema* schema = OpRegistry::Global().Find(op.type());
    if (schema == nullptr) return absl::InternalError(absl::StrCat(where(), ": unknown op type"));
    if (auto s = CheckArity(*schema, op); !s.ok()) return absl::InternalError(absl::StrCat(where(), ": ", s.message()));
    input_types.clear();
    const absl::Span<const int> ins = index->input_ids(i);
    for (int k = 0; k < static_cast<int>(ins.size()); ++k) {
      // Defined: a feed, parameter or state var, or written by an earlier op.
      const int producer = index->producer(ins[k]);
      if (!index->declared(ins[k]) || (index->kind(ins[k]) == ACTIVATION && (producer < 0 || producer >= i))) {
        return absl::InternalError(absl::StrCat(where(), ": input '", op.input(k), "' used before definition"));
      }
      input_types.push_back(index->type(ins[k]));
    }
    auto inferred = InferOutputTypes(*schema, op, std::move(input_types));
    input_types = {};
    if (!inferred.ok()) return absl::InternalError(absl::StrCat(where(), ": ", inferred.status().message()));
    const absl::Span<const int> outs = index->output_ids(i);
    for (int k = 0; k < static_cast<int>(outs.size()); ++k) {
      if (!index->declared(outs[k])) {
        return absl::InternalError(absl::StrCat(where(), ": output '", op.output(k), "' has no var entry"));
      }
      if (!index->HasType(outs[k], (*inferred)[k])) {
        return absl::InternalError(absl::StrCat(where(), ": output '", op.output(k), "' is recorded as ",
                                                index->type(outs[k]).ToString(), " but inferred as ",
                                                (*inferred)[k].ToString()));
      }
    }
  }
  return index;
}

}  // namespace strata
