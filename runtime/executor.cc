#include "runtime/executor.h"

#include "absl/strings/str_cat.h"
#include "runtime/initializers.h"

namespace strata {
namespace {

bool RunsInForward(OpRole role) { return role == FORWARD || role == LOSS; }
bool RunsInOptimize(OpRole role) { return role == OPTIMIZE || role == LR_SCHEDULE; }

std::string OpWhere(const Program& program, int i) {
  const Op& op = program.op(i);
  return absl::StrCat("op #", i, " '", op.type(), "'", op.name().empty() ? "" : absl::StrCat(" (", op.name(), ")"));
}

}  // namespace

double ScalarValue(const Tensor& t) {
  if (!t.defined() || t.num_elements() < 1) return 0;
  switch (t.dtype()) {
    case F32: return t.data<float>()[0];
    case F64: return t.data<double>()[0];
    case I64: return static_cast<double>(t.data<int64_t>()[0]);
    case I32: return t.data<int32_t>()[0];
    case BOOL: return t.data<bool>()[0] ? 1 : 0;
    default: return 0;
  }
}

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const RankPlan& plan, const ExecutorOptions& options) {
  std::unique_ptr<Executor> e(new Executor(plan, options));
  if (auto s = e->Prepare(); !s.ok()) return s;
  return e;
}

absl::Status Executor::Prepare() {
  const Program& program = plan_.program();
  slots_.resize(program.var_size());
  persistent_.resize(program.var_size());
  for (int i = 0; i < program.var_size(); ++i) {
    const Var& v = program.var(i);
    slot_of_[v.name()] = i;
    persistent_[i] = v.kind() == PARAM || v.kind() == STATE;
  }
  std::vector<bool> read(program.var_size(), false);
  for (const Op& op : program.op()) {
    for (const auto& in : op.input()) {
      auto it = slot_of_.find(in);
      if (it != slot_of_.end()) read[it->second] = true;
    }
  }
  for (int i = 0; i < program.var_size(); ++i) {
    if (program.var(i).kind() == FEED && read[i]) feeds_.push_back(&program.var(i));
  }
  auto loss = slot_of_.find(program.loss());
  if (loss == slot_of_.end()) return absl::InvalidArgumentError(absl::StrCat("plan: loss '", program.loss(), "' has no var"));
  loss_slot_ = loss->second;
  for (const auto& f : program.fetch()) {
    auto it = slot_of_.find(f);
    if (it == slot_of_.end()) return absl::InvalidArgumentError(absl::StrCat("plan: fetch '", f, "' has no var"));
    fetch_slots_.push_back({f, it->second});
  }

  const auto& frees = plan_.memory().frees_after_op();
  for (int i = 0; i < program.op_size(); ++i) {
    const Op& op = program.op(i);
    PreparedOp p;
    p.op_index = i;
    KernelDef def;
    def.op = &plan_.program().op(i);
    for (const auto& in : op.input()) {
      auto it = slot_of_.find(in);
      if (it == slot_of_.end()) return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i), " reads undeclared var '", in, "'"));
      p.inputs.push_back(&slots_[it->second]);
      const Var& v = program.var(it->second);
      def.input_types.push_back(TensorType{v.dtype(), std::vector<int64_t>(v.shape().begin(), v.shape().end())});
    }
    for (const auto& out : op.output()) {
      auto it = slot_of_.find(out);
      if (it == slot_of_.end()) return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i), " writes undeclared var '", out, "'"));
      p.output_slots.push_back(it->second);
      const Var& v = program.var(it->second);
      def.output_types.push_back(TensorType{v.dtype(), std::vector<int64_t>(v.shape().begin(), v.shape().end())});
    }
    p.outputs.resize(op.output_size());
    if (i < frees.size()) {
      for (const auto& var : frees.Get(i).var()) {
        auto it = slot_of_.find(var);
        if (it != slot_of_.end()) p.frees.push_back(it->second);
      }
    }
    DataType dtype = KernelDtype(def);
    const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), options_.device, dtype);
    if (factory == nullptr) {
      return absl::UnimplementedError(absl::StrCat(OpWhere(program, i), ": no ", options_.device, " kernel for dtype ",
                                                   DataTypeName(dtype)));
    }
    auto kernel = (*factory)(def);
    if (!kernel.ok()) return absl::InvalidArgumentError(absl::StrCat(OpWhere(program, i), ": ", kernel.status().message()));
    p.kernel = std::move(*kernel);
    if (RunsInForward(op.role())) {
      forward_.push_back(std::move(p));
    } else if (op.role() == BACKWARD) {
      backward_.push_back(std::move(p));
    } else if (RunsInOptimize(op.role())) {
      optimize_.push_back(std::move(p));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i), " has role ", OpRole_Name(op.role()),
                                                     ", which no action runs"));
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::InitializeState() {
  const Program& program = plan_.program();
  for (int i = 0; i < program.var_size(); ++i) {
    const Var& v = program.var(i);
    if (v.kind() == PARAM) {
      auto t = InitializeParam(v, options_.seed, options_.allocator);
      if (!t.ok()) return t.status();
      slots_[i] = std::move(*t);
    } else if (v.kind() == STATE) {
      Shape shape(v.shape().begin(), v.shape().end());
      slots_[i] = Tensor::Zeros(v.dtype(), shape, options_.allocator);
      if (!slots_[i].defined()) return absl::ResourceExhaustedError(absl::StrCat("out of memory for state '", v.name(), "'"));
    }
  }
  step_ = 0;
  return absl::OkStatus();
}

