#include "runtime/comm/communicator_set.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/mesh.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/comm/rendezvous.h"

namespace strata {
namespace {

using ::strata::testing::RunConnectedPlans;
using ::testing::HasSubstr;

// One plan per rank of the mesh, carrying only what the rendezvous reads:
// the fingerprint and the rank's groups.
std::vector<RankPlan> PlansFor(const Mesh& mesh) {
  std::vector<RankPlan> plans(mesh.world_size());
  for (int r = 0; r < mesh.world_size(); ++r) {
    plans[r].set_rank(r);
    plans[r].set_fingerprint("same-program");
    for (const CommGroup& g : mesh.GroupsOf(r)) *plans[r].mutable_topology()->add_group() = g;
  }
  return plans;
}

// Rank r contributes r + 1; a group's sum is its members' sum.
absl::StatusOr<double> SumOver(Communicator& comm, int rank) {
  Tensor t = Tensor::Empty(F64, {1});
  t.data<double>()[0] = rank + 1;
  if (absl::Status s = comm.AllReduce(&t, ReduceOp::kSum)->Wait(absl::Seconds(10)); !s.ok()) return s;
  return t.data<double>()[0];
}

double MembersSum(const CommGroup& g) {
  double sum = 0;
  for (int r : g.rank()) sum += r + 1;
  return sum;
}

TEST(CommunicatorSetTest, EachGroupReducesOverItsOwnMembersOnly) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"dp", 2}, {"pp", 2}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const std::vector<RankPlan> plans = PlansFor(*mesh);
  std::vector<absl::Status> results = RunConnectedPlans(plans, [&](int rank, CommunicatorSet* comms) {
    // Every rank walks its groups in the same order (world, dp, pp), so the
    // collectives of each group line up across its members.
    for (const CommGroup& g : plans[rank].topology().group()) {
      absl::StatusOr<Communicator*> comm = comms->Get(g.id());
      if (!comm.ok()) return comm.status();
      const int position = static_cast<int>(std::find(g.rank().begin(), g.rank().end(), rank) - g.rank().begin());
      if ((*comm)->size() != g.rank_size() || (*comm)->rank() != position) {
        return absl::InternalError(absl::StrCat("group ", g.id(), ": communicator rank ", (*comm)->rank(), " of ",
                                                (*comm)->size(), ", expected ", position, " of ", g.rank_size()));
      }
      absl::StatusOr<double> sum = SumOver(**comm, rank);
      if (!sum.ok()) return sum.status();
      if (*sum != MembersSum(g)) {
        return absl::InternalError(absl::StrCat(comms->Describe(g.id()), ": sum ", *sum, ", expected ", MembersSum(g)));
      }
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST(CommunicatorSetTest, AGroupOfTheWholeWorldIsServedByTheWorldsCommunicator) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"dp", 1}, {"pp", 3}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const std::vector<RankPlan> plans = PlansFor(*mesh);
  ASSERT_EQ(plans[0].topology().group_size(), 2);  // the world and the pipeline, the same ranks
  std::vector<absl::Status> results = RunConnectedPlans(plans, [&](int rank, CommunicatorSet* comms) {
    for (const CommGroup& g : plans[rank].topology().group()) {
      absl::StatusOr<Communicator*> comm = comms->Get(g.id());
      if (!comm.ok()) return comm.status();
      if (*comm != comms->world()) return absl::InternalError(absl::StrCat("group ", g.id(), " has a second communicator"));
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST(CommunicatorSetTest, CollectivesOfDifferentGroupsRunSideBySide) {
  // Ranks 0 and 1 (one pipeline group) reduce while ranks 2 and 3 do too;
  // then each data-parallel pair: no group waits for another's members.
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"dp", 2}, {"pp", 2}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const std::vector<RankPlan> plans = PlansFor(*mesh);
  std::vector<absl::Status> results = RunConnectedPlans(plans, [&](int rank, CommunicatorSet* comms) {
    const CommGroup& pp = plans[rank].topology().group(2);
    const CommGroup& dp = plans[rank].topology().group(1);
    for (int round = 0; round < 20; ++round) {
      for (const CommGroup* g : {&pp, &dp}) {
        absl::StatusOr<Communicator*> comm = comms->Get(g->id());
        if (!comm.ok()) return comm.status();
        absl::StatusOr<double> sum = SumOver(**comm, rank);
        if (!sum.ok()) return sum.status();
        if (*sum != MembersSum(*g)) return absl::InternalError(absl::StrCat("round ", round, ": wrong sum ", *sum));
      }
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

TEST(CommunicatorSetTest, AnUnknownGroupIsNotFoundNamingTheRanksGroups) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"pp", 2}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const std::vector<RankPlan> plans = PlansFor(*mesh);
  std::vector<absl::Status> results = RunConnectedPlans(plans, [&](int rank, CommunicatorSet* comms) {
    absl::StatusOr<Communicator*> comm = comms->Get(7);
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(comm.status().message(), HasSubstr(absl::StrCat("rank ", rank, " has no communicator for group 7 (its groups: 0, 1)")));
    // A group registered twice is refused.
    EXPECT_EQ(comms->Add(plans[rank].topology().group(0), nullptr).code(), absl::StatusCode::kAlreadyExists);
    return absl::OkStatus();
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

// A transport that only says who it is, for the registry's checks.
class NamedComm : public testing::InstantCommunicator {
 public:
  NamedComm(int rank, int size) : InstantCommunicator(rank, size, "named") {}
};

// A group's device transport (NCCL on GPUs) serves the kernels (Get), the
// host's keeps serving host values (GetHost); a transport for an unknown
// group, a second one, or one of another shape is refused.
TEST(CommunicatorSetTest, ADeviceTransportServesGetAndTheHostsGetHost) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"dp", 2}, {"pp", 2}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const std::vector<RankPlan> plans = PlansFor(*mesh);
  NamedComm world(0, 4);
  CommunicatorSet comms(&world);
  for (const CommGroup& g : plans[0].topology().group()) {
    ASSERT_TRUE(comms.Add(g, g.rank_size() == 4 ? nullptr : std::make_unique<NamedComm>(0, g.rank_size())).ok());
  }
  const int dp = plans[0].topology().group(1).id();
  absl::StatusOr<Communicator*> host = comms.Get(dp);
  ASSERT_TRUE(host.ok()) << host.status();
  auto device = std::make_unique<NamedComm>(0, 2);
  Communicator* device_ptr = device.get();
  ASSERT_TRUE(comms.SetDeviceTransport(dp, std::move(device)).ok());
  EXPECT_EQ(comms.device_transports(), 1);
  EXPECT_EQ(*comms.Get(dp), device_ptr);
  EXPECT_EQ(*comms.GetHost(dp), *host);
  EXPECT_EQ(comms.SetDeviceTransport(dp, std::make_unique<NamedComm>(0, 2)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(comms.SetDeviceTransport(99, std::make_unique<NamedComm>(0, 2)).code(), absl::StatusCode::kNotFound);
  const int pp = plans[0].topology().group(2).id();
  absl::Status mismatched = comms.SetDeviceTransport(pp, std::make_unique<NamedComm>(1, 2));
  EXPECT_EQ(mismatched.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatched.message(), HasSubstr("with this one at 1"));
  EXPECT_EQ(comms.GetHost(99).status().code(), absl::StatusCode::kNotFound);
}

// A transport that notes its own destruction, by name.
class NotingComm : public NamedComm {
 public:
  NotingComm(int rank, int size, std::string name, std::vector<std::string>* destroyed)
      : NamedComm(rank, size), name_(std::move(name)), destroyed_(destroyed) {}
  ~NotingComm() override { destroyed_->push_back(name_); }

 private:
  std::string name_;
  std::vector<std::string>* destroyed_;
};

// NCCL's destroy communicates with the other ranks, so every rank tears its
// transports down in one order: the transfers, then the groups by id.
TEST(CommunicatorSetTest, TransportsAreDestroyedTransfersFirstThenByGroupId) {
  std::vector<std::string> destroyed;
  {
    NamedComm world(0, 8);
    CommunicatorSet comms(&world);
    const std::vector<int> ids = {7, 2, 11, 5, 3, 9};
    for (int id : ids) {
      CommGroup g;
      g.set_id(id);
      g.add_rank(0);
      g.add_rank(1);
      ASSERT_TRUE(comms.Add(g, std::make_unique<NamedComm>(0, 2)).ok());
    }
    for (int id : ids) {
      ASSERT_TRUE(
          comms.SetDeviceTransport(id, std::make_unique<NotingComm>(0, 2, absl::StrCat("g", id), &destroyed)).ok());
    }
    ASSERT_TRUE(comms.SetTransfers(std::make_unique<NotingComm>(0, 8, "transfers", &destroyed)).ok());
  }
  EXPECT_THAT(destroyed, ::testing::ElementsAre("transfers", "g2", "g3", "g5", "g7", "g9", "g11"));
}

TEST(CommunicatorSetTest, AGroupWithoutThisRankIsRefused) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"dp", 2}, {"pp", 2}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  std::vector<RankPlan> plans = PlansFor(*mesh);
  // Rank 0 is handed rank 3's pipeline group.
  *plans[0].mutable_topology()->mutable_group(2) = plans[3].topology().group(2);
  plans.resize(1);
  plans[0].mutable_topology()->mutable_group()->DeleteSubrange(0, 1);  // no world rendezvous to wait for
  std::vector<absl::Status> results = RunConnectedPlans(plans, [](int, CommunicatorSet*) { return absl::OkStatus(); },
                                                        absl::Seconds(5));
  EXPECT_EQ(results[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(results[0].message(), HasSubstr("rank 0 is not a member of group"));
}

}  // namespace
}  // namespace strata
