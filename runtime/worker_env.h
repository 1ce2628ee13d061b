#ifndef STRATA_RUNTIME_WORKER_ENV_H_
#define STRATA_RUNTIME_WORKER_ENV_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

// Variables our launcher (runtime/launcher.h) sets for each worker. They take
// precedence over any torchrun or Slurm variables inherited from outside.
inline constexpr char kEnvRank[] = "STRATA_RANK";
inline constexpr char kEnvWorldSize[] = "STRATA_WORLD_SIZE";
inline constexpr char kEnvLocalRank[] = "STRATA_LOCAL_RANK";
inline constexpr char kEnvStore[] = "STRATA_STORE";
inline constexpr char kEnvMasterAddr[] = "STRATA_MASTER_ADDR";
inline constexpr char kEnvMasterPort[] = "STRATA_MASTER_PORT";

// Where this process sits in a multi-process job.
struct WorkerEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;       // index on this machine (picks the GPU)
  int local_world_size = 0;  // ranks on this machine (torchrun's LOCAL_WORLD_SIZE); 0: unknown, one machine assumed
  std::string master_addr;  // "" when not given
  int master_port = 0;      // 0 when not given
  // Rendezvous store, e.g. "file:///tmp/strata_store.XXXX"; "" when not given
  // (then the rendezvous uses master_addr:master_port).
  std::string store_spec;
  bool from_launcher = false;  // started by `strata run --nproc N`
};

// Reads the worker environment, first match wins:
//   1. STRATA_RANK, STRATA_WORLD_SIZE, STRATA_LOCAL_RANK, STRATA_STORE,
//      STRATA_MASTER_ADDR, STRATA_MASTER_PORT (our launcher);
//   2. torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//      MASTER_PORT;
//   3. Slurm (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, plus
//      MASTER_ADDR / MASTER_PORT.
// A flavour is present when its rank or world-size variable is set (for Slurm
// only SLURM_PROCID: an salloc/sbatch shell sets SLURM_NTASKS without being a
// task). For 2 and 3 STRATA_STORE, when set, also gives the store. A missing
// local rank defaults to the rank (one machine). Returns nullopt when none of
// the three is present (a single-process run). Malformed values (not an integer,
// negative, rank >= world size, a port outside 1..65535, a rank without a
// world size or the reverse) are InvalidArgument naming the variable.
absl::StatusOr<std::optional<WorkerEnv>> WorkerEnvFromEnvironment();

// The same over an injectable lookup (nullptr = unset), for tests.
using EnvLookup = std::function<const char*(const char* name)>;
absl::StatusOr<std::optional<WorkerEnv>> WorkerEnvFromLookup(const EnvLookup& lookup);

// Where a rank of a GPU job runs and how it reaches its peers.
struct GpuPlacement {
  int ordinal = 0;  // local_rank % gpus
  // Another rank of this machine uses the same GPU (more local ranks than
  // GPUs; one machine assumed when the local world size is unknown).
  bool shared = false;
  // Tensors between ranks go over Gloo staged through pinned host memory
  // (ranks sharing a GPU, which NCCL refuses).
  bool staged = true;
  // Collectives and transfers go over NCCL (each rank has a GPU of its
  // own), where the binary links NCCL (runtime/comm/device_collectives.h).
  bool nccl_collectives = false;
  // The one line rank 0 logs about it, without "note: ".
  std::string note;
};

// Rank `local_rank` of `local_world` ranks on a machine with `gpus` GPUs (> 0).
GpuPlacement PlaceOnGpu(int local_rank, int local_world, int gpus);

// The placement once every rank has opened its GPU and the ranks have
// exchanged which GPU that is: ids[r] is rank r's Device::physical_id (a
// UUID, unique across machines), so a rank that sees one GPU through its own
// CUDA_VISIBLE_DEVICES (Slurm's --gpus-per-task) is told from ranks that
// share one. Two equal ids: every rank stages through the host (the device
// transport is one choice for the world, and NCCL refuses two ranks on one
// GPU); all distinct: NCCL. `counted` (PlaceOnGpu's guess from the GPU
// count) stands where a rank could not name its GPU (an empty id).
GpuPlacement PlaceOnGpus(const GpuPlacement& counted, const std::vector<std::string>& ids);

}  // namespace strata

#endif  // STRATA_RUNTIME_WORKER_ENV_H_
