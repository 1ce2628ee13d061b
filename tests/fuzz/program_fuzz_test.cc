// Mutates the example programs and strategies many thousand times and checks
// that the compiler's front door never crashes or hangs: in process through
// ParseProgramText + Compile (and ValidateStrategy), then for the mutants that
// compile two training steps (the kernels must take any shape the shape
// functions accept), and a few hundred times through the real `strata`
// binary, whose exit code must be 0, 1 or 2.
//
// In-process mutations run in forked worker processes, so a crash kills the
// worker, not the test: the worker records each input in shared memory before
// compiling it, and the parent writes the input that killed it to
// TEST_UNDECLARED_OUTPUTS_DIR and resumes after it. Every mutation is a pure
// function of (seed, index), so a reported index reproduces exactly.

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "passes/compile.h"
#include "compiler/op_registry.h"
#include "compiler/program_text.h"
#include "compiler/validate.h"
#include "runtime/trainer.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr uint64_t kDefaultSeed = 20240611;
constexpr int64_t kProgramMutations = 50000;
constexpr int64_t kStrategyMutations = 10000;
constexpr int64_t kExecMutations = 200;
// Mutants drawn for the training-step phase; the few percent that compile run one step.
constexpr int64_t kRunMutations = 12000;
// Disjoint index ranges keep the streams of mutations independent.
constexpr int64_t kStrategyIndexBase = int64_t{1} << 40;
constexpr int64_t kExecIndexBase = int64_t{2} << 40;
constexpr int64_t kRunIndexBase = int64_t{3} << 40;
constexpr int64_t kMutationsPerWorker = 5000;
// Training-step phase: plans predicted above this are skipped (they test allocation, not kernels),
// and the worker's address space is capped so a runaway allocation fails instead of swapping.
constexpr int64_t kMaxRunPeakBytes = int64_t{64} << 20;
constexpr rlim_t kWorkerAddressSpace = rlim_t{8} << 30;
constexpr size_t kMaxText = 60000;  // mutators stop growing a text beyond this
constexpr int kHangSeconds = 20;
constexpr int kMaxReportedFailures = 10;

// Longer or different campaigns than CI's:
//   bazel test //tests/fuzz:program_fuzz_test --test_env=STRATA_FUZZ_SEED=7 --test_env=STRATA_FUZZ_SCALE=20
int64_t EnvInt(const char* name, int64_t default_value) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : default_value;
}
uint64_t FuzzSeed() {
  static const uint64_t seed = static_cast<uint64_t>(EnvInt("STRATA_FUZZ_SEED", kDefaultSeed));
  return seed;
}
int64_t Scaled(int64_t count) {
  static const int64_t scale = std::max<int64_t>(1, EnvInt("STRATA_FUZZ_SCALE", 1));
  return count * scale;
}

// ---------------------------------------------------------------------------
// Inputs.

struct SeedText {
  std::string name;
  std::string text;
};

std::string RunfilesRoot() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return ".";
  return absl::StrCat(srcdir, "/", workspace);
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every *.pbtxt in a runfiles folder, sorted so the seeds are the same on every run.
std::vector<SeedText> ReadSeeds(const std::string& folder, bool strategies) {
  std::vector<SeedText> seeds;
  std::string dir = RunfilesRoot() + "/" + folder;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return seeds;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (!absl::EndsWith(name, ".pbtxt")) continue;
    if (absl::EndsWith(name, ".strategy.pbtxt") != strategies) continue;
    seeds.push_back({folder + "/" + name, ReadWholeFile(dir + "/" + name)});
  }
  closedir(d);
  std::sort(seeds.begin(), seeds.end(), [](const SeedText& a, const SeedText& b) { return a.name < b.name; });
  return seeds;
}

const std::vector<SeedText>& ProgramSeeds() {
  static const auto* seeds = [] {
    auto* s = new std::vector<SeedText>(ReadSeeds("examples", false));
    for (auto& f : ReadSeeds("tests/fuzz", false)) s->push_back(std::move(f));
    return s;
  }();
  return *seeds;
}

const std::vector<SeedText>& StrategySeeds() {
  static const auto* seeds = [] {
    auto* s = new std::vector<SeedText>(ReadSeeds("examples", true));
    for (auto& f : ReadSeeds("tests/fuzz", true)) s->push_back(std::move(f));
    return s;
  }();
  return *seeds;
}

// ---------------------------------------------------------------------------
// Deterministic randomness: splitmix64 keyed by (seed, index).

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(Next() % n); }
  bool Percent(int p) { return static_cast<int>(Below(100)) < p; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) { return v[Below(v.size())]; }

 private:
  uint64_t state_;
};

Rng RngFor(int64_t index) { return Rng(FuzzSeed() * 0x100000001b3ull ^ static_cast<uint64_t>(index)); }

// ---------------------------------------------------------------------------
// Text mutators. Each edits `t` in place and must be safe on any text, empty included.

using Span = std::pair<size_t, size_t>;  // [begin, end)

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }

// Numbers outside words: 12, -1, 0.05, 1e-8 (inside strings too: "gpu:1").
std::vector<Span> FindNumbers(const std::string& t) {
  std::vector<Span> spans;
  for (size_t i = 0; i < t.size(); ++i) {
    bool starts = std::isdigit(static_cast<unsigned char>(t[i])) ||
                  (t[i] == '-' && i + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[i + 1])));
    if (!starts || (i > 0 && IsWordChar(t[i - 1]))) continue;
    size_t j = i + 1;
    while (j < t.size() && (std::isdigit(static_cast<unsigned char>(t[j])) || t[j] == '.' || t[j] == 'e' ||
                            t[j] == 'E' || ((t[j] == '-' || t[j] == '+') && (t[j - 1] == 'e' || t[j - 1] == 'E')))) {
      ++j;
    }
    spans.push_back({i, j});
    i = j;
  }
  return spans;
}

