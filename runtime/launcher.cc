#include "runtime/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <optional>
#include <set>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/worker_env.h"

extern char** environ;

namespace strata {

std::string SignalName(int signo) {
  if (const char* abbrev = sigabbrev_np(signo)) return absl::StrCat("SIG", abbrev);
  return absl::StrCat("signal ", signo);
}

namespace {

// A line the tool writes while all is well: progress ("step 12/300 epoch 1
// loss ..."), evaluations, notes and the end of a run's summary.
bool IsStatusLine(absl::string_view line) {
  for (absl::string_view prefix : {"step ", "eval ", "note:", "done", "final ", "warning:"}) {
    if (absl::StartsWith(line, prefix)) return true;
  }
  return false;
}

// A line longer than this is relayed in pieces rather than buffered without bound.
constexpr size_t kMaxLineBytes = 1 << 20;
// After the last worker is reaped, how long its pipes may stay open (held by
// an escaped grandchild) before we stop reading them.
constexpr std::chrono::seconds kDrainTimeout(2);
// Upper bound on one poll() so a lost wake-up can never stall the loop.
constexpr int kMaxPollMs = 500;
// A killed process closes its sockets before it becomes reapable, so under
// load a peer's "connection lost" exit can be reaped first: a failure
// without a signal waits this long for a crash to show before it is named.
constexpr auto kCauseGrace = std::chrono::milliseconds(300);
// When every failure so far says it lost a peer and the peers still run,
// the peer that went first may only be slow to become reapable (a loaded
// machine: its threads are still being torn down): wait this much longer
// for it before naming a "connection lost".
constexpr auto kLostPeerGrace = std::chrono::seconds(3);
// A rank's `error:` line waits this long for the job's end, whose one line
// says it (folding ranks that failed alike), before it is relayed as it
// came: a failure every rank meets at start (a checkpoint that does not fit
// the program) is one line, a rank failing mid-run still shows at once.
constexpr auto kErrorHold = std::chrono::seconds(1);
// A rank's held `error:` lines the job's line notes at most, then how many more.
constexpr int kHeldNotes = 3;

// Whether a rank's error says it failed because a peer went away (the
// communicators' "connection lost"), not for a reason of its own.
bool LostAPeer(absl::string_view error) { return absl::StrContains(error, kConnectionLost); }

// Deadlines follow the monotonic clock, immune to wall-clock steps.
using Clock = std::chrono::steady_clock;

// A poll() timeout reaching `deadline` (rounded up, never negative).
int MillisecondsUntil(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, kMaxPollMs));
}

// The self-pipe: signal handlers only write the signal number into it.
int g_signal_pipe_write = -1;
std::atomic<bool> g_launch_active{false};

void OnSignal(int signo) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(signo);
  ssize_t ignored = write(g_signal_pipe_write, &byte, 1);
  (void)ignored;
  errno = saved;
}

std::string ErrnoText(int err) { return strerror(err); }

// Writes all of `data`, waiting out EINTR and EAGAIN; false when the fd is gone (EPIPE, EBADF...).
bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p = {fd, POLLOUT, 0};
      poll(&p, 1, 100);
    } else {
      return false;
    }
  }
  return true;
}

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Installs our handlers for the launch and puts the old ones back afterwards.
class SignalHandlers {
 public:
  static constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

  absl::Status Install() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      return absl::InternalError(absl::StrCat("launcher: pipe2 failed: ", ErrnoText(errno)));
    }
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    g_signal_pipe_write = write_fd_;
    struct sigaction sa = {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    // SA_RESTART keeps other threads' system calls from failing with EINTR.
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (int signo : kHandled) sigaction(signo, &sa, &old_[signo]);
    // A closed stdout of the launcher becomes EPIPE, not a silent death.
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &old_[SIGPIPE]);
    installed_ = true;
    return absl::OkStatus();
  }

  ~SignalHandlers() {
    if (installed_) {
      for (int signo : kHandled) sigaction(signo, &old_[signo], nullptr);
      sigaction(SIGPIPE, &old_[SIGPIPE], nullptr);
    }
    g_signal_pipe_write = -1;
    CloseFd(read_fd_);
    CloseFd(write_fd_);
  }

  int read_fd() const { return read_fd_; }

 private:
  bool installed_ = false;
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct sigaction old_[NSIG] = {};
};

