#ifndef STRATA_RUNTIME_KERNEL_H_
#define STRATA_RUNTIME_KERNEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <type_traits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/plan.pb.h"
#include "proto/program.pb.h"
#include "runtime/tensor.h"

namespace strata {

class Communicator;
class CommunicatorSet;
class Work;

// What a step tells every kernel; random ops key their streams on it.
// A collective posted by one op and waited for by another, with what it is
// ("allreduce of bucket 2 (3 gradients, F32[1290]) over group 3 (dp: ranks 1, 3)").
struct PendingCollective {
  std::unique_ptr<Work> work;
  std::string what;
};

struct RunContext {
  uint64_t seed = 0;
  int64_t step = 0;           // optimizer steps taken before this one
  int64_t sample_offset = 0;  // global index of this micro-batch's first sample
  // {step, sample_offset} of this action in the device's memory, written by
  // the executor before the step's first kernel; null outside a training
  // step (kernel tests, evaluation). Random kernels read their counters from
  // here where it is set, so a step captured as a CUDA graph draws the masks
  // of the step it replays as, not those of the step it was captured in.
  const int64_t* random_counters = nullptr;
  int64_t total_steps = 0;    // of the whole run (cosine decay), 0 if unknown
  bool training = true;
  // Where the rank's tensors live and its kernels run.
  Device* device = GetCpuDevice();
  // Pipeline transfers (send/recv kernels); null on a single device.
  int micro_batch = 0;
  int micro_batches = 1;
  int64_t micro_batch_size = 0;  // samples in this micro-batch: the size of -1 dims
  // The rank's communicators: the world's (send/recv), and collectives find
  // their group's by id.
  const CommunicatorSet* comms = nullptr;
  std::vector<std::unique_ptr<Work>>* pending_sends = nullptr;  // the executor waits for them where the memory plan says
  // Gradient buckets being summed over the data-parallel group, by bucket id:
  // bucket_allreduce posts, bucket_wait waits (the executor, for any left
  // at a step's end).
  std::map<int64_t, PendingCollective>* pending_buckets = nullptr;
  // The optimizer runs at the end of this step (every step, but every k-th
  // under gradient merge): once-per-update ops act in its last backward.
  bool update_step = true;
  double comm_timeout_s = 300;
};

// Everything a kernel is built from, known at prepare time.
struct KernelDef {
  const Op* op = nullptr;
  std::vector<TensorType> input_types;
  std::vector<TensorType> output_types;
};

class KernelContext {
 public:
  KernelContext(const RunContext* run, absl::Span<const Tensor* const> inputs, absl::Span<Tensor> outputs)
      : run_(run), inputs_(inputs), outputs_(outputs) {}
  const RunContext& run() const { return *run_; }
  // The device the kernel runs on, and its stream to enqueue work on (null
  // on the CPU, where a kernel computes before it returns).
  Device& device() const { return *run_->device; }
  StreamHandle stream() const { return run_->device->compute_stream(); }
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  const Tensor& input(int i) const { return *inputs_[i]; }
  // Allocates output i on the device; ResourceExhausted if its allocator
  // fails. Where the caller handed output i in already (defined, with this
  // dtype and shape, on this device: the executor does so for a PARAM_COPY,
  // rewritten in its buffer), returns it instead; callers that keep an
  // outputs vector across calls clear it before each.
  absl::StatusOr<Tensor*> AllocateOutput(int i, DataType dtype, Shape shape);
  // Output i shares `t`'s buffer (reshape, identity).
  void SetOutput(int i, Tensor t) { outputs_[i] = std::move(t); }
  Tensor* output(int i) { return &outputs_[i]; }