// Contents of double-quoted strings (without the quotes).
std::vector<Span> FindQuoted(const std::string& t) {
  std::vector<Span> spans;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '#') {  // comment to end of line
      while (i < t.size() && t[i] != '\n') ++i;
      continue;
    }
    if (t[i] != '"') continue;
    size_t j = i + 1;
    while (j < t.size() && t[j] != '"' && t[j] != '\n') j += t[j] == '\\' ? 2 : 1;
    if (j >= t.size() || t[j] != '"') break;
    spans.push_back({i + 1, j});
    i = j;
  }
  return spans;
}

// Every occurrence of `needle`, as the span just after it.
std::vector<size_t> FindAll(const std::string& t, const std::string& needle) {
  std::vector<size_t> at;
  for (size_t p = t.find(needle); p != std::string::npos; p = t.find(needle, p + 1)) at.push_back(p + needle.size());
  return at;
}

std::vector<Span> Lines(const std::string& t) {
  std::vector<Span> lines;
  size_t begin = 0;
  while (begin < t.size()) {
    size_t end = t.find('\n', begin);
    end = end == std::string::npos ? t.size() : end + 1;
    lines.push_back({begin, end});
    begin = end;
  }
  return lines;
}

std::vector<Span> Tokens(const std::string& t) {
  std::vector<Span> tokens;
  size_t i = 0;
  while (i < t.size()) {
    while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
    size_t j = i;
    while (j < t.size() && !std::isspace(static_cast<unsigned char>(t[j]))) ++j;
    if (j > i) tokens.push_back({i, j});
    i = j;
  }
  return tokens;
}

void Replace(std::string& t, Span s, const std::string& with) { t.replace(s.first, s.second - s.first, with); }

const std::vector<std::string>& InterestingNumbers() {
  static const auto* v = new std::vector<std::string>{
      "0", "-1", "1", "2", "3", "-2", "7", "65536", "-0.0", "0.5", "1e-320", "1e308", "1e400", "nan", "inf", "-inf",
      "2147483647", "2147483648", "-2147483649", "4294967296", "1099511627776", "4611686018427387904",
      "9223372036854775807", "-9223372036854775808", "9223372036854775808", "99999999999999999999", "0x10", "1.5e3"};
  return *v;
}

const std::vector<std::string>& InterestingNames() {
  static const auto* v = new std::vector<std::string>{
      "", " ", "x", "loss", "acc", "label", "image", "h1", "fc1.w", "fc1.w@grad", "loss@grad", "@step", "@lr.F32",
      "@lr.F64", "fc1.w@moment1", "fc1.w@velocity", "@clip_coef.stage0", "gpu:0", "gpu:1", "cpu:3", "gpu:",
      "gpu:-1", "gpu:99999999999", "tpu:0", "gpu:1:2", "gpu: 1", "relu", "matmul", "F32", "\\\"", "\\n", "\\x00",
      "\\377\\376", "a very long name with spaces and ünïcödé"};
  return *v;
}

const std::vector<std::string>& Snippets() {
  static const auto* v = new std::vector<std::string>{
      "{", "}", "[", "]", ":", "\"", "#", ",", "<", ">", "\\",
      "op { type: \"relu\" input: [\"h1\"] output: [\"h1\"] }",
      "op { type: \"add_n\" input: [] output: [\"s\"] }",
      "op { type: \"concat\" input: [\"h1\", \"h1\", \"h1\"] output: [\"c\"] attr { key: \"axis\" value { i: -3 } } }",
      "op { type: \"reshape\" input: [\"image\"] output: [\"r\"] attr { key: \"shape\" value { list { i: [-1, -1, 0] } } } }",
      "op { type: \"split\" input: [\"image\"] output: [\"p\", \"q\"] attr { key: \"sections\" value { list { i: [0, 0] } } } }",
      "op { type: \"transpose\" input: [\"image\"] output: [\"tr\"] attr { key: \"perm\" value { list { i: [1, 1] } } } }",
      "op { type: \"slice\" input: [\"image\"] output: [\"sl\"] attr { key: \"axes\" value { list { i: [5] } } } "
      "attr { key: \"starts\" value { list { i: [9] } } } attr { key: \"ends\" value { list { i: [-9] } } } }",
      "op { type: \"max_pool2d\" input: [\"image\"] output: [\"mp\"] attr { key: \"kernel_size\" value { list { i: [0, 99] } } } }",
      "op { type: \"conv2d\" input: [\"image\", \"image\"] output: [\"cv\"] attr { key: \"groups\" value { i: 0 } } }",
      "op { type: \"embedding\" input: [\"label\", \"fc1.w\"] output: [\"em\"] }",
      "op { type: \"cast\" input: [\"label\"] output: [\"lf\"] attr { key: \"dtype\" value { s: \"BOOL\" } } }",
      "op { type: \"softmax\" input: [\"label\"] output: [\"sm\"] attr { key: \"axis\" value { i: 99 } } }",
      "op { type: \"reduce_sum\" input: [\"image\"] output: [\"rs\"] attr { key: \"axis\" value { list { i: [0, 0, -7] } } } }",
      "op { type: \"flatten\" input: [\"label\"] output: [\"fl\"] attr { key: \"start_axis\" value { i: 3 } } }",
      "op { type: \"layer_norm\" input: [\"image\", \"fc1.b\", \"fc1.b\"] output: [\"ln\"] }",
      "op { type: \"dropout\" input: [\"image\"] output: [\"dr\"] attr { key: \"p\" value { f: 1 } } }",
      "op { type: \"matmul\" input: [\"label\", \"label\"] output: [\"mm\"] attr { key: \"transpose_a\" value { b: true } } }",
      "op { }", "var { }", "var { name: \"fc1.w\" dtype: F32 shape: [1] kind: PARAM }",
      "var { name: \"z\" dtype: BOOL shape: [] kind: FEED }", "var { name: \"s\" dtype: I32 shape: [-1, 0] }",
      "device: \"gpu:1\"", "device: \"gpu:7\"", "device: \"\"", "role: LOSS", "role: 99", "stage: 3", "uid: -1",
      "line: -5", "channel { src_rank: 9 }", "name: \"\"", "frozen: true", "kind: STATE", "kind: 9", "dtype: 0",
      "init { uniform { low: 1 high: 1 } }", "init { normal { std: -1 } }", "init { xavier_uniform { gain: 0 } }",
      "init { kaiming_normal { a: -5 fan_out: true } }", "init { constant { value: inf } }",
      "attr { key: \"k\" value { i: 99 } }", "attr { key: \"axis\" value { i: -9223372036854775808 } }",
      "attr { key: \"p\" value { f: nan } }", "attr { key: \"\" value { } }", "attr { key: \"shape\" value { list { } } }",
      "input: \"image\"", "input: \"\"", "output: \"loss\"", "output: \"image\"", "loss: \"acc\"", "loss: \"image\"",
      "fetch: \"h1\"", "fetch: \"\"", "seed: -1", "source_file: \"x\"", "param_grad { key: \"a\" value: \"b\" }",
      "optimizer { sgd { learning_rate: 1e309 } }", "optimizer { }", "optimizer { adam { learning_rate: 1 beta1: 1 } }",
      "weight_decay: -1", "clip_global_norm: nan", "lr_schedule { warmup_steps: -1 }",
      "lr_schedule { cosine { decay_steps: -5 alpha: 2 } }", "lr_schedule { step_decay { step_size: 0 gamma: 0 } }",
      "pipeline { micro_batch_size: 0 }", "data_parallel { degree: 3 }", "gradient_merge { k_steps: -1 }",
      "recompute { checkpoints: [\"\", \"loss\", \"image\"] }", "schedule: F_THEN_B", "schedule: 7", "average: true",
      "bucket_mb: nan", "accumulate_steps: 1099511627776"};
  return *v;
}

