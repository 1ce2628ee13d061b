#include "runtime/worker_env.h"

#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// The variable names of one launcher flavour.
struct Flavour {
  const char* label;  // how error messages call it
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* master_addr;
  const char* master_port;
  bool from_launcher;
};

constexpr Flavour kStrata = {"strata launcher", kEnvRank,       kEnvWorldSize, kEnvLocalRank,
                             kEnvMasterAddr,    kEnvMasterPort, true};
constexpr Flavour kTorchrun = {"torchrun-style", "RANK",        "WORLD_SIZE", "LOCAL_RANK",
                               "MASTER_ADDR",    "MASTER_PORT", false};
constexpr Flavour kSlurm = {"Slurm",       "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                            "MASTER_ADDR", "MASTER_PORT",  false};

// Parses a decimal integer in [min, max]; the whole value must be a number.
absl::StatusOr<int> ParseInt(const char* name, const char* value, int min, int max, const char* expected) {
  int64_t parsed = 0;
  std::string text(value);
  bool ok = !text.empty() && text.find_first_of(" \t\n") == std::string::npos && absl::SimpleAtoi(text, &parsed);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", text, "' is not an integer (expected ", expected, ")"));
  }
  if (parsed < min || parsed > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "=", parsed, " is out of range (expected ", expected, ")"));
  }
  return static_cast<int>(parsed);
}

absl::StatusOr<WorkerEnv> ReadFlavour(const Flavour& f, const EnvLookup& lookup) {
  const char* rank_text = lookup(f.rank);
  const char* world_text = lookup(f.world_size);
  // Slurm's older name for the task count.
  if (world_text == nullptr && &f == &kSlurm) world_text = lookup("SLURM_NPROCS");
  if (rank_text == nullptr || world_text == nullptr) {
    const char* missing = rank_text == nullptr ? f.rank : f.world_size;
    const char* present = rank_text == nullptr ? f.world_size : f.rank;
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", present, " is set but ", missing,
                                                   " is not: a ", f.label, " worker needs both"));
  }
  constexpr int kMax = std::numeric_limits<int>::max();
  WorkerEnv env;
  env.from_launcher = f.from_launcher;
  auto world = ParseInt(f.world_size, world_text, 1, kMax, "a process count from 1 to 2^31 - 1");
  if (!world.ok()) return world.status();
  env.world_size = *world;
  auto rank = ParseInt(f.rank, rank_text, 0, env.world_size - 1,
                       absl::StrCat("0 <= rank < ", f.world_size, "=", env.world_size).c_str());
  if (!rank.ok()) return rank.status();
  env.rank = *rank;
  env.local_rank = env.rank;
  if (const char* local = lookup(f.local_rank)) {
    auto local_rank = ParseInt(f.local_rank, local, 0, env.world_size - 1,
                               absl::StrCat("0 <= local rank < ", f.world_size, "=", env.world_size).c_str());
    if (!local_rank.ok()) return local_rank.status();
    env.local_rank = *local_rank;
  }
  if (const char* addr = lookup(f.master_addr)) {
    env.master_addr = addr;
    if (env.master_addr.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", f.master_addr, " is empty (expected a host name or address)"));
    }
  }
  if (const char* port = lookup(f.master_port)) {
    auto parsed = ParseInt(f.master_port, port, 1, 65535, "a TCP port in 1..65535");
    if (!parsed.ok()) return parsed.status();
    env.master_port = *parsed;
  }
  if (const char* store = lookup(kEnvStore)) env.store_spec = store;
  // torchrun's ranks on this machine (several machines: fewer than the world).
  if (&f == &kTorchrun) {
    if (const char* local = lookup("LOCAL_WORLD_SIZE")) {
      auto parsed = ParseInt("LOCAL_WORLD_SIZE", local, 1, env.world_size,
                             absl::StrCat("1 <= local world size <= ", f.world_size, "=", env.world_size).c_str());
      if (!parsed.ok()) return parsed.status();
      env.local_world_size = *parsed;
    }
  }
  return env;
}

}  // namespace

absl::StatusOr<std::optional<WorkerEnv>> WorkerEnvFromLookup(const EnvLookup& lookup) {
  // A flavour is present when either of its two defining variables is set;
  // for Slurm only SLURM_PROCID counts, since an allocation shell (salloc,
  // sbatch) sets SLURM_NTASKS for a launcher that is not a task itself.
  for (const Flavour* f : {&kStrata, &kTorchrun, &kSlurm}) {
    bool world_counts = f != &kSlurm;
    if (lookup(f->rank) == nullptr && !(world_counts && lookup(f->world_size) != nullptr)) continue;
    auto env = ReadFlavour(*f, lookup);
    if (!env.ok()) return env.status();
    return std::optional<WorkerEnv>(*std::move(env));
  }
  return std::optional<WorkerEnv>();
}

absl::StatusOr<std::optional<WorkerEnv>> WorkerEnvFromEnvironment() {
  return WorkerEnvFromLookup([](const char* name) -> const char* { return std::getenv(name); });
}

GpuPlacement PlaceOnGpu(int local_rank, int local_world, int gpus) {
  GpuPlacement p;
  p.ordinal = local_rank % gpus;
  p.shared = local_world > gpus;
  p.staged = p.shared;
  p.nccl_collectives = !p.shared;
  const std::string where =
      absl::StrCat("--device gpu: ", local_world, " rank(s) on ", gpus, " GPU(s), rank r on GPU r % ", gpus, "; ");
  p.note = p.shared ? absl::StrCat(where,
                                   "ranks sharing a GPU exchange tensors over Gloo, staged through pinned host memory")
                    : absl::StrCat(where,
                                   "one GPU per rank: collectives, sends and receives over NCCL");
  return p;
}

GpuPlacement PlaceOnGpus(const GpuPlacement& counted, const std::vector<std::string>& ids) {
  std::map<std::string, int> first;  // id -> the first rank on it
  for (int r = 0; r < static_cast<int>(ids.size()); ++r) {
    if (ids[r].empty()) {
      GpuPlacement p = counted;
      p.note = absl::StrCat(counted.note, " (rank ", r, " could not name its GPU, so GPUs are counted)");
      return p;
    }
  }
  for (int r = 0; r < static_cast<int>(ids.size()); ++r) {
    const std::string& id = ids[r];
    auto [it, added] = first.emplace(id, r);
    if (added) continue;
    GpuPlacement p = counted;
    p.shared = true;
    p.staged = true;
    p.nccl_collectives = false;
    p.note = absl::StrCat("--device gpu: ranks ", it->second, " and ", r, " share GPU ", id,
                          ", so every rank exchanges tensors over Gloo, staged through pinned host memory");
    return p;
  }
  GpuPlacement p = counted;
  p.shared = false;
  p.staged = false;
  p.nccl_collectives = true;
  p.note = absl::StrCat("--device gpu: ", ids.size(), " rank(s) on ", ids.size(),
                        " distinct GPUs (by UUID): collectives, sends and receives over NCCL");
  return p;
}

}  // namespace strata
