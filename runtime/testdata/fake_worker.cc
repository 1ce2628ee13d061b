// A stand-in for a `strata run` worker, driven by flags, for launcher_test:
// prints lines, then fails, crashes or hangs on the ranks it is told to.
//   --lines=N            N lines "out R i" on stdout and "err R" on stderr
//   --print_pid          "pid P" on stdout first
//   --print_env          the STRATA_* variables and whether the store folder exists
//   --print_affinity     "cores C1,C2,..." (the cores it may run on) and STRATA_NUM_THREADS
//   --spawn_child        forks a child that sleeps forever ("child P")
//   --fail_rank=R --exit_code=C --error=MSG   rank R prints "error: MSG" and exits C
//   --fail_all           every rank fails so (with --rank_prefix, printing "error: rank R: MSG")
//   --first_error=MSG    a failing rank prints "error: MSG" before its error
//   --error_linger_ms=T  a failing rank waits T ms after its error before it exits
//   --error_lines=N      a failing rank prints "error: bad sample i" N times first
//   --hint=MSG           a failing rank prints MSG on stderr after its error
//   --crash_rank=R       rank R raises SIGSEGV
//   --delay_ms=T         wait T ms before failing or crashing
//   --lost_peer_rank=R   rank R prints "error: ... connection lost ..." and exits 1 at once
//                        (a peer's consequence of the failing rank, reaped first)
//   --sync_dir=DIR       each rank touches DIR/ready.R once set up; a failing or
//                        crashing rank first waits for all of them
//   --hang_rank=R / --hang_all   sleep forever (after "ready")
//   --ignore_sigterm     SIGTERM does nothing
//   --linger_ms=T        after "ready", sleep T ms, then exit 0 (a run finishing its last work)
//   --report_signals     on SIGTERM/SIGINT print "rank R got SIGNAME" and exit 128+sig
//   --steps              print "step i" every 20 ms forever
//   --steps_on_stderr    with --steps, also a progress line "step i/1000 epoch 1 loss 0.5" on stderr
//   --no_newline         end with "tail R" without a newline, then exit 0
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

namespace {

int g_rank = -1;

void ReportSignal(int signo) {
  char buf[64];
  int n = snprintf(buf, sizeof(buf), "rank %d got %s\n", g_rank, signo == SIGTERM ? "SIGTERM" : "SIGINT");
  ssize_t ignored = write(STDOUT_FILENO, buf, n);
  (void)ignored;
  _exit(128 + signo);
}

void SleepForever() {
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) continue;
    size_t eq = a.find('=');
    flags[a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
        eq == std::string::npos ? "1" : a.substr(eq + 1);
  }
  auto has = [&](const char* k) { return flags.count(k) > 0; };
  auto num = [&](const char* k, int def) { return has(k) ? std::atoi(flags[k].c_str()) : def; };
  const char* rank_env = std::getenv("STRATA_RANK");
  g_rank = rank_env ? std::atoi(rank_env) : -1;
  const int rank = g_rank;

  if (has("ignore_sigterm")) signal(SIGTERM, SIG_IGN);
  if (has("report_signals")) {
    signal(SIGTERM, ReportSignal);
    signal(SIGINT, ReportSignal);
  }
  if (has("print_pid")) printf("pid %d\n", static_cast<int>(getpid()));
  if (has("print_env")) {
    for (const char* name : {"STRATA_RANK", "STRATA_WORLD_SIZE", "STRATA_LOCAL_RANK", "STRATA_STORE",
                             "STRATA_MASTER_ADDR", "STRATA_MASTER_PORT", "FAKE_EXTRA"}) {
      const char* v = std::getenv(name);
      printf("%s=%s\n", name, v ? v : "(unset)");
    }
    const char* store = std::getenv("STRATA_STORE");
    struct stat st;
    bool exists = store && strncmp(store, "file://", 7) == 0 && stat(store + 7, &st) == 0 && S_ISDIR(st.st_mode);
    printf("store_exists=%d\n", exists ? 1 : 0);
  }
  if (has("print_affinity")) {
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof(set), &set);
    std::string cores;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cores += (cores.empty() ? "" : ",") + std::to_string(c);
    }
    const char* threads = std::getenv("STRATA_NUM_THREADS");
    printf("cores %s\nthreads %s\n", cores.c_str(), threads ? threads : "(unset)");
  }
  if (has("spawn_child")) {
    pid_t child = fork();
    if (child == 0) SleepForever();
    printf("child %d\n", static_cast<int>(child));
  }
  for (int i = 0; i < num("lines", 0); ++i) printf("out %d %d\n", rank, i);
  if (num("lines", 0) > 0) fprintf(stderr, "err %d\n", rank);
  printf("ready\n");

  if (has("lost_peer_rank") && num("lost_peer_rank", -1) == rank) {
    fprintf(stderr, "error: rank %d: allreduce failed, connection lost: peer closed\n", rank);
    return 1;
  }
  bool fails = has("fail_all") || (has("fail_rank") && num("fail_rank", -1) == rank);
  bool crashes = has("crash_rank") && num("crash_rank", -1) == rank;
  if (has("sync_dir")) {
    std::string dir = flags["sync_dir"];
    FILE* f = fopen((dir + "/ready." + std::to_string(rank)).c_str(), "w");
    if (f) fclose(f);
    const char* world_env = std::getenv("STRATA_WORLD_SIZE");
    int world = world_env ? std::atoi(world_env) : 1;
    // Failing before the others are set up would make the test race them.
    for (int waited = 0; (fails || crashes) && waited < 20000; waited += 5) {
      int ready = 0;
      struct stat st;
      for (int r = 0; r < world; ++r) ready += stat((dir + "/ready." + std::to_string(r)).c_str(), &st) == 0;
      if (ready == world) break;
      usleep(5000);
    }
  }
  if (fails || crashes) usleep(num("delay_ms", 0) * 1000);
  if (fails) {
    const char* error = has("error") ? flags["error"].c_str() : "failed";
    for (int i = 0; i < num("error_lines", 0); ++i) fprintf(stderr, "error: bad sample %d\n", i);
    if (has("first_error")) fprintf(stderr, "error: %s\n", flags["first_error"].c_str());
    if (has("rank_prefix")) {
      fprintf(stderr, "error: rank %d: %s\n", rank, error);
    } else {
      fprintf(stderr, "error: %s\n", error);
    }
    if (has("hint")) fprintf(stderr, "%s\n", flags["hint"].c_str());
    if (has("error_linger_ms")) usleep(num("error_linger_ms", 0) * 1000);
    return num("exit_code", 1);
  }
  if (crashes) raise(SIGSEGV);
  if (has("hang_all") || (has("hang_rank") && num("hang_rank", -1) == rank)) SleepForever();
  if (has("linger_ms")) usleep(num("linger_ms", 0) * 1000);
  if (has("steps")) {
    for (int step = 0;; ++step) {
      printf("step %d\n", step);
      if (has("steps_on_stderr")) fprintf(stderr, "step %d/1000 epoch 1 loss 0.5\n", step);
      usleep(20000);
    }
  }
  if (has("no_newline")) {
    printf("tail %d", rank);
    fflush(stdout);
  }
  return 0;
}
