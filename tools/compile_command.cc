// strata compile PROGRAM --out DIR: writes rank_<r>.pbtxt for every rank,
// schedule.txt, and with --dump_after PASS the program after that pass.

#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "compiler/program_text.h"
#include "tools/cli_common.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"

namespace strata {
namespace cli {
namespace {

std::string ScheduleDiagram(const RankPlan& plan) {
  std::string s = absl::StrCat("rank ", plan.rank(), " |");
  for (const Action& a : plan.schedule().action()) {
    if (a.kind() == Action::FORWARD) absl::StrAppend(&s, " F", a.micro_batch());
    if (a.kind() == Action::BACKWARD) absl::StrAppend(&s, " B", a.micro_batch());
    if (a.kind() == Action::OPTIMIZE) absl::StrAppend(&s, " OPT");
  }
  return s + "\n";
}

}  // namespace

int CompileCommand(const std::string& path) {
  if (auto kind = DeviceKindFromFlags(); !kind.ok()) {
    std::cerr << "error: " << kind.status().message() << "\n";
    return kExitUsage;
  }
  std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cerr << "error: strata compile needs --out DIR\n" << kUsage;
    return kExitUsage;
  }
  // Flags are checked before anything is written: a usage error leaves --out
  // as it was.
  if (absl::Status s = CheckPassFlags(); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitUsage;
  }
  const std::string dump_after = absl::GetFlag(FLAGS_dump_after);
  auto result = CompileFromFlags(path);
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    return kExitError;
  }
  out = UserPath(out);
  // mkdir -p: missing parents are created too.
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) {
    std::cerr << "error: --out " << out << ": cannot create folder: " << ec.message() << "\n";
    return kExitError;
  }
  std::string diagram;
  for (const RankPlan& plan : result->plans) {
    std::string file = absl::StrCat(out, "/rank_", plan.rank(), ".pbtxt");
    if (auto s = WriteFileAtomically(file, ProgramToText(plan)); !s.ok()) {
      std::cerr << "error: " << s.message() << "\n";
      return kExitError;
    }
    diagram += ScheduleDiagram(plan);
  }
  if (auto s = WriteFileAtomically(absl::StrCat(out, "/schedule.txt"), diagram); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return kExitError;
  }
  if (!dump_after.empty()) {
    // A pass that runs per rank (pipeline-split and after) leaves one program
    // per rank: after_PASS.rank_R.pbtxt, unless there is one rank.
    std::vector<std::pair<std::string, const Program*>> dumps;
    if (result->dumped_ranks.size() > 1) {
      for (size_t r = 0; r < result->dumped_ranks.size(); ++r) {
        dumps.push_back({absl::StrCat(out, "/after_", dump_after, ".rank_", r, ".pbtxt"), &result->dumped_ranks[r]});
      }
    } else {
      dumps.push_back({absl::StrCat(out, "/after_", dump_after, ".pbtxt"), &result->dumped});
    }
    for (const auto& [file, program] : dumps) {
      if (auto s = WriteFileAtomically(file, ProgramToText(*program)); !s.ok()) {
        std::cerr << "error: " << s.message() << "\n";
        return kExitError;
      }
    }
  }
  std::cout << "wrote " << result->plans.size() << " plan(s) and schedule.txt to " << out << "\n";
  return 0;
}

}  // namespace cli
}  // namespace strata
