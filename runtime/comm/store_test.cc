#include "runtime/comm/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hiredis.h"
#include "runtime/comm/comm_test_util.h"

namespace strata {
namespace {

using ::strata::testing::FreshDir;
using ::strata::testing::PickFreePort;
using ::strata::testing::RedisServer;
using ::strata::testing::UniqueMemorySpec;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::unique_ptr<Store> Open(const std::string& spec) {
  absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(spec);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

TEST(StoreTest, MalformedSpecsAreInvalidArgumentNamingTheSpec) {
  for (const std::string spec : {"", "ftp://host/x", "/tmp/dir", "file://", "file://relative/dir",
                                 "redis://", "redis://:6379", "redis://host:port", "redis://host:0",
                                 "redis://host:70000", "redis://host:6379/extra", "memory://", "tcp://", "tcp://host",
                                 "tcp://:29500", "tcp://host:0", "tcp://host:x", "tcp://::1:29500", "tcp://[::1",
                                 "tcp://[::1]29500", "tcp://[]:1", "tcp://[::1]", "tcp://[::1]:x", "redis://[::1]x",
                                 "tcp://[[::1]]:1"}) {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << spec << ": " << store.status();
    EXPECT_THAT(std::string(store.status().message()), HasSubstr("'" + spec + "'"));
  }
}

// An IPv6 address goes in brackets, as in a URL; a bare one is refused with
// that hint (its last ':' would read as the port's).
TEST(StoreTest, Ipv6AddressesAreWrittenInBrackets) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(StoreHostPort("tcp://[::1]:29500", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 29500);
  ASSERT_TRUE(StoreHostPort("redis://[fe80::1%eth0]", &host, &port).ok());
  EXPECT_EQ(host, "fe80::1%eth0");
  EXPECT_EQ(port, 6379);
  ASSERT_TRUE(StoreHostPort("tcp://10.0.0.1:1", &host, &port).ok());
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(HostPortText("::1", 29500), "[::1]:29500");
  EXPECT_EQ(HostPortText("node0", 29500), "node0:29500");
  EXPECT_THAT(std::string(CheckStoreSpec("tcp://[::1]").message()), HasSubstr("expected [ADDRESS]:PORT"));
  absl::Status bare = CheckStoreSpec("tcp://::1:29500");
  EXPECT_THAT(std::string(bare.message()), HasSubstr("an IPv6 address goes in brackets, [ADDRESS]:PORT")) << bare;
}

// Whether this machine has IPv6 loopback (a socket binds to ::1).
bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 addr = {};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// One served store answers IPv6 and IPv4 clients alike (a dual-stack
// socket); on a machine without IPv6, an IPv6 client says it cannot reach it.
TEST(StoreTest, TcpStoreServesIpv6AndIpv4Clients) {
  const int port = PickFreePort();
  ASSERT_GT(port, 0);
  absl::StatusOr<std::unique_ptr<Store>> server = OpenStore(absl::StrCat("tcp://[::1]:", port), /*serve=*/true);
  ASSERT_TRUE(server.ok()) << server.status();
  auto v4 = Open(absl::StrCat("tcp://127.0.0.1:", port));
  ASSERT_NE(v4, nullptr);
  ASSERT_TRUE(v4->Set("from_v4", "four").ok());
  absl::StatusOr<std::unique_ptr<Store>> v6 =
      OpenStore(absl::StrCat("tcp://[::1]:", port), /*serve=*/false, absl::Milliseconds(300));
  ASSERT_TRUE(v6.ok()) << v6.status();
  if (HasIpv6Loopback()) {
    ASSERT_TRUE((*v6)->Set("from_v6", "six").ok());
    EXPECT_EQ((*server)->Get("from_v6", absl::Seconds(1)).value_or("?"), "six");
    EXPECT_EQ((*v6)->Get("from_v4", absl::Seconds(1)).value_or("?"), "four");
  } else {
    absl::Status unreachable = (*v6)->Set("from_v6", "six");
    EXPECT_THAT(std::string(unreachable.message()), HasSubstr("cannot reach the store at [::1]:")) << unreachable;
  }
  EXPECT_EQ((*server)->Get("from_v4", absl::Seconds(1)).value_or("?"), "four");
}

TEST(StoreTest, RedisServerThatIsDownIsUnavailableNotAnException) {
  const int port = PickFreePort();
  ASSERT_GT(port, 0);
  const std::string spec = absl::StrCat("redis://127.0.0.1:", port);
  absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(spec);
  EXPECT_TRUE(absl::IsUnavailable(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()),
              AllOf(HasSubstr(spec), HasSubstr("cannot reach the redis server")));
}

TEST(StoreTest, MemoryStoresAreSharedByName) {
  const std::string spec = UniqueMemorySpec();
  auto writer = Open(spec);
  auto reader = Open(spec);
  auto other = Open(UniqueMemorySpec());
  ASSERT_TRUE(writer->Set("k", "value").ok());
  absl::StatusOr<std::string> read = reader->Get("k", absl::Seconds(1));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "value");
  EXPECT_TRUE(absl::IsDeadlineExceeded(other->Get("k", absl::Milliseconds(50)).status()));
}

TEST(StoreTest, KeysAreWriteOnce) {
  auto store = Open(UniqueMemorySpec());
  ASSERT_TRUE(store->Set("k", "1").ok());
  absl::Status again = store->Set("k", "2");
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
  EXPECT_THAT(std::string(again.message()), HasSubstr("'k'"));
}

TEST(StoreTest, GetWaitsForAKeySetLater) {
  const std::string spec = UniqueMemorySpec();
  auto reader = Open(spec);
  std::thread writer([spec] {
    absl::SleepFor(absl::Milliseconds(100));
    auto store = Open(spec);
    EXPECT_TRUE(store->Set("late", "here").ok());
  });
  absl::StatusOr<std::string> read = reader->Get("late", absl::Seconds(5));
  writer.join();
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "here");
}

TEST(StoreTest, FileStoreRoundTripsValuesIncludingEmptyOnes) {
  const std::string dir = FreshDir("file_store") + "/nested";
  auto writer = Open("file://" + dir);  // created, parents included
  auto reader = Open("file://" + dir);
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(writer->Set("binary", binary).ok());
  ASSERT_TRUE(writer->Set("empty", "").ok());
  absl::StatusOr<std::string> a = reader->Get("binary", absl::Seconds(2));
  absl::StatusOr<std::string> b = reader->Get("empty", absl::Seconds(2));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a, binary);
  EXPECT_EQ(*b, "");
}

