#include "runtime/launcher.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string FakeWorkerPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return "runtime/fake_worker";
  return absl::StrCat(srcdir, "/", workspace ? workspace : "strata", "/runtime/fake_worker");
}

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The state letter /proc/PID/stat gives (R, S, T, Z, ...); 0 when unreadable.
char ProcessState(pid_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : 0;
}

// A dead process: gone, or a zombie waiting for a parent that is not us
// (orphans go to pid 1, which may or may not reap here).
bool ProcessGone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  const char state = ProcessState(pid);
  return state == 0 || state == 'Z';
}

// Every worker the launcher reported is reaped (kill says no such process),
// and the test process has no child left at all.
void ExpectNoProcessLeft(const LaunchReport& report) {
  for (pid_t pid : report.pids) {
    errno = 0;
    EXPECT_EQ(kill(pid, 0), -1) << "worker pid " << pid << " still exists";
    EXPECT_EQ(errno, ESRCH) << "worker pid " << pid;
  }
  int status;
  EXPECT_EQ(waitpid(-1, &status, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// Polls `path` until `done(contents)` holds; false after `timeout`.
bool WaitForFile(const std::string& path, const std::function<bool(const std::string&)>& done,
                 absl::Duration timeout = absl::Seconds(20)) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done(ReadFile(path))) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// The number after the last "[rank R] <key> " in `text`, or -1.
int FindNumber(const std::string& text, int rank, const std::string& key) {
  std::string prefix = absl::StrCat("[rank ", rank, "] ", key, " ");
  int found = -1;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.substr(0, prefix.size()) != prefix) continue;
    int value;
    if (absl::SimpleAtoi(line.substr(prefix.size()), &value)) found = value;
  }
  return found;
}

// The lines of `text` that start with "[rank R] ", prefix removed.
std::vector<std::string> RankLines(const std::string& text, int rank) {
  std::string prefix = absl::StrCat("[rank ", rank, "] ");
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.substr(0, prefix.size()) == prefix) lines.emplace_back(line.substr(prefix.size()));
  }
  return lines;
}

// One launch of fake workers with stdout/stderr captured in files.
class LaunchFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    // Temporary stores land in the test's own folder.
    setenv("TMPDIR", TempDir().c_str(), 1);
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = absl::StrCat(TempDir(), "/", info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    out_path_ = dir_ + "/stdout.txt";
    err_path_ = dir_ + "/stderr.txt";
    out_fd_ = open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    err_fd_ = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    ASSERT_GE(out_fd_, 0);
    ASSERT_GE(err_fd_, 0);
  }
  void TearDown() override {
    close(out_fd_);
    close(err_fd_);
  }

  LaunchOptions Options(int nproc, std::vector<std::string> flags) {
    LaunchOptions o;
    o.executable = FakeWorkerPath();
    o.argv = {"fake_worker"};
    o.argv.insert(o.argv.end(), flags.begin(), flags.end());
    o.nproc = nproc;
    o.stdout_fd = out_fd_;
    o.stderr_fd = err_fd_;
    return o;
  }

  std::string Stdout() const { return ReadFile(out_path_); }
  std::string Stderr() const { return ReadFile(err_path_); }

  // SIGTERM to the launcher, then `crash` to rank 1 while the workers (which
  // ignore the SIGTERM) are still running.
  void CrashWhileStopping(int crash);

  // Under --print_pid, once both ranks of two said "pid P" and "ready":
  // rank `rank`'s pid; -1 (and a failure) when they never did.
  pid_t PidOnceReady(int rank) const {
    if (!WaitForFile(out_path_, [](const std::string& text) {
          return RankLines(text, 0).size() == 2 && RankLines(text, 1).size() == 2;
        })) {
      ADD_FAILURE() << "workers never got ready";
      return -1;
    }
    return FindNumber(Stdout(), rank, "pid");
  }

  std::string dir_, out_path_, err_path_;
  int out_fd_ = -1, err_fd_ = -1;
};

