// What every strata command shares: exit codes, the usage text, user paths,
// byte counts for humans, and compiling PROGRAM with --strategy/--batch_size.

#ifndef STRATA_TOOLS_CLI_COMMON_H_
#define STRATA_TOOLS_CLI_COMMON_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "passes/compile.h"

namespace strata {
namespace cli {

// Exit codes: 0 success, 1 a bad program/strategy/data or a failed run, 2 a usage error.
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

// Every command's synopsis; CommandHelp picks one command's lines out of it.
extern const char kUsage[];

// `bazel run` starts us in the runfiles tree; user paths are relative to where they typed the command.
std::string UserPath(const std::string& path);

// "1.50 MiB": a byte count for humans.
std::string Bytes(int64_t b);

// Compiles the PROGRAM file with --strategy, --batch_size and --dump_after.
// --device: cpu -> DEVICE_CPU, gpu -> DEVICE_CUDA; InvalidArgument otherwise.
absl::StatusOr<DeviceKind> DeviceKindFromFlags();
// The first op of the plans (rank by rank) with no kernel registered for
// `kind`, as "op #i 'type' (name) on rank r", or "" when every op has one.
std::string FirstOpWithoutKernel(const std::vector<RankPlan>& plans, DeviceKind kind);

// The --strategy file, or the default strategy when none is given.
absl::StatusOr<Strategy> StrategyFromFlags();
// --dump_after and --disable_passes against the passes that run for the
// --strategy and --device, before compiling (the passes depend on those
// alone, so a program that does not compile still gets the list): a usage
// error. OK where the strategy or device cannot be read (the compile says so).
absl::Status CheckPassFlags();
absl::StatusOr<CompileResult> CompileFromFlags(const std::string& program_path);
// The same with the strategy's recompute section cleared (same program, batch
// and device): what the plans would hold without recompute.
absl::StatusOr<CompileResult> CompileFromFlagsWithoutRecompute(const std::string& program_path);

}  // namespace cli
}  // namespace strata

#endif  // STRATA_TOOLS_CLI_COMMON_H_