// File and redis stores poll in whole seconds: a 1 s wait ends within ~2 s.
TEST(StoreTest, FileStoreWaitForMissingKeyIsDeadlineExceeded) {
  auto store = Open("file://" + FreshDir("file_store_timeout"));
  absl::Time start = absl::Now();
  absl::Status status = store->Wait({"never", "set"}, absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(std::string(status.message()), AllOf(HasSubstr("never, set"), HasSubstr("1s")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

TEST(StoreTest, PrefixesGiveEachGroupItsOwnKeys) {
  auto base = Open(UniqueMemorySpec());
  std::unique_ptr<Store> a = base->WithPrefix("a");
  std::unique_ptr<Store> b = base->WithPrefix("b");
  ASSERT_TRUE(a->Set("k", "in a").ok());
  ASSERT_TRUE(b->Set("k", "in b").ok());  // no clash with a's key
  EXPECT_EQ(*a->Get("k", absl::Seconds(1)), "in a");
  EXPECT_EQ(*b->Get("k", absl::Seconds(1)), "in b");
  EXPECT_EQ(*base->Get("a/k", absl::Seconds(1)), "in a");
  std::unique_ptr<Store> nested = a->WithPrefix("sub");
  ASSERT_TRUE(nested->Set("k", "deep").ok());
  EXPECT_EQ(*base->Get("a/sub/k", absl::Seconds(1)), "deep");
  EXPECT_EQ(nested->spec(), base->spec() + "/a/sub");
  // The prefixed view outlives the store it came from.
  base.reset();
  a.reset();
  EXPECT_EQ(*nested->Get("k", absl::Seconds(1)), "deep");
}

// tcp://: rank 0 serves, the others connect; values cross in both directions.
TEST(StoreTest, TcpStoreServedByOneProcessThreadServesTheOthers) {
  const int port = PickFreePort();
  ASSERT_GT(port, 0);
  const std::string spec = absl::StrCat("tcp://127.0.0.1:", port);
  // A client may start before the server: it retries until the server is up.
  std::unique_ptr<Store> early;
  std::thread client([&] {
    early = Open(spec);
    ASSERT_NE(early, nullptr);
    ASSERT_TRUE(early->Set("from_client", "hello").ok());
    absl::StatusOr<std::string> read = early->Get("from_server", absl::Seconds(10));
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, "world");
  });
  absl::SleepFor(absl::Milliseconds(200));
  absl::StatusOr<std::unique_ptr<Store>> server = OpenStore(spec, /*serve=*/true);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::string> read = (*server)->Get("from_client", absl::Seconds(10));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "hello");
  ASSERT_TRUE((*server)->Set("from_server", "world").ok());
  client.join();
  // An empty value, a key set twice from another connection, a timeout.
  auto other = Open(spec);
  ASSERT_TRUE(other->Set("empty", "").ok());
  absl::StatusOr<std::string> empty = (*server)->Get("empty", absl::Seconds(1));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "");
  absl::Status again = other->Set("from_client", "x");
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
  EXPECT_THAT(std::string(again.message()), HasSubstr("'from_client'"));
  absl::Status late = other->Wait({"never"}, absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(late)) << late;
  // The connection that timed out is replaced on the next call.
  absl::StatusOr<std::string> after = other->Get("from_server", absl::Seconds(1));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, "world");
  // Prefixes work over the wire too.
  auto prefixed = other->WithPrefix("group");
  ASSERT_TRUE(prefixed->Set("k", "v").ok());
  absl::StatusOr<std::string> via_server = (*server)->WithPrefix("group")->Get("k", absl::Seconds(1));
  ASSERT_TRUE(via_server.ok()) << via_server.status();
  EXPECT_EQ(*via_server, "v");
}

