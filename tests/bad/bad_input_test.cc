// Runs the real `strata` binary over every case of the bad-input corpus
// (tests/bad/cases.txt) and checks the contract: the expected exit code, never
// a signal or a hang, and exactly one "error:" line on stderr holding the
// expected message.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr int kTimeoutSeconds = 20;
constexpr int kMinCases = 40;

// One line of cases.txt: NAME EXIT ARGS... => SUBSTRING (parts joined by " && " must all appear)
struct BadCase {
  std::string name;
  int expected_exit = 0;
  std::vector<std::string> args;
  std::string substring;
  int line = 0;
};

// gtest prints a failing case by name, not as bytes.
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name << " (cases.txt:" << c.line << ")"; }

std::string RunfilesRoot() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return "";
  return absl::StrCat(srcdir, "/", workspace);
}

std::string CorpusDir() { return RunfilesRoot() + "/tests/bad"; }
std::string StrataBinary() { return RunfilesRoot() + "/tools/strata"; }

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parse errors of the manifest itself become a failing test, not a crash.
std::vector<std::string>& ManifestErrors() {
  static auto* errors = new std::vector<std::string>();
  return *errors;
}

std::vector<BadCase> LoadCases() {
  std::vector<BadCase> cases;
  std::string path = CorpusDir() + "/cases.txt";
  std::ifstream in(path);
  if (!in) {
    ManifestErrors().push_back(absl::StrCat(path, ": cannot open the manifest"));
    return cases;
  }
  std::set<std::string> names;
  std::string text;
  int line_number = 0;
  while (std::getline(in, text)) {
    ++line_number;
    absl::string_view line = absl::StripAsciiWhitespace(text);
    if (line.empty() || line[0] == '#') continue;
    std::string where = absl::StrCat("cases.txt:", line_number, ": ");
    size_t arrow = line.find(" => ");
    if (arrow == absl::string_view::npos) {
      ManifestErrors().push_back(where + "expected NAME EXIT ARGS... => SUBSTRING");
      continue;
    }
    std::vector<std::string> head = absl::StrSplit(line.substr(0, arrow), ' ', absl::SkipWhitespace());
    BadCase c;
    c.line = line_number;
    c.substring = std::string(absl::StripAsciiWhitespace(line.substr(arrow + 4)));
    if (head.size() < 2 || !absl::SimpleAtoi(head[1], &c.expected_exit)) {
      ManifestErrors().push_back(where + "expected a case name and an exit code");
      continue;
    }
    c.name = head[0];
    bool name_ok = !c.name.empty();
    for (char ch : c.name) name_ok &= absl::ascii_isalnum(ch) || ch == '_';
    if (!name_ok || !names.insert(c.name).second) {
      ManifestErrors().push_back(where + "case name '" + c.name + "' is not a unique identifier");
      continue;
    }
    if (c.substring.empty()) {
      ManifestErrors().push_back(where + "empty expected substring");
      continue;
    }
    c.args.assign(head.begin() + 2, head.end());
    cases.push_back(std::move(c));
  }
  return cases;
}

struct RunResult {
  bool timed_out = false;
  bool signaled = false;
  int signal = 0;
  int exit_code = -1;
  std::string out;
  std::string err;
};

// fork/exec in the corpus folder, stdout and stderr into files; the child gets
// its own process group so a hang is killed together with anything it started.
RunResult RunStrata(const std::vector<std::string>& args, const std::string& scratch) {
  RunResult r;
  std::string out_path = scratch + "/stdout", err_path = scratch + "/stderr";
  std::string binary = StrataBinary(), dir = CorpusDir();
  std::vector<std::string> argv_storage = {binary};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) {
    r.exit_code = -2;
    return r;
  }
  if (pid == 0) {
    setpgid(0, 0);
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int null_in = open("/dev/null", O_RDONLY);
    if (out < 0 || err < 0 || null_in < 0 || chdir(dir.c_str()) != 0) _exit(127);
    dup2(null_in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kTimeoutSeconds);
  int status = 0;
  while (true) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!r.timed_out) {
    if (WIFSIGNALED(status)) {
      r.signaled = true;
      r.signal = WTERMSIG(status);
    } else if (WIFEXITED(status)) {
      r.exit_code = WEXITSTATUS(status);
    }
  }
  r.out = ReadWholeFile(out_path);
  r.err = ReadWholeFile(err_path);
  return r;
}