const std::vector<std::string>& EnumWords() {
  static const auto* v = new std::vector<std::string>{
      "F32", "F64", "I64", "I32", "BOOL", "DT_INVALID", "FEED", "PARAM", "ACTIVATION", "STATE", "ONE_F_ONE_B",
      "F_THEN_B", "0", "5", "-1", "99"};
  return *v;
}

const std::vector<std::string>& AttrValues() {
  static const auto* v = new std::vector<std::string>{
      "{ i: -3 }", "{ i: 0 }", "{ i: 9223372036854775807 }", "{ f: nan }", "{ f: -1e300 }", "{ s: \"F16\" }",
      "{ s: \"\" }", "{ b: true }", "{ }", "{ list { } }", "{ list { i: [] } }", "{ list { i: [-1, 0, 99999999999] } }",
      "{ list { i: [1, 1, 1, 1, 1, 1, 1, 1, 1] } }", "{ list { f: [0.5] } }", "{ list { s: [\"a\"] } }",
      "{ list { i: [2] f: [2] } }"};
  return *v;
}

std::string ShapeList(Rng& rng) {
  static const std::vector<std::string> dims = {"-1", "0", "1", "2", "3", "4", "7", "10", "-2", "28",
                                                "4611686018427387904", "9223372036854775807"};
  std::vector<std::string> out;
  size_t rank = rng.Below(6);
  for (size_t i = 0; i < rank; ++i) out.push_back(rng.Pick(dims));
  return absl::StrCat("[", absl::StrJoin(out, ", "), "]");
}