// Garbage on one connection drops that connection, not the server.
TEST(StoreTest, TcpStoreSurvivesMalformedRequests) {
  const int port = PickFreePort();
  ASSERT_GT(port, 0);
  const std::string spec = absl::StrCat("tcp://127.0.0.1:", port);
  absl::StatusOr<std::unique_ptr<Store>> server = OpenStore(spec, /*serve=*/true);
  ASSERT_TRUE(server.ok()) << server.status();
  using namespace std::string_literals;  // the requests hold NUL bytes
  for (const std::string& garbage : {"X\x01\0\0\0"s, "S\0\0\0\0"s, "G\x02\0\0\0"s, "W\x01\0\0\0\xff\xff\xff\xff"s,
                                     "A\x02\0\0\0"s, "D\0\0\0\0"s}) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL), static_cast<ssize_t>(garbage.size()));
    char c;
    EXPECT_EQ(recv(fd, &c, 1, 0), 0) << "the server should close a connection that sent garbage";
    close(fd);
  }
  auto client = Open(spec);
  ASSERT_TRUE(client->Set("still", "here").ok());
  absl::StatusOr<std::string> read = (*server)->Get("still", absl::Seconds(1));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "here");
}

TEST(StoreTest, TcpStoreNobodyServesIsDeadlineExceededOrUnavailable) {
  const int port = PickFreePort();
  ASSERT_GT(port, 0);
  auto client = Open(absl::StrCat("tcp://127.0.0.1:", port));
  absl::Status waited = client->Wait({"k"}, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited)) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("cannot reach the store"));
}

TEST(StoreTest, OnlyTcpStoresAreServed) {
  absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(UniqueMemorySpec(), /*serve=*/true);
  EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
}

TEST(StoreTest, TempFileStoreSpecsAreFreshFolders) {
  absl::StatusOr<std::string> first = MakeTempFileStoreSpec();
  absl::StatusOr<std::string> second = MakeTempFileStoreSpec();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*first, *second);
  for (const std::string& spec : {*first, *second}) {
    ASSERT_TRUE(absl::StartsWith(spec, "file:///")) << spec;
    EXPECT_THAT(spec, HasSubstr("/strata_store."));
    struct stat info;
    EXPECT_EQ(stat(spec.substr(7).c_str(), &info), 0);
    EXPECT_TRUE(S_ISDIR(info.st_mode));
    EXPECT_EQ(stat((spec.substr(7) + "/owner.lock").c_str(), &info), 0) << "no owner record in " << spec;
    EXPECT_NE(Open(spec), nullptr);
    std::filesystem::remove_all(spec.substr(7));
  }
}


// ---- Counters and DeleteAll, on every backend ----

