#ifndef STRATA_PASSES_HOST_TRANSFERS_H_
#define STRATA_PASSES_HOST_TRANSFERS_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/pass.h"

namespace strata {

// Host transfers, the last pass on each rank of a plan for a GPU (--device
// gpu): every copy between host and device memory becomes an op of the
// program, so a step moves no bytes across that its plan does not show.
//
// Each feed the rank reads stays the data loader's host tensor
// (Var.host_memory); one copy_to_device per feed, at the head of the
// program on the stage of its first reader, writes `<feed>@device`, which
// every op that read the feed reads instead (the memory plan counts that
// activation where it counted the feed). The loss and each fetch produced on
// the rank get a copy_to_host right after their last writer, into the host
// var `<var>@host`, recorded in Program.host_copy: the executor reads the
// metrics from those after the step's end synchronisation, so a step no
// longer waits on the device for each micro-batch's loss.
//
// Idempotent: host vars and recorded copies are left as they are.
class HostTransfersPass : public Pass {
 public:
  std::string name() const override { return "host-transfers"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

}  // namespace strata

#endif  // STRATA_PASSES_HOST_TRANSFERS_H_
