#ifndef STRATA_RUNTIME_COMM_DEVICE_COLLECTIVES_H_
#define STRATA_RUNTIME_COMM_DEVICE_COLLECTIVES_H_

// NCCL for the collectives of ranks that each have a GPU of their own.
//
// A rank's groups are connected over Gloo first (rendezvous, ConnectGroups):
// that transport carries what the host agrees on (fingerprints, losses,
// evaluation sums, checkpoints' agreement) and the pipeline's sends and
// receives. Where each rank has a GPU of its own, every group a collective
// op of the plan names (the data-parallel gradient buckets, loss scaling's
// overflow vote) also gets an NcclCommunicator, registered as the group's
// device transport (CommunicatorSet::SetDeviceTransport): the kernels' device
// tensors then go GPU to GPU instead of through pinned host memory.
//
// The sends and receives (ConnectDeviceTransfers) go over NCCL too, but not
// on one communicator: NCCL matches two ranks' transfers by issue order and
// runs one communicator's work in order on one stream, and the executor
// posts a stage's receives early (recv kernels prefetch), so on one shared
// communicator a receive waiting for its peer's send would hold back the
// send that peer's own early receive waits for. Each ordered pair of ranks
// that talk gets a 2-rank communicator on a stream of its own, which only
// the first rank sends on: the sends on it follow the sender's schedule and
// the receives the receiver's, and both schedules visit a channel's
// micro-batches in the same order (the same ops in the same order in every
// micro-batch), which is what NCCL's matching needs. (PyTorch's pipelines
// instead group each schedule step's transfers with batch_isend_irecv.)

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/plan.pb.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/comm/nccl_api.h"
#include "runtime/comm/store.h"
#include "runtime/device.h"

namespace strata {

// The ids of the groups the plan's collective ops name (sorted, once each).
std::vector<int> CollectiveGroups(const RankPlan& plan);
// Those of every rank's plan that rank `rank` belongs to: what all members
// of a group agree on, even if one member's plan had no collective of it.
std::vector<int> CollectiveGroups(const std::vector<RankPlan>& plans, int rank);

// Registers an NcclCommunicator over `api` on `device` as the device
// transport of each group of `group_ids` with more than one rank, in id
// order (every rank of a group joins in the same order, since
// ncclCommInitRank blocks until all of them have). Each group meets under
// "nccl/g<id>" of `job_store`, this job's view of the store. Errors name the
// group.
absl::Status ConnectDeviceCollectives(std::shared_ptr<NcclApi> api, Store& job_store,
                                      const std::vector<int>& group_ids, Device* device, absl::Duration timeout,
                                      CommunicatorSet* set);

// The ranks `plan`'s sends go to and its receives come from.
std::vector<int> TransferPeers(const RankPlan& plan);

// Registers, as `set`'s transfer transport (CommunicatorSet::SetTransfers),
// a communicator whose Send(dst) and Recv(src) go over NCCL, one 2-rank
// communicator and stream per ordered pair of this rank and each of
// TransferPeers(plan), connected in the order of the pairs (lower rank,
// higher rank), which no two ranks can disagree on; each direction makes
// its first transfer (one element) as it is connected, since NCCL sets a
// pair's connection up at its first transfer and needs both ranks there.
// Its collectives are refused.
absl::Status ConnectDeviceTransfers(std::shared_ptr<NcclApi> api, Store& job_store, const RankPlan& plan,
                                    Device* device, absl::Duration timeout, CommunicatorSet* set);

// The NcclApi a binary links: the real one where runtime/cuda's
// cuda_nccl_api_factory is linked in, else null (and GPU ranks' collectives
// stay on Gloo).
using NcclApiFactory = std::function<std::shared_ptr<NcclApi>()>;
// At static initialisation; returns true so it can initialise a static.
bool RegisterNcclApiFactory(NcclApiFactory factory);
std::shared_ptr<NcclApi> NewRegisteredNcclApi();

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_DEVICE_COLLECTIVES_H_