// One store of each kind. For tcp, "tcp_served" tests the serving rank's
// Store (calls in process) and "tcp_client" a client's (calls on the wire).
class EveryBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string& kind = GetParam();
    if (kind == "file") {
      spec_ = "file://" + FreshDir("every_backend");
    } else if (kind == "memory") {
      spec_ = UniqueMemorySpec();
    } else if (kind == "redis") {
      absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
      ASSERT_TRUE(redis.ok()) << redis.status();
      redis_ = *std::move(redis);
      spec_ = redis_->spec();
    } else {
      const int port = PickFreePort();
      ASSERT_GT(port, 0);
      spec_ = absl::StrCat("tcp://127.0.0.1:", port);
      absl::StatusOr<std::unique_ptr<Store>> served = OpenStore(spec_, /*serve=*/true);
      ASSERT_TRUE(served.ok()) << served.status();
      served_ = *std::move(served);
    }
    store_ = kind == "tcp_served" ? std::move(served_) : Open(spec_);
    ASSERT_NE(store_, nullptr);
  }

  // Another Store on the same spec (a tcp:// client for both tcp kinds).
  std::unique_ptr<Store> OpenAnother() { return Open(spec_); }

  std::unique_ptr<RedisServer> redis_;
  std::unique_ptr<Store> served_;  // tcp_client: the server its store talks to
  std::string spec_;
  std::unique_ptr<Store> store_;  // the store under test
};

