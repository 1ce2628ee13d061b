// allreduce over the rank's pipeline group: sums a small tensor (the stages'
// partial sums of squared gradients, for clipping by the global norm).

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/comm/communicator.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

class AllReduceKernel : public OpKernel {
 public:
  explicit AllReduceKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    const RunContext& run = ctx.run();
    Tensor out = ctx.input(0).Clone();
    if (!out.defined()) return absl::ResourceExhaustedError("out of memory for allreduce");
    if (run.comm != nullptr && run.comm->size() > 1) {
      std::unique_ptr<Work> work = run.comm->AllReduce(&out, ReduceOp::kSum);
      if (auto s = work->Wait(absl::Seconds(run.comm_timeout_s)); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("allreduce over ", run.comm->size(), " ranks: ", s.message()));
      }
    }
    ctx.SetOutput(0, std::move(out));
    return absl::OkStatus();
  }
};

STRATA_REGISTER_KERNEL("allreduce", "cpu", F32, MakeFactory<AllReduceKernel>());
STRATA_REGISTER_KERNEL("allreduce", "cpu", F64, MakeFactory<AllReduceKernel>());

}  // namespace
}  // namespace strata
