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
  explicit AllReduceKernel(const KernelDef& def) : group_(def.op->has_group() ? def.op->group() : -1) {}
  absl::Status Compute(KernelContext& ctx) override {
    const RunContext& run = ctx.run();
    Tensor out = ctx.input(0).Clone();
    if (!out.defined()) return absl::ResourceExhaustedError("out of memory for allreduce");
    if (run.comm != nullptr && run.comm->size() > 1) {
      // Only the world's communicator exists yet: a group must span it.
      if (group_ >= 0 && run.groups != nullptr) {
        const CommGroup* group = nullptr;
        for (const CommGroup& g : *run.groups) group = g.id() == group_ ? &g : group;
        if (group == nullptr) {
          return absl::InternalError(absl::StrCat("allreduce: group ", group_, " is not among the plan's groups"));
        }
        if (group->rank_size() != run.comm->size()) {
          return absl::UnimplementedError(absl::StrCat("allreduce over group ", group_, " (", group->rank_size(),
                                                       " of ", run.comm->size(),
                                                       " ranks): communicators for sub-groups are not built yet"));
        }
      }
      std::unique_ptr<Work> work = run.comm->AllReduce(&out, ReduceOp::kSum);
      if (auto s = work->Wait(absl::Seconds(run.comm_timeout_s)); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("allreduce over ", run.comm->size(), " ranks: ", s.message()));
      }
    }
    ctx.SetOutput(0, std::move(out));
    return absl::OkStatus();
  }

 private:
  const int group_;
};

STRATA_REGISTER_KERNEL("allreduce", "cpu", F32, MakeFactory<AllReduceKernel>());
STRATA_REGISTER_KERNEL("allreduce", "cpu", F64, MakeFactory<AllReduceKernel>());

}  // namespace
}  // namespace strata
