#include "runtime/comm/rendezvous.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/comm_test_util.h"
#include "runtime/comm/store.h"

namespace strata {
namespace {

using ::strata::testing::FreshDir;
using ::strata::testing::RedisServer;
using ::strata::testing::RunRanks;
using ::strata::testing::UniqueMemorySpec;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kWait = absl::Seconds(10);

RendezvousOptions Options(int rank, int world, const std::string& spec,
                          const std::string& fingerprint = "3fa2c0de") {
  RendezvousOptions options;
  options.rank = rank;
  options.world_size = world;
  options.store_spec = spec;
  options.fingerprint = fingerprint;
  options.timeout = absl::Seconds(10);
  return options;
}

// Every rank sums [rank, rank, rank] and sends its rank to the next one.
void ExchangeAndCheck(Communicator& comm) {
  const int world = comm.size();
  const int rank = comm.rank();
  Tensor sum = Tensor::Empty(F64, {3});
  sum.Fill(rank);
  ASSERT_TRUE(comm.AllReduce(&sum, ReduceOp::kSum)->Wait(kWait).ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sum.data<double>()[i], world * (world - 1) / 2.0);
  if (world < 2) return;
  Tensor mine = Tensor::Empty(I64, {1});
  mine.data<int64_t>()[0] = rank;
  Tensor theirs = Tensor::Zeros(I64, {1});
  auto recv = comm.Recv(&theirs, (rank + world - 1) % world, 1);
  auto send = comm.Send(mine, (rank + 1) % world, 1);
  ASSERT_TRUE(send->Wait(kWait).ok());
  ASSERT_TRUE(recv->Wait(kWait).ok());
  EXPECT_EQ(theirs.data<int64_t>()[0], (rank + world - 1) % world);
}

TEST(RendezvousTest, ThreeRanksOverAMemoryStoreConnectAndCommunicate) {
  const std::string spec = UniqueMemorySpec();
  RunRanks(3, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(Options(rank, 3, spec));
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ((*comm)->rank(), rank);
    EXPECT_EQ((*comm)->size(), 3);
    ExchangeAndCheck(**comm);
  });
}

TEST(RendezvousTest, ThreeRanksOverATcpStoreServedByRankZero) {
  const int port = ::strata::testing::PickFreePort();
  ASSERT_GT(port, 0);
  const std::string spec = absl::StrCat("tcp://127.0.0.1:", port);
  RunRanks(3, [&](int rank) {
    RendezvousOptions options = Options(rank, 3, spec);
    options.serve_store = rank == 0;
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(options);
    ASSERT_TRUE(comm.ok()) << "rank " << rank << ": " << comm.status();
    ExchangeAndCheck(**comm);
  });
}

// An IPv6 store: the ranks listen on the route to it (::1 here), Gloo's
// pairs connect over IPv6, and the store's host is this machine's.
TEST(RendezvousTest, ThreeRanksOverAnIpv6TcpStore) {
  const int port = ::strata::testing::PickFreePort();
  ASSERT_GT(port, 0);
  const std::string spec = absl::StrCat("tcp://[::1]:", port);
  absl::StatusOr<std::string> listen = ChooseListenAddress(spec, "");
  if (!listen.ok()) {
    // No IPv6 here: the route's lookup names the host, and nothing else runs.
    EXPECT_THAT(std::string(listen.status().message()), HasSubstr("'::1'")) << listen.status();
    return;
  }
  EXPECT_EQ(*listen, "::1");
  EXPECT_TRUE(CheckHostIsLocal("::1").ok());
  RunRanks(3, [&](int rank) {
    RendezvousOptions options = Options(rank, 3, spec);
    options.serve_store = rank == 0;
    options.hostname = *listen;
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(options);
    ASSERT_TRUE(comm.ok()) << "rank " << rank << ": " << comm.status();
    ExchangeAndCheck(**comm);
  });
}

TEST(RendezvousTest, OneRankWorldNeedsNoPeers) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      Rendezvous(Options(0, 1, UniqueMemorySpec()));
  ASSERT_TRUE(comm.ok()) << comm.status();
  ExchangeAndCheck(**comm);
}

TEST(RendezvousTest, FileStoreInATempFolder) {
  const std::string spec = "file://" + FreshDir("rendezvous_file");
  RunRanks(3, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(Options(rank, 3, spec));
    ASSERT_TRUE(comm.ok()) << comm.status();
    ExchangeAndCheck(**comm);
  });
}

