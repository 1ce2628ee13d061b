#include "proto/mesh.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::ElementsAre;

TEST(MeshTest, RanksFollowDesignsFormulaOuterAxisFirst) {
  auto mesh = Mesh::Create({{"dp", 2}, {"pp", 3}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->world_size(), 6);
  for (int dp = 0; dp < 2; ++dp) {
    for (int pp = 0; pp < 3; ++pp) {
      const int rank = dp * 3 + pp;  // rank = dp_rank * num_stages + stage
      EXPECT_EQ(mesh->RankOf({dp, pp}), rank);
      EXPECT_THAT(mesh->Coordinates(rank), ElementsAre(dp, pp));
      EXPECT_EQ(mesh->Coordinate(rank, "pp"), pp);
      EXPECT_EQ(mesh->Coordinate(rank, "dp"), dp);
      EXPECT_EQ(mesh->Coordinate(rank, "tp"), 0);  // an axis it does not have
    }
  }
  // With tensor parallel innermost: rank = (dp * stages + stage) * tp + tp_rank.
  auto tp = Mesh::Create({{"dp", 2}, {"pp", 3}, {"tp", 4}});
  ASSERT_TRUE(tp.ok());
  EXPECT_EQ(tp->RankOf({1, 2, 3}), (1 * 3 + 2) * 4 + 3);
  EXPECT_EQ(tp->WithCoordinate(tp->RankOf({1, 2, 3}), "pp", 0), tp->RankOf({1, 0, 3}));
}

TEST(MeshTest, GroupsPartitionTheWorldWithIdsEveryMemberAgreesOn) {
  auto mesh = Mesh::Create({{"dp", 2}, {"pp", 3}});
  ASSERT_TRUE(mesh.ok());
  EXPECT_THAT(mesh->GroupRanks(4, {"pp"}), ElementsAre(3, 4, 5));  // rank 4's pipeline
  EXPECT_THAT(mesh->GroupRanks(4, {"dp"}), ElementsAre(1, 4));     // its data-parallel peers
  std::set<int> ids;
  for (int rank = 0; rank < mesh->world_size(); ++rank) {
    std::vector<CommGroup> groups = mesh->GroupsOf(rank);
    ASSERT_EQ(groups.size(), 3u);  // world, pp, dp
    EXPECT_EQ(groups[0].id(), 0);
    EXPECT_EQ(groups[0].rank_size(), 6);
    for (const CommGroup& g : groups) {
      ids.insert(g.id());
      // Every member of a group names it with the same id and ranks.
      for (int member : g.rank()) {
        bool found = false;
        for (const CommGroup& h : mesh->GroupsOf(member)) {
          if (h.id() == g.id()) {
            found = true;
            EXPECT_EQ(h.SerializeAsString(), g.SerializeAsString());
          }
        }
        EXPECT_TRUE(found) << "rank " << member << " lacks group " << g.id();
      }
    }
  }
  EXPECT_EQ(ids.size(), 1u + 2u + 3u);  // the world, two pipelines, three dp groups
  // An axis of size 1 makes no group of its own.
  auto one = Mesh::Create({{"dp", 1}, {"pp", 4}});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->GroupsOf(2).size(), 2u);
}

TEST(MeshTest, RoundTripsAndRefusesBadAxes) {
  auto mesh = Mesh::Create({{"dp", 2}, {"pp", 2}});
  ASSERT_TRUE(mesh.ok());
  auto back = Mesh::FromProto(mesh->ToProto());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->world_size(), 4);
  EXPECT_EQ(back->axis_name(1), "pp");
  EXPECT_FALSE(Mesh::Create({{"dp", 0}}).ok());
  EXPECT_FALSE(Mesh::Create({{"dp", 2}, {"dp", 2}}).ok());
  EXPECT_FALSE(Mesh::Create({{"", 2}}).ok());
  EXPECT_FALSE(Mesh::Create({{"dp", 1 << 11}, {"pp", 1 << 11}}).ok());
}

}  // namespace
}  // namespace strata
