#include "runtime/comm/comm_test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/comm/rendezvous.h"

namespace strata {
namespace testing {

void RunRanks(int world, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int rank = 0; rank < world; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& thread : threads) thread.join();
}

std::string UniqueMemorySpec() {
  static std::atomic<int> counter{0};
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat("memory://", info != nullptr ? info->name() : "store", "-", counter++);
}

std::string FreshDir(const std::string& name) {
  static std::atomic<int> counter{0};
  return absl::StrCat(::testing::TempDir(), "/", name, "-", getpid(), "-", counter++);
}

namespace {

// Rank `rank` of `world` joining the in-memory store `spec`.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectRank(int rank, int world, const std::string& spec,
                                                          const std::string& fingerprint, absl::Duration timeout,
                                                          absl::Duration op_timeout) {
  RendezvousOptions options;
  options.rank = rank;
  options.world_size = world;
  options.store_spec = spec;
  options.fingerprint = fingerprint;
  options.timeout = timeout;
  options.op_timeout = op_timeout;
  return Rendezvous(options);
}

}  // namespace

std::vector<absl::Status> RunConnectedPlans(const std::vector<RankPlan>& plans,
                                            const std::function<absl::Status(int rank, CommunicatorSet* comms)>& fn,
                                            absl::Duration timeout, bool stage_device_tensors) {
  const int world = static_cast<int>(plans.size());
  std::vector<absl::Status> results(world);
  const std::string spec = UniqueMemorySpec();
  RunRanks(world, [&](int rank) {
    RendezvousOptions options;
    options.rank = rank;
    options.world_size = world;
    options.store_spec = spec;
    options.fingerprint = plans[rank].fingerprint();
    options.timeout = timeout;
    options.op_timeout = timeout;
    options.stage_device_tensors = stage_device_tensors;
    auto store = OpenStore(spec, false, timeout);
    if (!store.ok()) {
      results[rank] = store.status();
      return;
    }
    auto comm = Rendezvous(options, **store);
    if (!comm.ok()) {
      results[rank] = comm.status();
      return;
    }
    CommunicatorSet comms(*std::move(comm));
    if (absl::Status s = ConnectGroups(options, **store, plans[rank].topology().group(), &comms); !s.ok()) {
      results[rank] = s;
      return;
    }
    results[rank] = fn(rank, &comms);
  });
  return results;
}

std::vector<std::unique_ptr<Communicator>> ConnectRanks(int world, absl::Duration op_timeout) {
  std::vector<std::unique_ptr<Communicator>> comms(world);
  const std::string spec = UniqueMemorySpec();
  RunRanks(world, [&](int rank) {
    auto comm = ConnectRank(rank, world, spec, "same-program", absl::Seconds(10), op_timeout);
    if (!comm.ok()) {
      ADD_FAILURE() << "rank " << rank << ": " << comm.status();
      return;
    }
    comms[rank] = *std::move(comm);
  });
  return comms;
}

int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

namespace {

bool CanConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// Stops a child: SIGTERM, then SIGKILL if it lingers; always reaped.
void Stop(pid_t pid) {
  kill(pid, SIGTERM);
  for (int i = 0; i < 300; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    usleep(10 * 1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start() {
  std::string last_error;
  // The port is free when picked but could be taken before redis binds it.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int port = PickFreePort();
    if (port <= 0) return absl::UnavailableError("cannot pick a free loopback port");
    const std::string port_text = std::to_string(port);
    const std::string log_path = absl::StrCat(::testing::TempDir(), "/redis-", port_text, ".log");
    // Built before fork: only async-signal-safe calls run in the child.
    std::vector<std::string> args = {
        "redis-server", "--bind", "127.0.0.1",         "--port", port_text, "--save", "", "--appendonly",
        "no",           "--dir",  ::testing::TempDir()};
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", strerror(errno)));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (log >= 0) {
        dup2(log, STDOUT_FILENO);
        dup2(log, STDERR_FILENO);
      }
      execvp("redis-server", argv.data());
      execv("/usr/bin/redis-server", argv.data());
      _exit(127);
    }
    for (int i = 0; i < 500; ++i) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        last_error = WIFEXITED(status) && WEXITSTATUS(status) == 127
                         ? "redis-server is not installed (exec failed)"
                         : absl::StrCat("redis-server exited at start (status ", status, "), see ", log_path);
        pid = -1;
        break;
      }
      if (CanConnect(port)) return std::unique_ptr<RedisServer>(new RedisServer(pid, port));
      usleep(10 * 1000);
    }
    if (pid > 0) {
      Stop(pid);
      last_error = absl::StrCat("redis-server did not listen on port ", port, " within 5 s");
    }
    if (absl::StrContains(last_error, "not installed")) break;
  }
  return absl::UnavailableError(last_error);
}

RedisServer::~RedisServer() { Stop(pid_); }

std::string RedisServer::spec() const { return absl::StrCat("redis://127.0.0.1:", port_); }

}  // namespace testing
}  // namespace strata
