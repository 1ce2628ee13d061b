#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/lr_schedule_of.h"
#include "proto/roles.h"
#include "runtime/comm/waiting_for.h"
#include "runtime/initializers.h"
#include "runtime/step_graph.h"

namespace strata {
namespace {

// The first element of a host PARAM (F32 or F64, as validation requires)
// that is not finite; -1 when every one is.
int64_t FirstNonFinite(const Tensor& t) {
  auto first = [n = t.num_elements()](const auto* p) -> int64_t {
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(p[i])) return i;
    }
    return -1;
  };
  if (t.dtype() == F32) return first(t.data<float>());
  if (t.dtype() == F64) return first(t.data<double>());
  return -1;
}

std::string OpWhere(const Program& program, int i) {
  const Op& op = program.op(i);
  return absl::StrCat("op #", i, " '", op.type(), "'", op.name().empty() ? "" : absl::StrCat(" (", op.name(), ")"));
}

// An update op with attr copy_dtype (passes/hoist_param_casts.h) writes its
// params' 16-bit copies as its last n outputs (n: a multi-tensor op's attr
// n, else 1): PARAM_COPY vars (`copy_slot`) of that dtype shaped like the
// params (inputs 0..n-1). A hand-edited plan that breaks this is refused: the
// kernel would write a buffer of its own that the copy's readers read as
// the declared type.
absl::Status CheckCopyOutputs(const Program& program, int i, const KernelDef& def, const std::vector<int>& out_slots,
                              const std::vector<bool>& copy_slot) {
  const Op& op = program.op(i);
  auto attr = op.attr().find("copy_dtype");
  if (attr == op.attr().end() || attr->second.s().empty()) return absl::OkStatus();
  DataType dtype = DT_INVALID;
  auto n_attr = op.attr().find("n");
  const int64_t n = n_attr != op.attr().end() ? n_attr->second.i() : 1;
  if (!DataType_Parse(attr->second.s(), &dtype) || n < 1 || n > op.output_size() || n > op.input_size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i), ": attr copy_dtype '",
                                                   attr->second.s(), "' does not fit its ", op.output_size(),
                                                   " outputs"));
  }
  for (int64_t k = 0; k < n; ++k) {
    const int out = static_cast<int>(op.output_size() - n + k);
    const TensorType& want = def.input_types[k];
    const TensorType& got = def.output_types[out];
    if (!copy_slot[out_slots[out]] || got.dtype != dtype || got.shape != want.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: ", OpWhere(program, i), " writes '", op.output(out), "' as the ", attr->second.s(),
                       " copy of '", op.input(static_cast<int>(k)), "' ", want.ToString(), ", but it is ",
                       copy_slot[out_slots[out]] ? got.ToString() : "not a PARAM_COPY"));
    }
  }
  return absl::OkStatus();
}

// Rows [begin, begin + n) of a host tensor whose first dimension is the
// batch, copied onto `device`.
// Rows [begin, begin + n) of t: from host memory into `device`'s, or, for a
// t already on a device (a caller's fixed batch), a copy on that device.
Tensor SliceRows(const Tensor& t, int64_t begin, int64_t n, Device* device) {
  Shape shape = t.shape();
  const size_t row_bytes = shape[0] == 0 ? 0 : t.bytes() / shape[0];
  shape[0] = n;
  Device* where = t.on_host() ? device : t.device();
  Tensor out = Tensor::Empty(t.dtype(), shape, where);
  if (out.defined() && n > 0) {
    const void* rows = static_cast<const char*>(t.raw_data()) + begin * row_bytes;
    where->NoteError(t.on_host() ? where->CopyFromHost(out.raw_data(), rows, n * row_bytes)
                                 : where->CopyOnDevice(out.raw_data(), rows, n * row_bytes));
  }
  return out;
}

}  // namespace

double ScalarValue(const Tensor& t) { return t.ValueAt(0); }

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const RankPlan& plan, const ExecutorOptions& options) {
  std::unique_ptr<Executor> e(new Executor(plan, options));
  if (auto s = e->Prepare(); !s.ok()) return s;
  return e;
}

