#include "runtime/comm/health.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

std::unique_ptr<Store> HealthStore(const std::string& spec, const std::string& job) {
  auto store = OpenStore(spec);
  EXPECT_TRUE(store.ok()) << store.status();
  return (*store)->WithPrefix(HealthKeyPrefix(job));
}

TEST(FailureReportTest, TheStoreOrdersFailuresFirstFirst) {
  std::unique_ptr<Store> a = HealthStore("memory://failures", "job1");
  std::unique_ptr<Store> b = HealthStore("memory://failures", "job1");
  ASSERT_TRUE(ReportFailure(*b, 1, "rank 1: step 3: loss is nan").ok());
  ASSERT_TRUE(ReportFailure(*a, 0, "rank 0: recv h2@grad: connection lost").ok());
  auto failures = ReadFailures(*a, absl::Milliseconds(100));
  ASSERT_TRUE(failures.ok()) << failures.status();
  ASSERT_EQ(failures->size(), 2u);
  EXPECT_EQ((*failures)[0].order, 1);
  EXPECT_EQ((*failures)[0].rank, 1);
  EXPECT_EQ((*failures)[0].message, "rank 1: step 3: loss is nan");
  EXPECT_EQ((*failures)[1].rank, 0);
  // Another job's store view sees none of them.
  auto other = ReadFailures(*HealthStore("memory://failures", "job2"), absl::Milliseconds(100));
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->empty());
}

HeartbeatMonitor::Options Monitor(const std::string& spec, int rank, std::atomic<int>* named) {
  HeartbeatMonitor::Options o;
  o.store_spec = spec;
  o.job_id = "hb";
  o.rank = rank;
  o.world_size = 2;
  // Generous against a loaded CI machine: a thread late by a second is no stall.
  o.interval = absl::Milliseconds(100);
  o.timeout = absl::Milliseconds(1500);
  o.on_unresponsive = [named](int r, const std::string&) { named->store(r); };
  return o;
}

TEST(HeartbeatMonitorTest, NamesARankWhoseHeartbeatStops) {
  std::atomic<int> named0{-1}, named1{-1};
  auto m0 = HeartbeatMonitor::Start(Monitor("memory://hb_stop", 0, &named0));
  auto m1 = HeartbeatMonitor::Start(Monitor("memory://hb_stop", 1, &named1));
  ASSERT_TRUE(m0.ok() && m1.ok());
  absl::SleepFor(absl::Milliseconds(2000));
  EXPECT_EQ(named0.load(), -1) << "both ranks beat";
  m1->reset();  // rank 1 stalls: its heartbeat stops without saying it finished
  for (int i = 0; i < 100 && named0.load() < 0; ++i) absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(named0.load(), 1);
  auto failures = ReadFailures(*HealthStore("memory://hb_stop", "hb"), absl::Milliseconds(100));
  ASSERT_TRUE(failures.ok());
  ASSERT_EQ(failures->size(), 1u);
  EXPECT_EQ((*failures)[0].rank, 0);
  EXPECT_NE((*failures)[0].message.find("rank 1 is unresponsive"), std::string::npos) << (*failures)[0].message;
}

TEST(HeartbeatMonitorTest, ARankThatFinishedIsNotWatched) {
  std::atomic<int> named0{-1}, named1{-1};
  auto m0 = HeartbeatMonitor::Start(Monitor("memory://hb_finish", 0, &named0));
  auto m1 = HeartbeatMonitor::Start(Monitor("memory://hb_finish", 1, &named1));
  ASSERT_TRUE(m0.ok() && m1.ok());
  (*m1)->Finish();
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_EQ(named0.load(), -1);
}

}  // namespace
}  // namespace strata
