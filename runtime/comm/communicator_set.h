#ifndef STRATA_RUNTIME_COMM_COMMUNICATOR_SET_H_
#define STRATA_RUNTIME_COMM_COMMUNICATOR_SET_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "proto/plan.pb.h"
#include "runtime/comm/communicator.h"

namespace strata {

// A rank's communicators: the world's (send/recv, the trainer's agreements)
// and one for each communication group of its plan (Topology.group), looked
// up by the group's id, as c10d keeps one process group per new_group().
//
// A group whose members are the whole world (the world group itself; the
// pipeline group without data parallelism) is served by the world's
// communicator rather than a second TCP mesh over the same ranks; so two
// groups share a communicator exactly when they have the same members, and
// the schedule verifier orders collectives per member set for that reason.
class CommunicatorSet {
 public:
  // `world` spans every rank; the set owns it.
  explicit CommunicatorSet(std::unique_ptr<Communicator> world);
  // Borrows `world`, which must outlive the set.
  explicit CommunicatorSet(Communicator* world);
  // The transfer transport first, then the device transports by group id:
  // NCCL's destroy communicates with the communicator's other ranks (NCCL
  // 2.23 on), so every rank must tear its communicators down in one order,
  // which a hash map's iteration (seeded per process) does not give.
  ~CommunicatorSet();

  CommunicatorSet(const CommunicatorSet&) = delete;
  CommunicatorSet& operator=(const CommunicatorSet&) = delete;

  Communicator* world() const { return world_; }

  // Registers group `group`, which this rank belongs to: `comm` is its
  // communicator (ranks numbered by position in group.rank()), or null when
  // the group spans the world (then the world's serves it). Errors: an id
  // registered twice, a communicator whose size or rank does not match the
  // group's.
  absl::Status Add(const CommGroup& group, std::unique_ptr<Communicator> comm);

  // A device transport for group `id`'s collectives (NCCL between the
  // ranks' GPUs), for a group registered already: Get then hands it to the
  // kernels, whose tensors are on the device, while GetHost keeps serving
  // the host values the trainer agrees on. Errors: an unknown group, a
  // second transport, a size or rank that does not match the group's.
  absl::Status SetDeviceTransport(int id, std::unique_ptr<Communicator> comm);

  // Group `id`'s communicator for device tensors: its device transport
  // where it has one, else the host's; NotFound naming the id and the
  // groups there are when this rank has no such group.
  absl::StatusOr<Communicator*> Get(int id) const;
  // Group `id`'s communicator for host tensors (Gloo), whatever Get serves.
  absl::StatusOr<Communicator*> GetHost(int id) const;
  // Groups with a device transport.
  int device_transports() const { return static_cast<int>(device_.size()); }

  // The transport of the pipeline's sends and receives (point-to-point
  // pairs over NCCL on GPUs), in place of the world's; world size and this
  // rank as the world's.
  absl::Status SetTransfers(std::unique_ptr<Communicator> transfers);
  // Where send and recv kernels go: the transfer transport, else the world.
  Communicator* transfers() const { return transfers_ != nullptr ? transfers_.get() : world_; }

  // The group as registered (its axes and ranks, for messages); null if unknown.
  const CommGroup* group(int id) const;

  // "group 3 (dp: ranks 1, 3)", for messages.
  std::string Describe(int id) const;

 private:
  Communicator* world_;
  std::unique_ptr<Communicator> owned_world_;
  std::vector<std::unique_ptr<Communicator>> owned_;
  absl::flat_hash_map<int, std::pair<CommGroup, Communicator*>> groups_;
  absl::flat_hash_map<int, std::unique_ptr<Communicator>> device_;
  std::unique_ptr<Communicator> transfers_;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_COMMUNICATOR_SET_H_