// The names in `dir`, without "." and "..".
std::set<std::string> FilesIn(const std::string& dir) {
  std::set<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.insert(e->d_name);
    }
    closedir(d);
  }
  return names;
}

class BadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInputTest, RejectsWithOneClearLine) {
  const BadCase& c = GetParam();
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr) << "run under bazel test";
  std::string scratch = absl::StrCat(tmp, "/", c.name);
  ASSERT_TRUE(mkdir(scratch.c_str(), 0755) == 0 || errno == EEXIST);
  std::vector<std::string> args;
  for (const auto& a : c.args) args.push_back(absl::StrReplaceAll(a, {{"$TMP", scratch}}));

  SCOPED_TRACE(absl::StrCat("cases.txt:", c.line, ": strata ", absl::StrJoin(args, " ")));
  RunResult r = RunStrata(args, scratch);
  ASSERT_FALSE(r.timed_out) << "hang: still running after " << kTimeoutSeconds << " s; stderr:\n" << r.err;
  ASSERT_FALSE(r.signaled) << "crash: killed by signal " << r.signal << " (" << strsignal(r.signal)
                           << "); stderr:\n" << r.err;
  ASSERT_NE(r.exit_code, 127) << "could not start " << StrataBinary();
  EXPECT_EQ(r.exit_code, c.expected_exit) << "stderr:\n" << r.err;

  // The error line, and anything else on stderr: usage errors may add the usage text, nothing else may.
  std::vector<std::string> error_lines, other_lines;
  for (absl::string_view line : absl::StrSplit(r.err, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "error:")) {
      error_lines.push_back(std::string(line));
    } else if (!(c.expected_exit == 2 && (absl::StartsWith(line, "usage:") || absl::StartsWith(line, " ") ||
                                              absl::StartsWith(line, "strata COMMAND --help")))) {
      other_lines.push_back(std::string(line));
    }
  }
  if (c.expected_exit == 0) {
    // A control case: the same files are fine, so the bad cases fail for their own reason.
    EXPECT_TRUE(error_lines.empty()) << "stderr:\n" << r.err;
    for (absl::string_view part : absl::StrSplit(c.substring, " && ")) {
      EXPECT_TRUE(absl::StrContains(r.out, part) || absl::StrContains(r.err, part))
          << "the output lacks \"" << part << "\"; stdout:\n"
          << r.out << "\nstderr:\n"
          << r.err;
    }
    return;
  }
  ASSERT_EQ(error_lines.size(), 1u) << "expected exactly one line starting with \"error:\"; stderr:\n" << r.err;
  EXPECT_TRUE(other_lines.empty()) << "stderr has more than the error line:\n" << r.err;
  if (c.expected_exit == 2) {
    // A usage error is found before anything is written: $TMP holds only the captured output.
    EXPECT_EQ(FilesIn(scratch), (std::set<std::string>{"stderr", "stdout"})) << "a usage error wrote into $TMP";
  }
  for (absl::string_view part : absl::StrSplit(c.substring, " && ")) {
    EXPECT_TRUE(absl::StrContains(error_lines[0], part))
        << "the error line lacks \"" << part << "\":\n" << error_lines[0];
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, BadInputTest, ::testing::ValuesIn(LoadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(BadInputManifestTest, ParsesAndCoversEnoughCases) {
  EXPECT_TRUE(ManifestErrors().empty()) << absl::StrJoin(ManifestErrors(), "\n");
  EXPECT_GE(LoadCases().size(), static_cast<size_t>(kMinCases));
}

}  // namespace
}  // namespace strata
