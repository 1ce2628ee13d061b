#ifndef STRATA_RUNTIME_COMM_HEALTH_H_
#define STRATA_RUNTIME_COMM_HEALTH_H_

// A job's health through its store: which rank failed first, and which rank
// stopped answering. Both work on any number of machines because they are
// ordered by the store (its atomic counters), never by clocks.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "runtime/comm/store.h"

namespace strata {

// The job's health keys live under this prefix of its store:
// "strata/<job_id>/health". ReportFailure and ReadFailures take a store view
// with it (Store::WithPrefix).
std::string HealthKeyPrefix(const std::string& job_id);

// One rank's own error, as it reported it.
struct FailureReport {
  int64_t order = 0;  // 1 = the first failure the store saw
  int rank = -1;
  std::string message;
};

// Records this rank's error in the job's health store: the store's counter
// "failure/count" numbers it, so the first failure in time has order 1 on
// every machine. Best effort: a store that cannot be reached is not an error
// worth more than the one being reported.
absl::Status ReportFailure(Store& health_store, int rank, const std::string& message);
// The failures reported so far, first first (waits at most `timeout` per key).
absl::StatusOr<std::vector<FailureReport>> ReadFailures(Store& health_store, absl::Duration timeout);

// A background thread that writes this rank's heartbeat (a store counter)
// every `interval` and watches the other ranks': a rank whose heartbeat has
// not moved for `timeout` (and that has not said it finished) is reported
// unresponsive through `on_unresponsive`, once. A rank that heartbeats but
// makes no progress (a long evaluation, a hung kernel) is left to the
// communication timeout. When the store itself stops answering for `timeout`
// (a tcp:// store lives in rank 0's process: rank 0 stalled), that is
// reported as rank `store_owner` (-1: unknown).
class HeartbeatMonitor {
 public:
  struct Options {
    std::string store_spec;  // the job's store; the monitor opens its own connection
    std::string job_id;
    int rank = 0;
    int world_size = 1;
    absl::Duration interval = absl::Seconds(3);
    absl::Duration timeout = absl::Seconds(30);
    int store_owner = -1;  // the rank whose process serves the store (tcp://: 0)
    // What this rank was waiting for from its peers when it found one
    // unresponsive ("allreduce of bucket 0 ... over group 1 (dp: ranks 0,
    // 1)"), for the message; empty or unset: nothing said.
    std::function<std::string()> waiting_for;
    // Called on the monitor's thread with the unresponsive rank and why,
    // after the monitor recorded it as this rank's failure.
    std::function<void(int rank, const std::string& why)> on_unresponsive;
  };

  static absl::StatusOr<std::unique_ptr<HeartbeatMonitor>> Start(Options options);
  // Stops the thread; the rank's heartbeat stops.
  ~HeartbeatMonitor();
  // Says this rank finished (its heartbeat stops on purpose) and stops the
  // thread: the others no longer watch it.
  void Finish();

 private:
  explicit HeartbeatMonitor(Options options) : options_(std::move(options)) {}
  void Run();
  void Stop();  // ends the thread and joins it

  Options options_;
  std::unique_ptr<Store> store_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_HEALTH_H_