INSTANTIATE_TEST_SUITE_P(Backends, EveryBackendTest,
                         ::testing::Values("file", "redis", "tcp_served", "tcp_client", "memory"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST_P(EveryBackendTest, AddStartsAtZeroAndReturnsTheNewValue) {
  EXPECT_EQ(store_->Add("c", 0).value(), 0);
  EXPECT_EQ(store_->Add("c", 5).value(), 5);
  EXPECT_EQ(store_->Add("c", -7).value(), -2);
  EXPECT_EQ(store_->Add("c", 0).value(), -2);
  EXPECT_EQ(OpenAnother()->Add("c", 0).value(), -2);
  EXPECT_EQ(OpenAnother()->Add("c", 3).value(), 1);
  EXPECT_EQ(store_->Add("c", 0).value(), 1);
}

TEST_P(EveryBackendTest, CountersAreANamespaceApartFromKeys) {
  ASSERT_TRUE(store_->Set("n", "value").ok());
  EXPECT_EQ(store_->Add("n", 0).value(), 0);
  EXPECT_EQ(store_->Add("n", 4).value(), 4);
  EXPECT_EQ(store_->Get("n", absl::Seconds(2)).value(), "value");
  EXPECT_EQ(store_->Add("m", 1).value(), 1);
  EXPECT_TRUE(store_->Set("m", "free").ok());
}

TEST_P(EveryBackendTest, CountersRespectPrefixes) {
  std::unique_ptr<Store> group = store_->WithPrefix("g");
  EXPECT_EQ(group->Add("x", 3).value(), 3);
  EXPECT_EQ(store_->Add("g/x", 0).value(), 3);
  EXPECT_EQ(store_->Add("x", 0).value(), 0);
  EXPECT_EQ(OpenAnother()->WithPrefix("g")->Add("x", 1).value(), 4);
  std::unique_ptr<Store> nested = group->WithPrefix("h");
  EXPECT_EQ(nested->Add("y", 2).value(), 2);
  EXPECT_EQ(store_->Add("g/h/y", 0).value(), 2);
  EXPECT_EQ(store_->WithPrefix("g/h")->Add("y", 0).value(), 2);
  EXPECT_EQ(store_->WithPrefix("g2")->Add("x", 0).value(), 0);
}

// 4 threads x 200 Adds, each thread on its own Store (for tcp_served thread
// 0 on the serving one, in process, the others on the wire): every value
// from 1 to 800 is returned exactly once.
TEST_P(EveryBackendTest, ConcurrentAddsOnSeparateStoresAreAtomic) {
  constexpr int kThreads = 4, kAdds = 200;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<Store> own = t == 0 && GetParam() == "tcp_served" ? nullptr : OpenAnother();
      Store& store = own != nullptr ? *own : *store_;
      for (int i = 0; i < kAdds; ++i) {
        absl::StatusOr<int64_t> value = store.WithPrefix("job")->Add("count", 1);
        ASSERT_TRUE(value.ok()) << value.status();
        seen[t].push_back(*value);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(store_->Add("job/count", 0).value(), kThreads * kAdds);
  std::set<int64_t> all;
  for (const auto& values : seen) all.insert(values.begin(), values.end());
  EXPECT_EQ(all.size(), size_t{kThreads * kAdds});
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
}

TEST_P(EveryBackendTest, OverflowIsOutOfRangeNamingTheStoreAndKeyAndChangesNothing) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  std::unique_ptr<Store> group = store_->WithPrefix("g");
  ASSERT_EQ(group->Add("big", kMax).value(), kMax);
  absl::StatusOr<int64_t> over = group->Add("big", 1);
  EXPECT_TRUE(absl::IsOutOfRange(over.status())) << over.status();
  EXPECT_THAT(std::string(over.status().message()), AllOf(HasSubstr(group->spec()), HasSubstr("'big'")));
  EXPECT_EQ(group->Add("big", 0).value(), kMax);
  ASSERT_EQ(group->Add("small", kMin).value(), kMin);
  EXPECT_TRUE(absl::IsOutOfRange(group->Add("small", -1).status()));
  EXPECT_EQ(group->Add("small", 0).value(), kMin);
}

// What a job's end does (rank 0 deletes "strata/<job>"): the next job with
// the same id sets the same keys again, and nothing outside its prefix goes.
TEST_P(EveryBackendTest, DeleteAllLetsTheNextJobWithThePrefixSetTheSameKeys) {
  std::unique_ptr<Store> job = store_->WithPrefix("strata/job1");
  std::unique_ptr<Store> sibling = store_->WithPrefix("strata/job10");
  ASSERT_TRUE(job->Set("fingerprint/0", "first").ok());
  ASSERT_TRUE(job->WithPrefix("mesh")->Set("rank/0", "addr").ok());
  ASSERT_NO_THROW(job->WithPrefix("mesh")->gloo_store().set("gloo/0", std::vector<char>{'g'}));  // as connectFullMesh
  ASSERT_EQ(job->Add("failure/count", 2).value(), 2);
  ASSERT_TRUE(sibling->Set("fingerprint/0", "other job").ok());
  ASSERT_EQ(sibling->Add("failure/count", 5).value(), 5);
  ASSERT_TRUE(store_->Set("strata/job1", "a key named like the prefix").ok());
  ASSERT_EQ(store_->Add("strata/job1", 7).value(), 7);

  absl::Status again = job->Set("fingerprint/0", "second");
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;  // today's failure without DeleteAll

  // Another Store of the job deletes: the keys are the store's, not the object's.
  absl::Status deleted = OpenAnother()->WithPrefix("strata/job1")->DeleteAll();
  ASSERT_TRUE(deleted.ok()) << deleted;
  EXPECT_EQ(job->Add("failure/count", 0).value(), 0);
  ASSERT_TRUE(job->Set("fingerprint/0", "second").ok());
  ASSERT_TRUE(job->WithPrefix("mesh")->Set("rank/0", "addr2").ok());
  EXPECT_NO_THROW(job->WithPrefix("mesh")->gloo_store().set("gloo/0", std::vector<char>{'g'}));
  EXPECT_EQ(job->Get("fingerprint/0", absl::Seconds(2)).value(), "second");
  EXPECT_EQ(job->Add("failure/count", 1).value(), 1);
  // Outside the prefix: untouched.
  EXPECT_EQ(sibling->Get("fingerprint/0", absl::Seconds(2)).value(), "other job");
  EXPECT_EQ(sibling->Add("failure/count", 0).value(), 5);
  EXPECT_EQ(store_->Get("strata/job1", absl::Seconds(2)).value(), "a key named like the prefix");
  EXPECT_EQ(store_->Add("strata/job1", 0).value(), 7);
  // Deleting what is already gone is fine.
  EXPECT_TRUE(store_->WithPrefix("never/used")->DeleteAll().ok());
}

TEST_P(EveryBackendTest, UnprefixedDeleteAllEmptiesTheStoreButRedisRefuses) {
  ASSERT_TRUE(store_->Set("k", "v").ok());
  ASSERT_EQ(store_->Add("c", 1).value(), 1);
  absl::Status deleted = store_->DeleteAll();
  if (GetParam() == "redis") {
    EXPECT_TRUE(absl::IsFailedPrecondition(deleted)) << deleted;
    EXPECT_THAT(std::string(deleted.message()), AllOf(HasSubstr(spec_), HasSubstr("other jobs")));
    EXPECT_EQ(store_->Add("c", 0).value(), 1);
    return;
  }
  ASSERT_TRUE(deleted.ok()) << deleted;
  EXPECT_EQ(store_->Add("c", 0).value(), 0);
  EXPECT_TRUE(store_->Set("k", "again").ok());
}

// ---- Backend specifics ----

// The files of a file:// store's folder, owner records aside.
std::set<std::string> FilesIn(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

TEST(StoreTest, FileCounterHoldingGarbageIsDataLossNamingTheStoreAndKey) {
  const std::string dir = FreshDir("file_counter_garbage");
  auto store = Open("file://" + dir);
  ASSERT_EQ(store->Add("x", 1).value(), 1);
  std::string counter_name;
  for (const std::string& name : FilesIn(dir)) {
    if (absl::StartsWith(name, "counter-")) counter_name = name;
  }
  ASSERT_FALSE(counter_name.empty());
  std::ofstream(dir + "/" + counter_name, std::ios::trunc) << "garbage";
  for (int64_t delta : {0, 1}) {
    absl::StatusOr<int64_t> value = store->Add("x", delta);
    EXPECT_TRUE(absl::IsDataLoss(value.status())) << value.status();
    EXPECT_THAT(std::string(value.status().message()),
                AllOf(HasSubstr(store->spec()), HasSubstr("'x'"), HasSubstr(counter_name), HasSubstr("garbage")));
  }
}

// Keys never become paths: a key full of "../" names a hashed file in DIR.
TEST(StoreTest, FileCounterKeysCannotNameAPath) {
  const std::string root = FreshDir("file_counter_paths");
  const std::string dir = root + "/store";
  auto store = Open("file://" + dir);
  ASSERT_EQ(store->Add("../../escaped", 1).value(), 1);
  ASSERT_EQ(store->Add("/etc/passwd", 1).value(), 1);
  EXPECT_EQ(FilesIn(root), std::set<std::string>{"store"});
  for (const std::string& name : FilesIn(dir)) EXPECT_TRUE(absl::StartsWith(name, "counter-")) << name;
  EXPECT_EQ(FilesIn(dir).size(), 2u);
  EXPECT_EQ(store->Add("../../escaped", 0).value(), 1);
}

// Processes, not only threads: 2 children and this process add to one file.
TEST(StoreTest, FileCountersAreAtomicAcrossProcesses) {
  const std::string spec = "file://" + FreshDir("file_counter_processes");
  ASSERT_NE(Open(spec), nullptr);
  constexpr int kAdds = 200;
  std::vector<pid_t> children;
  for (int c = 0; c < 2; ++c) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(spec);
      if (!store.ok()) _exit(2);
      for (int i = 0; i < kAdds; ++i) {
        if (!(*store)->Add("count", 1).ok()) _exit(3);
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  auto store = Open(spec);
  for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(store->Add("count", 1).ok());
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  EXPECT_EQ(store->Add("count", 0).value(), 3 * kAdds);
}

// The remaining time to live of a redis key in ms (-1: none, -2: no key).
long long RedisPttl(const RedisServer& redis, const std::string& key) {
  redisContext* context = redisConnect("127.0.0.1", redis.port());
  if (context == nullptr || context->err != 0) {
    ADD_FAILURE() << "cannot connect to redis";
    if (context != nullptr) redisFree(context);
    return -3;
  }
  auto* reply = static_cast<redisReply*>(redisCommand(context, "PTTL %b", key.data(), key.size()));
  long long ttl = reply != nullptr && reply->type == REDIS_REPLY_INTEGER ? reply->integer : -3;
  if (reply != nullptr) freeReplyObject(reply);
  redisFree(context);
  return ttl;
}

TEST(StoreTest, RedisKeysAndCountersGetTheTimeToLive) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  const std::string spec = (*redis)->spec();
  constexpr long long kHourMs = 3600 * 1000;
  {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(spec, false, absl::Minutes(5), absl::Hours(1));
    ASSERT_TRUE(store.ok()) << store.status();
    std::unique_ptr<Store> job = (*store)->WithPrefix("job");
    ASSERT_TRUE(job->Set("k", "v").ok());
    ASSERT_EQ(job->Add("c", 1).value(), 1);
    // Gloo's own writes (connectFullMesh's) go through the same store.
    ASSERT_NO_THROW(job->gloo_store().set("mesh", {'m'}));
    for (const std::string key : {"job/k", "job/c#counter", "job/mesh"}) {
      const long long ttl = RedisPttl(**redis, key);
      EXPECT_GT(ttl, kHourMs - 60 * 1000) << key;
      EXPECT_LE(ttl, kHourMs) << key;
    }
    // Every Add renews it.
    ASSERT_EQ(job->Add("c", 1).value(), 2);
    EXPECT_GT(RedisPttl(**redis, "job/c#counter"), kHourMs - 60 * 1000);
  }
  {
    auto store = Open(spec);  // the default: a day
    ASSERT_TRUE(store->Set("daily", "v").ok());
    EXPECT_GT(RedisPttl(**redis, "daily"), 24 * kHourMs - 60 * 1000);
    EXPECT_LE(RedisPttl(**redis, "daily"), 24 * kHourMs);
  }
  {
    absl::StatusOr<std::unique_ptr<Store>> store =
        OpenStore(spec, false, absl::Minutes(5), absl::InfiniteDuration());
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Set("forever", "v").ok());
    ASSERT_EQ((*store)->Add("forever", 1).value(), 1);
    EXPECT_EQ(RedisPttl(**redis, "forever"), -1);
    EXPECT_EQ(RedisPttl(**redis, "forever#counter"), -1);
  }
}

TEST(StoreTest, RedisKeysExpireAfterTheirTimeToLive) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore((*redis)->spec(), false, absl::Minutes(5), absl::Milliseconds(300));
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v").ok());
  ASSERT_EQ((*store)->Add("c", 3).value(), 3);
  absl::SleepFor(absl::Milliseconds(700));
  EXPECT_TRUE((*store)->Set("k", "again").ok());
  EXPECT_EQ((*store)->Add("c", 0).value(), 0);
}

TEST(StoreTest, RedisKeyTimeToLiveMustBePositive) {
  for (absl::Duration ttl : {absl::ZeroDuration(), absl::Seconds(-1)}) {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenStore("redis://127.0.0.1:1", false, absl::Minutes(5), ttl);
    EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
    EXPECT_THAT(std::string(store.status().message()), HasSubstr("time-to-live"));
  }
  // Ignored by the other kinds.
  EXPECT_TRUE(OpenStore(UniqueMemorySpec(), false, absl::Minutes(5), absl::ZeroDuration()).ok());
}

TEST(StoreTest, RedisCounterHoldingSomethingElseIsDataLoss) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  auto store = Open((*redis)->spec());
  // A key set under the counter's redis name collides (documented); the
  // counter then fails rather than reading the value as a number.
  ASSERT_TRUE(store->Set("x#counter", "text").ok());
  for (int64_t delta : {0, 1}) {
    absl::StatusOr<int64_t> value = store->Add("x", delta);
    EXPECT_TRUE(absl::IsDataLoss(value.status())) << value.status();
    EXPECT_THAT(std::string(value.status().message()), AllOf(HasSubstr(store->spec()), HasSubstr("'x'")));
  }
}

