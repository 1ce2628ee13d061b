// allreduce over a communication group (Op.group): sums a small tensor (the
// stages' partial sums of squared gradients, for clipping by the global norm)
// over the group's communicator from the rank's CommunicatorSet.

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

class AllReduceKernel : public OpKernel {
 public:
  explicit AllReduceKernel(const KernelDef& def) : group_(def.op->has_group() ? def.op->group() : -1) {}
  absl::Status Compute(KernelContext& ctx) override {
    const RunContext& run = ctx.run();
    Tensor out = ctx.input(0).Clone();
    if (!out.defined()) return absl::ResourceExhaustedError("out of memory for allreduce");
    // One device: the sum over one rank is the tensor itself.
    if (run.comms != nullptr && run.comms->world()->size() > 1) {
      if (group_ < 0) return absl::InternalError("allreduce without a communication group");
      absl::StatusOr<Communicator*> comm = run.comms->Get(group_);
      if (!comm.ok()) return absl::Status(comm.status().code(), absl::StrCat("allreduce: ", comm.status().message()));
      if ((*comm)->size() > 1) {
        std::unique_ptr<Work> work = (*comm)->AllReduce(&out, ReduceOp::kSum);
        if (auto s = work->Wait(absl::Seconds(run.comm_timeout_s)); !s.ok()) {
          return absl::Status(s.code(), absl::StrCat("allreduce over ", run.comms->Describe(group_), ": ", s.message()));
        }
      }
    }
    ctx.SetOutput(0, std::move(out));
    return absl::OkStatus();
  }

 private:
  const int group_;
};

STRATA_REGISTER_KERNEL("allreduce", DEVICE_CPU, F32, MakeFactory<AllReduceKernel>());
STRATA_REGISTER_KERNEL("allreduce", DEVICE_CPU, F64, MakeFactory<AllReduceKernel>());

}  // namespace
}  // namespace strata