TEST_F(LaunchFixture, PrefixesOutputPerRankAndWritesWorkerLogs) {
  LaunchOptions o = Options(3, {"--lines=3"});
  o.log_dir = dir_ + "/logs/nested";
  LaunchReport report;
  auto result = LaunchWorkers(o, &report);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, 0);
  std::string out = Stdout(), err = Stderr();
  for (int r = 0; r < 3; ++r) {
    // Each rank's lines arrive whole and in order, on the stream they were written to.
    std::string s = absl::StrCat(r);
    EXPECT_THAT(RankLines(out, r), ElementsAre("out " + s + " 0", "out " + s + " 1", "out " + s + " 2", "ready"));
    EXPECT_THAT(RankLines(err, r), ElementsAre("err " + s));
    std::string log = ReadFile(absl::StrCat(o.log_dir, "/workerlog.", r));
    EXPECT_THAT(log, HasSubstr(absl::StrCat("out ", r, " 0\nout ", r, " 1\nout ", r, " 2\n")));
    EXPECT_THAT(log, HasSubstr(absl::StrCat("err ", r, "\n")));
    EXPECT_THAT(log, HasSubstr("ready\n"));
    EXPECT_THAT(log, Not(HasSubstr("[rank")));
    EXPECT_THAT(log, Not(HasSubstr(absl::StrCat("out ", (r + 1) % 3))));
    EXPECT_EQ(report.workers[r].exit_code, 0);
    EXPECT_EQ(report.workers[r].signal, 0);
  }
  EXPECT_EQ(report.failed_rank, -1);
  ASSERT_EQ(report.pids.size(), 3u);
  ExpectNoProcessLeft(report);
}

TEST_F(LaunchFixture, WorkersGetRankStoreAndPortInTheirEnvironment) {
  LaunchOptions o = Options(2, {"--print_env"});
  o.extra_env = {{"FAKE_EXTRA", "hello"}};
  LaunchReport report;
  auto result = LaunchWorkers(o, &report);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, 0);
  ASSERT_THAT(report.store_spec, ::testing::StartsWith("file://"));
  EXPECT_GT(report.master_port, 0);
  std::string out = Stdout();
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> lines = RankLines(out, r);
    EXPECT_THAT(lines, ::testing::IsSupersetOf({
                           absl::StrCat("STRATA_RANK=", r),
                           std::string("STRATA_WORLD_SIZE=2"),
                           absl::StrCat("STRATA_LOCAL_RANK=", r),
                           "STRATA_STORE=" + report.store_spec,
                           std::string("STRATA_MASTER_ADDR=127.0.0.1"),
                           absl::StrCat("STRATA_MASTER_PORT=", report.master_port),
                           std::string("FAKE_EXTRA=hello"),
                           std::string("store_exists=1"),
                       }));
  }
  // The temporary FileStore folder is gone once the job is over.
  struct stat st;
  EXPECT_NE(stat(report.store_spec.substr(7).c_str(), &st), 0);
  ExpectNoProcessLeft(report);
}

