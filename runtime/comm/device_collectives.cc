#include "runtime/comm/device_collectives.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/nccl_communicator.h"

namespace strata {
namespace {

NcclApiFactory& RegisteredFactory() {
  static NcclApiFactory* factory = new NcclApiFactory();
  return *factory;
}

}  // namespace

std::vector<int> CollectiveGroups(const RankPlan& plan) {
  std::set<int> ids;
  for (const Op& op : plan.program().op()) {
    if (op.has_group() && !op.has_channel()) ids.insert(op.group());
  }
  return std::vector<int>(ids.begin(), ids.end());
}

absl::Status ConnectDeviceCollectives(std::shared_ptr<NcclApi> api, Store& job_store, const RankPlan& plan,
                                      Device* device, absl::Duration timeout, CommunicatorSet* set) {
  if (api == nullptr) return absl::InvalidArgumentError("no NCCL to connect the collectives with");
  for (int id : CollectiveGroups(plan)) {
    const CommGroup* group = set->group(id);
    if (group == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", plan.rank(), "'s collectives name group ", id,
                                                     ", which it has not connected"));
    }
    if (group->rank_size() <= 1) continue;
    const auto me = std::find(group->rank().begin(), group->rank().end(), plan.rank());
    if (me == group->rank().end()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", plan.rank(), " is not a member of group ", id));
    }
    std::unique_ptr<Store> group_store = job_store.WithPrefix(absl::StrCat("nccl/g", id));
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
        NcclCommunicator::Create(api, *group_store, device, static_cast<int>(me - group->rank().begin()),
                                 group->rank_size(), timeout);
    if (!comm.ok()) {
      return absl::Status(comm.status().code(), absl::StrCat("connecting ", set->Describe(id), " over NCCL: ",
                                                             comm.status().message()));
    }
    if (absl::Status s = set->SetDeviceTransport(id, *std::move(comm)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool RegisterNcclApiFactory(NcclApiFactory factory) {
  RegisteredFactory() = std::move(factory);
  return true;
}

std::shared_ptr<NcclApi> NewRegisteredNcclApi() {
  const NcclApiFactory& factory = RegisteredFactory();
  return factory ? factory() : nullptr;
}

}  // namespace strata