// A real redis-server on loopback, started and stopped by the test. A missing
// redis-server fails the test: the store is part of the contract.
TEST(RendezvousTest, RedisStoreWithARealServer) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string spec = (*server)->spec();
  RunRanks(2, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(Options(rank, 2, spec));
    ASSERT_TRUE(comm.ok()) << comm.status();
    ExchangeAndCheck(**comm);
  });
  // A second group meets in the same server under its own keys.
  RunRanks(2, [&](int rank) {
    RendezvousOptions options = Options(rank, 2, spec);
    options.group = "dp0";
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    ExchangeAndCheck(**comm);
  });
  // The first group's keys are still there: a rank meeting again is told
  // how to delete them on this server (its host and port in the command).
  absl::StatusOr<std::unique_ptr<Communicator>> again = Rendezvous(Options(0, 2, spec));
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  std::string host;
  int port = 0;
  ASSERT_TRUE(StoreHostPort(spec, &host, &port).ok());
  EXPECT_THAT(std::string(again.status().message()),
              HasSubstr(absl::StrCat("(redis-cli -h ", host, " -p ", port, " --scan --pattern 'strata/*' | xargs ",
                                     "redis-cli -h ", host, " -p ", port, " del)")));
}

TEST(RendezvousTest, DifferentFingerprintIsRefusedOnEveryRankNamingBoth) {
  const std::string spec = UniqueMemorySpec();
  RunRanks(3, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Rendezvous(Options(rank, 3, spec, rank == 1 ? "9bc1d00d" : "3fa2c0de"));
    EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
    EXPECT_THAT(std::string(comm.status().message()),
                HasSubstr("rank 1 compiled program set 9bc1d00d but rank 0 compiled 3fa2c0de"));
  });
}

TEST(RendezvousTest, MissingRankIsDeadlineExceededWithinTheTimeout) {
  const std::string spec = UniqueMemorySpec();
  RunRanks(2, [&](int rank) {  // rank 2 of 3 never comes
    RendezvousOptions options = Options(rank, 3, spec);
    options.timeout = absl::Milliseconds(500);
    absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(options);
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));
    EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
    EXPECT_THAT(std::string(comm.status().message()),
                AllOf(HasSubstr("rank 2 did not arrive within 500ms"), HasSubstr(spec)));
  });
}

// File stores poll in whole seconds, so the bound is looser than the timeout.
TEST(RendezvousTest, MissingRankOverAFileStoreIsDeadlineExceeded) {
  const std::string spec = "file://" + FreshDir("rendezvous_missing");
  absl::Time start = absl::Now();
  RendezvousOptions options = Options(0, 2, spec);
  options.timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("rank 1 did not arrive"));
}

// Rank 0 published its fingerprint and died before the TCP mesh. Gloo's own
// key reads would wait 30 s on a file store; the rendezvous deadline holds.
TEST(RendezvousTest, RankThatStopsBeforeTheMeshIsDeadlineExceeded) {
  const std::string spec = "file://" + FreshDir("rendezvous_no_mesh");
  {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->WithPrefix("strata/world")->Set("fingerprint/0", "3fa2c0de").ok());
  }
  RendezvousOptions options = Options(1, 2, spec);
  options.timeout = absl::Seconds(1);
  absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("TCP mesh did not connect"));
}

// An earlier job that failed left rank 0's fingerprint in the folder: this
// job's rank 0 cannot publish its own, and rank 1, which read the stale key
// and went on to the mesh, waited out its whole timeout in silence. Now rank
// 0 says it gives up through the store, and rank 1 stops within seconds
// naming rank 0's reason.
TEST(RendezvousTest, ARankThatCannotJoinEndsTheOthersWaitWithItsReason) {
  const std::string spec = "file://" + FreshDir("rendezvous_stale");
  {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status();
    // What the earlier job's rank 0 left: its fingerprint, and its arrival.
    std::unique_ptr<Store> world = (*store)->WithPrefix("strata/world");
    ASSERT_TRUE(world->Set("fingerprint/0", "3fa2c0de").ok());
    ASSERT_TRUE(world->Add("arrived", 1).ok());
  }
  RunRanks(2, [&](int rank) {
    RendezvousOptions options = Options(rank, 2, spec);
    options.timeout = absl::Seconds(30);
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(options);
    EXPECT_LT(absl::Now() - start, absl::Seconds(6)) << "rank " << rank;
    EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
    EXPECT_THAT(std::string(comm.status().message()), HasSubstr("cannot publish this rank's fingerprint"));
    if (rank == 1) {
      EXPECT_THAT(std::string(comm.status().message()), HasSubstr("rank 0 gave up: "));
    }
  });
}

