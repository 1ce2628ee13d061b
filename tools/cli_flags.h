// The strata command line's flags, defined once in cli_flags.cc, and how each
// command's own flags are parsed and listed by `strata COMMAND --help`.

#ifndef STRATA_TOOLS_CLI_FLAGS_H_
#define STRATA_TOOLS_CLI_FLAGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"

ABSL_DECLARE_FLAG(std::string, strategy);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, dump_after);
ABSL_DECLARE_FLAG(std::vector<std::string>, disable_passes);
ABSL_DECLARE_FLAG(double, device_memory_gib);
ABSL_DECLARE_FLAG(int64_t, nproc);
ABSL_DECLARE_FLAG(int64_t, steps);
ABSL_DECLARE_FLAG(int64_t, epochs);
ABSL_DECLARE_FLAG(int64_t, batch_size);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(std::string, eval_data);
ABSL_DECLARE_FLAG(int64_t, eval_every);
ABSL_DECLARE_FLAG(bool, eval_only);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, metrics);
ABSL_DECLARE_FLAG(std::string, trace);
ABSL_DECLARE_FLAG(std::string, log_dir);
ABSL_DECLARE_FLAG(std::string, save);
ABSL_DECLARE_FLAG(int64_t, save_every);
ABSL_DECLARE_FLAG(int64_t, keep_checkpoints);
ABSL_DECLARE_FLAG(std::string, load);
ABSL_DECLARE_FLAG(bool, quiet);
ABSL_DECLARE_FLAG(bool, cuda_graph);
ABSL_DECLARE_FLAG(bool, nccl);
ABSL_DECLARE_FLAG(double, comm_timeout_s);
ABSL_DECLARE_FLAG(std::string, store);
ABSL_DECLARE_FLAG(std::string, socket_ifname);
ABSL_DECLARE_FLAG(double, heartbeat_timeout_s);
ABSL_DECLARE_FLAG(std::string, job_id);
ABSL_DECLARE_FLAG(bool, compare_single);
ABSL_DECLARE_FLAG(bool, bind_cores);
ABSL_DECLARE_FLAG(std::string, layers);
ABSL_DECLARE_FLAG(int64_t, stages);
ABSL_DECLARE_FLAG(int64_t, blocks);
ABSL_DECLARE_FLAG(std::string, optimizer);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(bool, cosine);
ABSL_DECLARE_FLAG(double, dropout);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(int64_t, d_model);
ABSL_DECLARE_FLAG(int64_t, heads);
ABSL_DECLARE_FLAG(int64_t, seq);
ABSL_DECLARE_FLAG(int64_t, vocab);
ABSL_DECLARE_FLAG(std::string, gelu);
namespace strata {
namespace cli {

// The flags each command accepts, by command name.
const std::map<std::string, std::set<std::string>>& CommandFlags();

// What ParseFlags found: the positional arguments and the flags given on the
// command line (by name), so that a default can be told from an explicit value.
struct ParsedArgs {
  std::vector<std::string> positional;
  std::set<std::string> given;
};

// `strata COMMAND --help` or `-h` anywhere before "--".
bool WantsHelp(int argc, char** argv, int first);

// The command's lines of kUsage, then each of its flags with its default.
std::string CommandHelp(const std::string& command);

// Parses "--name=value", "--name value" and "--flag"/"--noflag" for the
// command's own flags.
absl::StatusOr<ParsedArgs> ParseFlags(const std::string& command, int argc, char** argv, int first);

}  // namespace cli
}  // namespace strata

#endif  // STRATA_TOOLS_CLI_FLAGS_H_
