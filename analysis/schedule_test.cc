#include "analysis/schedule.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

std::string Render(const Schedule& s) {
  std::string out;
  for (const Action& a : s.action()) {
    if (!out.empty()) out += " ";
    if (a.kind() == Action::FORWARD) absl::StrAppend(&out, "F", a.micro_batch());
    if (a.kind() == Action::BACKWARD) absl::StrAppend(&out, "B", a.micro_batch());
    if (a.kind() == Action::OPTIMIZE) out += "OPT";
  }
  return out;
}

TEST(ScheduleTest, OneFOneBMatchesMegatronTable) {
  // 4 stages, 6 micro-batches: warm-up of (stages - stage - 1) forwards.
  EXPECT_EQ(Render(BuildSchedule(ONE_F_ONE_B, 4, 0, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 OPT");
  EXPECT_EQ(Render(BuildSchedule(ONE_F_ONE_B, 4, 2, 6)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5 OPT");
  EXPECT_EQ(Render(BuildSchedule(ONE_F_ONE_B, 4, 3, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 OPT");
  // Fewer micro-batches than the warm-up wants.
  EXPECT_EQ(Render(BuildSchedule(ONE_F_ONE_B, 4, 0, 2)), "F0 F1 B0 B1 OPT");
}

TEST(ScheduleTest, FThenBRunsAllForwardsFirst) {
  EXPECT_EQ(Render(BuildSchedule(F_THEN_B, 3, 1, 3)), "F0 F1 F2 B0 B1 B2 OPT");
}

TEST(ScheduleTest, EveryScheduleIsWellFormed) {
  for (ScheduleKind kind : {ONE_F_ONE_B, F_THEN_B}) {
    for (int stages = 1; stages <= 8; ++stages) {
      for (int stage = 0; stage < stages; ++stage) {
        for (int mbs = 1; mbs <= 12; ++mbs) {
          Schedule s = BuildSchedule(kind, stages, stage, mbs);
          SCOPED_TRACE(absl::StrCat(ScheduleKind_Name(kind), " stages=", stages, " stage=", stage, " mbs=", mbs));
          ASSERT_EQ(s.action_size(), 2 * mbs + 1);
          EXPECT_EQ(s.action(s.action_size() - 1).kind(), Action::OPTIMIZE);
          std::vector<int> forward_at(mbs, -1), backward_at(mbs, -1);
          int in_flight = 0, max_in_flight = 0, next_f = 0, next_b = 0;
          for (int i = 0; i + 1 < s.action_size(); ++i) {
            const Action& a = s.action(i);
            if (a.kind() == Action::FORWARD) {
              EXPECT_EQ(a.micro_batch(), next_f++) << "forwards run in order";
              forward_at[a.micro_batch()] = i;
              max_in_flight = std::max(max_in_flight, ++in_flight);
            } else {
              ASSERT_EQ(a.kind(), Action::BACKWARD);
              EXPECT_EQ(a.micro_batch(), next_b++) << "backwards run in order";
              backward_at[a.micro_batch()] = i;
              --in_flight;
            }
          }
          for (int mb = 0; mb < mbs; ++mb) EXPECT_LT(forward_at[mb], backward_at[mb]);
          // 1F1B keeps at most (stages - stage) micro-batches' activations alive.
          if (kind == ONE_F_ONE_B) {
            EXPECT_LE(max_in_flight, std::min(mbs, stages - stage));
          } else {
            EXPECT_EQ(max_in_flight, mbs);
          }
        }
      }
    }
  }
}

TEST(ScheduleTest, IdealBubble) {
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(1, 4), 0.0);
  EXPECT_DOUBLE_EQ(IdealBubbleFraction(4, 8), 3.0 / 11.0);
}

}  // namespace
}  // namespace strata