absl::Status Executor::Prepare() {
  const Program& program = plan_.program();
  const int num_vars = program.var_size();
  dp_degree_ = std::max(1, plan_.topology().dp_degree());
  dp_rank_ = plan_.topology().dp_rank();
  merge_steps_ = std::max(1, plan_.schedule().merge_steps());
  StepGraphConditions graph_conditions;
  graph_conditions.requested = options_.cuda_graph;
  graph_conditions.device_unsupported = options_.device->GraphUnsupported();
  graph_conditions.tracing = options_.tracer != nullptr;
  graph_conditions.comms = options_.comms;
  graph_blocker_ = StepGraphBlocker(plan_, graph_conditions);
  if (graph_blocker_.empty()) {
    absl::StatusOr<std::vector<Communicator*>> comms = StepCommunicators(plan_, options_.comms);
    if (!comms.ok()) return comms.status();
    graph_comms_ = *std::move(comms);
  }
  if (options_.cuda_graph && !graph_blocker_.empty()) graph_note_ = absl::StrCat("not used: ", graph_blocker_);
  const bool peers =
      options_.comms != nullptr && options_.comms->world() != nullptr && options_.comms->world()->size() > 1;
  // --cuda_graph must be the same on every rank: a rank without it never votes.
  graph_vote_ = options_.cuda_graph && peers;
  // With peers, the device's kernels may wait for them: an allocation that
  // misses waits for the device's work no longer than a transfer may wait,
  // then fails naming its bytes, where a full synchronization could wait
  // for a peer that waits for this rank.
  if (peers) options_.device->LimitPeerWaits(absl::Seconds(options_.comm_timeout_s));
  persistent_.resize(num_vars);
  checkpointed_.resize(num_vars);
  in_place_output_.resize(num_vars);
  state_.resize(num_vars);
  scopes_.assign(std::max(1, plan_.schedule().micro_batches()), std::vector<Tensor>(num_vars));
  for (int i = 0; i < num_vars; ++i) {
    const Var& v = program.var(i);
    slot_of_[v.name()] = i;
    persistent_[i] = IsPersistent(v.kind());
    checkpointed_[i] = IsCheckpointed(v.kind());
    in_place_output_[i] = v.kind() == PARAM_COPY;
  }
  if (!program.loss_scale().empty() || !program.skipped_updates().empty()) {
    auto scale = slot_of_.find(program.loss_scale());
    auto skipped = slot_of_.find(program.skipped_updates());
    if (scale == slot_of_.end() || skipped == slot_of_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("plan: loss_scale '", program.loss_scale(), "' or skipped_updates '",
                                                     program.skipped_updates(), "' is not a var of the program"));
    }
    loss_scale_slot_ = scale->second;
    skipped_updates_slot_ = skipped->second;
  }
  if (program.optimizer().kind_case() != Optimizer::KIND_NOT_SET) lr_schedule_ = LrScheduleOf(program.optimizer());
  for (const Op& op : program.op()) {
    if (op.type() != "lr_schedule" || op.input_size() != 1) continue;
    if (auto it = slot_of_.find(op.input(0)); it != slot_of_.end()) update_count_slot_ = it->second;
    break;
  }
  std::vector<bool> read(num_vars, false);
  for (const Op& op : program.op()) {
    for (const auto& in : op.input()) {
      auto it = slot_of_.find(in);
      if (it != slot_of_.end()) read[it->second] = true;
    }
  }
  for (int i = 0; i < num_vars; ++i) {
    if (program.var(i).kind() == FEED && read[i]) {
      feeds_.push_back(&program.var(i));
      feed_slots_.push_back(i);
    }
  }
  // The loss and fetches are read from their host copies where the plan
  // made them (Program.host_copy), after the step's end synchronisation.
  auto metric_slot = [&](const std::string& name, const char* what) -> absl::StatusOr<int> {
    auto copy = program.host_copy().find(name);
    const bool copied = copy != program.host_copy().end();
    const std::string& var = copied ? copy->second : name;
    auto it = slot_of_.find(var);
    if (it == slot_of_.end()) return absl::InvalidArgumentError(absl::StrCat("plan: ", what, " '", var, "' has no var"));
    if (copied && !program.var(it->second).host_memory()) {
      return absl::InvalidArgumentError(absl::StrCat("plan: host copy '", var, "' of ", what, " '", name,
                                                     "' is not a host var"));
    }
    return it->second;
  };
  if (!program.loss().empty()) {
    absl::StatusOr<int> slot = metric_slot(program.loss(), "loss");
    if (!slot.ok()) return slot.status();
    loss_slot_ = *slot;
  }
  for (const auto& f : program.fetch()) {
    absl::StatusOr<int> slot = metric_slot(f, "fetch");
    if (!slot.ok()) return slot.status();
    fetch_slots_.push_back({f, *slot});
  }
  if (!program.grad_sumsq().empty()) {
    absl::StatusOr<int> slot = metric_slot(program.grad_sumsq(), "grad_sumsq");
    if (!slot.ok()) return slot.status();
    grad_sumsq_slot_ = *slot;
  }

  const auto& frees = plan_.memory().frees_after_op();
  const auto& eval_frees = plan_.memory().eval_frees_after_op();
  // The plan's device kind picks the kernels (a plan from before plans named one is for the CPU).
  const DeviceKind device_kind = plan_.device_kind() == DEVICE_KIND_UNSPECIFIED ? DEVICE_CPU : plan_.device_kind();
  for (int i = 0; i < program.op_size(); ++i) {
    const Op& op = program.op(i);
    PreparedOp p;
    p.op_index = i;
    const bool transfer = op.has_channel();
    p.trace_name = transfer ? op.name() : op.type();
    p.trace_category = transfer ? "comm" : "op";
    p.is_transfer = transfer;
    KernelDef def;
    def.op = &plan_.program().op(i);
    for (const auto& in : op.input()) {
      auto it = slot_of_.find(in);
      if (it == slot_of_.end()) return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i), " reads undeclared var '", in, "'"));
      p.input_slots.push_back(it->second);
      const Var& v = program.var(it->second);
      if (v.host_memory() != (op.type() == "copy_to_device")) {
        return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i), " reads ",
                                                       v.host_memory() ? "host" : "device", " var '", in, "' (",
                                                       v.host_memory() ? "only copy_to_device may" : "it copies from the host",
                                                       ")"));
      }
      def.input_types.push_back(TensorType{v.dtype(), Shape(v.shape().begin(), v.shape().end())});
    }
    p.inputs.resize(op.input_size());
    for (const auto& out : op.output()) {
      auto it = slot_of_.find(out);
      if (it == slot_of_.end()) return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i), " writes undeclared var '", out, "'"));
      p.output_slots.push_back(it->second);
      const Var& v = program.var(it->second);
      if (v.host_memory() != (op.type() == "copy_to_host")) {
        return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i), " writes ",
                                                       v.host_memory() ? "host" : "device", " var '", out, "' (",
                                                       v.host_memory() ? "only copy_to_host may" : "it copies to the host",
                                                       ")"));
      }
      def.output_types.push_back(TensorType{v.dtype(), Shape(v.shape().begin(), v.shape().end())});
    }
    p.outputs.resize(op.output_size());
    for (const auto& [list, slots] : {std::pair{&frees, &p.frees}, std::pair{&eval_frees, &p.eval_frees}}) {
      if (i >= list->size()) continue;
      for (const auto& var : list->Get(i).var()) {
        auto it = slot_of_.find(var);
        if (it != slot_of_.end()) slots->push_back(it->second);
      }
    }
    // A plan from before evaluations had their own: the step's.
    if (eval_frees.empty()) p.eval_frees = p.frees;
    DataType dtype = KernelDtype(def);
    const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), device_kind, dtype);
    if (factory == nullptr) {
      return absl::UnimplementedError(absl::StrCat(OpWhere(program, i), ": no ", DeviceKindLabel(device_kind),
                                                   " kernel for dtype ", DataTypeName(dtype)));
    }
    auto kernel = (*factory)(def);
    if (!kernel.ok()) return absl::InvalidArgumentError(absl::StrCat(OpWhere(program, i), ": ", kernel.status().message()));
    p.kernel = std::move(*kernel);
    Section* section = ActionRuns(Action::FORWARD, op.role())    ? &forward_
                       : ActionRuns(Action::BACKWARD, op.role()) ? &backward_
                       : ActionRuns(Action::OPTIMIZE, op.role()) ? &optimize_
                                                                 : nullptr;
    if (absl::Status s = CheckCopyOutputs(program, i, def, p.output_slots, in_place_output_); !s.ok()) return s;
    if (op.role() == REFRESH) {
      // A copy an update op writes at every step: this op only refreshes it,
      // from persistent vars (the executor runs it outside any action).
      if (p.output_slots.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("plan: ", OpWhere(program, i), " has role REFRESH but writes nothing"));
      }
      for (int slot : p.output_slots) {
        if (!in_place_output_[slot]) {
          return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i),
                                                         " has role REFRESH but writes '", program.var(slot).name(),
                                                         "', not a PARAM_COPY"));
        }
      }
      for (int slot : p.input_slots) {
        if (!persistent_[slot]) {
          return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i), " has role REFRESH but reads '",
                                                         program.var(slot).name(), "', which is not persistent"));
        }
      }
      refresh_.ops.push_back(std::move(p));
      continue;
    }
    if (section == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("plan: ", OpWhere(program, i), " has role ", OpRole_Name(op.role()),
                                                     ", which no action runs"));
    }
    if (p.kernel->prefetches()) section->prefetching.push_back(static_cast<int>(section->ops.size()));
    if (op.type() == "send") section->send_channels.push_back(op.channel().id());
    bool refreshes = section == &optimize_ && !p.output_slots.empty();
    for (int slot : p.output_slots) refreshes = refreshes && in_place_output_[slot];
    if (refreshes) {
      // Its twin in refresh_, with a kernel of its own.
      PreparedOp twin;
      twin.input_slots = p.input_slots;
      twin.inputs.resize(p.inputs.size());
      twin.output_slots = p.output_slots;
      twin.outputs.resize(p.outputs.size());
      twin.op_index = p.op_index;
      twin.trace_name = p.trace_name;
      twin.trace_category = p.trace_category;
      auto again = (*factory)(def);
      if (!again.ok()) return absl::InvalidArgumentError(absl::StrCat(OpWhere(program, i), ": ", again.status().message()));
      twin.kernel = std::move(*again);
      refresh_.ops.push_back(std::move(twin));
    }
    section->ops.push_back(std::move(p));
  }
  // An action posts its receives when it starts, in channel order: the
  // order each sender's sends to this rank go in (channel ids follow the
  // program order of what they carry), as NCCL, which matches a pair's
  // messages by the order they are issued, needs.
  for (Section* section : {&forward_, &backward_, &optimize_}) {
    std::stable_sort(section->prefetching.begin(), section->prefetching.end(), [&](int a, int b) {
      const Op& x = program.op(section->ops[a].op_index);
      const Op& y = program.op(section->ops[b].op_index);
      return x.channel().id() < y.channel().id();
    });
  }
  // Every PARAM_COPY an op reads is written by an op refresh_ runs, and a
  // copy refreshed from a var the step writes (an updated weight) is written
  // in the step too: it would go stale otherwise.
  std::vector<bool> refreshed(num_vars, false), written_in_step(num_vars, false);
  for (const PreparedOp& p : refresh_.ops) {
    for (int slot : p.output_slots) refreshed[slot] = true;
  }
  for (const Section* section : {&forward_, &backward_, &optimize_}) {
    for (const PreparedOp& p : section->ops) {
      for (int slot : p.output_slots) written_in_step[slot] = true;
    }
  }
  for (const PreparedOp& p : refresh_.ops) {
    if (program.op(p.op_index).role() != REFRESH) continue;  // an OPTIMIZE cast's twin
    for (int in : p.input_slots) {
      if (!written_in_step[in]) continue;
      for (int slot : p.output_slots) {
        if (!written_in_step[slot]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "plan: ", OpWhere(program, p.op_index), " refreshes PARAM_COPY '", program.var(slot).name(), "' from '",
              program.var(in).name(), "', which the step updates, but no op of the step writes the copy"));
        }
      }
    }
  }
  for (const Section* section : {&forward_, &backward_, &optimize_}) {
    for (const PreparedOp& p : section->ops) {
      for (int slot : p.input_slots) {
        if (in_place_output_[slot] && !refreshed[slot]) {
          return absl::InvalidArgumentError(
              absl::StrCat("plan: ", OpWhere(program, p.op_index), " reads PARAM_COPY '", program.var(slot).name(),
                           "', which no op refreshes (an OPTIMIZE cast or a REFRESH op)"));
        }
      }
    }
  }
  for (const auto& wait : plan_.memory().send_waits()) {
    send_wait_action_[{wait.channel(), wait.micro_batch()}] = wait.action();
  }
  // What a training step holds of its forward sends when a forward starts
  // (HoldSends's rule): an evaluation holds no more (proto/roles.h; the
  // memory plan predicts it so).
  eval_sends_in_flight_ = EvalSendsInFlight(plan_.schedule(), plan_.memory().send_waits(), forward_.send_channels);

  return absl::OkStatus();
}