 private:
  const RunContext* run_;
  absl::Span<const Tensor* const> inputs_;
  absl::Span<Tensor> outputs_;
};

// A kernel is built once per op at prepare time (attrs parsed then) and
// called every step.
class OpKernel {
 public:
  virtual ~OpKernel() = default;
  virtual absl::Status Compute(KernelContext& ctx) = 0;
  // Kernels that want work started before their turn (a recv posting its
  // receive buffer) say so, and the executor calls Prefetch at the start of
  // the action that will run them.
  virtual bool prefetches() const { return false; }
  virtual absl::Status Prefetch(KernelContext& ctx) { return absl::OkStatus(); }
};

using KernelFactory = std::function<absl::StatusOr<std::unique_ptr<OpKernel>>(const KernelDef&)>;

// The scratch bytes a kernel draws from the allocator while it runs (beyond
// its outputs), for input types with every dimension known, when it runs on
// `threads` threads: the CPU analogue of cuDNN's workspace-size queries, so
// the memory plan can count them.
using WorkspaceFn = std::function<absl::StatusOr<int64_t>(const KernelDef& def, int threads)>;

// Kernels keyed by (op type, device kind, dtype). The dtype is that of the op's
// first floating-point input, else its first input, else its first output.
class KernelRegistry {
 public:
  static KernelRegistry& Global();
  void Register(const std::string& op_type, DeviceKind device, DataType dtype, KernelFactory factory);
  const KernelFactory* Find(const std::string& op_type, DeviceKind device, DataType dtype) const;
  std::vector<DataType> DtypesFor(const std::string& op_type, DeviceKind device) const;
  // Kernels that draw scratch memory register how much (all dtypes at once).
  void RegisterWorkspace(const std::string& op_type, DeviceKind device, WorkspaceFn fn);
  const WorkspaceFn* FindWorkspace(absl::string_view op_type, DeviceKind device) const;

 private:
  std::vector<std::tuple<std::string, DeviceKind, DataType, KernelFactory>> entries_;
  absl::flat_hash_map<int, absl::flat_hash_map<std::string, WorkspaceFn>> workspaces_;  // device kind -> op type
};

DataType KernelDtype(const KernelDef& def);

// "cpu", "cuda": how messages name a device kind.
std::string DeviceKindLabel(DeviceKind kind);

// Attribute readers for kernels; the compiler has filled in defaults, so a
// missing attr here is a programmer error reported as Internal.
absl::StatusOr<int64_t> AttrInt(const Op& op, const std::string& name);
absl::StatusOr<double> AttrFloat(const Op& op, const std::string& name);
absl::StatusOr<bool> AttrBool(const Op& op, const std::string& name);
absl::StatusOr<std::string> AttrString(const Op& op, const std::string& name);
absl::StatusOr<std::vector<int64_t>> AttrInts(const Op& op, const std::string& name);

struct KernelRegistrar {
  KernelRegistrar(const char* op_type, DeviceKind device, DataType dtype, KernelFactory factory) {
    KernelRegistry::Global().Register(op_type, device, dtype, std::move(factory));
  }
};

struct WorkspaceRegistrar {
  WorkspaceRegistrar(const char* op_type, DeviceKind device, WorkspaceFn fn) {
    KernelRegistry::Global().RegisterWorkspace(op_type, device, std::move(fn));
  }
};

#define STRATA_KERNEL_CONCAT_INNER(a, b) a##b
#define STRATA_KERNEL_CONCAT(a, b) STRATA_KERNEL_CONCAT_INNER(a, b)
// STRATA_REGISTER_KERNEL("relu", DEVICE_CPU, F32, factory);
#define STRATA_REGISTER_KERNEL(op_type, device, dtype, factory)                          \
  static ::strata::KernelRegistrar STRATA_KERNEL_CONCAT(strata_kernel_registrar_, __LINE__)( \
      op_type, device, dtype, factory)

// STRATA_REGISTER_WORKSPACE("conv2d", DEVICE_CPU, fn);
#define STRATA_REGISTER_WORKSPACE(op_type, device, fn)                                                  \
  static ::strata::WorkspaceRegistrar STRATA_KERNEL_CONCAT(strata_workspace_registrar_, __LINE__)( \
      op_type, device, fn)

// A factory for a kernel class constructible from (const KernelDef&) that
// cannot fail at construction.
template <typename K>
KernelFactory MakeFactory() {
  return [](const KernelDef& def) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
    return std::unique_ptr<OpKernel>(new K(def));
  };
}

// A factory for a kernel class with an `absl::Status Init(const Op&)` that
// reads the attrs, constructed from (const KernelDef&) or by default.
template <typename K>
KernelFactory InitFactory() {
  return [](const KernelDef& def) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
    if (def.op == nullptr) return absl::InternalError("kernel built without an op");
    std::unique_ptr<K> kernel;
    if constexpr (std::is_constructible_v<K, const KernelDef&>) {
      kernel = std::make_unique<K>(def);
    } else {
      kernel = std::make_unique<K>();
    }
    if (absl::Status s = kernel->Init(*def.op); !s.ok()) return s;
    return std::unique_ptr<OpKernel>(std::move(kernel));
  };
}

}  // namespace strata

#endif  // STRATA_RUNTIME_KERNEL_H_