// One mutation of a random kind; `ops` are the registered op types.
void MutateOnce(std::string& t, Rng& rng, const std::vector<std::string>& ops) {
  const bool may_grow = t.size() < kMaxText;
  switch (rng.Below(17)) {
    case 0: {  // overwrite a byte (any value but NUL, which only exercises the binary check)
      if (t.empty()) break;
      t[rng.Below(t.size())] = static_cast<char>(1 + rng.Below(255));
      break;
    }
    case 1: {  // flip one bit
      if (t.empty()) break;
      t[rng.Below(t.size())] ^= static_cast<char>(1 << rng.Below(8));
      break;
    }
    case 2: {  // delete a short range
      if (t.empty()) break;
      size_t at = rng.Below(t.size());
      t.erase(at, 1 + rng.Below(16));
      break;
    }
    case 3: {  // duplicate a line
      auto lines = Lines(t);
      if (lines.empty() || !may_grow) break;
      Span l = rng.Pick(lines);
      t.insert(l.second, t.substr(l.first, l.second - l.first));
      break;
    }
    case 4: {  // delete a line
      auto lines = Lines(t);
      if (lines.empty()) break;
      Span l = rng.Pick(lines);
      t.erase(l.first, l.second - l.first);
      break;
    }
    case 5: {  // swap two lines
      auto lines = Lines(t);
      if (lines.size() < 2) break;
      Span a = rng.Pick(lines), b = rng.Pick(lines);
      if (a.first > b.first) std::swap(a, b);
      if (a.first == b.first) break;
      std::string la = t.substr(a.first, a.second - a.first), lb = t.substr(b.first, b.second - b.first);
      Replace(t, b, la);
      Replace(t, a, lb);
      break;
    }
    case 6: {  // a number becomes an interesting one
      auto numbers = FindNumbers(t);
      if (numbers.empty()) break;
      Replace(t, rng.Pick(numbers), rng.Pick(InterestingNumbers()));
      break;
    }
    case 7: {  // rename: a quoted string becomes another one of the file, or an odd name
      auto quoted = FindQuoted(t);
      if (quoted.empty()) break;
      Span target = rng.Pick(quoted);
      std::string name;
      if (rng.Percent(60)) {
        Span other = rng.Pick(quoted);
        name = t.substr(other.first, other.second - other.first);
      } else if (rng.Percent(50)) {
        name = rng.Pick(InterestingNames());
      } else {
        name = absl::StrCat("v", rng.Below(1000));
      }
      Replace(t, target, name);
      break;
    }
    case 8: {  // rename a var everywhere it appears
      auto quoted = FindQuoted(t);
      if (quoted.empty()) break;
      Span s = rng.Pick(quoted);
      std::string from = absl::StrCat("\"", t.substr(s.first, s.second - s.first), "\"");
      std::string to = absl::StrCat("\"", rng.Percent(50) ? rng.Pick(InterestingNames()) : "renamed", "\"");
      std::string out;
      size_t pos = 0;
      for (size_t p = t.find(from); p != std::string::npos && out.size() < kMaxText; p = t.find(from, pos)) {
        out += t.substr(pos, p - pos) + to;
        pos = p + from.size();
      }
      t = out + t.substr(pos);
      break;
    }
    case 9: {  // change an op's type to any registered op, or a near miss
      auto at = FindAll(t, "type: \"");
      if (at.empty()) break;
      size_t begin = rng.Pick(at);
      size_t end = t.find('"', begin);
      if (end == std::string::npos) break;
      std::string type = rng.Percent(85) ? rng.Pick(ops) : rng.Pick(InterestingNames());
      Replace(t, {begin, end}, type);
      break;
    }
    case 10: {  // change a shape
      auto at = FindAll(t, "shape: ");
      if (at.empty()) break;
      size_t begin = rng.Pick(at);
      size_t end = t.find(']', begin);
      if (end == std::string::npos || t[begin] != '[') break;
      Replace(t, {begin, end + 1}, ShapeList(rng));
      break;
    }
    case 11: {  // delete a token
      auto tokens = Tokens(t);
      if (tokens.empty()) break;
      Replace(t, rng.Pick(tokens), "");
      break;
    }
    case 12: {  // insert a snippet between tokens
      if (!may_grow) break;
      auto tokens = Tokens(t);
      size_t at = tokens.empty() ? 0 : rng.Pick(tokens).second;
      t.insert(at, absl::StrCat(" ", rng.Pick(Snippets()), " "));
      break;
    }
    case 13: {  // place an op on a stage (or a malformed device)
      auto at = FindAll(t, "op {");
      if (at.empty() || !may_grow) break;
      static const std::vector<std::string> devices = {"gpu:0", "gpu:1", "gpu:2", "gpu:5", "cpu:1", "gpu", "cpu",
                                                       "gpu:x", "gpu:-1", "", "gpu:4097", "GPU:0"};
      t.insert(rng.Pick(at), absl::StrCat(" device: \"", rng.Pick(devices), "\""));
      break;
    }
    case 14: {  // swap two quoted strings (e.g. an op's inputs)
      auto quoted = FindQuoted(t);
      if (quoted.size() < 2) break;
      Span a = rng.Pick(quoted), b = rng.Pick(quoted);
      if (a.first > b.first) std::swap(a, b);
      if (a.first == b.first) break;
      std::string sa = t.substr(a.first, a.second - a.first), sb = t.substr(b.first, b.second - b.first);
      Replace(t, b, sa);
      Replace(t, a, sb);
      break;
    }
    case 15: {  // an attr value of another type or an odd value
      auto at = FindAll(t, "value ");
      if (at.empty()) break;
      size_t begin = rng.Pick(at);
      if (begin >= t.size() || t[begin] != '{') break;
      // Find the matching brace.
      int depth = 0;
      size_t end = begin;
      for (; end < t.size(); ++end) {
        if (t[end] == '{') ++depth;
        if (t[end] == '}' && --depth == 0) break;
      }
      if (end >= t.size()) break;
      Replace(t, {begin, end + 1}, rng.Pick(AttrValues()));
      break;
    }
    default: {  // swap an enum word (dtype, kind, schedule) for another, or a number
      auto tokens = Tokens(t);
      std::vector<Span> enums;
      for (const Span& s : tokens) {
        std::string word = t.substr(s.first, s.second - s.first);
        while (!word.empty() && (word.back() == '}' || word.back() == ',')) word.pop_back();
        const auto& words = EnumWords();
        if (std::find(words.begin(), words.end(), word) != words.end()) {
          enums.push_back({s.first, s.first + word.size()});
        }
      }
      if (enums.empty()) break;
      Replace(t, rng.Pick(enums), rng.Pick(EnumWords()));
      break;
    }
  }
}

// 1 to 3 stacked mutations of a seed, or occasionally a truncation.
std::string Mutate(const std::string& seed, Rng& rng, const std::vector<std::string>& ops) {
  std::string t = seed;
  int n = 1 + static_cast<int>(rng.Below(3));
  for (int i = 0; i < n; ++i) MutateOnce(t, rng, ops);
  if (rng.Percent(3)) t.resize(rng.Below(t.size() + 1));
  return t;
}

int64_t PickBatchSize(Rng& rng) {
  // The values `strata --batch_size` lets through (it rejects negatives).
  static const std::vector<int64_t> sizes = {0, 0, 0, 0, 1, 2, 3, 7, 64, 100, 4096, int64_t{1} << 40,
                                             std::numeric_limits<int64_t>::max()};
  return rng.Pick(sizes);
}

std::string PickDumpAfter(Rng& rng) {
  static const std::vector<std::string> passes = {"", "", "", "", "validate", "autodiff", "optimizer", "nosuchpass"};
  return rng.Pick(passes);
}

std::vector<std::string> OpTypes() { return OpRegistry::Global().Names(); }

// ---------------------------------------------------------------------------
// What one mutation checks, in process. Returns normally for OK and for any
// error Status; a crash or a broken invariant ends the worker.

[[noreturn]] void Invariant(const std::string& what) {
  fprintf(stderr, "invariant broken: %s\n", what.c_str());
  fflush(stderr);
  std::abort();
}