// A free TCP port on `addr` (any address when it is not numeric IPv4).
absl::StatusOr<int> PickFreePort(const std::string& addr) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("launcher: socket failed: ", ErrnoText(errno)));
  sockaddr_in sin = {};
  sin.sin_family = AF_INET;
  sin.sin_port = 0;
  if (inet_pton(AF_INET, addr.c_str(), &sin.sin_addr) != 1) sin.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(sin);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len) != 0) {
    int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("launcher: cannot find a free port on ", addr, ": ", ErrnoText(err)));
  }
  close(fd);
  return ntohs(sin.sin_port);
}

// One of a worker's two output pipes.
struct Stream {
  int fd = -1;
  bool is_stderr = false;
  std::string partial;  // bytes after the last newline
};

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
  int log_fd = -1;
  std::string last_error_line;   // last line starting with "error:"
  // Its stderr lines not relayed yet, in order: from its first `error:`
  // line held (kErrorHold), every stderr line after it waits behind it.
  struct HeldLine {
    Clock::time_point when;
    std::string line;
    bool error;
  };
  std::deque<HeldLine> held;
  std::string last_stderr_line;  // last non-blank stderr line
  // Stopped (SIGSTOP, a debugger) when the job was to stop, so killed at
  // once: it could not finish its step or save, and its peers' errors about
  // it are consequences.
  bool killed_while_stopped = false;
  WorkerOutcome outcome;
};

class Launcher {
 public:
  explicit Launcher(const LaunchOptions& options) : options_(options) {}

  ~Launcher() {
    // Whatever path we leave by, no worker survives and the store folder goes.
    KillAll(SIGKILL);
    for (Worker& w : workers_) {
      if (w.running) {
        int status;
        while (waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
        }
        w.running = false;
      }
      CloseFd(w.out.fd);
      CloseFd(w.err.fd);
      CloseFd(w.log_fd);
    }
    CloseFd(devnull_);
    if (!temp_store_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(temp_store_dir_, ec);
    }
  }

  absl::StatusOr<int> Run(LaunchReport* report) {
    absl::Status status = Setup();
    if (status.ok()) status = SpawnAll();
    absl::StatusOr<int> result = status.ok() ? Supervise() : absl::StatusOr<int>(status);
    if (report != nullptr) FillReport(*report);
    return result;
  }