// A rank that gives up before any member arrived leaves nothing behind: a
// file store keeps its keys, and the news would end the corrected rerun.
TEST(RendezvousTest, GivingUpWithNobodyWaitingLeavesTheStoreClean) {
  const std::string spec = "file://" + FreshDir("rendezvous_nobody_waiting");
  absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status();
  AbortRendezvous(Options(1, 2, spec), **store, "its --save cannot be written");
  std::unique_ptr<Store> world = (*store)->WithPrefix("strata/world");
  EXPECT_EQ(world->Add("abort", 0).value_or(-1), 0);
  RunRanks(2, [&](int rank) { EXPECT_TRUE(Rendezvous(Options(rank, 2, spec)).ok()); });
}

// Over a tcp:// store that rank 0's process serves, rank 0 used to leave at
// once over a mismatch, taking the store with it: a rank that had not read
// rank 0's fingerprint yet waited out its timeout. Rank 1 starts late here.
TEST(RendezvousTest, AMismatchOverATcpStoreIsNamedOnEveryRank) {
  const int port = ::strata::testing::PickFreePort();
  ASSERT_GT(port, 0);
  const std::string spec = absl::StrCat("tcp://127.0.0.1:", port);
  RunRanks(2, [&](int rank) {
    RendezvousOptions options = Options(rank, 2, spec, rank == 1 ? "9bc1d00d" : "3fa2c0de");
    options.serve_store = rank == 0;
    options.timeout = absl::Seconds(30);
    if (rank == 1) absl::SleepFor(absl::Milliseconds(300));
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(options);
    EXPECT_LT(absl::Now() - start, absl::Seconds(6)) << "rank " << rank;
    EXPECT_TRUE(absl::IsFailedPrecondition(comm.status())) << comm.status();
    EXPECT_THAT(std::string(comm.status().message()),
                HasSubstr("rank 1 compiled program set 9bc1d00d but rank 0 compiled 3fa2c0de"));
  });
}

TEST(RendezvousTest, StoreServesOneRendezvousPerGroup) {
  const std::string spec = UniqueMemorySpec();
  RunRanks(2, [&](int rank) { ASSERT_TRUE(Rendezvous(Options(rank, 2, spec)).ok()); });
  absl::StatusOr<std::unique_ptr<Communicator>> again = Rendezvous(Options(0, 2, spec));
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_THAT(std::string(again.status().message()),
              HasSubstr(absl::StrCat("another process started as rank 0 of this job, or an earlier job with no job "
                                     "id left its keys in ", spec, ": give this job another --job_id")));
  EXPECT_THAT(std::string(again.status().message()), Not(HasSubstr("redis-cli")));
}

// Over a tcp:// store that rank 0 serves for one job, a taken key is a rank
// started twice (or another job's server on the port), never an earlier
// job's keys, and no redis-cli hint.
TEST(RendezvousTest, ATakenKeyInATcpStoreNamesARankStartedTwice) {
  const int port = ::strata::testing::PickFreePort();
  ASSERT_GT(port, 0);
  const std::string spec = absl::StrCat("tcp://127.0.0.1:", port);
  absl::StatusOr<std::unique_ptr<Store>> server = OpenStore(spec, /*serve=*/true, absl::Seconds(5));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->WithPrefix("strata/world")->Set("fingerprint/1", "3fa2c0de").ok());
  absl::StatusOr<std::unique_ptr<Communicator>> second = Rendezvous(Options(1, 2, spec));
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(absl::StrCat("another process started as rank 1 of this job, or another job's rank 0 still "
                                     "serves ", spec, ": give each process its own rank")));
  EXPECT_THAT(std::string(second.status().message()), Not(HasSubstr("redis-cli")));
}