TEST(CoresOfRankTest, SplitsCoresEvenlyOrSharesThemWhenTooFew) {
  const std::vector<int> four = {0, 1, 2, 3};
  EXPECT_EQ(CoresOfRank(four, 0, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(CoresOfRank(four, 1, 2), (std::vector<int>{2, 3}));
  EXPECT_EQ(CoresOfRank(four, 2, 4), (std::vector<int>{2}));
  EXPECT_EQ(CoresOfRank({0, 1, 2}, 1, 2), (std::vector<int>{1, 2}));
  // Fewer cores than ranks: neighbours share one.
  EXPECT_EQ(CoresOfRank({4, 5}, 0, 4), (std::vector<int>{4}));
  EXPECT_EQ(CoresOfRank({4, 5}, 1, 4), (std::vector<int>{4}));
  EXPECT_EQ(CoresOfRank({4, 5}, 2, 4), (std::vector<int>{5}));
  EXPECT_EQ(CoresOfRank({4, 5}, 3, 4), (std::vector<int>{5}));
  EXPECT_TRUE(CoresOfRank({}, 0, 2).empty());
  EXPECT_TRUE(CoresOfRank(four, 2, 2).empty());
}

TEST_F(LaunchFixture, BoundWorkersRunOnTheirOwnCores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cores;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  }
  const int n = 3;
  LaunchOptions o = Options(n, {"--print_affinity"});
  o.bind_cores = true;
  LaunchReport report;
  auto result = LaunchWorkers(o, &report);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, 0);
  const std::string out = Stdout();
  for (int r = 0; r < n; ++r) {
    const std::vector<int> want = CoresOfRank(cores, r, n);
    EXPECT_THAT(RankLines(out, r), ::testing::IsSupersetOf({absl::StrCat("cores ", absl::StrJoin(want, ",")),
                                                            absl::StrCat("threads ", want.size())}))
        << out;
  }
}

TEST_F(LaunchFixture, GivenStoreSpecIsPassedThroughAndKept) {
  std::string store_dir = dir_ + "/store";
  mkdir(store_dir.c_str(), 0755);
  LaunchOptions o = Options(2, {"--print_env"});
  o.store_spec = "file://" + store_dir;
  o.master_port = 29511;
  LaunchReport report;
  auto result = LaunchWorkers(o, &report);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(RankLines(Stdout(), 1),
              ::testing::IsSupersetOf({"STRATA_STORE=file://" + store_dir, std::string("STRATA_MASTER_PORT=29511")}));
  struct stat st;
  EXPECT_EQ(stat(store_dir.c_str(), &st), 0);
}

TEST_F(LaunchFixture, FailingRankStopsTheOthersAndNamesItsError) {
  LaunchOptions o = Options(3, {"--fail_rank=1", "--exit_code=3", "--error=loss is NaN at step 7", "--sync_dir=" + dir_,
                                "--delay_ms=100", "--hang_all"});
  o.log_dir = dir_ + "/logs";
  LaunchReport report;
  absl::Time start = absl::Now();
  auto result = LaunchWorkers(o, &report);
  absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(result.status().message(),
            absl::StrCat("rank 1 failed (exit 3): loss is NaN at step 7 (log: ", o.log_dir, "/workerlog.1)"));
  // Ranks 0 and 2 hang until stopped; SIGTERM ends them at once, well inside the grace.
  EXPECT_LT(took, absl::Seconds(5)) << took;
  EXPECT_EQ(report.failed_rank, 1);
  EXPECT_EQ(report.workers[1].exit_code, 3);
  EXPECT_EQ(report.workers[0].signal, SIGTERM);
  EXPECT_EQ(report.workers[2].signal, SIGTERM);
  EXPECT_EQ(report.workers[1].last_error_line, "error: loss is NaN at step 7");
  EXPECT_THAT(ReadFile(o.log_dir + "/workerlog.1"), HasSubstr("error: loss is NaN at step 7\n"));
  // The error is the launcher's to say, once: not relayed as it came.
  EXPECT_THAT(Stderr(), Not(HasSubstr("error:")));
  ExpectNoProcessLeft(report);
}

