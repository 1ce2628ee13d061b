#ifndef STRATA_RUNTIME_CHECKPOINT_H_
#define STRATA_RUNTIME_CHECKPOINT_H_

#include <functional>
#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/fault_injection.h"
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
// Which tensors a load reads (the others' bytes are skipped), given the
// metadata of every file of the checkpoint: a pipeline rank needs only its
// stage's share.
using TensorFilter =
    std::function<bool(const std::string& name, const std::map<std::string, std::string>& metadata)>;
// Reads dir/model.safetensors (every *.safetensors of dir, merged), with
// `wanted` only the tensors it names.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir, const TensorFilter* wanted = nullptr);
// Writes one rank's share (dir/file_name, through a temporary name); LoadCheckpoint
// merges every *.safetensors file of a folder, so any layout can load any other's.
absl::Status SaveCheckpointShard(const std::string& dir, const std::string& file_name, const Checkpoint& ckpt);

// ---------------------------------------------------------------------------
// The checkpoint folder (format 2), atomic as a whole:
//   DIR/step-N/model.rank<R>.safetensors   one per rank, fsync'd
//   DIR/step-N/COMMITTED                   written once every rank's file is durable
//   DIR/latest                             "step-N", replaced (temporary name, fsync, rename) last
// A failure anywhere before `latest` is replaced leaves the previous step
// folder, and `latest`, as they were.
inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr char kLatestFileName[] = "latest";
inline constexpr char kCommittedFileName[] = "COMMITTED";

// Whether every rank wrote its file: each rank passes its own write status
// and gets OK only if every rank's was OK (a collective on several ranks).
using AgreeFn = std::function<absl::Status(const absl::Status& mine)>;

struct SaveStepOptions {
  std::string dir;      // --save
  int64_t step = 0;     // the folder is DIR/step-<step>
  int rank = 0;
  int world_size = 1;
  int keep = 2;         // --keep_checkpoints: committed step folders kept (0: all)
  AgreeFn agree;        // null: one rank, its own status
};

// Writes this rank's share of step `step` into DIR/step-N/, agrees with the
// other ranks that every share is durable, then (rank 0) commits the folder,
// points DIR/latest at it and removes what --keep_checkpoints no longer
// keeps. The metadata gains format_version, world_size and step (the same in
// every rank's file: the loader requires shards to agree; the rank is in the
// file's name).
absl::Status SaveCheckpointStep(const SaveStepOptions& options, Checkpoint ckpt);

// Before the first step: `dir` can be created and written, and holds no
// other run's checkpoint (a `latest`), unless this run resumes from it.
absl::Status CheckSaveTarget(const std::string& dir, bool resumes_from_it);

// Whether `load` names the `save` folder or one of its step folders (a run
// resuming into the folder it saves to).
bool LoadsFromSaveFolder(const std::string& load, const std::string& save);
// The step DIR/latest names, or -1 when there is none.
absl::StatusOr<int64_t> LatestStep(const std::string& dir);
// Whether two paths name one folder ("ck", "./ck/").
bool SameFolder(const std::string& a, const std::string& b);

// What `--load PATH` names, resolved: DIR holding `latest` loads the step
// folder it names; a folder of *.safetensors files (DIR/step-N, or a flat
// format-1 folder) as it is. LoadCheckpointFrom then refuses a format-2
// folder that was not committed.
struct CheckpointSource {
  std::string folder;       // where the files are
  std::string description;  // e.g. "ckpt/step-20 (latest)"
  // The save's own id, from its COMMITTED file (a random 64-bit hex number
  // each save draws), which ranks loading "the same" checkpoint compare; ""
  // for folders saved before it existed and flat (format 1) ones.
  std::string save_id;
};
absl::StatusOr<CheckpointSource> ResolveCheckpoint(const std::string& path);
// ResolveCheckpoint, then the metadata of one of its files (no tensor data).
absl::StatusOr<std::map<std::string, std::string>> ReadCheckpointMetadata(const std::string& path);
// ResolveCheckpoint, then each file's header and that its tensors tile its
// data (no tensor data read): what a launcher checks once, before its ranks
// each load their share and fail alike on a truncated file. The names of
// the tensors the files hold.
absl::StatusOr<std::set<std::string>> CheckCheckpointFiles(const std::string& path);
// ResolveCheckpoint, then LoadCheckpoint of its folder; a format-2 folder
// must hold exactly one file per rank of the world that saved it.
absl::StatusOr<Checkpoint> LoadCheckpointFrom(const std::string& path, CheckpointSource* source = nullptr,
                                              const TensorFilter* wanted = nullptr);

// A save has the test hooks checkpoint_partial_write and
// checkpoint_before_agree (runtime/fault_injection.h).

// The safetensors format (readable by Python's `safetensors`): an 8-byte
// little-endian header length, a JSON header
//   {"__metadata__": {str: str}, NAME: {"dtype": "F32"|"F64"|"I64"|"I32"|"BOOL"|"BF16"|"F16",
//    "shape": [...], "data_offsets": [begin, end]}, ...}
// padded with spaces to a multiple of 8 bytes, then the little-endian data, the
// tensors back to back in name order. The reader is strict: truncation, bad
// JSON, unknown dtypes or fields, offsets that do not tile the data exactly are
// errors naming the path (and tensor).
absl::Status WriteSafetensorsFile(const std::string& path, const Checkpoint& ckpt);
absl::StatusOr<Checkpoint> ReadSafetensorsFile(const std::string& path);

}  // namespace strata

#endif  // STRATA_RUNTIME_CHECKPOINT_H_
