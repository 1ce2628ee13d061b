#ifndef STRATA_COMPILER_VALIDATE_H_
#define STRATA_COMPILER_VALIDATE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/graph_index.h"
#include "proto/program.pb.h"

namespace strata {

// The first compiler step over a user's program: checks every declared var
// and every op (registered type, argument counts, attrs, definition before
// use, single definition), fills in attr defaults, infers and records the type
// of every intermediate var, resolves each op's pipeline stage from its
// `device` (the device_guard) and assigns roles (FORWARD, LOSS) and stable
// uids. Errors name the file, line, op (index and type) or var.
absl::Status ValidateAndInferProgram(Program* program);

// Parses a device_guard string: "gpu:N" or "cpu:N" (N the stage), or "gpu"/"cpu" (stage 0).
absl::StatusOr<int> ParseDeviceStage(const std::string& device);

// Number of pipeline stages the program's placements name (1 when unplaced).
int NumStages(const Program& program);

// Re-infers every op's output types and checks them against the declared
// vars, and that every input is defined before use. Run between passes.
absl::Status VerifyProgram(const Program& program);
// The same, returning the GraphIndex it checked the program with.
absl::StatusOr<std::unique_ptr<GraphIndex>> VerifyAndIndexProgram(const Program& program);

// "file:LINE: var 'name'" for messages about a var.
std::string VarLocation(const Program& program, const Var& var);

}  // namespace strata

#endif  // STRATA_COMPILER_VALIDATE_H_
