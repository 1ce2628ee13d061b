#ifndef STRATA_COMPILER_PROGRAM_TEXT_H_
#define STRATA_COMPILER_PROGRAM_TEXT_H_

// Reading programs and strategies written as protobuf text. Errors carry
// file:line:column; each op remembers its line so later messages can point at it.

#include <string>

#include "absl/status/statusor.h"
#include "proto/plan.pb.h"
#include "proto/program.pb.h"
#include "proto/strategy.pb.h"

namespace strata {

absl::StatusOr<Program> ParseProgramText(const std::string& text, const std::string& filename);
absl::StatusOr<Program> ReadProgramFile(const std::string& path);
absl::StatusOr<Strategy> ParseStrategyText(const std::string& text, const std::string& filename);
absl::StatusOr<Strategy> ReadStrategyFile(const std::string& path);
absl::StatusOr<RankPlan> ReadRankPlanFile(const std::string& path);

// Reads a whole file; NotFound / InvalidArgument naming the path.
absl::StatusOr<std::string> ReadFile(const std::string& path);
// Writes through a temporary name and a rename, so readers never see half a file.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

std::string ProgramToText(const google::protobuf::Message& message);

// "file:LINE: op #I 'type'" for messages about an op.
std::string OpLocation(const Program& program, int op_index);
// The same from its parts: `file` (the source file, else the program name),
// then ":line" when known, " op #i 'type'" and " (name)" when named.
std::string OpLocation(absl::string_view file, int op_index, absl::string_view type, int line, absl::string_view name);

}  // namespace strata

#endif  // STRATA_COMPILER_PROGRAM_TEXT_H_
