#include "runtime/comm/communicator_set.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata {

CommunicatorSet::CommunicatorSet(std::unique_ptr<Communicator> world)
    : world_(world.get()), owned_world_(std::move(world)) {}

CommunicatorSet::CommunicatorSet(Communicator* world) : world_(world) {}

CommunicatorSet::~CommunicatorSet() {
  transfers_.reset();
  std::vector<int> ids;
  for (const auto& [id, comm] : device_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int id : ids) device_.at(id).reset();
}

absl::Status CommunicatorSet::Add(const CommGroup& group, std::unique_ptr<Communicator> comm) {
  if (groups_.contains(group.id())) {
    return absl::AlreadyExistsError(absl::StrCat("communication group ", group.id(), " is registered twice"));
  }
  const auto me = std::find(group.rank().begin(), group.rank().end(), world_->rank());
  if (me == group.rank().end()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", world_->rank(), " is not a member of group ", group.id(),
                                                   " (ranks ", absl::StrJoin(group.rank(), ", "), ")"));
  }
  Communicator* serving = comm != nullptr ? comm.get() : world_;
  const int group_rank = comm != nullptr ? static_cast<int>(me - group.rank().begin()) : world_->rank();
  if (serving->size() != group.rank_size() || serving->rank() != group_rank) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group.id(), " has ", group.rank_size(),
                                                   " ranks with this one at ", group_rank, ", but its communicator has ",
                                                   serving->size(), " with this one at ", serving->rank()));
  }
  if (comm != nullptr) owned_.push_back(std::move(comm));
  groups_.emplace(group.id(), std::make_pair(group, serving));
  return absl::OkStatus();
}

absl::Status CommunicatorSet::SetDeviceTransport(int id, std::unique_ptr<Communicator> comm) {
  auto it = groups_.find(id);
  if (it == groups_.end()) {
    return absl::NotFoundError(absl::StrCat("a device transport for group ", id, ", which rank ", world_->rank(),
                                            " has not registered"));
  }
  if (comm == nullptr) return absl::InvalidArgumentError(absl::StrCat("a null device transport for group ", id));
  if (device_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("group ", id, " has a device transport already"));
  }
  const Communicator* host = it->second.second;
  if (comm->size() != host->size() || comm->rank() != host->rank()) {
    return absl::InvalidArgumentError(absl::StrCat("group ", id, "'s device transport (", comm->backend(), ") has ",
                                                   comm->size(), " ranks with this one at ", comm->rank(),
                                                   ", the group ", host->size(), " with this one at ", host->rank()));
  }
  device_.emplace(id, std::move(comm));
  return absl::OkStatus();
}

absl::Status CommunicatorSet::SetTransfers(std::unique_ptr<Communicator> transfers) {
  if (transfers == nullptr) return absl::InvalidArgumentError("a null transfer transport");
  if (transfers_ != nullptr) return absl::AlreadyExistsError("the transfers have a transport already");
  if (transfers->size() != world_->size() || transfers->rank() != world_->rank()) {
    return absl::InvalidArgumentError(absl::StrCat("the transfer transport (", transfers->backend(), ") has ",
                                                   transfers->size(), " ranks with this one at ", transfers->rank(),
                                                   ", the world ", world_->size(), " with this one at ",
                                                   world_->rank()));
  }
  transfers_ = std::move(transfers);
  return absl::OkStatus();
}

absl::StatusOr<Communicator*> CommunicatorSet::Get(int id) const {
  auto device = device_.find(id);
  if (device != device_.end()) return device->second.get();
  return GetHost(id);
}

absl::StatusOr<Communicator*> CommunicatorSet::GetHost(int id) const {
  auto it = groups_.find(id);
  if (it != groups_.end()) return it->second.second;
  std::vector<int> ids;
  for (const auto& [known, unused] : groups_) ids.push_back(known);
  std::sort(ids.begin(), ids.end());
  return absl::NotFoundError(absl::StrCat("rank ", world_->rank(), " has no communicator for group ", id,
                                          " (its groups: ", ids.empty() ? "none" : absl::StrJoin(ids, ", "), ")"));
}

const CommGroup* CommunicatorSet::group(int id) const {
  auto it = groups_.find(id);
  return it == groups_.end() ? nullptr : &it->second.first;
}

std::string CommunicatorSet::Describe(int id) const {
  const CommGroup* g = group(id);
  if (g == nullptr) return absl::StrCat("group ", id);
  return absl::StrCat("group ", id, " (", absl::StrJoin(g->axis(), ","), ": ranks ", absl::StrJoin(g->rank(), ", "), ")");
}

}  // namespace strata