TEST(RendezvousTest, BadOptionsAreInvalidArgument) {
  EXPECT_TRUE(absl::IsInvalidArgument(Rendezvous(Options(2, 2, UniqueMemorySpec())).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Rendezvous(Options(-1, 2, UniqueMemorySpec())).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Rendezvous(Options(0, 0, UniqueMemorySpec())).status()));
  RendezvousOptions no_time = Options(0, 1, UniqueMemorySpec());
  no_time.timeout = absl::ZeroDuration();
  EXPECT_TRUE(absl::IsInvalidArgument(Rendezvous(no_time).status()));
  absl::StatusOr<std::unique_ptr<Communicator>> bad_spec = Rendezvous(Options(0, 1, "tcp://x"));
  EXPECT_TRUE(absl::IsInvalidArgument(bad_spec.status())) << bad_spec.status();
  EXPECT_THAT(std::string(bad_spec.status().message()), HasSubstr("'tcp://x'"));
}

TEST(RendezvousTest, UnusableHostnameIsUnavailable) {
  RendezvousOptions options = Options(0, 1, UniqueMemorySpec());
  options.hostname = "no-such-host.invalid";
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(options);
  EXPECT_TRUE(absl::IsUnavailable(comm.status())) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("no-such-host.invalid"));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(ChooseListenAddressTest, LoopbackForOneMachineAndTheRouteToTheStoreOtherwise) {
  EXPECT_EQ(ChooseListenAddress("file:///tmp/strata_store.x", "").value(), "127.0.0.1");
  EXPECT_EQ(ChooseListenAddress("memory://a", "").value(), "127.0.0.1");
  // A store on this machine is reached over loopback.
  EXPECT_EQ(ChooseListenAddress("tcp://127.0.0.1:29500", "").value(), "127.0.0.1");
  EXPECT_EQ(ChooseListenAddress("redis://localhost:6379", "").value().rfind("127.", 0), 0u);
  // Its host is this machine's, IPv4 or IPv6; another's is refused by name.
  EXPECT_TRUE(CheckHostIsLocal("127.0.0.1").ok());
  absl::Status elsewhere = CheckHostIsLocal("192.0.2.1");
  EXPECT_NE(elsewhere.message().find("'192.0.2.1' is not an address of this machine"), std::string::npos) << elsewhere;
  // A named interface wins.
  EXPECT_EQ(ChooseListenAddress("tcp://127.0.0.1:29500", "lo").value(), "127.0.0.1");
  absl::StatusOr<std::string> bogus = ChooseListenAddress("file:///tmp/x", "no_such_if0");
  ASSERT_FALSE(bogus.ok());
  EXPECT_TRUE(absl::IsNotFound(bogus.status()));
  EXPECT_NE(bogus.status().message().find("'no_such_if0' has no address here (interfaces: lo"), std::string::npos)
      << bogus.status();
  EXPECT_FALSE(ChooseListenAddress("tcp://nowhere.invalid:1", "").ok());
  // An IPv4-mapped IPv6 store is IPv4 on the wire: the ranks listen on the
  // IPv4 address (Gloo finds no interface for the mapped form).
  EXPECT_EQ(ChooseListenAddress("tcp://[::ffff:127.0.0.1]:29500", "").value(), "127.0.0.1");
  // A link-local address without its interface names no route; the error says so.
  absl::StatusOr<std::string> unscoped = ChooseListenAddress("tcp://[fe80::1]:29500", "");
  ASSERT_FALSE(unscoped.ok());
  EXPECT_THAT(std::string(unscoped.status().message()), HasSubstr("a link-local address needs its interface"));
  // A link-local IPv6 store is reached from an address with its interface
  // (fe80::...%eth0), which Gloo can bind; here where an interface has one.
  struct ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  for (const struct ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET6) continue;
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
    if (!IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;
    char text[INET6_ADDRSTRLEN] = {};
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    const std::string scoped = absl::StrCat(text, "%", i->ifa_name);
    absl::StatusOr<std::string> listen = ChooseListenAddress(absl::StrCat("tcp://[", scoped, "]:29500"), "");
    ASSERT_TRUE(listen.ok()) << scoped << ": " << listen.status();
    EXPECT_EQ(*listen, scoped);
    break;
  }
  freeifaddrs(list);
}

}  // namespace
}  // namespace strata