// Every rank failing alike (a checkpoint that does not fit the program) is
// one message naming them, not a line a rank; a rank failing otherwise is
// a note after it.
TEST_F(LaunchFixture, RanksFailingAlikeAreOneMessage) {
  // The tool's errors name their rank ("error: rank R: ..."); folded either way.
  for (const bool prefix : {true, false}) {
    SCOPED_TRACE(prefix);
    ASSERT_EQ(ftruncate(err_fd_, 0), 0);
    std::vector<std::string> flags = {"--fail_all", "--error=--load ck: holds 1 rank file(s)", "--sync_dir=" + dir_};
    if (prefix) flags.push_back("--rank_prefix");
    LaunchOptions o = Options(3, flags);
    o.log_dir = dir_ + "/logs";
    LaunchReport report;
    auto result = LaunchWorkers(o, &report);
    ASSERT_FALSE(result.ok());
    EXPECT_THAT(std::string(result.status().message()),
                ::testing::MatchesRegex(absl::StrCat("rank [0-2] failed \\(exit 1\\): ", prefix ? "rank [0-2]: " : "",
                                                     "--load ck: holds 1 rank file\\(s\\) "
                                                     "\\(log: .*\\); ranks [0-2], [0-2] failed alike")));
    EXPECT_THAT(report.consequences, ElementsAre());
    EXPECT_THAT(Stderr(), Not(HasSubstr("error:")));
    for (int r = 0; r < 3; ++r) {
      EXPECT_THAT(ReadFile(absl::StrCat(o.log_dir, "/workerlog.", r)),
                  HasSubstr(absl::StrCat("error: ", prefix ? absl::StrCat("rank ", r, ": ") : "",
                                         "--load ck: holds 1 rank file(s)\n")));
    }
    ExpectNoProcessLeft(report);
  }
}

// An error the job's end does not follow within a second is relayed as it
// came (a launcher killed later still showed it); an error before a rank's
// last is a note; one no failure names (the rank then exits 0) is relayed
// at the end, not lost.
TEST_F(LaunchFixture, ErrorsNoFailureSaysAreNotLost) {
  {
    LaunchOptions o = Options(2, {"--fail_rank=1", "--first_error=disk full writing ck/step-5",
                                  "--error=cleanup failed", "--error_linger_ms=3000", "--hang_all"});
    LaunchReport report;
    std::string seen_while_running;
    std::thread watcher([&] {
      absl::SleepFor(absl::Milliseconds(2000));  // the error came at about 0; the rank exits at 3 s
      seen_while_running = Stderr();
    });
    auto result = LaunchWorkers(o, &report);
    watcher.join();
    EXPECT_THAT(seen_while_running, HasSubstr("[rank 1] error: disk full writing ck/step-5\n"));
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().message(), "rank 1 failed (exit 1): cleanup failed");
    EXPECT_THAT(report.consequences, ElementsAre());  // shown already
    ExpectNoProcessLeft(report);
  }
  {
    // Many errors before the one named: three notes, then how many more;
    // a line after the error (a hint) goes out after it, not before.
    ASSERT_EQ(ftruncate(err_fd_, 0), 0);
    LaunchOptions o = Options(2, {"--fail_rank=1", "--error_lines=9", "--error=cleanup failed",
                                  "--hint=(did you mean bar?)"});
    LaunchReport report;
    auto result = LaunchWorkers(o, &report);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().message(), "rank 1 failed (exit 1): cleanup failed");
    EXPECT_THAT(report.consequences, ElementsAre("rank 1: bad sample 0", "rank 1: bad sample 1",
                                                 "rank 1: bad sample 2", "rank 1: 6 more error lines"));
    EXPECT_EQ(Stderr(), "[rank 1] (did you mean bar?)\n");
    ExpectNoProcessLeft(report);
  }
  {
    ASSERT_EQ(ftruncate(err_fd_, 0), 0);
    LaunchOptions o = Options(2, {"--fail_rank=1", "--first_error=disk full writing ck/step-5",
                                  "--error=cleanup failed"});
    LaunchReport report;
    auto result = LaunchWorkers(o, &report);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().message(), "rank 1 failed (exit 1): cleanup failed");
    EXPECT_THAT(report.consequences, ElementsAre("rank 1: disk full writing ck/step-5"));
    ExpectNoProcessLeft(report);
  }
  {
    ASSERT_EQ(ftruncate(err_fd_, 0), 0);
    LaunchOptions o =
        Options(2, {"--fail_rank=1", "--exit_code=0", "--error=odd but not fatal", "--hint=(carrying on)"});
    LaunchReport report;
    auto result = LaunchWorkers(o, &report);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(*result, 0);
    EXPECT_EQ(Stderr(), "[rank 1] error: odd but not fatal\n[rank 1] (carrying on)\n");
    ExpectNoProcessLeft(report);
  }
}

