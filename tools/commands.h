// The strata commands' entry points, one file each (check_command.cc, ...).
// Each returns the process's exit code (see cli_common.h); flags are parsed
// before a command runs.

#ifndef STRATA_TOOLS_COMMANDS_H_
#define STRATA_TOOLS_COMMANDS_H_

#include <set>
#include <string>
#include <vector>

namespace strata {
namespace cli {

// strata check PROGRAM: compiles and prints the plan's summary.
int CheckCommand(const std::string& program_path);

// strata compile PROGRAM --out DIR: writes every rank's plan and the schedule.
int CompileCommand(const std::string& program_path);

// strata run PROGRAM: trains on one process, launches --nproc workers, or is
// one of those workers. `given`: the flags the command line set.
int RunCommand(const std::string& program_path, int argc, char** argv, const std::set<std::string>& given);

// strata gen MODEL: prints a generated program.
int GenCommand(const std::vector<std::string>& args, const std::set<std::string>& given);

}  // namespace cli
}  // namespace strata

#endif  // STRATA_TOOLS_COMMANDS_H_