 private:
  absl::Status Setup() {
    const LaunchOptions& o = options_;
    if (o.nproc < 1) return absl::InvalidArgumentError(absl::StrCat("--nproc must be >= 1, got ", o.nproc));
    if (o.executable.empty()) return absl::InvalidArgumentError("launcher: no executable given");
    if (o.grace < absl::ZeroDuration()) return absl::InvalidArgumentError("launcher: grace must be >= 0");
    if (o.master_port < 0 || o.master_port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("launcher: master port ", o.master_port, " is not in 0..65535"));
    }
    if (const char* rank = std::getenv(kEnvRank)) {
      return absl::FailedPreconditionError(absl::StrCat("this process is already worker ", rank,
                                                        " of a strata launcher (", kEnvRank,
                                                        " is set): --nproc cannot be nested"));
    }
    devnull_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull_ < 0) return absl::InternalError(absl::StrCat("launcher: cannot open /dev/null: ", ErrnoText(errno)));

    if (!o.store_spec.empty()) {
      store_spec_ = o.store_spec;
    } else {
      // A fresh folder this process holds a lock on for its life, so a later
      // run removes it if this launcher is SIGKILLed (and removes such
      // leftovers of earlier runs now).
      absl::StatusOr<std::string> spec = MakeTempFileStoreSpec();
      if (!spec.ok()) return absl::InternalError(absl::StrCat("launcher: ", spec.status().message()));
      store_spec_ = *spec;
      temp_store_dir_ = std::string(absl::StripPrefix(store_spec_, "file://"));
    }
    master_port_ = o.master_port;
    if (master_port_ == 0) {
      auto port = PickFreePort(o.master_addr);
      if (!port.ok()) return port.status();
      master_port_ = *port;
    }
    workers_.resize(o.nproc);
    if (!o.log_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o.log_dir, ec);
      if (ec) return absl::InvalidArgumentError(absl::StrCat("--log_dir ", o.log_dir, ": ", ec.message()));
      for (int r = 0; r < o.nproc; ++r) {
        std::string path = LogPath(r);
        workers_[r].log_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (workers_[r].log_fd < 0) {
          return absl::InvalidArgumentError(absl::StrCat("--log_dir: cannot write ", path, ": ", ErrnoText(errno)));
        }
      }
    }
    // Everything already buffered by the caller goes out before the workers' lines.
    std::fflush(nullptr);
    return handlers_.Install();
  }

  std::string LogPath(int rank) const {
    return absl::StrCat(options_.log_dir, options_.log_dir.back() == '/' ? "" : "/", "workerlog.", rank);
  }

  // The launcher's environment minus the names we set, plus ours for `rank`.
  // The cores this process may run on, in increasing order.
  static std::vector<int> AllowedCores() {
    std::vector<int> cores;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) cores.push_back(c);
      }
    }
    return cores;
  }

  std::vector<std::string> WorkerEnvironment(int rank) const {
    std::vector<std::pair<std::string, std::string>> ours = {
        {kEnvRank, absl::StrCat(rank)},         {kEnvWorldSize, absl::StrCat(options_.nproc)},
        {kEnvLocalRank, absl::StrCat(rank)},    {kEnvStore, store_spec_},
        {kEnvMasterAddr, options_.master_addr}, {kEnvMasterPort, absl::StrCat(master_port_)},
    };
    for (const auto& kv : options_.extra_env) ours.push_back(kv);
    std::set<std::string> names;
    for (const auto& kv : ours) names.insert(kv.first);
    std::vector<std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      absl::string_view entry(*e);
      size_t eq = entry.find('=');
      if (eq != absl::string_view::npos && names.count(std::string(entry.substr(0, eq)))) continue;
      env.emplace_back(entry);
    }
    // Later duplicates (extra_env) win: keep only the last value of each name.
    std::vector<std::string> tail;
    std::set<std::string> seen;
    for (auto it = ours.rbegin(); it != ours.rend(); ++it) {
      if (seen.insert(it->first).second) tail.push_back(absl::StrCat(it->first, "=", it->second));
    }
    env.insert(env.end(), tail.rbegin(), tail.rend());
    return env;
  }

  absl::Status SpawnAll() {
    std::vector<std::string> args = options_.argv;
    if (args.empty()) args.push_back(options_.executable);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t launcher_pid = getpid();
    for (int r = 0; r < options_.nproc; ++r) {
      // Everything the child touches is prepared before fork: after fork only
      // async-signal-safe calls are allowed (the caller may have threads).
      std::vector<std::string> env_strings = WorkerEnvironment(r);
      cpu_set_t cpus;
      CPU_ZERO(&cpus);
      if (options_.bind_cores) {
        const std::vector<int> mine = CoresOfRank(AllowedCores(), r, options_.nproc);
        for (int c : mine) CPU_SET(c, &cpus);
        if (std::getenv("STRATA_NUM_THREADS") == nullptr) {
          env_strings.push_back(absl::StrCat("STRATA_NUM_THREADS=", mine.size()));
        }
      }
      std::vector<char*> envp;
      for (std::string& e : env_strings) envp.push_back(e.data());
      envp.push_back(nullptr);
      int out[2], err[2], exec_err[2];
      if (pipe2(out, O_CLOEXEC) != 0) return SpawnError(r, "pipe2", errno);
      if (pipe2(err, O_CLOEXEC) != 0) {
        int e = errno;
        close(out[0]);
        close(out[1]);
        return SpawnError(r, "pipe2", e);
      }
      if (pipe2(exec_err, O_CLOEXEC) != 0) {
        int e = errno;
        for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
        return SpawnError(r, "pipe2", e);
      }
      Worker& w = workers_[r];
      w.rank = r;
      w.out.fd = out[0];
      w.err.fd = err[0];
      w.err.is_stderr = true;
      // Signals stay blocked across fork so our handlers cannot run in the
      // child (they would write into the launcher's self-pipe) before exec.
      sigset_t all, saved_mask;
      sigfillset(&all);
      pthread_sigmask(SIG_SETMASK, &all, &saved_mask);
      pid_t pid = fork();
      if (pid == 0) {
        setpgid(0, 0);
        if (options_.bind_cores) sched_setaffinity(0, sizeof(cpus), &cpus);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != launcher_pid) _exit(127);  // the launcher died before prctl
        dup2(devnull_, STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        struct sigaction dfl = {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) sigaction(signo, &dfl, nullptr);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, nullptr);
        execve(options_.executable.c_str(), argv.data(), envp.data());
        int e = errno;
        ssize_t ignored = write(exec_err[1], &e, sizeof(e));
        (void)ignored;
        _exit(127);
      }
      int fork_errno = errno;
      pthread_sigmask(SIG_SETMASK, &saved_mask, nullptr);
      close(out[1]);
      close(err[1]);
      close(exec_err[1]);
      if (pid < 0) {
        close(exec_err[0]);
        return SpawnError(r, "fork", fork_errno);
      }
      // Both sides set the group, so a kill(-pid) right after fork cannot miss.
      setpgid(pid, pid);
      w.pid = pid;
      w.running = true;
      w.outcome.rank = r;
      w.outcome.pid = pid;
      fcntl(w.out.fd, F_SETFL, O_NONBLOCK);
      fcntl(w.err.fd, F_SETFL, O_NONBLOCK);
      // Blocks until exec succeeds (EOF from O_CLOEXEC) or reports its errno.
      int exec_errno = 0;
      ssize_t n;
      while ((n = read(exec_err[0], &exec_errno, sizeof(exec_errno))) < 0 && errno == EINTR) {
      }
      close(exec_err[0]);
      if (n == sizeof(exec_errno)) {
        return absl::InvalidArgumentError(absl::StrCat("launcher: cannot execute ", options_.executable, " for rank ",
                                                       r, ": ", ErrnoText(exec_errno)));
      }
    }
    return absl::OkStatus();
  }

  absl::Status SpawnError(int rank, const char* what, int err) {
    return absl::InternalError(absl::StrCat("launcher: ", what, " failed starting rank ", rank, ": ", ErrnoText(err)));
  }

  void KillAll(int signo) {
    for (Worker& w : workers_) {
      if (!w.running) continue;
      // The group takes the worker's own children along; the direct kill
      // covers a worker that left its group.
      kill(-w.pid, signo);
      kill(w.pid, signo);
      // A stopped worker (SIGSTOP, a debugger) cannot act on SIGTERM: waiting
      // out the grace for it would only delay the job's end.
      if (signo != SIGKILL && IsStopped(w.pid)) {
        kill(-w.pid, SIGKILL);
        kill(w.pid, SIGKILL);
        w.killed_while_stopped = true;
      }
    }
  }

  // Whether a signal the launcher did not send killed a worker: one it never
  // sends (SIGSEGV, SIGABRT, ...), or a SIGKILL before it sent any (the
  // kernel's OOM killer). A crash, even while the job stops.
  bool KilledByAnotherHand(int signo) const {
    if (signo == SIGKILL) return !killed_;
    return signo != 0 && signo != SIGTERM && signo != SIGINT && signo != SIGHUP;
  }

  // Whether /proc/PID/stat says the process is stopped ('T').
  static bool IsStopped(pid_t pid) {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    if (!std::getline(stat, line)) return false;
    const size_t paren = line.rfind(')');  // the command name may hold spaces and parentheses
    // 'T' stopped by a signal, 't' stopped by a debugger.
    return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'T' || line[paren + 2] == 't');
  }

  void BeginStop(int signo) {
    if (stopping_) return;
    stopping_ = true;
    // A SIGTERM to the launcher is a preemption: the workers finish their step and save.
    const bool preempted = signo == SIGTERM && interrupt_signal_ == SIGTERM && failed_rank_ < 0;
    kill_deadline_ = Clock::now() + absl::ToChronoNanoseconds(preempted ? options_.preemption_grace : options_.grace);
    KillAll(signo);
  }

  void EmitLine(Worker& w, const Stream& s, absl::string_view line) {
    if (w.log_fd >= 0) WriteAll(w.log_fd, absl::StrCat(line, "\n"));
    absl::string_view trimmed = absl::StripAsciiWhitespace(line);
    // A rank's error waits for the job's one error line (kErrorHold), and
    // its stderr lines after it wait behind it.
    const bool error = s.is_stderr && absl::StartsWith(trimmed, "error:");
    const bool hold = s.is_stderr && (error || !w.held.empty());
    if (hold) w.held.push_back({Clock::now(), std::string(line), error});
    int& dest = s.is_stderr ? stderr_fd_ : stdout_fd_;
    if (!hold) RelayLine(dest, w, line);
    if (absl::StartsWith(trimmed, "error:")) w.last_error_line = std::string(trimmed);
    if (s.is_stderr && !trimmed.empty()) w.last_stderr_line = std::string(trimmed);
  }

  // "[rank R] LINE" to `dest` (-1 once it is gone).
  static void RelayLine(int& dest, const Worker& w, absl::string_view line) {
    if (dest >= 0 && !WriteAll(dest, absl::StrCat("[rank ", w.rank, "] ", line, "\n"))) dest = -1;
  }

  // "rank R: TEXT" of an `error:` line (or of a store's record, "rank R: TEXT"), as a note says it.
  static std::string ErrorNote(const Worker& w, absl::string_view line) {
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumePrefix(&line, "error:");
    return absl::StrCat("rank ", w.rank, ": ", WithoutRankPrefix(absl::StripLeadingAsciiWhitespace(line)));
  }

  // Relays a rank's held lines in order, up to the first `error:` line not
  // yet due (all: every one). A rank that has exited failing keeps its
  // lines for the job's line, whose end is near (the cause grace, the stop).
  void RelayHeldLines(bool all) {
    const Clock::time_point now = Clock::now();
    for (Worker& w : workers_) {
      if (!all && !w.running && !w.outcome.ok()) continue;
      while (!w.held.empty() && (all || !w.held.front().error || now - w.held.front().when >= kErrorHold)) {
        const Worker::HeldLine& h = w.held.front();
        RelayLine(stderr_fd_, w, h.line);
        if (h.error) relayed_errors_.insert(ErrorNote(w, h.line));
        w.held.pop_front();
      }
    }
  }

  // When the next held line is due; none when none can be.
  std::optional<Clock::time_point> NextHeldLineDue() const {
    std::optional<Clock::time_point> next;
    for (const Worker& w : workers_) {
      if (w.held.empty() || (!w.running && !w.outcome.ok())) continue;
      const Clock::time_point due = w.held.front().when + kErrorHold;
      if (!next || due < *next) next = due;
    }
    return next;
  }

  // Reads what is there; relays complete lines; at EOF relays the rest and closes.
  void ReadStream(Worker& w, Stream& s) {
    char buf[65536];
    while (s.fd >= 0) {
      ssize_t n = read(s.fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        FlushStream(w, s);
        return;
      }
      s.partial.append(buf, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
        EmitLine(w, s, absl::string_view(s.partial).substr(start, nl - start));
      }
      s.partial.erase(0, start);
      if (s.partial.size() >= kMaxLineBytes) {
        EmitLine(w, s, s.partial);
        s.partial.clear();
      }
    }
  }

  void FlushStream(Worker& w, Stream& s) {
    if (!s.partial.empty()) EmitLine(w, s, s.partial);
    s.partial.clear();
    CloseFd(s.fd);
  }

  // Reaps the workers that have exited; returns the ranks that failed on their own.
  std::vector<int> Reap() {
    std::vector<int> failed;
    for (Worker& w : workers_) {
      if (!w.running) continue;
      siginfo_t info = {};
      // WNOWAIT keeps the zombie (and so its pid and group id) until its
      // group is killed, so the kill can never hit a recycled id.
      if (waitid(P_PID, w.pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) continue;
      kill(-w.pid, SIGKILL);
      int status = 0;
      while (waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
      }
      w.running = false;
      if (WIFSIGNALED(status)) {
        w.outcome.signal = WTERMSIG(status);
        w.outcome.exit_code = -1;
      } else {
        w.outcome.exit_code = WEXITSTATUS(status);
      }
      // While stopping, a worker that did not exit cleanly or stop after its
      // signal (its save failed, say) is still a failure, unless the
      // launcher had to kill it.
      const bool clean = w.outcome.ok() || w.outcome.stopped();
      if (w.killed_while_stopped && w.outcome.signal == SIGKILL) {
        // It is the cause, however its peers failed on losing it.
        if (w.last_error_line.empty()) {
          w.last_error_line = "it was stopped (SIGSTOP, or held by a debugger) when the job was to stop, so it "
                              "could not finish its step or save and was killed";
        }
        failed.push_back(w.rank);
      } else if (!clean && (!stopping_ || (!killed_ && w.outcome.signal == 0 && interrupt_signal_ != 0) ||
                            KilledByAnotherHand(w.outcome.signal))) {
        failed.push_back(w.rank);
      }
    }
    return failed;
  }

  absl::StatusOr<int> Supervise() {
    stdout_fd_ = options_.stdout_fd;
    stderr_fd_ = options_.stderr_fd;
    std::optional<Clock::time_point> drain_deadline;
    std::vector<int> pending_failed;  // failed, the cause not yet chosen
    std::optional<Clock::time_point> decide_at;
    while (true) {
      bool any_running = std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
      if (!any_running && !drain_deadline) drain_deadline = Clock::now() + kDrainTimeout;
      std::vector<pollfd> fds = {{handlers_.read_fd(), POLLIN, 0}};
      std::vector<std::pair<Worker*, Stream*>> streams;
      for (Worker& w : workers_) {
        for (Stream* s : {&w.out, &w.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.emplace_back(&w, s);
        }
      }
      if (!any_running && streams.empty()) break;
      if (drain_deadline && Clock::now() >= *drain_deadline) {
        for (auto& [w, s] : streams) FlushStream(*w, *s);
        break;
      }
      int timeout_ms = kMaxPollMs;
      if (stopping_ && !killed_) timeout_ms = std::min(timeout_ms, MillisecondsUntil(kill_deadline_));
      if (drain_deadline) timeout_ms = std::min(timeout_ms, MillisecondsUntil(*drain_deadline));
      if (decide_at) timeout_ms = std::min(timeout_ms, MillisecondsUntil(*decide_at));
      if (auto due = NextHeldLineDue()) timeout_ms = std::min(timeout_ms, MillisecondsUntil(*due));
      int ready = poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) {
        BeginStop(SIGKILL);
        return absl::InternalError(absl::StrCat("launcher: poll failed: ", ErrnoText(errno)));
      }
      HandleSignals();
      for (size_t i = 1; ready > 0 && i < fds.size(); ++i) {
        if (fds[i].revents != 0) ReadStream(*streams[i - 1].first, *streams[i - 1].second);
      }
      RelayHeldLines(false);
      std::vector<int> failed = Reap();
      if (failed_rank_ < 0 && !failed.empty()) {
        pending_failed.insert(pending_failed.end(), failed.begin(), failed.end());
        if (!decide_at) decide_at = Clock::now() + kCauseGrace;
      }
      if (failed_rank_ < 0 && !pending_failed.empty()) {
        // Of ranks found dead together, a crash is the likelier root cause than
        // a peer's error about the connection the crash broke; so is any exit
        // that does not say it lost a peer.
        auto by_signal = std::find_if(pending_failed.begin(), pending_failed.end(),
                                      [&](int r) { return workers_[r].outcome.signal != 0; });
        const bool others_running =
            std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
        auto cause = std::find_if(pending_failed.begin(), pending_failed.end(),
                                  [&](int r) { return !LostAPeer(workers_[r].last_error_line); });
        if (by_signal == pending_failed.end() && cause == pending_failed.end() && others_running &&
            !lost_peer_grace_ && Clock::now() >= *decide_at) {
          lost_peer_grace_ = true;
          decide_at = *decide_at - kCauseGrace + kLostPeerGrace;
        }
        if (by_signal != pending_failed.end() || !others_running || Clock::now() >= *decide_at) {
          failed_rank_ = by_signal != pending_failed.end() ? *by_signal
                         : cause != pending_failed.end()   ? *cause
                                                           : pending_failed.front();
          decide_at.reset();
          BeginStop(SIGTERM);
        }
      }
      if (stopping_ && !killed_ && Clock::now() >= kill_deadline_) {
        KillAll(SIGKILL);
        killed_ = true;
      }
    }
    for (Worker& w : workers_) {
      // Without an error line, the last stderr line may say why (an abort's
      // "terminate called ..."); the tool's own progress and notes do not (a
      // rank killed by SIGKILL was named with a stale "step 198/3000 ...").
      const bool says_why = !IsStatusLine(w.last_stderr_line);
      w.outcome.last_error_line =
          !w.last_error_line.empty() ? w.last_error_line : says_why ? w.last_stderr_line : std::string();
    }
    if (failed_rank_ >= 0) {
      // The first failure in time, as the ranks recorded it in the store,
      // beats the first exit the launcher saw (often a peer's "connection
      // lost" caused by it).
      std::vector<std::pair<int, std::string>> records;
      if (options_.recorded_failures) records = options_.recorded_failures(store_spec_);
      // But not a record of a lost peer over a rank that exited for a reason
      // of its own without recording it (a crash, an injected fault): the
      // record is the consequence.
      const bool seen_recorded = std::any_of(records.begin(), records.end(),
                                             [&](const auto& r) { return r.first == failed_rank_; });
      const bool record_is_consequence = !records.empty() && LostAPeer(records.front().second) &&
                                         !LostAPeer(workers_[failed_rank_].outcome.last_error_line);
      std::string message;
      if (seen_recorded && !record_is_consequence && records.front().first >= 0 &&
          records.front().first < static_cast<int>(workers_.size())) {
        failed_rank_ = records.front().first;
        message = records.front().second;
        records.erase(records.begin());
      }
      for (const auto& [rank, text] : records) consequences_.push_back(text);
      // The errors not relayed yet, which the store did not record (a
      // tcp:// store goes with rank 0) or which came before a rank's last
      // (the one its failure names), each a note "rank R: ..." (the first
      // kHeldNotes of a rank, then how many more); the rank's other held
      // lines go out as they came. An error relayed already is no note.
      const std::string named_note = ErrorNote(
          workers_[failed_rank_], message.empty() ? workers_[failed_rank_].outcome.last_error_line : message);
      std::set<std::string> noted(consequences_.begin(), consequences_.end());
      for (Worker& w : workers_) {
        int added = 0, more = 0;
        for (const Worker::HeldLine& h : w.held) {
          if (!h.error) {
            RelayLine(stderr_fd_, w, h.line);
            continue;
          }
          std::string note = ErrorNote(w, h.line);
          if (note == named_note || noted.count(note) > 0) continue;
          if (added >= kHeldNotes) {
            ++more;
            continue;
          }
          noted.insert(note);
          consequences_.push_back(std::move(note));
          ++added;
        }
        if (more > 0) {
          consequences_.push_back(absl::StrCat("rank ", w.rank, ": ", more, " more error line", more == 1 ? "" : "s",
                                               options_.log_dir.empty() ? "" : absl::StrCat(" (", LogPath(w.rank), ")")));
        }
        w.held.clear();
      }
      // What was relayed as it came is said once.
      consequences_.erase(std::remove_if(consequences_.begin(), consequences_.end(),
                                         [&](const std::string& c) { return relayed_errors_.count(c) > 0; }),
                          consequences_.end());
      return absl::AbortedError(FoldAlike(FailureMessage(workers_[failed_rank_], message), named_note));
    }
    // No failure names them: the lines still held go out as they came.
    RelayHeldLines(true);
    // A stop signal (to the launcher, or to one worker, which every rank
    // then honours): 128 + that signal, as a process it stopped; unless it
    // came too late to stop anything (during the last evaluation or save),
    // every rank ending its run with 0, as one process then does.
    const bool all_done = std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.outcome.ok(); });
    if (interrupt_signal_ != 0 && !all_done) return 128 + interrupt_signal_;
    for (const Worker& w : workers_) {
      if (w.outcome.stopped()) return w.outcome.exit_code;
    }
    return 0;
  }

  void HandleSignals() {
    unsigned char buf[64];
    ssize_t n;
    while ((n = read(handlers_.read_fd(), buf, sizeof(buf))) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        int signo = buf[i];
        if (signo == SIGCHLD) continue;  // only a wake-up; Reap() looks
        if (interrupt_signal_ == 0) interrupt_signal_ = signo;
        if (!stopping_) {
          // Forward what we got (Ctrl-C stays SIGINT, so workers can tell).
          BeginStop(signo);
        } else if (!killed_ && signo == SIGINT) {
          // A Ctrl-C while the job stops means now. A repeated SIGTERM or
          // SIGHUP does not: GNU `timeout` signals the launcher and then its
          // process group, and schedulers repeat their notice; the stop and
          // its checkpoint go on within their grace.
          KillAll(SIGKILL);
          killed_ = true;
          killed_at_signal_ = signo;
        }
      }
    }
  }

  // The failure message, with the other ranks whose error says the same as
  // the failed rank's (`named`, "rank R: TEXT") but for its rank named in it
  // instead of in a note each: "...; ranks 1, 2 failed alike".
  std::string FoldAlike(std::string failure, const std::string& named) {
    const absl::string_view own = WithoutRankPrefix(named);
    if (own.empty()) return failure;
    std::vector<int> alike;
    std::vector<std::string> rest;
    for (const std::string& c : consequences_) {
      int rank;
      if (WithoutRankPrefix(c, &rank) != own || rank < 0) {
        rest.push_back(c);
      } else if (rank != failed_rank_ && !absl::c_linear_search(alike, rank)) {
        alike.push_back(rank);  // (the failed rank's own record again says nothing new)
      }
    }
    consequences_ = std::move(rest);
    if (alike.empty()) return failure;
    return absl::StrCat(failure, "; ", alike.size() == 1 ? "rank " : "ranks ", absl::StrJoin(alike, ", "),
                        " failed alike");
  }

  // "rank R: TEXT" -> TEXT (and R); anything else as it is (and -1).
  static absl::string_view WithoutRankPrefix(absl::string_view text, int* rank = nullptr) {
    if (rank != nullptr) *rank = -1;
    absl::string_view rest = text;
    if (!absl::ConsumePrefix(&rest, "rank ")) return text;
    const size_t colon = rest.find(": ");
    int r;
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, colon), &r)) return text;
    if (rank != nullptr) *rank = r;
    return rest.substr(colon + 2);
  }

  // "rank R failed (exit C): MESSAGE (log: ...)"; MESSAGE is the rank's last
  // error line unless given.
  std::string FailureMessage(const Worker& w, const std::string& message = "") const {
    const WorkerOutcome& o = w.outcome;
    std::string how = o.signal != 0    ? absl::StrCat("killed by ", SignalName(o.signal))
                      : o.exit_code >= 0 ? absl::StrCat("exit ", o.exit_code)
                                         : std::string("stopped");
    absl::string_view line = message.empty() ? absl::string_view(o.last_error_line) : absl::string_view(message);
    absl::ConsumePrefix(&line, "error:");
    line = absl::StripLeadingAsciiWhitespace(line);
    std::string msg = absl::StrCat("rank ", w.rank, " failed (", how, ")");
    if (!line.empty()) absl::StrAppend(&msg, ": ", line);
    if (!options_.log_dir.empty()) absl::StrAppend(&msg, " (log: ", LogPath(w.rank), ")");
    return msg;
  }

  void FillReport(LaunchReport& report) const {
    report = LaunchReport();
    for (const Worker& w : workers_) {
      if (w.pid < 0) continue;
      report.pids.push_back(w.pid);
      report.workers.push_back(w.outcome);
    }
    report.failed_rank = failed_rank_;
    report.interrupt_signal = interrupt_signal_;
    report.killed_at_signal = killed_at_signal_;
    report.consequences = consequences_;
    report.store_spec = store_spec_;
    report.master_port = master_port_;
  }

  const LaunchOptions& options_;
  SignalHandlers handlers_;
  std::vector<Worker> workers_;
  int devnull_ = -1;
  std::string temp_store_dir_;
  std::string store_spec_;
  std::vector<std::string> consequences_;
  int master_port_ = 0;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  bool stopping_ = false;
  bool killed_ = false;
  int killed_at_signal_ = 0;  // the signal that had the workers killed at once while they stopped
  std::set<std::string> relayed_errors_;  // the `error:` lines relayed as they came, as notes would say them
  bool lost_peer_grace_ = false;  // the wait for a lost peer to show has been extended once
  Clock::time_point kill_deadline_;
  int failed_rank_ = -1;
  int interrupt_signal_ = 0;
};

}  // namespace