TEST_F(LaunchFixture, CrashedRankIsNamedWithItsSignal) {
  LaunchOptions o = Options(2, {"--crash_rank=0", "--sync_dir=" + dir_, "--hang_all"});
  LaunchReport report;
  auto result = LaunchWorkers(o, &report);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), "rank 0 failed (killed by SIGSEGV)");
  EXPECT_EQ(report.workers[0].signal, SIGSEGV);
  ExpectNoProcessLeft(report);
}

// A rank killed without a word is named so, not with its last progress line
// on stderr (a stale "step 198/3000 ..." before).
TEST_F(LaunchFixture, RankKilledMidStepEndsTheJobWithinSeconds) {
  LaunchOptions o = Options(3, {"--print_pid", "--steps", "--steps_on_stderr"});
  LaunchReport report;
  absl::Time killed_at = absl::InfiniteFuture();
  std::thread killer([&] {
    // Kill rank 1 from outside once every rank is stepping.
    bool stepping = WaitForFile(out_path_, [](const std::string& text) {
      return FindNumber(text, 0, "step") >= 0 && FindNumber(text, 1, "step") >= 3 && FindNumber(text, 2, "step") >= 0;
    });
    int pid = FindNumber(Stdout(), 1, "pid");
    if (stepping && pid > 0) {
      killed_at = absl::Now();
      kill(pid, SIGKILL);
    } else {
      kill(getpid(), SIGTERM);  // ends the launch instead of hanging the test
    }
  });
  auto result = LaunchWorkers(o, &report);
  absl::Time ended = absl::Now();
  killer.join();
  ASSERT_NE(killed_at, absl::InfiniteFuture()) << "rank 1 never got to step 3:\n" << Stdout();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), "rank 1 failed (killed by SIGKILL)");
  EXPECT_LT(ended - killed_at, absl::Seconds(30));
  EXPECT_LT(ended - killed_at, absl::Seconds(5)) << "the others should stop at SIGTERM";
  EXPECT_EQ(report.failed_rank, 1);
  ExpectNoProcessLeft(report);
}

// A rank that fails for its own reason but is slow to become reapable (a
// loaded machine tearing down its threads) after a peer's "connection lost"
// exit: the launcher waits for it rather than name the consequence.
TEST_F(LaunchFixture, ALostPeerWaitsForTheSlowFailureThatCausedIt) {
  LaunchOptions o = Options(2, {"--lost_peer_rank=0", "--fail_rank=1", "--delay_ms=1000", "--exit_code=86",
                                "--error=fault injected"});
  LaunchReport report;
  auto result = LaunchWorkers(o, &report);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), "rank 1 failed (exit 86): fault injected");
  EXPECT_EQ(report.failed_rank, 1);
  // Rank 0's error, which no store recorded here, is the note after it.
  EXPECT_THAT(report.consequences, ElementsAre("rank 0: allreduce failed, connection lost: peer closed"));
  ExpectNoProcessLeft(report);
}

TEST_F(LaunchFixture, RankIgnoringSigtermIsKilledAfterTheGrace) {
  LaunchOptions o = Options(2, {"--fail_rank=1", "--hang_all", "--ignore_sigterm", "--sync_dir=" + dir_});
  o.grace = absl::Seconds(1);
  LaunchReport report;
  absl::Time start = absl::Now();
  auto result = LaunchWorkers(o, &report);
  absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), "rank 1 failed (exit 1): failed");
  EXPECT_EQ(report.workers[0].signal, SIGKILL);
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LT(took, absl::Seconds(10));
  ExpectNoProcessLeft(report);
}