struct Mutant {
  std::string program;   // program text (empty for a strategy mutation of a seed program)
  std::string strategy;  // strategy text, or empty
  int64_t batch_size = 0;
  std::string dump_after;
  int program_seed = -1;  // strategy mutations: the seed program they pair with
  // Beside the CPU float32 plan every mutant gets: plans for a GPU (the
  // passes only GPU plans run: pad-vocab, fuse-epilogues, fuse-optimizer,
  // host-transfers) and under BF16 mixed precision (its casts, and the
  // 16-bit CPU kernels in the training phase).
  DeviceKind device = DEVICE_CPU;
  bool bf16 = false;
};

// The extra settings of a mutant (Mutant::device, Mutant::bf16), from its stream.
void PickVariant(Rng& rng, Mutant& m) {
  m.device = rng.Percent(40) ? DEVICE_CUDA : DEVICE_CPU;
  m.bf16 = rng.Percent(40);
}

Strategy Bf16Strategy() {
  Strategy s;
  s.mutable_mixed_precision()->set_dtype(BF16);
  return s;
}

// Compile's contract for any input: an error with a message, or plans that verify.
void CheckCompiles(const Program& program, const Strategy& strategy, const CompileOptions& options,
                   const char* what) {
  absl::StatusOr<CompileResult> result = Compile(program, strategy, options);
  if (!result.ok()) {
    if (result.status().message().empty()) Invariant(absl::StrCat(what, ": compile error without a message"));
    return;
  }
  if (result->plans.empty()) Invariant(absl::StrCat(what, ": Compile returned OK with no plans"));
  for (const RankPlan& plan : result->plans) {
    if (absl::Status s = VerifyProgram(plan.program()); !s.ok()) {
      Invariant(absl::StrCat(what, ": Compile returned OK but rank ", plan.rank(), "'s plan does not verify: ",
                             s.message()));
    }
  }
}

Mutant MakeProgramMutant(int64_t index, const std::vector<std::string>& ops) {
  Rng rng = RngFor(index);
  const auto& seeds = ProgramSeeds();
  Mutant m;
  m.program = Mutate(seeds[index % seeds.size()].text, rng, ops);
  m.batch_size = PickBatchSize(rng);
  m.dump_after = PickDumpAfter(rng);
  PickVariant(rng, m);
  return m;
}

Mutant MakeStrategyMutant(int64_t index, const std::vector<std::string>& ops) {
  Rng rng = RngFor(index);
  const auto& strategies = StrategySeeds();
  Mutant m;
  m.strategy = Mutate(strategies[index % strategies.size()].text, rng, ops);
  m.program_seed = static_cast<int>(rng.Below(ProgramSeeds().size()));
  m.batch_size = PickBatchSize(rng);
  PickVariant(rng, m);
  return m;
}

// How far a mutant got: rejected by the parser, rejected by the compiler, or compiled.
enum Outcome { kParseError = 0, kCompileError = 1, kCompiled = 2 };

Outcome CheckProgramMutant(const Mutant& m) {
  absl::StatusOr<Program> program = ParseProgramText(m.program, "mutant.pbtxt");
  if (!program.ok()) {
    if (program.status().message().empty()) Invariant("parse error without a message");
    return kParseError;
  }
  CompileOptions options;
  options.batch_size = m.batch_size;
  options.dump_after = m.dump_after;
  absl::StatusOr<CompileResult> result = Compile(*program, Strategy(), options);
  if (!result.ok()) {
    if (result.status().message().empty()) Invariant("compile error without a message");
    return kCompileError;
  }
  // What compiles must verify and name a plan for each rank.
  if (result->plans.empty()) Invariant("Compile returned OK with no plans");
  for (const RankPlan& plan : result->plans) {
    if (absl::Status s = VerifyProgram(plan.program()); !s.ok()) {
      Invariant(absl::StrCat("Compile returned OK but the plan does not verify: ", s.message()));
    }
  }
  if (m.device != DEVICE_CPU || m.bf16) {
    options.device_kind = m.device;
    options.dump_after.clear();
    CheckCompiles(*program, m.bf16 ? Bf16Strategy() : Strategy(), options, m.bf16 ? "BF16 plan" : "GPU plan");
  }
  return kCompiled;
}

// The validated seed programs that strategy mutations pair with.
const std::vector<Program>& ValidatedSeedPrograms() {
  static const auto* programs = [] {
    auto* v = new std::vector<Program>();
    for (const SeedText& seed : ProgramSeeds()) {
      absl::StatusOr<Program> p = ParseProgramText(seed.text, seed.name);
      Program program = p.ok() ? *p : Program();
      if (p.ok() && !ValidateAndInferProgram(&program).ok()) program = *p;
      v->push_back(std::move(program));
    }
    return v;
  }();
  return *programs;
}

Outcome CheckStrategyMutant(const Mutant& m) {
  absl::StatusOr<Strategy> strategy = ParseStrategyText(m.strategy, "mutant.strategy.pbtxt");
  if (!strategy.ok()) return kParseError;
  const Program& validated = ValidatedSeedPrograms()[m.program_seed];
  absl::Status valid = ValidateStrategy(*strategy, validated, m.batch_size, "mutant.strategy.pbtxt");
  absl::StatusOr<Program> program = ParseProgramText(ProgramSeeds()[m.program_seed].text, "seed.pbtxt");
  if (!program.ok()) Invariant("a seed program does not parse");
  CompileOptions options;
  options.batch_size = m.batch_size;
  options.device_kind = m.device;
  absl::StatusOr<CompileResult> result = Compile(*program, *strategy, options, "mutant.strategy.pbtxt");
  // Compile runs ValidateStrategy itself, so it cannot accept what ValidateStrategy rejects.
  if (!valid.ok() && result.ok()) {
    Invariant(absl::StrCat("Compile accepted a strategy that ValidateStrategy rejects: ", valid.message()));
  }
  if (result.ok()) {
    for (const RankPlan& plan : result->plans) {
      if (absl::Status s = VerifyProgram(plan.program()); !s.ok()) {
        Invariant(absl::StrCat("Compile returned OK but rank ", plan.rank(), "'s plan does not verify: ", s.message()));
      }
    }
  }
  return valid.ok() ? kCompiled : kCompileError;
}