std::vector<int> CoresOfRank(const std::vector<int>& cores, int rank, int nproc) {
  const int64_t c = static_cast<int64_t>(cores.size());
  if (c == 0 || nproc < 1 || rank < 0 || rank >= nproc) return {};
  if (c < nproc) return {cores[rank * c / nproc]};
  return std::vector<int>(cores.begin() + rank * c / nproc, cores.begin() + (rank + 1) * c / nproc);
}

absl::StatusOr<int> LaunchWorkers(const LaunchOptions& options, LaunchReport* report) {
  if (g_launch_active.exchange(true)) {
    return absl::FailedPreconditionError("launcher: another LaunchWorkers is already running in this process");
  }
  absl::StatusOr<int> result;
  {
    Launcher launcher(options);
    result = launcher.Run(report);
  }
  g_launch_active.store(false);
  return result;
}

std::vector<std::string> ArgvWithoutFlag(const std::vector<std::string>& argv, std::string_view name,
                                         bool takes_value) {
  const absl::string_view flag(name.data(), name.size());
  std::vector<std::string> result;
  for (size_t i = 0; i < argv.size(); ++i) {
    absl::string_view arg = argv[i];
    if (i > 0 && arg == "--") {
      result.insert(result.end(), argv.begin() + i, argv.end());
      break;
    }
    absl::string_view body = arg;
    bool dashed = i > 0 && (absl::ConsumePrefix(&body, "--") || absl::ConsumePrefix(&body, "-"));
    if (dashed) {
      absl::string_view key = body.substr(0, body.find('='));
      bool has_value = key.size() < body.size();
      if (key == flag) {
        // "--name V" also swallows the value that follows.
        if (takes_value && !has_value && i + 1 < argv.size()) ++i;
        continue;
      }
      if (!takes_value && !has_value && absl::StartsWith(key, "no") && key.substr(2) == flag) continue;
    }
    result.push_back(argv[i]);
  }
  return result;
}

}  // namespace strata