// A SIGTERM to the launcher while a worker is stopped (SIGSTOP, a debugger):
// that worker cannot stop cleanly or save, so it is killed at once and named
// as the failure; the others' clean stop (or their errors about losing it)
// are not the cause. The job was named after a peer's "connection lost".
TEST_F(LaunchFixture, AWorkerStoppedWhenTheJobIsToStopIsNamed) {
  LaunchOptions o = Options(2, {"--print_pid", "--hang_all", "--report_signals"});
  LaunchReport report;
  std::thread signaller([&] {
    if (const pid_t frozen = PidOnceReady(1); frozen > 0) {
      kill(frozen, SIGSTOP);
      for (int i = 0; i < 200 && ProcessState(frozen) != 'T'; ++i) absl::SleepFor(absl::Milliseconds(10));
    }
    kill(getpid(), SIGTERM);
  });
  auto result = LaunchWorkers(o, &report);
  signaller.join();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(),
            "rank 1 failed (killed by SIGKILL): it was stopped (SIGSTOP, or held by a debugger) when the job was to "
            "stop, so it could not finish its step or save and was killed");
  EXPECT_EQ(report.failed_rank, 1);
  EXPECT_EQ(report.interrupt_signal, SIGTERM);
  EXPECT_EQ(report.workers[0].exit_code, 128 + SIGTERM);
  EXPECT_EQ(report.workers[1].signal, SIGKILL);
  ExpectNoProcessLeft(report);
}

// A worker that crashes while the job stops (after a SIGTERM to the
// launcher) is the job's failure, named by its signal: it was not counted,
// and the job was named after its peer, or stopped with exit 143.
TEST_F(LaunchFixture, AWorkerCrashingWhileTheJobStopsIsNamed) {
  for (const int crash : {SIGSEGV, SIGKILL}) {  // SIGKILL: the OOM killer's
    SCOPED_TRACE(crash);
    CrashWhileStopping(crash);
  }
}

void LaunchFixture::CrashWhileStopping(int crash) {
  ASSERT_EQ(ftruncate(out_fd_, 0), 0);
  LaunchOptions o = Options(2, {"--print_pid", "--hang_all", "--ignore_sigterm"});
  o.preemption_grace = absl::Seconds(2);
  LaunchReport report;
  std::thread signaller([&] {
    const pid_t victim = PidOnceReady(1);
    kill(getpid(), SIGTERM);
    absl::SleepFor(absl::Milliseconds(300));
    if (victim > 0) kill(victim, crash);
  });
  auto result = LaunchWorkers(o, &report);
  signaller.join();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().message(), absl::StrCat("rank 1 failed (killed by ", crash == SIGKILL ? "SIGKILL" : "SIGSEGV", ")"));
  EXPECT_EQ(report.failed_rank, 1);
  EXPECT_EQ(report.workers[1].signal, crash);
  EXPECT_EQ(report.workers[0].signal, SIGKILL);  // it ignored the SIGTERM
  ExpectNoProcessLeft(report);
}

TEST_F(LaunchFixture, LauncherForwardsSigtermAndStopsWorkers) {
  LaunchOptions o = Options(2, {"--hang_all", "--report_signals"});
  LaunchReport report;
  std::thread signaller([&] {
    if (WaitForFile(out_path_, [](const std::string& text) {
          return RankLines(text, 0).size() == 1 && RankLines(text, 1).size() == 1;  // both said "ready"
        })) {
      kill(getpid(), SIGTERM);
    } else {
      ADD_FAILURE() << "workers never got ready";
      kill(getpid(), SIGTERM);
    }
  });
  auto result = LaunchWorkers(o, &report);
  signaller.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, 128 + SIGTERM);
  EXPECT_EQ(report.interrupt_signal, SIGTERM);
  EXPECT_EQ(report.failed_rank, -1);
  EXPECT_THAT(RankLines(Stdout(), 0), ElementsAre("ready", "rank 0 got SIGTERM"));
  EXPECT_THAT(RankLines(Stdout(), 1), ElementsAre("ready", "rank 1 got SIGTERM"));
  EXPECT_EQ(report.workers[0].exit_code, 128 + SIGTERM);
  // Our handler is gone again: SIGTERM is back to its default action.
  struct sigaction now;
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  ExpectNoProcessLeft(report);
}