std::map<std::string, Tensor> Executor::PersistentState() const {
  std::map<std::string, Tensor> out;
  for (int i = 0; i < plan_.program().var_size(); ++i) {
    if (persistent_[i]) out[plan_.program().var(i).name()] = slots_[i];
  }
  return out;
}

absl::Status Executor::LoadPersistentState(const std::map<std::string, Tensor>& state) {
  const Program& program = plan_.program();
  for (int i = 0; i < program.var_size(); ++i) {
    if (!persistent_[i]) continue;
    const Var& v = program.var(i);
    auto it = state.find(v.name());
    if (it == state.end()) return absl::NotFoundError(absl::StrCat("checkpoint has no tensor '", v.name(), "'"));
    const Tensor& t = it->second;
    std::vector<int64_t> want(v.shape().begin(), v.shape().end());
    std::vector<int64_t> got(t.shape().begin(), t.shape().end());
    if (t.dtype() != v.dtype() || want != got) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor '", v.name(), "' is ", DataTypeName(t.dtype()),
                                                     ShapeString(got), ", the program wants ", DataTypeName(v.dtype()),
                                                     ShapeString(want)));
    }
    slots_[i] = t.Clone();
  }
  return absl::OkStatus();
}

absl::Status Executor::BindFeeds(const std::map<std::string, Tensor>& feeds) {
  int64_t batch = -1;
  for (const Var* v : feeds_) {
    auto it = feeds.find(v->name());
    if (it == feeds.end()) return absl::InvalidArgumentError(absl::StrCat("no data for feed '", v->name(), "'"));
    const Tensor& t = it->second;
    bool ok = t.dtype() == v->dtype() && t.rank() == v->shape_size();
    for (int d = 0; ok && d < v->shape_size(); ++d) {
      if (v->shape(d) == -1) {
        if (batch >= 0 && t.dim(d) != batch) ok = false;
        batch = t.dim(d);
      } else if (v->shape(d) != t.dim(d)) {
        ok = false;
      }
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("feed '", v->name(), "' got ", DataTypeName(t.dtype()),
                                                     ShapeString(t.shape()), ", the program declares ",
                                                     DataTypeName(v->dtype()), ShapeString(v->shape())));
    }
    slots_[slot_of_[v->name()]] = t;
  }
  return absl::OkStatus();
}

absl::Status Executor::RunSection(Section section, const RunContext& run) {
  std::vector<PreparedOp>& ops = section == Section::kForward ? forward_ : section == Section::kBackward ? backward_ : optimize_;
  for (PreparedOp& p : ops) {
    KernelContext ctx(&run, p.inputs, absl::MakeSpan(p.outputs));
    absl::Status s = p.kernel->Compute(ctx);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(OpWhere(plan_.program(), p.op_index), ": ", s.message()));
    }
    for (size_t k = 0; k < p.output_slots.size(); ++k) slots_[p.output_slots[k]] = std::move(p.outputs[k]);
    for (int slot : p.frees) slots_[slot] = Tensor();
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Executor::Collect() {
  StepResult r;
  if (!slots_[loss_slot_].defined()) return absl::InternalError("the loss was not computed");
  r.loss = ScalarValue(slots_[loss_slot_]);
  for (const auto& [name, slot] : fetch_slots_) r.fetches[name] = ScalarValue(slots_[slot]);
  return r;
}

void Executor::ClearActivations() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!persistent_[i]) slots_[i] = Tensor();
  }
}

absl::StatusOr<StepResult> Executor::TrainStep(const std::map<std::string, Tensor>& feeds, int64_t sample_offset) {
  RunContext run;
  run.seed = options_.seed;
  run.step = step_;
  run.sample_offset = sample_offset;
  run.total_steps = total_steps_;
  run.training = true;
  run.allocator = options_.allocator;
  absl::Status s = BindFeeds(feeds);
  if (s.ok()) s = RunSection(Section::kForward, run);
  absl::StatusOr<StepResult> result = s.ok() ? Collect() : absl::StatusOr<StepResult>(s);
  if (s.ok() && result.ok()) s = RunSection(Section::kBackward, run);
  if (s.ok() && result.ok()) s = RunSection(Section::kOptimize, run);
  ClearActivations();
  if (!s.ok()) return s;
  if (result.ok()) ++step_;
  return result;
}

absl::StatusOr<StepResult> Executor::Evaluate(const std::map<std::string, Tensor>& feeds, int64_t sample_offset) {
  RunContext run;
  run.seed = options_.seed;
  run.step = step_;
  run.sample_offset = sample_offset;
  run.training = false;
  run.allocator = options_.allocator;
  absl::Status s = BindFeeds(feeds);
  if (s.ok()) s = RunSection(Section::kForward, run);
  absl::StatusOr<StepResult> result = s.ok() ? Collect() : absl::StatusOr<StepResult>(s);
  ClearActivations();
  return result;
}

}  // namespace strata