absl::Status Executor::InitializeState(const std::set<std::string>& to_load) {
  DropGraphs();  // they write the buffers replaced here
  loss_scale_state_.reset();
  updates_made_.reset();
  param_copies_stale_ = true;  // from here on, even if it fails part way
  const Program& program = plan_.program();
  for (int i = 0; i < program.var_size(); ++i) {
    const Var& v = program.var(i);
    if (checkpointed_[i] && to_load.count(v.name())) {
      state_[i] = Tensor();
    } else if (v.kind() == PARAM) {
      // Initialised on the host (the same bits on every device), then moved.
      auto t = InitializeParam(v, options_.seed, options_.device->host_accessible() ? options_.device->allocator()
                                                                                      : GetCpuAllocator());
      if (!t.ok()) return t.status();
      if (!options_.device->host_accessible()) {
        t = t->CopyTo(options_.device);
        if (!t.ok()) return t.status();
      }
      state_[i] = std::move(*t);
    } else if (v.kind() == STATE && v.has_init()) {
      // A compiler state var with a constant start (the loss scale).
      auto t = InitializeParam(v, options_.seed, options_.device->host_accessible() ? options_.device->allocator()
                                                                                      : GetCpuAllocator());
      if (!t.ok()) return t.status();
      if (!options_.device->host_accessible()) {
        t = t->CopyTo(options_.device);
        if (!t.ok()) return t.status();
      }
      state_[i] = std::move(*t);
    } else if (v.kind() == STATE || v.kind() == SCRATCH) {
      Shape shape(v.shape().begin(), v.shape().end());
      state_[i] = Tensor::Zeros(v.dtype(), shape, options_.device);
      if (!state_[i].defined()) return absl::ResourceExhaustedError(absl::StrCat("out of memory for state '", v.name(), "'"));
    }
  }
  step_ = 0;
  update_base_ = update_base_step_ = 0;
  return absl::OkStatus();
}

std::map<std::string, Tensor> Executor::PersistentState() const {
  std::map<std::string, Tensor> out;
  for (int i = 0; i < plan_.program().var_size(); ++i) {
    if (checkpointed_[i]) out[plan_.program().var(i).name()] = state_[i];
  }
  return out;
}

absl::StatusOr<std::map<std::string, Tensor>> Executor::HostState() const {
  std::map<std::string, Tensor> state = PersistentState();
  if (options_.device->host_accessible()) return state;
  for (auto& [name, t] : state) {
    t = t.Clone(GetCpuAllocator());
    if (!t.defined()) return absl::ResourceExhaustedError(absl::StrCat("out of host memory copying '", name, "'"));
  }
  if (absl::Status s = options_.device->Synchronize(); !s.ok()) return s;
  return state;
}

absl::Status Executor::LoadPersistentState(const std::map<std::string, Tensor>& state, bool weights_only) {
  std::map<std::string, Tensor> shared = state;  // handles: the caller's tensors are copied below, never adopted
  return LoadState(shared, /*adopt=*/false, weights_only);
}

absl::Status Executor::LoadPersistentState(std::map<std::string, Tensor>&& state, bool weights_only) {
  return LoadState(state, /*adopt=*/true, weights_only);
}

absl::Status Executor::LoadState(std::map<std::string, Tensor>& state, bool adopt, bool weights_only) {
  DropGraphs();  // they write the buffers replaced here
  loss_scale_state_.reset();
  updates_made_.reset();
  param_copies_stale_ = true;  // from here on, even if it fails part way
  const Program& program = plan_.program();
  // A parameter no op reads has no gradient and never changes: one device
  // keeps it (its initial value), a pipeline's plans drop it, so their
  // checkpoints lack it; it keeps its initial value here too.
  std::set<std::string> read;
  for (const Op& op : program.op()) read.insert(op.input().begin(), op.input().end());
  for (int i = 0; i < program.var_size(); ++i) {
    if (!checkpointed_[i]) continue;
    const Var& v = program.var(i);
    auto it = state.find(v.name());
    if (it == state.end() && weights_only && absl::StrContains(v.name(), '@') && state_[i].defined()) continue;
    if (it == state.end() && v.kind() == PARAM && !read.count(v.name()) && state_[i].defined()) continue;
    if (it == state.end()) return absl::NotFoundError(absl::StrCat("checkpoint has no tensor '", v.name(), "'"));
    const Tensor& t = it->second;
    std::vector<int64_t> want(v.shape().begin(), v.shape().end());
    std::vector<int64_t> got(t.shape().begin(), t.shape().end());
    if (t.dtype() != v.dtype() || want != got) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint tensor '", v.name(), "' is ", DataTypeName(t.dtype()),
                                                     ShapeString(got), ", the program wants ", DataTypeName(v.dtype()),
                                                     ShapeString(want)));
    }
    // A weight that is not finite (a diverged run's save, a damaged file)
    // would fail the first step as "loss is nan; lower the learning rate?".
    // Other state may hold one legitimately (an F16 merge buffer after an
    // overflowing micro-batch, its update to be skipped).
    if (v.kind() == PARAM && t.on_host()) {
      if (const int64_t bad = FirstNonFinite(t); bad >= 0) {
        return absl::DataLossError(absl::StrCat("checkpoint tensor '", v.name(), "' (a weight) holds ", t.ValueAt(bad),
                                                " at element ", bad,
                                                ": the saving run had diverged, or the file is damaged"));
      }
    }
    if (adopt && t.sole_owner() && t.device() == options_.device) {
      state_[i] = std::move(it->second);
      continue;
    }
    // Onto this rank's device, so its allocator counts the bytes (a host
    // tensor's Clone would take the reader's allocator: an --eval_only run
    // measured its loaded weights nowhere).
    absl::StatusOr<Tensor> copy = t.CopyTo(options_.device);
    if (!copy.ok()) return copy.status();
    state_[i] = std::move(*copy);
  }
  return absl::OkStatus();
}

