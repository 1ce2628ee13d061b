// The strata command-line tool: check, compile, run, gen (DESIGN.md, "The command line").
// Exit codes: 0 success, 1 a bad program/strategy/data or a failed run, 2 a usage error.
// This file picks the command and checks what all commands share; each command
// lives in its own file (tools/commands.h).

#include <signal.h>

#include <cstdint>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "proto/utf8.h"
#include "tools/cli_common.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"

namespace strata {
namespace cli {
namespace {

constexpr int64_t kMaxBatchSize = int64_t{1} << 24;

// --eval_only trains nothing: a flag that would train or save, given at all
// (0 included), is a mistake, said before its value is judged. 0, or the
// exit code once it printed why.
int CheckEvalOnly(const std::set<std::string>& given) {
  if (!absl::GetFlag(FLAGS_eval_only)) return 0;
  // --data too: the training data, read by nothing (an --eval_only ignored any, nonsense included).
  for (const char* flag :
       {"steps", "epochs", "eval_every", "save", "save_every", "keep_checkpoints", "compare_single", "data"}) {
    if (given.count(flag)) {
      std::cerr << "error: --eval_only trains nothing, so --" << flag << " has nothing to do; leave it out\n";
      return kExitUsage;
    }
  }
  if (absl::GetFlag(FLAGS_eval_data).empty()) {
    std::cerr << "error: --eval_only needs --eval_data (the set to evaluate)\n";
    return kExitUsage;
  }
  return 0;
}

// --steps and --epochs exclude each other. 0, or the exit code once it printed why.
int CheckStepsAndEpochs(const std::set<std::string>& given) {
  if (given.count("steps") && given.count("epochs")) {
    std::cerr << "error: --steps and --epochs are mutually exclusive; give one\n";
    return kExitUsage;
  }
  // Left out, --steps and --epochs train one epoch; an explicit 0 asks for nothing, which is a mistake.
  const bool zero_steps = given.count("steps") && absl::GetFlag(FLAGS_steps) == 0;
  if (zero_steps || (given.count("epochs") && absl::GetFlag(FLAGS_epochs) == 0)) {
    std::cerr << "error: --" << (zero_steps ? "steps" : "epochs")
              << " 0: give at least 1, or leave out --steps and --epochs to train one epoch\n";
    return kExitUsage;
  }
  return 0;
}

// check, compile and run take one PROGRAM and a --batch_size in range. 0, or
// the exit code once it printed why not.
int CheckProgramArgs(const std::string& command, const std::vector<std::string>& positional) {
  const int64_t batch_size = absl::GetFlag(FLAGS_batch_size);
  if (batch_size < 0 || batch_size > kMaxBatchSize) {
    std::cerr << "error: --batch_size must be in 1.." << kMaxBatchSize << ", got " << batch_size << "\n";
    return kExitUsage;
  }
  if (positional.size() != 1) {
    std::cerr << "error: strata " << command << " needs exactly one PROGRAM file, got " << positional.size() << "\n" << kUsage;
    return kExitUsage;
  }
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help") {
    std::cerr << kUsage;
    return argc < 2 ? kExitUsage : 0;
  }
  // An argument with a line break or a terminal escape (a path, a --data
  // spec) would break the one error line that quotes it, or drive the
  // terminal; a tab is kept.
  for (int i = 1; i < argc; ++i) {
    if (HasControlCharacter(argv[i], /*allow_tab=*/true)) {
      std::cerr << "error: argument " << i << " '" << absl::CHexEscape(argv[i]) << "' contains a control character\n";
      return kExitUsage;
    }
  }
  std::string command = argv[1];
  if (!CommandFlags().count(command)) {
    std::cerr << "error: unknown command '" << command << "'\n" << kUsage;
    return kExitUsage;
  }
  if (WantsHelp(argc, argv, 2)) {
    std::cout << CommandHelp(command);
    return 0;
  }
  auto parsed = ParseFlags(command, argc, argv, 2);
  if (!parsed.ok()) {
    std::cerr << "error: " << parsed.status().message() << "\n";
    return kExitUsage;
  }
  if (int rc = CheckEvalOnly(parsed->given); rc != 0) return rc;
  if (int rc = CheckStepsAndEpochs(parsed->given); rc != 0) return rc;
  const std::vector<std::string>& positional = parsed->positional;
  if (command == "gen") return GenCommand(positional, parsed->given);
  if (int rc = CheckProgramArgs(command, positional); rc != 0) return rc;
  const std::string& program = positional[0];
  if (command == "check") return CheckCommand(program);
  if (command == "compile") return CompileCommand(program);
  return RunCommand(program, argc, argv, parsed->given);
}

}  // namespace
}  // namespace cli
}  // namespace strata

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported as
  // an error, instead of killing the process with SIGXFSZ.
  signal(SIGXFSZ, SIG_IGN);
  return strata::cli::Main(argc, argv);
}
