#ifndef STRATA_RUNTIME_COMM_COMM_TEST_UTIL_H_
#define STRATA_RUNTIME_COMM_COMM_TEST_UTIL_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/plan.pb.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/communicator_set.h"

namespace strata {
namespace testing {

// Runs fn(rank) for every rank on its own thread and joins them all.
void RunRanks(int world, const std::function<void(int rank)>& fn);

// A memory:// spec no other test in this process uses.
std::string UniqueMemorySpec();

// A folder path under the test's temp dir that no earlier run used
// (stores are write-once, so reruns need fresh folders).
std::string FreshDir(const std::string& name);

// Rendezvous of `world` ranks as threads over a fresh in-memory store;
// element r is rank r's communicator. Fails the test on any error.
std::vector<std::unique_ptr<Communicator>> ConnectRanks(
    int world, absl::Duration op_timeout = absl::Seconds(30));

// Runs fn(rank, comms) for every rank of `plans` on its own thread, after a
// rendezvous of all ranks over a fresh in-memory store and of the groups of
// each rank's plan (ConnectGroups); rank r presents plans[r]'s fingerprint.
// Element r is rank r's result: fn's, or the rendezvous error.
std::vector<absl::Status> RunConnectedPlans(const std::vector<RankPlan>& plans,
                                            const std::function<absl::Status(int rank, CommunicatorSet* comms)>& fn,
                                            absl::Duration timeout = absl::Seconds(60));

// A loopback TCP port nobody listens on right now.
int PickFreePort();

// A redis-server child process on 127.0.0.1 (no persistence), killed when
// this object goes (and by the kernel if the test process dies first).
class RedisServer {
 public:
  // Fails (never skips) when redis-server is missing or does not come up.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start();
  ~RedisServer();

  int port() const { return port_; }
  std::string spec() const;

 private:
  RedisServer(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
};

}  // namespace testing
}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_COMM_TEST_UTIL_H_