// A SIGTERM repeated while the workers stop (GNU `timeout` signals the
// launcher, then its process group) leaves them their grace to finish the
// step and save; a Ctrl-C then kills them at once. The workers ignore
// SIGTERM, so the grace runs out in the first case.
TEST_F(LaunchFixture, ARepeatedSigtermLeavesTheGraceAndACtrlCEndsIt) {
  for (const int second : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(second);
    ASSERT_EQ(ftruncate(out_fd_, 0), 0);
    LaunchOptions o = Options(2, {"--print_pid", "--hang_all", "--ignore_sigterm"});
    o.preemption_grace = absl::Seconds(2);
    LaunchReport report;
    absl::Time signalled;
    std::thread signaller([&] {
      PidOnceReady(0);
      signalled = absl::Now();
      kill(getpid(), SIGTERM);
      absl::SleepFor(absl::Milliseconds(100));
      kill(getpid(), second);
    });
    auto result = LaunchWorkers(o, &report);
    const absl::Duration took = absl::Now() - signalled;
    signaller.join();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(*result, 128 + SIGTERM);
    EXPECT_EQ(report.interrupt_signal, SIGTERM);
    EXPECT_EQ(report.workers[0].signal, SIGKILL);
    EXPECT_EQ(report.workers[1].signal, SIGKILL);
    if (second == SIGTERM) {
      EXPECT_EQ(report.killed_at_signal, 0);
      EXPECT_GE(took, absl::Seconds(2));
    } else {
      EXPECT_EQ(report.killed_at_signal, SIGINT);
      EXPECT_LT(took, absl::Seconds(1.5));
    }
    ExpectNoProcessLeft(report);
  }
}

// A SIGTERM that comes too late to stop anything (every rank finishes its
// run, exit 0) ends the job with 0, as one process then does.
TEST_F(LaunchFixture, AStopSignalEveryRankOutlivesEndsTheJobWith0) {
  LaunchOptions o = Options(2, {"--ignore_sigterm", "--linger_ms=500"});
  LaunchReport report;
  std::thread signaller([&] {
    if (!WaitForFile(out_path_, [](const std::string& text) {
          return RankLines(text, 0).size() == 1 && RankLines(text, 1).size() == 1;  // both said "ready"
        })) {
      ADD_FAILURE() << "workers never got ready";
    }
    kill(getpid(), SIGTERM);
  });
  auto result = LaunchWorkers(o, &report);
  signaller.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, 0);
  EXPECT_EQ(report.interrupt_signal, SIGTERM);
  EXPECT_TRUE(report.workers[0].ok());
  EXPECT_TRUE(report.workers[1].ok());
  ExpectNoProcessLeft(report);
}

TEST_F(LaunchFixture, ChildrenOfAFailedWorkerDieWithIt) {
  LaunchOptions o = Options(2, {"--spawn_child", "--fail_rank=0", "--sync_dir=" + dir_, "--hang_all"});
  LaunchReport report;
  auto result = LaunchWorkers(o, &report);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("rank 0 failed (exit 1)"));
  std::string out = Stdout();
  for (int r = 0; r < 2; ++r) {
    int child = FindNumber(out, r, "child");
    ASSERT_GT(child, 0) << out;
    // Orphaned grandchildren are reaped by pid 1, not by us: give it a moment.
    EXPECT_TRUE(WaitForFile(
        "/dev/null", [&](const std::string&) { return ProcessGone(child); }, absl::Seconds(5)))
        << "grandchild " << child << " of rank " << r << " survived";
  }
  ExpectNoProcessLeft(report);
}