// Kernels must never crash on a shape that the shape functions accepted: a
// mutant that compiles trains two steps on synthetic data at a tiny batch,
// evaluated after each (the forward-only evaluation pass, its last batch
// partial).
// Outcomes: kParseError (did not compile, or skipped as too big), kCompileError
// (the run returned an error), kCompiled (it trained).
Outcome CheckRunMutant(const Mutant& m) {
  absl::StatusOr<Program> program = ParseProgramText(m.program, "mutant.pbtxt");
  if (!program.ok()) return kParseError;
  CompileOptions options;
  options.batch_size = m.batch_size;
  absl::StatusOr<CompileResult> result = Compile(*program, m.bf16 ? Bf16Strategy() : Strategy(), options);
  if (!result.ok() || result->plans[0].memory().peak_bytes() > kMaxRunPeakBytes) return kParseError;
  const RankPlan& plan = result->plans[0];
  TrainOptions train;
  // Synthetic data takes the program's classes (or vocab) by default; classes= is refused for a program
  // without a label feed (the GPT seeds), which then never trained.
  train.data = "synthetic:size=16";
  train.eval_data = absl::StrCat("synthetic:test,size=", result->batch_size + 1);
  train.eval_every = 1;
  train.steps = 2;
  train.seed = 1;
  train.progress = false;
  absl::StatusOr<TrainReport> report = Train(plan, train);
  if (!report.ok()) {
    if (report.status().message().empty()) Invariant("training error without a message");
    // A kernel refusing what the shape functions accepted is worth a look: STRATA_FUZZ_VERBOSE=1 lists them.
    if (EnvInt("STRATA_FUZZ_VERBOSE", 0) != 0) {
      fprintf(stderr, "training error: %s\n", std::string(report.status().message()).c_str());
    }
    return kCompileError;
  }
  return kCompiled;
}

// Seeds whose feeds hold at most 256 elements per sample: synthetic data for
// them is cheap (its teacher costs features x 64 per sample), so the training
// phase draws from them most of the time.
const std::vector<int>& SmallFeedSeeds() {
  static const auto* small = [] {
    auto* v = new std::vector<int>();
    const auto& seeds = ProgramSeeds();
    for (int i = 0; i < static_cast<int>(seeds.size()); ++i) {
      absl::StatusOr<Program> p = ParseProgramText(seeds[i].text, seeds[i].name);
      if (!p.ok()) continue;
      int64_t elements = 0;
      for (const Var& v : p->var()) {
        if (v.kind() != FEED) continue;
        int64_t n = 1;
        for (int64_t d : v.shape()) n *= d > 0 ? d : 1;
        elements += n;
      }
      if (elements <= 256) v->push_back(i);
    }
    return v;
  }();
  return *small;
}

Mutant MakeRunMutant(int64_t index, const std::vector<std::string>& ops) {
  Rng rng = RngFor(index);
  const auto& seeds = ProgramSeeds();
  const auto& small = SmallFeedSeeds();
  int seed = !small.empty() && rng.Percent(85) ? rng.Pick(small) : static_cast<int>(rng.Below(seeds.size()));
  Mutant m;
  m.program = Mutate(seeds[seed].text, rng, ops);
  m.batch_size = 1 + static_cast<int64_t>(rng.Below(3));
  m.bf16 = rng.Percent(40);  // the training phase runs CPU plans only
  return m;
}

// ---------------------------------------------------------------------------
// Forked workers with a shared progress record.

constexpr size_t kSlot = 2 * kMaxText + 1024;

struct Progress {
  std::atomic<int64_t> current;  // index being checked
  std::atomic<int64_t> done;     // indices finished, for hang detection
  std::atomic<int64_t> outcomes[3];  // counts by Outcome
  size_t program_size;
  size_t strategy_size;
  char program[kSlot];
  char strategy[kSlot];
};

// Texts may hold NUL bytes, so they travel with their sizes.
void CopyTo(char* slot, size_t* size, const std::string& text) {
  *size = std::min(text.size(), kSlot);
  std::memcpy(slot, text.data(), *size);
}