// SCAN MATCH takes a glob: a prefix's '*', '?' and '[' match themselves only.
TEST(StoreTest, RedisDeleteAllMatchesThePrefixLiterally) {
  absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  auto store = Open((*redis)->spec());
  const std::vector<std::string> others = {"ab", "a", "aXb", "a\\*", "b"};
  for (const std::string& prefix : others) {
    ASSERT_TRUE(store->WithPrefix(prefix)->Set("k", prefix).ok());
    ASSERT_EQ(store->WithPrefix(prefix)->Add("c", 1).value(), 1);
  }
  for (const char* prefix : {"a*", "a?b", "[ab]", "a\\"}) {
    std::unique_ptr<Store> view = store->WithPrefix(prefix);
    ASSERT_TRUE(view->Set("k", "mine").ok());
    ASSERT_EQ(view->Add("c", 1).value(), 1);
    absl::Status deleted = view->DeleteAll();
    ASSERT_TRUE(deleted.ok()) << prefix << ": " << deleted;
    EXPECT_TRUE(view->Set("k", "again").ok()) << prefix;
    EXPECT_EQ(view->Add("c", 0).value(), 0) << prefix;
  }
  for (const std::string& prefix : others) {
    EXPECT_EQ(store->WithPrefix(prefix)->Get("k", absl::Seconds(2)).value(), prefix);
    EXPECT_EQ(store->WithPrefix(prefix)->Add("c", 0).value(), 1) << prefix;
  }
}

