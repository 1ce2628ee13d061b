#ifndef STRATA_COMPILER_VALIDATE_H_
#define STRATA_COMPILER_VALIDATE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/graph_index.h"
#include "proto/program.pb.h"

namespace strata {

// Elements per tensor beyond which a shape is absurd (2^40: 4 TiB of F32):
// declared shapes are held to it at validation, and a batched var at its
// micro-batch at compile time, so no byte count past it can overflow.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;

// The first compiler step over a user's program: checks every declared var
// and every op (registered type, argument counts, attrs, definition before
// use, single definition), fills in attr defaults, infers and records the type
// of every intermediate var and assigns roles (FORWARD, LOSS) and stable
// uids. Errors name the file, line, op (index and type) or var. Stages come
// after, from the placement pass (passes/placement.h).
absl::Status ValidateAndInferProgram(Program* program);

// Re-infers every op's output types and checks them against the declared
// vars, and that every input is defined before use. Run between passes.
absl::Status VerifyProgram(const Program& program);
// The same, returning the GraphIndex it checked the program with.
absl::StatusOr<std::unique_ptr<GraphIndex>> VerifyAndIndexProgram(const Program& program);

// "file:LINE: var 'name'" for messages about a var.
std::string VarLocation(const Program& program, const Var& var);

}  // namespace strata

#endif  // STRATA_COMPILER_VALIDATE_H_