absl::Status Executor::PlaceFeeds(const std::map<std::string, Tensor>& feeds, std::vector<Tensor>& scope) {
  for (size_t f = 0; f < feeds_.size(); ++f) {
    const Tensor& t = feeds.at(feeds_[f]->name());
    // A host feed (Var.host_memory: the plan copies it to the device with an
    // op, on the device where the caller put it there) and any feed of a
    // host device are used as they are (whatever host allocator made them);
    // else the device gets its own copy here (a plan made before the
    // host-transfers pass).
    Device* where = FeedDevice(*feeds_[f]);
    if (t.device() == where || (t.on_host() && where->host_accessible()) ||
        (feeds_[f]->host_memory() && t.device() == options_.device)) {
      scope[feed_slots_[f]] = t;
      continue;
    }
    absl::StatusOr<Tensor> copy = t.CopyTo(where);
    if (!copy.ok()) {
      return absl::Status(copy.status().code(), absl::StrCat("feed '", feeds_[f]->name(), "' to ", where->name(), ": ",
                                                             copy.status().message()));
    }
    scope[feed_slots_[f]] = std::move(*copy);
  }
  return absl::OkStatus();
}

Device* Executor::FeedDevice(const Var& feed) const {
  return feed.host_memory() ? GetCpuDevice() : options_.device;
}