TEST_F(LaunchFixture, WorkersDieWhenTheLauncherIsKilled) {
  LaunchOptions o = Options(2, {"--print_pid", "--hang_all"});
  // A killed launcher cannot remove a temporary store; use one the test owns.
  o.store_spec = "file://" + dir_;
  pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    auto result = LaunchWorkers(o);
    _exit(result.ok() ? 0 : 2);
  }
  std::vector<int> pids(2, -1);
  bool started = WaitForFile(out_path_, [&](const std::string& text) {
    for (int r = 0; r < 2; ++r) pids[r] = FindNumber(text, r, "pid");
    return pids[0] > 0 && pids[1] > 0;
  });
  kill(launcher, SIGKILL);
  int status;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
  ASSERT_TRUE(started) << Stdout();
  for (int pid : pids) {
    EXPECT_TRUE(WaitForFile(
        "/dev/null", [&](const std::string&) { return ProcessGone(pid); }, absl::Seconds(5)))
        << "worker " << pid << " outlived its launcher";
  }
}

TEST_F(LaunchFixture, PartialLastLineIsRelayed) {
  LaunchOptions o = Options(2, {"--no_newline"});
  auto result = LaunchWorkers(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(Stdout(), HasSubstr("[rank 0] tail 0\n"));
  EXPECT_THAT(Stdout(), HasSubstr("[rank 1] tail 1\n"));
}

TEST_F(LaunchFixture, UnrunnableExecutableIsAnErrorAndLeavesNoWorker) {
  LaunchOptions o = Options(3, {});
  o.executable = dir_ + "/no_such_binary";
  LaunchReport report;
  auto result = LaunchWorkers(o, &report);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("cannot execute"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("no_such_binary"));
  ExpectNoProcessLeft(report);
}

TEST_F(LaunchFixture, RejectsBadOptions) {
  LaunchOptions o = Options(0, {});
  auto result = LaunchWorkers(o);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("--nproc"));

  o = Options(2, {});
  o.log_dir = "/proc/self/no/such/dir";
  result = LaunchWorkers(o);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("--log_dir"));

  ASSERT_EQ(setenv("STRATA_RANK", "0", 1), 0);
  result = LaunchWorkers(Options(2, {}));
  unsetenv("STRATA_RANK");
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("nested"));
}

TEST(ArgvWithoutFlagTest, RemovesEverySpellingOfTheFlag) {
  std::vector<std::string> argv = {"strata", "run", "p.pbtxt", "--nproc", "4", "--steps=3"};
  EXPECT_THAT(ArgvWithoutFlag(argv, "nproc"), ElementsAre("strata", "run", "p.pbtxt", "--steps=3"));
  EXPECT_THAT(ArgvWithoutFlag({"strata", "run", "--nproc=4", "p"}, "nproc"), ElementsAre("strata", "run", "p"));
  EXPECT_THAT(ArgvWithoutFlag({"strata", "run", "-nproc", "4", "-nproc=2", "p"}, "nproc"),
              ElementsAre("strata", "run", "p"));
  EXPECT_THAT(ArgvWithoutFlag({"strata", "run", "--nprocs=4", "--log_dir", "x"}, "nproc"),
              ElementsAre("strata", "run", "--nprocs=4", "--log_dir", "x"));
  EXPECT_THAT(ArgvWithoutFlag({"strata", "run", "--", "--nproc", "4"}, "nproc"),
              ElementsAre("strata", "run", "--", "--nproc", "4"));
  EXPECT_THAT(ArgvWithoutFlag({"strata", "run", "--quiet", "--noquiet", "--quiet=false", "p"}, "quiet", false),
              ElementsAre("strata", "run", "p"));
}

}  // namespace
}  // namespace strata
