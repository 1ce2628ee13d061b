#ifndef STRATA_RUNTIME_CHECKPOINT_H_
#define STRATA_RUNTIME_CHECKPOINT_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/tensor.h"

namespace strata {

// Everything a run needs to resume, keyed by global var name, so a checkpoint
// written under one parallel layout loads under any other.
struct Checkpoint {
  std::map<std::string, Tensor> tensors;        // parameters and optimizer state (host tensors)
  std::map<std::string, std::string> metadata;  // e.g. "step", "epoch", "data_position", "program_fingerprint"
};

// The file inside a checkpoint directory.
inline constexpr char kCheckpointFileName[] = "model.safetensors";

// Creates `dir` (and its parents) and writes dir/model.safetensors through a
// temporary file renamed into place, so a crash never leaves a torn checkpoint.
absl::Status SaveCheckpoint(const std::string& dir, const Checkpoint& ckpt);
// Reads dir/model.safetensors.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir);
// Writes one rank's share (dir/file_name, through a temporary name); LoadCheckpoint
// merges every *.safetensors file of a folder, so any layout can load any other's.
absl::Status SaveCheckpointShard(const std::string& dir, const std::string& file_name, const Checkpoint& ckpt);

// The safetensors format (readable by Python's `safetensors`): an 8-byte
// little-endian header length, a JSON header
//   {"__metadata__": {str: str}, NAME: {"dtype": "F32"|"F64"|"I64"|"I32"|"BOOL",
//    "shape": [...], "data_offsets": [begin, end]}, ...}
// padded with spaces to a multiple of 8 bytes, then the little-endian data, the
// tensors back to back in name order. The reader is strict: truncation, bad
// JSON, unknown dtypes or fields, offsets that do not tile the data exactly are
// errors naming the path (and tensor).
absl::Status WriteSafetensorsFile(const std::string& path, const Checkpoint& ckpt);
absl::StatusOr<Checkpoint> ReadSafetensorsFile(const std::string& path);

}  // namespace strata

#endif  // STRATA_RUNTIME_CHECKPOINT_H_