std::string OutputsDir() {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (dir != nullptr) return dir;
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

struct Failure {
  int64_t index;
  std::string what;  // "crash: signal 11", "hang", "exit 3"
  std::string saved_to;
};

std::string SaveFailure(const std::string& kind, int64_t index, const std::string& program,
                        const std::string& strategy) {
  std::string base = absl::StrCat(OutputsDir(), "/", kind, "_", index);
  if (!program.empty()) std::ofstream(base + ".pbtxt", std::ios::binary) << program;
  if (!strategy.empty()) std::ofstream(base + ".strategy.pbtxt", std::ios::binary) << strategy;
  return base;
}

// Runs check(make(i)) for i in [begin, end) in forked workers, restarting after a
// crash or a hang at the index after it. Returns the failures it saw.
std::vector<Failure> RunInWorkers(const std::string& kind, int64_t begin, int64_t end,
                                  const std::function<Mutant(int64_t, const std::vector<std::string>&)>& make,
                                  const std::function<Outcome(const Mutant&)>& check,
                                  int64_t outcomes[3]) {
  std::vector<Failure> failures;
  void* mem = mmap(nullptr, sizeof(Progress), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    failures.push_back({begin, "mmap failed", ""});
    return failures;
  }
  auto* progress = new (mem) Progress();
  int64_t next = begin;
  while (next < end && static_cast<int>(failures.size()) < kMaxReportedFailures) {
    int64_t stop = std::min(end, next + kMutationsPerWorker);
    progress->current = next;
    progress->done = next;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
      failures.push_back({next, "fork failed", ""});
      break;
    }
    if (pid == 0) {
      rlimit limit = {kWorkerAddressSpace, kWorkerAddressSpace};
      setrlimit(RLIMIT_AS, &limit);
      const std::vector<std::string> ops = OpTypes();
      for (int64_t i = next; i < stop; ++i) {
        Mutant m = make(i, ops);
        progress->current = i;
        CopyTo(progress->program, &progress->program_size, m.program);
        CopyTo(progress->strategy, &progress->strategy_size, m.strategy);
        progress->outcomes[check(m)]++;
        progress->done = i + 1;
      }
      _exit(0);
    }
    int status = 0;
    int64_t last_done = progress->done;
    auto last_change = std::chrono::steady_clock::now();
    bool hung = false;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (progress->done != last_done) {
        last_done = progress->done;
        last_change = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - last_change > std::chrono::seconds(kHangSeconds)) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        hung = true;
        break;
      }
    }
    if (!hung && WIFEXITED(status) && WEXITSTATUS(status) == 0 && progress->done == stop) {
      next = stop;
      continue;
    }
    int64_t bad = progress->current;
    std::string what = hung                  ? absl::StrCat("hang: no progress for ", kHangSeconds, " s")
                       : WIFSIGNALED(status) ? absl::StrCat("crash: signal ", WTERMSIG(status), " (",
                                                            strsignal(WTERMSIG(status)), ")")
                                             : absl::StrCat("worker exited with status ", WEXITSTATUS(status));
    std::string saved = SaveFailure(kind, bad, std::string(progress->program, progress->program_size),
                                    std::string(progress->strategy, progress->strategy_size));
    failures.push_back({bad, what, saved});
    next = bad + 1;
  }
  for (int k = 0; k < 3; ++k) outcomes[k] = progress->outcomes[k];
  munmap(mem, sizeof(Progress));
  return failures;
}

std::string Describe(const std::vector<Failure>& failures) {
  std::string s;
  for (const Failure& f : failures) {
    // Bazel zips TEST_UNDECLARED_OUTPUTS_DIR into bazel-testlogs/tests/fuzz/program_fuzz_test/test.outputs/.
    absl::StrAppend(&s, "  mutation ", f.index, ": ", f.what, "; input saved as ", f.saved_to, ".*\n");
  }
  return s;
}

TEST(ProgramFuzzTest, FindsItsSeeds) {
  // The examples and this folder's fixtures; a missing seed would quietly weaken the fuzzing.
  EXPECT_GE(ProgramSeeds().size(), 11u);
  EXPECT_GE(StrategySeeds().size(), 6u);
  for (const SeedText& seed : ProgramSeeds()) {
    absl::StatusOr<Program> program = ParseProgramText(seed.text, seed.name);
    ASSERT_TRUE(program.ok()) << program.status();
    // Every variant a mutant may get compiles before mutation.
    for (DeviceKind device : {DEVICE_CPU, DEVICE_CUDA}) {
      for (bool bf16 : {false, true}) {
        CompileOptions options;
        options.device_kind = device;
        absl::StatusOr<CompileResult> result = Compile(*program, bf16 ? Bf16Strategy() : Strategy(), options);
        EXPECT_TRUE(result.ok()) << seed.name << " should compile before mutation (" << DeviceKind_Name(device)
                                 << (bf16 ? ", BF16" : "") << "): " << result.status();
      }
    }
  }
}

TEST(ProgramFuzzTest, MutatedProgramsNeverCrashTheCompiler) {
  ASSERT_FALSE(ProgramSeeds().empty());
  int64_t outcomes[3] = {0, 0, 0};
  std::vector<Failure> failures =
      RunInWorkers("program", 0, Scaled(kProgramMutations), MakeProgramMutant, CheckProgramMutant, outcomes);
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << Scaled(kProgramMutations)
                                << " mutated programs broke the compiler (seed " << FuzzSeed() << "):\n"
                                << Describe(failures);
  std::printf("%lld mutated programs: %lld rejected by the parser, %lld by the compiler, %lld compiled\n",
              static_cast<long long>(Scaled(kProgramMutations)), static_cast<long long>(outcomes[kParseError]),
              static_cast<long long>(outcomes[kCompileError]), static_cast<long long>(outcomes[kCompiled]));
  // Mutants must get past the parser often, or they test the parser only.
  EXPECT_GT(outcomes[kCompileError], Scaled(kProgramMutations) / 4);
  EXPECT_GT(outcomes[kCompiled], 0);
}

TEST(ProgramFuzzTest, MutatedStrategiesNeverCrashTheCompiler) {
  ASSERT_FALSE(StrategySeeds().empty());
  ASSERT_FALSE(ProgramSeeds().empty());
  int64_t outcomes[3] = {0, 0, 0};
  std::vector<Failure> failures =
      RunInWorkers("strategy", kStrategyIndexBase, kStrategyIndexBase + Scaled(kStrategyMutations),
                   MakeStrategyMutant, CheckStrategyMutant, outcomes);
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << Scaled(kStrategyMutations)
                                << " mutated strategies broke the compiler (seed " << FuzzSeed() << "):\n"
                                << Describe(failures);
  std::printf("%lld mutated strategies: %lld rejected by the parser, %lld by ValidateStrategy, %lld passed it\n",
              static_cast<long long>(Scaled(kStrategyMutations)), static_cast<long long>(outcomes[kParseError]),
              static_cast<long long>(outcomes[kCompileError]), static_cast<long long>(outcomes[kCompiled]));
  EXPECT_GT(outcomes[kCompileError], Scaled(kStrategyMutations) / 4);
}