absl::StatusOr<int64_t> Executor::CheckFeeds(const std::map<std::string, Tensor>& feeds) const {
  int64_t batch = -1;
  for (const Var* v : feeds_) {
    auto it = feeds.find(v->name());
    if (it == feeds.end()) return absl::InvalidArgumentError(absl::StrCat("no data for feed '", v->name(), "'"));
    const Tensor& t = it->second;
    bool ok = t.dtype() == v->dtype() && t.rank() == v->shape_size() && t.rank() > 0;
    for (int d = 0; ok && d < v->shape_size(); ++d) {
      if (v->shape(d) == -1) {
        if ((batch >= 0 && t.dim(d) != batch) || d != 0) ok = false;
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
  }
  return batch;
}

absl::Status Executor::HoldSends(const Section& section, int action, int micro_batch) {
  if (!pending_sends_.empty() && pending_sends_.size() != section.send_channels.size()) {
    return absl::InternalError(absl::StrCat("action ", action, " posted ", pending_sends_.size(), " sends, expected ",
                                            section.send_channels.size()));
  }
  const int last = plan_.schedule().action_size() - 1;
  for (size_t k = 0; k < pending_sends_.size(); ++k) {
    auto it = send_wait_action_.find({section.send_channels[k], micro_batch});
    const int at = it == send_wait_action_.end() ? last : std::max(action, it->second);
    held_sends_[at].push_back(std::move(pending_sends_[k]));
  }
  pending_sends_.clear();
  auto due = held_sends_.find(action);
  if (due == held_sends_.end()) return absl::OkStatus();
  absl::Status s = WaitSends(due->second, absl::OkStatus());
  held_sends_.erase(due);
  return s;
}

// Waits for every send (the receiver has taken it) and drops it, freeing its
// buffer; the first error unless `status` already holds one.
absl::Status Executor::WaitSends(std::vector<std::unique_ptr<Work>>& sends, absl::Status status) {
  if (sends.empty()) return status;
  const int64_t start = Tracer::NowMicros();
  for (auto& work : sends) {
    absl::Status s = work->Wait(absl::Seconds(options_.comm_timeout_s));
    if (status.ok() && !s.ok()) status = absl::Status(s.code(), absl::StrCat("send: ", s.message()));
    work.reset();
  }
  sends.clear();
  wait_seconds_ += (Tracer::NowMicros() - start) * 1e-6;
  return status;
}

RunContext Executor::MakeRunContext(int64_t sample_offset, bool training, int micro_batches, int64_t micro_batch_size) {
  RunContext run;
  run.seed = options_.seed;
  // Random streams and learning-rate schedules follow optimizer updates: k
  // merged steps draw as one step of k times the batch.
  run.step = step_ / merge_steps_;
  run.sample_offset = sample_offset;
  run.total_steps = total_steps_ / merge_steps_;
  run.update_step = UpdateStep();
  run.training = training;
  run.device = options_.device;
  run.micro_batches = micro_batches;
  run.micro_batch_size = micro_batch_size;
  run.comms = options_.comms;
  run.pending_sends = &pending_sends_;
  run.pending_buckets = &pending_buckets_;
  run.comm_timeout_s = options_.comm_timeout_s;
  return run;
}

std::string Executor::OutOfMemoryDetail(bool training) const {
  const Allocator* allocator = options_.device->allocator();
  const bool eval = !training && plan_.memory().eval_peak_bytes() > 0;
  return absl::StrCat("; ", options_.device->name(), " held ", allocator->live_bytes(), " bytes in tensors (peak ",
                      allocator->peak_bytes(), eval ? " this evaluation" : " this step", "), the plan predicted ",
                      eval ? "an evaluation's peak of " : "a peak of ", PredictedPeak(plan_.memory(), eval),
                      " bytes for rank ", plan_.rank());
}

absl::Status Executor::RefreshParamCopies() {
  if (!param_copies_stale_) return absl::OkStatus();
  if (!refresh_.ops.empty()) {
    const RunContext run = MakeRunContext(0, true, 1, 0);
    if (absl::Status s = RunSection(refresh_, 0, run); !s.ok()) return s;
  }
  param_copies_stale_ = false;
  return absl::OkStatus();
}

absl::Status Executor::RunSection(Section& section, int micro_batch, const RunContext& run) {
  std::vector<Tensor>& scope = scopes_[micro_batch];
  for (int index : section.prefetching) {
    PreparedOp& p = section.ops[index];
    KernelContext ctx(&run, {}, absl::MakeSpan(p.outputs));
    if (auto s = p.kernel->Prefetch(ctx); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(OpWhere(plan_.program(), p.op_index), ": ", s.message()));
    }
  }
  for (PreparedOp& p : section.ops) {
    for (size_t k = 0; k < p.input_slots.size(); ++k) {
      const int slot = p.input_slots[k];
      p.inputs[k] = persistent_[slot] ? &state_[slot] : &scope[slot];
    }
    // A PARAM_COPY's cast writes into the copy's buffer (KernelContext::AllocateOutput
    // reuses a defined output of its type), as a replayed graph needs.
    // Any other output starts empty (a failed call may have left one).
    for (size_t k = 0; k < p.output_slots.size(); ++k) {
      const int slot = p.output_slots[k];
      p.outputs[k] = in_place_output_[slot] ? state_[slot] : Tensor();
    }
    KernelContext ctx(&run, p.inputs, absl::MakeSpan(p.outputs));
    const bool timed = options_.tracer != nullptr || options_.comms != nullptr;
    const int64_t start = timed ? Tracer::NowMicros() : 0;
    // A transfer's trace event also carries the CPU it took (posting a send
    // writes to the socket; a receive's wait costs little unless it blocks)
    // and its payload.
    const bool traced_transfer = options_.tracer != nullptr && p.is_transfer;
    const int64_t cpu_start = traced_transfer ? Tracer::ThreadCpuMicros() : 0;
    absl::Status s = p.kernel->Compute(ctx);
    // On a device with its own stream the kernel only queued work: a trace
    // waits for it, so each op's event is its device time (the run is then
    // serialized, as under CUDA_LAUNCH_BLOCKING).
    if (s.ok() && options_.tracer != nullptr && !p.is_transfer && options_.device->compute_stream() != nullptr) {
      s = options_.device->Synchronize();
    }
    if (timed) {
      const double seconds = (Tracer::NowMicros() - start) * 1e-6;
      (p.is_transfer ? wait_seconds_ : busy_seconds_) += seconds;
    }
    if (traced_transfer) {
      const Tensor* payload = !p.inputs.empty() ? p.inputs[0] : !p.outputs.empty() ? &p.outputs[0] : nullptr;
      options_.tracer->Add(absl::StrCat(p.trace_name, " mb ", micro_batch), p.trace_category, start,
                           Tracer::NowMicros(), Tracer::ThreadCpuMicros() - cpu_start,
                           payload != nullptr && payload->defined() ? static_cast<int64_t>(payload->bytes()) : -1);
    } else if (options_.tracer) {
      options_.tracer->Add(p.trace_name, p.trace_category, start, Tracer::NowMicros());
    }
    if (!s.ok()) {
      std::string where = absl::StrCat(OpWhere(plan_.program(), p.op_index), ": ", s.message());
      // Out of memory: what the device held and what the plan expected, so
      // the user can tell a device too small for the plan from a plan that
      // underestimates.
      // Only for this device's memory (not, say, host staging memory).
      if (s.code() == absl::StatusCode::kResourceExhausted &&
          absl::StrContains(s.message(), options_.device->name())) {
        absl::StrAppend(&where, OutOfMemoryDetail(run.training));
      }
      return absl::Status(s.code(), where);
    }
    for (size_t k = 0; k < p.output_slots.size(); ++k) {
      const int slot = p.output_slots[k];
      if (!persistent_[slot]) {
        scope[slot] = std::move(p.outputs[k]);
        continue;
      }
      if (moved_state_.empty() && run.training && state_[slot].defined() &&
          p.outputs[k].raw_data() != state_[slot].raw_data()) {
        moved_state_ = absl::StrCat(OpWhere(plan_.program(), p.op_index), " writes persistent var '",
                                    plan_.program().var(slot).name(), "' into a new buffer, not in place");
      }
      state_[slot] = std::move(p.outputs[k]);
    }
    for (int slot : run.training ? p.frees : p.eval_frees) scope[slot] = Tensor();  // an evaluation: its own
  }
  return absl::OkStatus();
}

void Executor::HoldMetrics(int micro_batch) {
  const std::vector<Tensor>& scope = scopes_[micro_batch];
  if (loss_slot_ >= 0 && scope[loss_slot_].defined()) held_metrics_.push_back({-1, scope[loss_slot_]});
  for (size_t f = 0; f < fetch_slots_.size(); ++f) {
    const Tensor& t = scope[fetch_slots_[f].second];
    if (t.defined()) held_metrics_.push_back({static_cast<int>(f), t});
  }
}

bool IsSummedFetch(const RankPlan& plan, const std::string& name) {
  return std::find(plan.summed_fetch().begin(), plan.summed_fetch().end(), name) != plan.summed_fetch().end();
}

void Executor::SumMetrics(StepResult* result) {
  // After the step's synchronisation a host copy holds its bytes; a device
  // tensor (a plan without host copies) is read here, one copy each.
  for (const auto& [index, t] : held_metrics_) {
    if (index == kGradSumsqMetric) {
      result->has_grad_norm = true;
      result->grad_norm = std::sqrt(ScalarValue(t));
    } else if (index < 0) {
      result->has_loss = true;
      result->loss += ScalarValue(t);
    } else {
      result->fetches[fetch_slots_[index].first] += ScalarValue(t);
    }
  }
  held_metrics_.clear();
}

absl::Status Executor::FinishStep(absl::Status status) {
  // Every posted send completes (or fails) before its buffer may be reused.
  status = WaitSends(pending_sends_, status);
  for (auto& [action, sends] : held_sends_) status = WaitSends(sends, status);
  held_sends_.clear();
  // A bucket posted but not waited for (a step that failed) finishes before
  // its buffer may be written again.
  for (auto& [bucket, pending] : pending_buckets_) {
    absl::Status s = pending.work->Wait(absl::Seconds(options_.comm_timeout_s));
    if (status.ok() && !s.ok()) status = absl::Status(s.code(), absl::StrCat(pending.what, ": ", s.message()));
  }
  pending_buckets_.clear();
  for (auto& scope : scopes_) {
    for (Tensor& t : scope) t = Tensor();
  }
  // Errors of work queued on the device surface here, once a step.
  absl::Status synced = launched_graph_ && !graph_comms_.empty() ? WaitForReplay() : options_.device->Synchronize();
  launched_graph_ = false;
  return status.ok() ? synced : status;
}

absl::Status Executor::WaitForReplay() {
  // NCCL's own timeouts do not cover a graph's kernels; a replay takes about
  // an eager step's time, and a wait in it at most --comm_timeout_s.
  const absl::Duration limit = absl::Seconds(options_.comm_timeout_s) + absl::Seconds(eager_step_seconds_);
  const absl::Time deadline = absl::Now() + limit;
  ScopedWaitingFor waiting(absl::StrCat("the transfers and collectives of step ", step_ + 1, "'s replayed graph"));
  absl::Duration nap = absl::Microseconds(10);
  for (;;) {
    absl::StatusOr<bool> done = options_.device->WorkDone();
    if (!done.ok() || *done) {
      absl::Status synced = options_.device->Synchronize();
      return done.ok() ? synced : done.status();
    }
    absl::Status failed;
    for (Communicator* comm : graph_comms_) {
      failed = comm->CheckHealth();
      if (!failed.ok()) break;
    }
    if (failed.ok() && absl::Now() >= deadline) {
      failed = absl::DeadlineExceededError(absl::StrCat(
          "did not finish within ", absl::FormatDuration(limit),
          " (--comm_timeout_s plus an eager step's time): a rank died, stalled or issued other transfers"));
    }
    if (!failed.ok()) {
      failed = absl::Status(failed.code(), absl::StrCat("step ", step_ + 1, "'s replayed graph: ", failed.message(),
                                                        "; its communicators are aborted"));
      AbortReplay(failed);
      return failed;
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Microseconds(100));
  }
}

absl::StatusOr<StepResult> Executor::TrainStep(const std::map<std::string, Tensor>& feeds, int64_t sample_offset) {
  auto batch = CheckFeeds(feeds);
  if (!batch.ok()) return batch.status();
  const int micro_batches = std::max(1, plan_.schedule().micro_batches());
  const int64_t rows = *batch < 0 ? plan_.schedule().micro_batch_size() * micro_batches : *batch;
  if (rows % micro_batches != 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", rows, " rows does not split into ", micro_batches,
                                                   " micro-batches"));
  }
  const int64_t stride = std::max<int64_t>(1, rows / micro_batches * dp_degree_);  // rows of one global micro-batch
  return TrainStep(
      [&](int64_t first, int64_t n) -> absl::StatusOr<std::map<std::string, Tensor>> {
        if (micro_batches == 1) return feeds;
        // The feeds are this rank's share: micro-batch first / stride of it.
        std::map<std::string, Tensor> slice;
        for (const Var* v : feeds_) {
          slice[v->name()] = SliceRows(feeds.at(v->name()), first / stride * n, n, FeedDevice(*v));
        }
        return slice;
      },
      sample_offset, rows / micro_batches);
}

absl::StatusOr<StepResult> Executor::TrainStep(const FeedFn& feeds, int64_t sample_offset) {
  return TrainStep(feeds, sample_offset, plan_.schedule().micro_batch_size());
}

absl::StatusOr<std::vector<double>> Executor::ReadStateScalars(const std::vector<int>& slots) const {
  std::vector<Tensor> host;
  for (int slot : slots) {
    Tensor t = state_[slot];
    if (!options_.device->host_accessible()) {
      t = t.Clone(GetCpuAllocator());
      if (!t.defined()) return absl::ResourceExhaustedError("out of host memory reading a scalar");
    }
    host.push_back(std::move(t));
  }
  if (!options_.device->host_accessible()) {
    if (absl::Status s = options_.device->Synchronize(); !s.ok()) return s;
  }
  std::vector<double> values;
  for (const Tensor& t : host) {
    switch (t.dtype()) {
      case F32:
        values.push_back(static_cast<double>(t.data<float>()[0]));
        break;
      case F64:
        values.push_back(t.data<double>()[0]);
        break;
      case I64:
        values.push_back(static_cast<double>(t.data<int64_t>()[0]));
        break;
      default:
        return absl::InternalError(absl::StrCat("state scalar of dtype ", DataTypeName(t.dtype())));
    }
  }
  return values;
}

