#ifndef STRATA_RUNTIME_LAUNCHER_H_
#define STRATA_RUNTIME_LAUNCHER_H_

#include <sys/types.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata {

// What `strata run --nproc N` needs to start its workers.
struct LaunchOptions {
  std::string executable = "/proc/self/exe";
  // Full argv of every worker, argv[0] included (the CLI's own argv minus --nproc).
  std::vector<std::string> argv;
  int nproc = 1;
  // When set: created if missing, and DIR/workerlog.R receives rank R's
  // stdout and stderr, unprefixed, line by line as they arrive.
  std::string log_dir;
  // Rendezvous store handed to workers as STRATA_STORE. Empty: a fresh
  // temporary folder for a Gloo FileStore ("file://DIR"), removed at the end.
  std::string store_spec;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port on master_addr
  // Pins each worker to its own share of the launcher's cores (DeepSpeed's
  // --bind_cores_to_rank): rank R of N gets cores [R*C/N, (R+1)*C/N) of the
  // C it may run on, or core R*C/N when there are fewer cores than ranks;
  // STRATA_NUM_THREADS defaults to the count it got.
  bool bind_cores = false;
  // Called once every worker is reaped after a rank failed, before the
  // temporary store is removed, with the store's spec: the errors the ranks
  // recorded in the store, first in time first (ordered by its counter), as
  // (rank, message). The first is named unless the failed rank the launcher
  // saw first recorded nothing (it died by a signal, or exited before it
  // could): then that rank is the cause and the records its consequences.
  std::function<std::vector<std::pair<int, std::string>>(const std::string& store_spec)> recorded_failures;
  // Added to (or overriding) the launcher's environment in every worker.
  std::vector<std::pair<std::string, std::string>> extra_env;
  // After the first failure (or a SIGINT/SIGTERM to the launcher) the others
  // get SIGTERM, and SIGKILL once this much time has passed.
  absl::Duration grace = absl::Seconds(5);
  // After a SIGTERM to the launcher (a cluster's preemption), forwarded to
  // every worker: the time they have to finish their step and save.
  absl::Duration preemption_grace = absl::Seconds(30);
  // Where the "[rank R] " prefixed lines go (tests point these at files).
  int stdout_fd = STDOUT_FILENO;
  int stderr_fd = STDERR_FILENO;
};

// The cores (from `cores`, the ones the launcher may run on) that rank
// `rank` of `nproc` is bound to under LaunchOptions::bind_cores.
std::vector<int> CoresOfRank(const std::vector<int>& cores, int rank, int nproc);

// How one worker ended.
struct WorkerOutcome {
  int rank = 0;
  pid_t pid = -1;
  int exit_code = -1;           // when it exited; -1 when killed by a signal
  int signal = 0;               // the signal that killed it; 0 when it exited
  std::string last_error_line;  // its last line starting with "error:" (else its last stderr line)
  bool ok() const { return signal == 0 && exit_code == 0; }
  // Exited 128 + SIGTERM/SIGINT/SIGHUP on its own: it stopped cleanly after a
  // stop signal (saving a checkpoint), which is not a failure.
  bool stopped() const { return signal == 0 && (exit_code == 143 || exit_code == 130 || exit_code == 129); }
};

// Everything a caller (or a test) may want to know after the fact.
// "SIGTERM", "SIGSEGV", ...; "signal N" for one without a name.
std::string SignalName(int signo);

struct LaunchReport {
  std::vector<pid_t> pids;             // by rank; every one reaped when LaunchWorkers returns
  std::vector<WorkerOutcome> workers;  // by rank
  int failed_rank = -1;                // the first rank that failed, -1 if none
  int interrupt_signal = 0;            // SIGINT/SIGTERM/SIGHUP the launcher received, 0 if none
  // SIGINT when a Ctrl-C while the workers stopped had them killed at once
  // (a repeated SIGTERM or SIGHUP leaves them their grace), 0 otherwise.
  int killed_at_signal = 0;
  // The other recorded failures after the one named, "rank R: message", in order.
  std::vector<std::string> consequences;
  std::string store_spec;              // what the workers got as STRATA_STORE
  int master_port = 0;                 // what the workers got as STRATA_MASTER_PORT
};

// Starts `nproc` workers (fork + exec of `executable`), each in its own
// process group, with STRATA_RANK, STRATA_WORLD_SIZE, STRATA_LOCAL_RANK,
// STRATA_STORE, STRATA_MASTER_ADDR and STRATA_MASTER_PORT set, stdin from
// /dev/null, and SIGKILL as parent-death signal (no orphans if the launcher
// dies). Relays every line of their stdout/stderr to stdout_fd/stderr_fd as
// "[rank R] line" and waits for all of them.
//
// Returns 0 when every rank exited 0. When a rank exits non-zero or dies by a
// signal, the others get SIGTERM then SIGKILL after `grace`, everything is
// reaped, and the result is an Aborted error "rank R failed (exit C): MSG" or
// "rank R failed (killed by SIGSEGV)[: MSG]" (MSG: that rank's last error
// line). When the launcher receives SIGINT, SIGTERM or SIGHUP it forwards the
// signal, stops the workers the same way and returns 128 + signal; a SIGINT
// while they stop kills them at once, a repeated SIGTERM or SIGHUP does not.
// Setup problems (bad options, log_dir not creatable, executable not
// runnable) are errors too, and leave no worker behind.
//
// Call from the main thread (the parent-death signal follows the thread that
// forks), one launch at a time per process; it installs its own handlers for
// SIGINT, SIGTERM, SIGHUP, SIGCHLD and SIGPIPE and restores the old ones.
// Refuses to run inside a worker (STRATA_RANK set), so --nproc cannot nest.
absl::StatusOr<int> LaunchWorkers(const LaunchOptions& options, LaunchReport* report = nullptr);

// argv without the flag `name` in any of its spellings ("--name=V",
// "--name V", "-name=V", "-name V"; with takes_value=false "--name",
// "--noname", "--name=V"); arguments after "--" are left alone.
std::vector<std::string> ArgvWithoutFlag(const std::vector<std::string>& argv, std::string_view name,
                                         bool takes_value = true);

}  // namespace strata

#endif  // STRATA_RUNTIME_LAUNCHER_H_
