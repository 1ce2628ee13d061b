#include "runtime/comm/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/comm_test_util.h"

namespace strata {
namespace {

using ::strata::testing::FreshDir;
using ::strata::testing::PickFreePort;
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
                                 "tcp://:29500", "tcp://host:0", "tcp://host:x"}) {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << spec << ": " << store.status();
    EXPECT_THAT(std::string(store.status().message()), HasSubstr("'" + spec + "'"));
  }
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
  for (const std::string& garbage : {"X\x01\0\0\0"s, "S\0\0\0\0"s, "G\x02\0\0\0"s, "W\x01\0\0\0\xff\xff\xff\xff"s}) {
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
    struct stat info;
    EXPECT_EQ(stat(spec.substr(7).c_str(), &info), 0);
    EXPECT_TRUE(S_ISDIR(info.st_mode));
    EXPECT_NE(Open(spec), nullptr);
    rmdir(spec.substr(7).c_str());
  }
}

}  // namespace
}  // namespace strata