absl::StatusOr<std::pair<double, double>> Executor::LossScaleState() {
  if (!loss_scale_state_.has_value()) {
    absl::StatusOr<std::vector<double>> v = ReadStateScalars({loss_scale_slot_, skipped_updates_slot_});
    if (!v.ok()) return v.status();
    loss_scale_state_ = std::make_pair((*v)[0], (*v)[1]);
  }
  return *loss_scale_state_;
}

absl::Status Executor::WriteRandomCounters(int64_t sample_offset, int64_t rows) {
  const int micro_batches = static_cast<int>(scopes_.size());
  Device* device = options_.device;
  int64_t* counters = nullptr;
  if (device->host_accessible()) {
    counters_on_host_.resize(2 * micro_batches);
    counters = counters_on_host_.data();
  } else {
    if (!counters_host_.defined()) {
      counters_host_ = Tensor::Empty(I64, {micro_batches, 2}, device->staging_allocator());
      counters_device_ = Tensor::Empty(I64, {micro_batches, 2}, device);
      if (!counters_host_.defined() || !counters_device_.defined()) {
        counters_host_ = counters_device_ = Tensor();
        return absl::ResourceExhaustedError(absl::StrCat("out of memory on ", device->name(), " for the random counters"));
      }
    }
    counters = counters_host_.data<int64_t>();
  }
  for (int mb = 0; mb < micro_batches; ++mb) {
    counters[2 * mb] = step_ / merge_steps_;
    counters[2 * mb + 1] = sample_offset + SampleRow(mb, rows);
  }
  return absl::OkStatus();
}

absl::Status Executor::EnqueueRandomCounters() {
  if (options_.device->host_accessible()) return absl::OkStatus();
  // The previous step's copy finished at its end synchronisation, so the
  // host may rewrite the page-locked source.
  return options_.device->CopyFromHost(counters_device_.raw_data(), counters_host_.raw_data(),
                                       counters_host_.bytes());
}

const int64_t* Executor::RandomCounters(int micro_batch) const {
  const int64_t* base =
      options_.device->host_accessible() ? counters_on_host_.data() : counters_device_.data<int64_t>();
  return base + 2 * micro_batch;
}

int64_t Executor::SampleRow(int micro_batch, int64_t rows) const {
  return (int64_t{micro_batch} * dp_degree_ + dp_rank_) * rows;
}

absl::StatusOr<StepResult> Executor::TrainStep(const FeedFn& feeds, int64_t sample_offset, int64_t rows) {
  const int micro_batches = std::max(1, plan_.schedule().micro_batches());
  // Under gradient merge, step j of an update holds samples [j*B, (j+1)*B)
  // of the update's merged batch.
  sample_offset += (step_ % merge_steps_) * rows * micro_batches * dp_degree_;
  const bool update = UpdateStep();
  StepResult result;
  double skipped_before = 0;
  if (update && update_count_slot_ >= 0 && !updates_made_.has_value()) {
    absl::StatusOr<std::vector<double>> count = ReadStateScalars({update_count_slot_});
    if (!count.ok()) return count.status();
    updates_made_ = static_cast<int64_t>((*count)[0]);
  }
  if (loss_scale_slot_ >= 0) {
    absl::StatusOr<std::pair<double, double>> scale_state = LossScaleState();
    if (!scale_state.ok()) return scale_state.status();
    result.has_loss_scale = true;
    result.loss_scale = scale_state->first;
    skipped_before = scale_state->second;
  }
  const MicroBatchFeeds load = [&](int mb) -> absl::StatusOr<std::map<std::string, Tensor>> {
    auto loaded = feeds(SampleRow(mb, rows), rows);
    if (!loaded.ok()) return loaded.status();
    auto got = CheckFeeds(*loaded);
    if (got.ok() && *got != rows) {
      got = absl::InvalidArgumentError(absl::StrCat("micro-batch ", mb, " has ", *got, " rows, expected ", rows));
    }
    if (!got.ok()) return got.status();
    return loaded;
  };
  absl::Status status = RefreshParamCopies();
  if (status.ok()) status = RunStep(load, sample_offset, rows, update);
  status = FinishStep(status);
  if (!status.ok()) {
    held_metrics_.clear();
    loss_scale_state_.reset();  // the step may have updated them before it failed
    updates_made_.reset();
    param_copies_stale_ = true;  // and the weights, not their copies
    return status;
  }
  SumMetrics(&result);
  if (!plan_.summed_loss()) result.loss /= micro_batches;  // a sum over samples: their total
  for (auto& [name, value] : result.fetches) {
    // A sum over samples is the micro-batches' sum; the others their mean.
    if (!IsSummedFetch(plan_, name)) value /= micro_batches;
  }
  if (update) result.optimizer_step = update_base_ + (step_ + 1 - update_base_step_) / merge_steps_;
  if (update && loss_scale_slot_ >= 0) {
    // The update may have changed both: one read for this step's verdict
    // and the next step's scale.
    loss_scale_state_.reset();
    absl::StatusOr<std::pair<double, double>> scale_state = LossScaleState();
    if (!scale_state.ok()) return scale_state.status();
    result.skipped_update = scale_state->second > skipped_before;
  }
  if (update && lr_schedule_.has_value()) {
    // The rate of the updates made before this one, the count the
    // lr_schedule kernel read: a skipped update (loss scaling) leaves it
    // where it was, and a run resumed with another gradient merge k goes
    // on from the checkpoint's count. A rank without the count (the loss's
    // stage training no parameter) is told the loaded one
    // (set_updates_made), else works it out from the steps.
    const int64_t made = updates_made_.has_value()
                             ? *updates_made_
                             : result.optimizer_step - 1 - static_cast<int64_t>(skipped_before);
    result.has_lr = true;
    result.lr = kernel_math::LearningRate(*lr_schedule_, made, total_steps_ / merge_steps_);
    if (updates_made_.has_value() && !result.skipped_update) ++*updates_made_;
  }
  ++step_;
  return result;
}

absl::Status Executor::RunActions(const MicroBatchFeeds& load, int64_t sample_offset, int64_t rows, bool update) {
  const int micro_batches = std::max(1, plan_.schedule().micro_batches());
  moved_state_.clear();
  absl::Status status = WriteRandomCounters(sample_offset, rows);
  if (status.ok()) status = EnqueueRandomCounters();
  for (int i = 0; status.ok() && i < plan_.schedule().action_size(); ++i) {
    const Action& action = plan_.schedule().action(i);
    const int mb = action.kind() == Action::OPTIMIZE ? 0 : action.micro_batch();
    RunContext run = MakeRunContext(sample_offset + SampleRow(mb, rows), true, micro_batches, rows);
    run.micro_batch = mb;
    run.random_counters = RandomCounters(mb);
    const int64_t action_start = options_.tracer ? Tracer::NowMicros() : 0;
    const int64_t action_cpu = options_.tracer ? Tracer::ThreadCpuMicros() : 0;
    Section& section = action.kind() == Action::FORWARD    ? forward_
                       : action.kind() == Action::BACKWARD ? backward_
                                                           : optimize_;
    if (action.kind() == Action::FORWARD) {
      if (!feeds_.empty()) {
        auto loaded = load(mb);
        if (!loaded.ok()) {
          status = loaded.status();
          break;
        }
        status = PlaceFeeds(*loaded, scopes_[mb]);
        if (!status.ok()) break;
      }
      status = RunSection(section, mb, run);
      if (status.ok()) HoldMetrics(mb);
    } else if (action.kind() != Action::OPTIMIZE || update) {
      status = RunSection(section, mb, run);
      // The update's gradient norm, read with the metrics at the step's end.
      if (status.ok() && action.kind() == Action::OPTIMIZE && grad_sumsq_slot_ >= 0 &&
          scopes_[mb][grad_sumsq_slot_].defined()) {
        held_metrics_.push_back({kGradSumsqMetric, scopes_[mb][grad_sumsq_slot_]});
      }
    }
    if (status.ok()) status = HoldSends(section, i, mb);
    if (options_.tracer) {
      options_.tracer->Add(action.kind() == Action::FORWARD    ? absl::StrCat("F", mb)
                           : action.kind() == Action::BACKWARD ? absl::StrCat("B", mb)
                                                               : std::string("OPT"),
                           "action", action_start, Tracer::NowMicros(), Tracer::ThreadCpuMicros() - action_cpu);
    }
  }
  return status;
}