// ---- Temporary store folders ----

// Sets TMPDIR to a folder of the test's own for its life.
class ScopedTmpdir {
 public:
  explicit ScopedTmpdir(const std::string& name) : path_(FreshDir(name)) {
    std::filesystem::create_directories(path_);
    const char* old = getenv("TMPDIR");
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    setenv("TMPDIR", path_.c_str(), 1);
  }
  ~ScopedTmpdir() {
    if (had_) {
      setenv("TMPDIR", old_.c_str(), 1);
    } else {
      unsetenv("TMPDIR");
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_, old_;
  bool had_ = false;
};

bool Exists(const std::string& path) {
  struct stat info;
  return lstat(path.c_str(), &info) == 0;
}

// A child that makes a temp store and reports its folder; it exits when the
// pipe `release` closes (at once when `release` is null).
pid_t ChildMakingTempStore(const int* release, std::string* folder) {
  int report[2];
  if (pipe(report) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(report[0]);
    if (release != nullptr) close(release[1]);  // else its own copy keeps the pipe open
    absl::StatusOr<std::string> spec = MakeTempFileStoreSpec();
    const std::string line = spec.ok() ? spec->substr(7) : "";
    if (write(report[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(2);
    close(report[1]);
    char c;
    if (release != nullptr) (void)!read(release[0], &c, 1);
    _exit(spec.ok() ? 0 : 1);
  }
  close(report[1]);
  char buf[4096];
  ssize_t n;
  folder->clear();
  while ((n = read(report[0], buf, sizeof(buf))) > 0) folder->append(buf, static_cast<size_t>(n));
  close(report[0]);
  return pid;
}

TEST(StoreTest, StaleTempFileStoresAreRemovedOnlyWhenTheirOwnerIsProvablyDead) {
  ScopedTmpdir tmpdir("stale_stores");
  // Owned by a child that has exited and been reaped: abandoned.
  std::string dead;
  pid_t reaped = ChildMakingTempStore(nullptr, &dead);
  ASSERT_GT(reaped, 0);
  int status = 0;
  ASSERT_EQ(waitpid(reaped, &status, 0), reaped);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_FALSE(dead.empty());
  ASSERT_TRUE(Exists(dead + "/owner.lock"));
  ASSERT_TRUE(std::filesystem::is_directory(dead));
  std::ofstream(dead + "/some_key") << "left by a SIGKILLed job";
  // Owned by a child that still runs (until `release` closes).
  int release[2];
  ASSERT_EQ(pipe(release), 0);
  std::string alive_elsewhere;
  pid_t running = ChildMakingTempStore(release, &alive_elsewhere);
  ASSERT_GT(running, 0);
  close(release[0]);
  ASSERT_FALSE(alive_elsewhere.empty());
  // Owned by this process (it also sweeps first, removing `dead`).
  absl::StatusOr<std::string> mine = MakeTempFileStoreSpec();
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_FALSE(Exists(dead)) << "MakeTempFileStoreSpec should have swept " << dead;
  // No owner record: another program's folder, or one being made.
  const std::string unrecorded = tmpdir.path() + "/strata_store.norecord";
  ASSERT_TRUE(std::filesystem::create_directory(unrecorded));
  // A link to a folder whose owner is dead is not followed.
  std::string dead2;
  pid_t reaped2 = ChildMakingTempStore(nullptr, &dead2);
  ASSERT_GT(reaped2, 0);
  ASSERT_EQ(waitpid(reaped2, &status, 0), reaped2);
  const std::string outside = FreshDir("stale_store_outside");
  std::filesystem::rename(dead2, outside);
  std::filesystem::create_directory_symlink(outside, tmpdir.path() + "/strata_store.link");

  EXPECT_EQ(RemoveStaleTempFileStores().value(), 0);
  EXPECT_TRUE(Exists(mine->substr(7) + "/owner.lock"));
  EXPECT_TRUE(Exists(alive_elsewhere + "/owner.lock"));
  EXPECT_TRUE(Exists(unrecorded));
  EXPECT_TRUE(Exists(outside + "/owner.lock"));
  EXPECT_TRUE(Exists(tmpdir.path() + "/strata_store.link"));
  // The running owner ends: its folder goes at the next sweep.
  close(release[1]);
  ASSERT_EQ(waitpid(running, &status, 0), running);
  EXPECT_EQ(RemoveStaleTempFileStores().value(), 1);
  EXPECT_FALSE(Exists(alive_elsewhere));
  EXPECT_TRUE(Exists(mine->substr(7) + "/owner.lock"));
  EXPECT_TRUE(Exists(unrecorded));
  EXPECT_TRUE(Exists(outside + "/owner.lock"));
}

}  // namespace
}  // namespace strata