// The training phase's seeds train as they are: a seed that fails before
// its first step (its data refused, as the GPTs' were for a day) leaves its
// mutants untrained while the phase still passes.
TEST(ProgramFuzzTest, EverySmallSeedTrainsUnmutated) {
  const auto& seeds = ProgramSeeds();
  ASSERT_FALSE(SmallFeedSeeds().empty());
  for (int i : SmallFeedSeeds()) {
    Mutant m;
    m.program = seeds[i].text;
    m.batch_size = 2;
    for (const bool bf16 : {false, true}) {
      m.bf16 = bf16;
      EXPECT_EQ(CheckRunMutant(m), kCompiled)
          << seeds[i].name << (bf16 ? " (bf16)" : "") << " (STRATA_FUZZ_VERBOSE=1 prints the error)";
    }
  }
}

TEST(ProgramFuzzTest, MutatedProgramsThatCompileNeverCrashTheKernels) {
  ASSERT_FALSE(ProgramSeeds().empty());
  int64_t outcomes[3] = {0, 0, 0};
  std::vector<Failure> failures =
      RunInWorkers("run", kRunIndexBase, kRunIndexBase + Scaled(kRunMutations), MakeRunMutant, CheckRunMutant,
                   outcomes);
  EXPECT_TRUE(failures.empty()) << failures.size() << " mutated programs crashed or hung in training (seed "
                                << FuzzSeed() << "):\n" << Describe(failures);
  std::printf("%lld mutants: %lld did not compile (or were too big), %lld failed in training with an error, "
              "%lld trained two steps, evaluated after each\n",
              static_cast<long long>(Scaled(kRunMutations)), static_cast<long long>(outcomes[kParseError]),
              static_cast<long long>(outcomes[kCompileError]), static_cast<long long>(outcomes[kCompiled]));
  EXPECT_GT(outcomes[kCompiled], 0);
}

// ---------------------------------------------------------------------------
// Through the real binary.

struct ExecResult {
  bool timed_out = false;
  int signal = 0;
  int exit_code = -1;
  std::string err;
};

ExecResult RunStrata(const std::vector<std::string>& args, const std::string& scratch) {
  ExecResult r;
  std::string binary = RunfilesRoot() + "/tools/strata";
  std::string err_path = scratch + "/stderr";
  std::vector<std::string> storage = {binary};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return r;
  if (pid == 0) {
    setpgid(0, 0);
    int null_fd = open("/dev/null", O_RDWR);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (null_fd < 0 || err < 0) _exit(127);
    dup2(null_fd, 0);
    dup2(null_fd, 1);
    dup2(err, 2);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kHangSeconds);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!r.timed_out) {
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  }
  r.err = ReadWholeFile(err_path);
  return r;
}

TEST(ProgramFuzzTest, MutatedInputsNeverCrashTheTool) {
  ASSERT_FALSE(ProgramSeeds().empty());
  const char* tmp = std::getenv("TEST_TMPDIR");
  ASSERT_NE(tmp, nullptr) << "run under bazel test";
  const std::string scratch = absl::StrCat(tmp, "/exec");
  ASSERT_TRUE(mkdir(scratch.c_str(), 0755) == 0 || errno == EEXIST);
  const std::vector<std::string> ops = OpTypes();
  std::vector<Failure> failures;
  int exit_counts[3] = {0, 0, 0};
  for (int64_t k = 0; k < Scaled(kExecMutations) && static_cast<int>(failures.size()) < kMaxReportedFailures; ++k) {
    const int64_t index = kExecIndexBase + k;
    Rng rng = RngFor(index);
    const auto& seeds = ProgramSeeds();
    std::string program = Mutate(seeds[index % seeds.size()].text, rng, ops);
    std::string program_path = scratch + "/mutant.pbtxt";
    std::ofstream(program_path, std::ios::binary) << program;
    std::vector<std::string> args = {rng.Percent(85) ? "check" : "compile", program_path};
    if (args[0] == "compile") args.insert(args.end(), {"--out", scratch + "/plans"});
    std::string strategy;
    if (rng.Percent(30)) {
      strategy = Mutate(rng.Pick(StrategySeeds()).text, rng, ops);
      std::ofstream(scratch + "/mutant.strategy.pbtxt", std::ios::binary) << strategy;
      args.insert(args.end(), {"--strategy", scratch + "/mutant.strategy.pbtxt"});
    }
    if (rng.Percent(20)) args.push_back(absl::StrCat("--batch_size=", PickBatchSize(rng)));
    if (rng.Percent(30)) args.insert(args.end(), {"--device", "gpu"});
    ExecResult r = RunStrata(args, scratch);
    std::string what;
    if (r.timed_out) {
      what = absl::StrCat("hang: still running after ", kHangSeconds, " s");
    } else if (r.signal != 0) {
      what = absl::StrCat("crash: signal ", r.signal, " (", strsignal(r.signal), ")");
    } else if (r.exit_code < 0 || r.exit_code > 2) {
      what = absl::StrCat("exit code ", r.exit_code);
    } else if (r.exit_code != 0 && !absl::StrContains(r.err, "error: ")) {
      what = "non-zero exit without an error line";
    }
    if (!what.empty()) {
      failures.push_back({index, absl::StrCat(what, "; stderr: ", r.err.substr(0, 500)),
                          SaveFailure("exec", index, program, strategy)});
      continue;
    }
    ++exit_counts[r.exit_code];
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << Scaled(kExecMutations)
                                << " runs of `strata check` failed (seed " << FuzzSeed() << "):\n"
                                << Describe(failures);
  // The mutations must reach past the parser sometimes, or they test little.
  EXPECT_GT(exit_counts[0] + exit_counts[1], 0);
  std::printf("strata exit codes over %lld mutated inputs: 0 x%d, 1 x%d, 2 x%d\n",
              static_cast<long long>(Scaled(kExecMutations)), exit_counts[0], exit_counts[1], exit_counts[2]);
}

}  // namespace
}  // namespace strata