absl::Status Executor::RunStep(const MicroBatchFeeds& load, int64_t sample_offset, int64_t rows, bool update) {
  // A rank that may not capture still walks to its first warm-up, where its
  // peers wait for its vote.
  if (!options_.cuda_graph || (!graph_blocker_.empty() && !graph_vote_)) {
    return RunActions(load, sample_offset, rows, update);
  }
  // rows (the schedule's micro-batch size) and update (the step count under
  // gradient merge) are the same on every rank, so every rank votes at the
  // same steps: the first of each shape, and each shape's capture.
  if (graph_rows_ < 0) graph_rows_ = rows;
  // Another batch size (a last, partial batch) runs eagerly.
  if (rows != graph_rows_) return RunActions(load, sample_offset, rows, update);
  auto graph = graphs_.find(update);
  if (graph != graphs_.end()) return ReplayStep(graph->second, load, sample_offset, rows);
  if (warmed_.count(update) == 0 || !graph_blocker_.empty()) {
    // The first step of its shape runs eagerly: kernels build their plans,
    // the allocators their segments, NCCL its connections, outside any
    // capture.
    const absl::Time start = absl::Now();
    absl::Status status = RunActions(load, sample_offset, rows, update);
    eager_step_seconds_ = std::max(eager_step_seconds_, absl::ToDoubleSeconds(absl::Now() - start));
    if (!status.ok()) return status;
    std::string why_not = graph_blocker_;
    if (why_not.empty() && !moved_state_.empty()) {
      why_not = absl::StrCat("a replayed step would not follow its state: ", moved_state_);
    }
    absl::StatusOr<std::string> agreed = AgreeOnGraphs(why_not);
    if (!agreed.ok()) {
      DisableGraphs(std::string(agreed.status().message()));
      return agreed.status();
    }
    if (agreed->empty()) {
      warmed_.insert(update);
    } else if (graph_blocker_.empty()) {
      DisableGraphs(*agreed);
    } else {
      graph_vote_ = false;  // its note, from Prepare, stays
    }
    return status;
  }
  return CaptureStep(load, sample_offset, rows, update);
}

absl::StatusOr<std::string> Executor::AgreeOnGraphs(const std::string& why_not) {
  if (!graph_vote_) return why_not;
  absl::StatusOr<StepGraphVote> vote =
      AgreeOnStepGraphs(*options_.comms->world(), why_not, absl::Seconds(options_.comm_timeout_s));
  if (!vote.ok()) return vote.status();
  if (!why_not.empty()) return why_not;  // this rank's own reason, as alone
  if (vote->rank < 0) return std::string();
  return absl::StrCat("rank ", vote->rank, " cannot capture its step: ", vote->reason);
}

absl::Status Executor::FillGraphFeeds(const MicroBatchFeeds& load) {
  if (feeds_.empty()) return absl::OkStatus();
  for (int mb = 0; mb < static_cast<int>(scopes_.size()); ++mb) {
    auto loaded = load(mb);
    if (!loaded.ok()) return loaded.status();
    if (absl::Status s = FillGraphFeeds(mb, *loaded); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Executor::FillGraphFeeds(int micro_batch, const std::map<std::string, Tensor>& feeds) {
  graph_feeds_.resize(scopes_.size());
  for (const Var* v : feeds_) {
    const Tensor& t = feeds.at(v->name());
    Tensor& fixed = graph_feeds_[micro_batch][v->name()];
    if (!fixed.defined()) {
      fixed = t.on_host() ? Tensor::Empty(t.dtype(), t.shape(), options_.device->staging_allocator())
                          : Tensor::Empty(t.dtype(), t.shape(), t.device());
      if (!fixed.defined()) {
        return absl::ResourceExhaustedError(absl::StrCat("out of memory for feed '", v->name(), "''s graph buffer on ",
                                                         t.on_host() ? "the host" : t.device()->name()));
      }
    }
    if (fixed.raw_data() == t.raw_data()) continue;
    if (fixed.dtype() != t.dtype() || fixed.shape() != t.shape() || fixed.on_host() != t.on_host() ||
        (!t.on_host() && fixed.device() != t.device())) {
      return absl::InvalidArgumentError(absl::StrCat("feed '", v->name(), "' is ", DataTypeName(t.dtype()),
                                                     ShapeString(t.shape()), " on ", t.device()->name(),
                                                     ", its captured buffer ", DataTypeName(fixed.dtype()),
                                                     ShapeString(fixed.shape()), " on ", fixed.device()->name()));
    }
    if (t.on_host()) {
      // The last replay that read it ended with its step.
      std::memcpy(fixed.raw_data(), t.raw_data(), t.bytes());
    } else if (absl::Status s = t.device()->CopyOnDevice(fixed.raw_data(), t.raw_data(), t.bytes()); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::CaptureStep(const MicroBatchFeeds& load, int64_t sample_offset, int64_t rows, bool update) {
  if (absl::Status s = FillGraphFeeds(load); !s.ok()) return s;
  // The step's feeds, whether it is captured or, after a failure (which
  // drops graph_feeds_), run eagerly.
  const std::vector<std::map<std::string, Tensor>> step_feeds = graph_feeds_;
  const MicroBatchFeeds fixed = [&step_feeds](int mb) -> absl::StatusOr<std::map<std::string, Tensor>> {
    return step_feeds.at(mb);
  };
  // A capture runs nothing: if it fails, the step runs eagerly from the
  // state it found.
  const std::vector<Tensor> state_before = state_;
  const DeviceGraph* share = graphs_.empty() ? nullptr : graphs_.begin()->second.graph.get();
  if (absl::Status s = options_.device->BeginCapture(share); !s.ok()) {
    // Nothing was recorded, so nothing to undo; the peers' captures are
    // dropped by the vote.
    absl::StatusOr<std::string> agreed = AgreeOnGraphs(absl::StrCat("the device could not capture: ", s.message()));
    DisableGraphs(std::string(agreed.ok() ? *agreed : agreed.status().message()));
    if (!agreed.ok()) return agreed.status();
    return RunActions(fixed, sample_offset, rows, update);
  }
  absl::Status status = RunActions(fixed, sample_offset, rows, update);
  absl::StatusOr<std::unique_ptr<DeviceGraph>> graph = options_.device->EndCapture();
  std::string why;
  if (!status.ok()) {
    why = absl::StrCat("an op failed under capture: ", status.message());
  } else if (!graph.ok()) {
    why = absl::StrCat("the device refused the capture: ", graph.status().message());
  } else if (!moved_state_.empty()) {
    why = absl::StrCat("a replayed step would not follow its state: ", moved_state_);
  }
  for (auto& scope : scopes_) {
    for (Tensor& t : scope) t = Tensor();
  }
  // Launched, a graph's NCCL ops meet their peers' only if every peer
  // launches its graph too: the capture is used only if all of them
  // succeeded, else every rank drops its graph unlaunched.
  absl::StatusOr<std::string> agreed = AgreeOnGraphs(why);
  if (!agreed.ok() || !agreed->empty()) {
    if (graph.ok()) graph->reset();
    state_ = state_before;
    held_metrics_.clear();
    // A step the capture stopped part-way left Works of recorded ops
    // (never run) queued: drop them unwaited (a transport keeps their
    // tensors) so the eager step starts clean.
    pending_sends_.clear();
    held_sends_.clear();
    pending_buckets_.clear();
    // An error a helper noted on the device under the failed capture is
    // the capture's, not the eager step's.
    options_.device->Synchronize().IgnoreError();
    DisableGraphs(std::string(agreed.ok() ? *agreed : agreed.status().message()));
    if (!agreed.ok()) return agreed.status();
    return RunActions(fixed, sample_offset, rows, update);
  }
  StepGraph& captured = graphs_[update];
  captured.graph = *std::move(graph);
  captured.metrics = held_metrics_;
  graph_note_ = absl::StrCat("step ", step_ + 1, " captured as a graph (", update ? "with" : "without",
                             " the optimizer update", graph_comms_.empty() ? "" : " and its communication",
                             ") and replayed from now on");
  launched_graph_ = true;
  return captured.graph->Launch();
}

absl::Status Executor::ReplayStep(StepGraph& graph, const MicroBatchFeeds& load, int64_t sample_offset, int64_t rows) {
  if (absl::Status s = FillGraphFeeds(load); !s.ok()) return s;
  // The graph copies the counters to the device itself.
  if (absl::Status s = WriteRandomCounters(sample_offset, rows); !s.ok()) return s;
  launched_graph_ = true;
  if (absl::Status s = graph.graph->Launch(); !s.ok()) return s;
  held_metrics_ = graph.metrics;
  return absl::OkStatus();
}

void Executor::AbortReplay(const absl::Status& why) {
  // ncclCommAbort stops the communicators' kernels at once, but since NCCL
  // 2.26 it returns only when no CUDA graph holds their ops any more (the
  // graph's destruction gives back NCCL's references), and destroying a
  // graph waits for its replay, which waits for every communicator's
  // kernels. So: abort each communicator on a thread of its own, all at
  // once (one after another, the first would wait for graphs that wait for
  // the second's kernels), wait (bounded) for the device to drain, drop the
  // graphs, then wait (bounded) for the aborts. The threads hold their
  // communicators' pointers: the rank ends with its error (the worker exits
  // without tearing them down) before they could go.
  std::vector<std::future<void>> aborted;
  for (Communicator* comm : graph_comms_) {
    auto done = std::make_shared<std::promise<void>>();
    aborted.push_back(done->get_future());
    std::thread([comm, why, done] {
      comm->Abort(why);
      done->set_value();
    }).detach();
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool drained = false;
  while (absl::Now() < deadline) {
    absl::StatusOr<bool> work_done = options_.device->WorkDone();
    if (!work_done.ok() || *work_done) {
      drained = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  // The kernels did not stop, and destroying a graph would wait for them
  // for good: let the graphs go undestroyed (leaked, never launched again),
  // and do not wait for aborts that cannot return while they exist.
  if (!drained) {
    for (auto& [update, graph] : graphs_) (void)graph.graph.release();
  }
  DisableGraphs(std::string(why.message()));  // drained: destroyed, NCCL's references go back
  if (!drained) return;
  options_.device->Synchronize().IgnoreError();
  // One deadline for all of them: they run at once.
  const absl::Time aborts_deadline = absl::Now() + absl::Seconds(10);
  for (std::future<void>& f : aborted) {
    f.wait_for(absl::ToChronoNanoseconds(std::max(aborts_deadline - absl::Now(), absl::ZeroDuration())));
  }
}

void Executor::DisableGraphs(const std::string& reason) {
  // Every rank reaches this at the same vote (or, after AbortReplay, ends
  // its run): from here no rank votes again.
  graph_vote_ = false;
  graph_blocker_ = reason;
  graph_note_ = absl::StrCat("not used from step ", step_ + 1, ": ", reason);
  graphs_.clear();
  graph_feeds_.clear();
}

void Executor::DropGraphs() {
  graphs_.clear();  // each waits for its replays
}

absl::StatusOr<StepResult> Executor::Evaluate(const std::map<std::string, Tensor>& feeds, int64_t sample_offset,
                                              int64_t rows) {
  if (rows < 0) {
    auto fed = CheckFeeds(feeds);
    if (!fed.ok()) return fed.status();
    rows = *fed < 0 ? 1 : *fed;
  }
  auto results = Evaluate({{sample_offset, rows}}, [&](int) { return feeds; });
  if (!results.ok()) return results.status();
  return std::move(results->front());
}

absl::StatusOr<std::vector<StepResult>> Executor::Evaluate(const std::vector<EvalMicroBatch>& micro_batches,
                                                           const EvalFeedFn& load) {
  // Each micro-batch's sends (a stage's outputs on their way to the next)
  // under its own tag among those in flight, so no two share one: more tags
  // than any rank holds (at most its M earlier forwards'), a count every rank agrees on.
  const int tags = std::max(1, plan_.schedule().micro_batches()) + 1;
  std::deque<std::vector<std::unique_ptr<Work>>> in_flight;
  std::vector<StepResult> results(micro_batches.size());
  // Metrics held for micro-batches [summed, summed + held_ends.size()); the
  // k-th one's end in held_metrics_ is held_ends[k]. They are read once the
  // device has passed them, as many micro-batches at a time as hold sends.
  size_t summed = 0;
  std::vector<size_t> held_ends;
  auto sum_held = [&]() {
    const std::vector<std::pair<int, Tensor>> held = std::move(held_metrics_);
    size_t begin = 0;
    for (size_t end : held_ends) {
      held_metrics_.assign(held.begin() + begin, held.begin() + end);
      SumMetrics(&results[summed++]);
      begin = end;
    }
    held_metrics_.clear();
    held_ends.clear();
  };
  absl::Status status = RefreshParamCopies();
  for (size_t m = 0; status.ok() && m < micro_batches.size(); ++m) {
    const int64_t rows = micro_batches[m].rows;
    std::vector<Tensor>& scope = scopes_[0];
    if (!feeds_.empty()) {
      auto feeds = load(static_cast<int>(m));
      if (!feeds.ok()) {
        status = feeds.status();
        break;
      }
      auto fed = CheckFeeds(*feeds);
      status = fed.status();
      if (status.ok() && *fed >= 0 && *fed != rows) {
        status = absl::InvalidArgumentError(
            absl::StrCat("evaluation micro-batch ", m, " has ", *fed, " rows, expected ", rows));
      }
      if (status.ok()) status = PlaceFeeds(*feeds, scope);
    }
    if (status.ok()) {
      RunContext run = MakeRunContext(micro_batches[m].first_sample, false, tags, rows);
      run.micro_batch = static_cast<int>(m % tags);
      status = RunSection(forward_, 0, run);
    }
    if (status.ok()) {
      HoldMetrics(0);
      held_ends.push_back(held_metrics_.size());
    }
    // What the forward kept for a backward goes now; a send holds its own
    // buffer until the next stage takes it.
    for (Tensor& t : scope) t = Tensor();
    in_flight.push_back(std::move(pending_sends_));
    pending_sends_.clear();
    while (static_cast<int>(in_flight.size()) > eval_sends_in_flight_) {
      status = WaitSends(in_flight.front(), status);
      in_flight.pop_front();
    }
    if (status.ok() && static_cast<int>(held_ends.size()) >= std::max(1, eval_sends_in_flight_)) {
      status = options_.device->Synchronize();
      if (status.ok()) sum_held();
    }
  }
  for (auto& sends : in_flight) status = WaitSends(sends, status);
  status = FinishStep(status);
  if (!status.ok()) {
    held_metrics_.clear();
    return status;
  }
  sum_held();
  return results;
}

}  // namespace strata
