#include "tools/run_worker.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/checkpoint.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/device_collectives.h"
#include "runtime/comm/health.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/comm/store.h"
#include "runtime/comm/waiting_for.h"
#include "runtime/trainer.h"
#include "tools/cli_common.h"
#include "tools/cli_flags.h"
#include "tools/training_process.h"

namespace strata {
namespace cli {
namespace {

constexpr absl::Duration kMinRendezvousTimeout = absl::Seconds(5);

// The job's id: --job_id, else what the launcher or torchrun set (their run
// id), else Slurm's job; "default" for ranks started by hand without one.
// A restarted job (torchrun's restarts, a requeued Slurm job) keeps its id
// but counts its restarts: each attempt gets keys of its own.
std::string JobId() {
  if (!absl::GetFlag(FLAGS_job_id).empty()) return absl::GetFlag(FLAGS_job_id);
  const auto env = [](const char* var) -> std::string {
    const char* value = std::getenv(var);
    return value != nullptr ? value : "";
  };
  if (!env("STRATA_JOB_ID").empty()) return env("STRATA_JOB_ID");
  for (const auto& [id, restarts] : {std::pair<const char*, const char*>{"TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"},
                                    {"SLURM_JOB_ID", "SLURM_RESTART_COUNT"}}) {
    if (env(id).empty()) continue;
    return env(restarts).empty() ? env(id) : absl::StrCat(env(id), ".", env(restarts));
  }
  return "default";
}

// The address this rank listens on, on the interface --socket_ifname,
// STRATA_SOCKET_IFNAME or GLOO_SOCKET_IFNAME names, else the one whose route
// reaches the store's host. 0, or the exit code once it printed why not.
int ChooseListenHostname(const WorkerEnv& env, RendezvousOptions* ropts) {
  std::string ifname_from;
  const std::string ifname = SocketIfname(&ifname_from);
  auto listen = ChooseListenAddress(ropts->store_spec, ifname);
  if (!listen.ok()) {
    std::cerr << "error: rank " << env.rank << ": choosing the address to listen on"
              << (ifname.empty() ? "" : absl::StrCat(" (", ifname_from, " ", ifname, ")")) << ": "
              << listen.status().message() << "\n";
    return kExitError;
  }
  ropts->hostname = *listen;
  return 0;
}

// The store the ranks meet in: --store, else the launcher's, else torchrun's
// MASTER_ADDR:MASTER_PORT (served by rank 0); "" when there is none.
std::string StoreSpecOf(const WorkerEnv& env) {
  if (!absl::GetFlag(FLAGS_store).empty()) return absl::GetFlag(FLAGS_store);
  if (!env.store_spec.empty()) return env.store_spec;
  if (env.master_addr.empty() || env.master_port <= 0) return "";
  // An IPv6 MASTER_ADDR may come bare ("::1", as torchrun takes it) or in brackets.
  std::string addr = env.master_addr;
  if (absl::StartsWith(addr, "[") && absl::EndsWith(addr, "]")) addr = addr.substr(1, addr.size() - 2);
  return absl::StrCat("tcp://", HostPortText(addr, env.master_port));
}

// How this rank meets the others: its job, the store (StoreSpecOf), the
// address it listens on, the plan's fingerprint and the timeouts. 0, or the
// exit code once it printed why not.
int FillRendezvousOptions(const WorkerEnv& env, const RankPlan& plan, RendezvousOptions* ropts) {
  ropts->rank = env.rank;
  ropts->world_size = env.world_size;
  ropts->job_id = JobId();
  ropts->store_spec = StoreSpecOf(env);
  if (absl::GetFlag(FLAGS_store).empty() && env.store_spec.empty() && !ropts->store_spec.empty()) {
    // torchrun's way: rank 0 serves the store on MASTER_ADDR:MASTER_PORT.
    if (absl::Status s = CheckStoreSpec(ropts->store_spec); !s.ok()) {
      std::cerr << "error: rank " << env.rank << ": MASTER_ADDR='" << env.master_addr
                << "' is not a host name or address (an IPv6 address bare, ::1, or in brackets, [::1])\n";
      return kExitUsage;
    }
  }
  if (ropts->store_spec.empty()) {
    std::cerr << "error: rank " << env.rank
              << ": no store to meet the other ranks (set MASTER_ADDR and MASTER_PORT, STRATA_STORE, or --store "
                 "redis://HOST:PORT)\n";
    return kExitUsage;
  }
  ropts->serve_store = absl::StartsWith(ropts->store_spec, "tcp://") && env.rank == 0;
  if (int rc = ChooseListenHostname(env, ropts); rc != 0) return rc;
  ropts->fingerprint = plan.fingerprint();
  // The rendezvous also waits for ranks still starting (compiling their
  // plans) and for TCP connects, so it waits at least kMinRendezvousTimeout
  // however short --comm_timeout_s is (0.001 failed every job in its mesh).
  ropts->timeout = std::max(absl::Seconds(absl::GetFlag(FLAGS_comm_timeout_s)), kMinRendezvousTimeout);
  ropts->op_timeout = absl::Seconds(absl::GetFlag(FLAGS_comm_timeout_s));
  return 0;
}

// A rank whose heartbeat stops (SIGSTOP, a dead machine) ends the job
// within --heartbeat_timeout_s, named; the monitor thread ends this process.
HeartbeatMonitor::Options HeartbeatOptions(const WorkerEnv& env, const RendezvousOptions& ropts) {
  HeartbeatMonitor::Options hopts;
  hopts.store_spec = ropts.store_spec;
  hopts.job_id = ropts.job_id;
  hopts.rank = env.rank;
  hopts.world_size = env.world_size;
  hopts.timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  hopts.interval = std::clamp(hopts.timeout / 6, absl::Milliseconds(100), absl::Seconds(3));
  hopts.store_owner = absl::StartsWith(ropts.store_spec, "tcp://") ? 0 : -1;
  hopts.waiting_for = [] { return WaitingFor(); };
  hopts.on_unresponsive = [rank = env.rank](int, const std::string& why) {
    std::cerr << "error: rank " << rank << ": " << why << "\n";
    std::cerr.flush();
    _exit(kExitError);
  };
  return hopts;
}

}  // namespace

void SetNcclEnvironment() {
  if (absl::GetFlag(FLAGS_device) != "gpu") return;
  // A captured step's NCCL ops must not register buffers with the peers
  // while being captured (NCCL_GRAPH_REGISTER, on by default: a host
  // exchange a rank whose capture failed, running eagerly, never joins).
  if (absl::GetFlag(FLAGS_cuda_graph)) setenv("NCCL_GRAPH_REGISTER", "0", /*overwrite=*/0);
  // The interface --socket_ifname names carries NCCL's bootstrap and socket
  // traffic too (NCCL_SOCKET_IFNAME), as it carries Gloo's.
  if (const std::string ifname = absl::GetFlag(FLAGS_socket_ifname); !ifname.empty()) {
    setenv("NCCL_SOCKET_IFNAME", ifname.c_str(), /*overwrite=*/0);
  }
}

std::string SocketIfname(std::string* from) {
  std::string ifname = absl::GetFlag(FLAGS_socket_ifname);
  *from = "--socket_ifname";
  for (const char* var : {"STRATA_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    if (ifname.empty() && std::getenv(var) != nullptr) {
      ifname = std::getenv(var);
      *from = var;
    }
  }
  return ifname;
}

int CheckWorkerSetup() {
  std::string from;
  const std::string store = absl::GetFlag(FLAGS_store);
  if (const std::string ifname = SocketIfname(&from); !ifname.empty()) {
    if (auto address = ChooseListenAddress("", ifname); !address.ok()) {
      std::cerr << "error: " << from << " " << ifname << ": " << address.status().message() << "\n";
      return kExitUsage;
    }
  } else if (absl::StartsWith(store, "tcp://") || absl::StartsWith(store, "redis://")) {
    // Each rank listens where the route to the store's host leaves: a host
    // that does not resolve fails every rank alike.
    if (auto address = ChooseListenAddress(store, ""); !address.ok()) {
      std::cerr << "error: --store " << store << ": " << address.status().message() << "\n";
      return kExitUsage;
    }
  }
  // These workers' rank 0 serves a tcp:// store on this machine: a host
  // that is another's would leave the ranks waiting for one that never came.
  if (std::string host; absl::StartsWith(store, "tcp://")) {
    int port = 0;
    absl::Status s = StoreHostPort(store, &host, &port);
    if (s.ok()) s = CheckHostIsLocal(host);
    if (!s.ok()) {
      std::cerr << "error: --store " << store << ": " << s.message()
                << "; under --nproc rank 0 serves it here (on several machines, start the ranks with torchrun or "
                   "srun)\n";
      return kExitUsage;
    }
  }
  // Opening a file:// store makes its folder (a tcp:// one is served by
  // rank 0, a redis:// one the ranks reach themselves).
  if (absl::StartsWith(store, "file://")) {
    if (auto opened = OpenStore(store); !opened.ok()) {
      std::cerr << "error: --store " << store << ": " << opened.status().message() << "\n";
      return kExitError;
    }
  }
  // A damaged checkpoint file (truncated, not safetensors) every rank would
  // fail on alike; a folder with no checkpoint yet is the ranks' to note.
  if (const std::string load = absl::GetFlag(FLAGS_load); !load.empty()) {
    if (absl::Status s = CheckCheckpointFiles(UserPath(load)).status(); s.code() == absl::StatusCode::kDataLoss) {
      std::cerr << "error: --load " << load << ": " << s.message() << "\n";
      return kExitError;
    }
  }
  return 0;
}

// How long a rank that stops before the rendezvous waits for another to
// arrive and hear of it.
constexpr absl::Duration kAnnounceWait = absl::Seconds(5);

void AnnounceWorkerExit(const WorkerEnv& env) {
  if (env.world_size <= 1) return;
  RendezvousOptions ropts;
  ropts.rank = env.rank;
  ropts.world_size = env.world_size;
  ropts.job_id = JobId();
  ropts.store_spec = StoreSpecOf(env);
  // Rank 0 of a tcp:// store would serve it: nobody could read the news.
  if (ropts.store_spec.empty() || !CheckStoreSpec(ropts.store_spec).ok() ||
      (absl::StartsWith(ropts.store_spec, "tcp://") && env.rank == 0)) {
    return;
  }
  absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(ropts.store_spec, /*serve=*/false, absl::Seconds(2));
  if (!store.ok()) return;
  // The others may still be compiling their plans: a few seconds for one to arrive.
  AbortRendezvous(ropts, **store, "it stopped before meeting the others (its own error line says why)",
                  kAnnounceWait);
}

int RunWorker(const CompileResult& result, const WorkerEnv& env, uint64_t program_seed,
              const std::set<std::string>& given, Device* device, const GpuPlacement& placement) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const int world = static_cast<int>(result.plans.size());
  if (env.world_size != world) {
    std::cerr << "error: rank " << env.rank << ": started with world size " << env.world_size << " but the strategy needs "
              << world << " rank(s)\n";
    return kExitUsage;
  }
  // Under torchrun or srun the outer launcher starts the ranks: a --nproc
  // that disagrees with it was ignored without a word.
  if (const int64_t nproc = absl::GetFlag(FLAGS_nproc);
      !env.from_launcher && given.count("nproc") > 0 && nproc != env.world_size) {
    std::cerr << "error: rank " << env.rank << ": --nproc " << nproc << ", but an outside launcher (torchrun or srun) "
              << "started this process as one of " << env.world_size
              << " ranks; under it, leave --nproc out (its ranks are the job's)\n";
    return kExitUsage;
  }
  const RankPlan& plan = result.plans[env.rank];
  RendezvousOptions ropts;
  if (int rc = FillRendezvousOptions(env, plan, &ropts); rc != 0) {
    AnnounceWorkerExit(env);
    return rc;
  }
  ropts.stage_device_tensors = device != nullptr && !device->host_accessible();
  auto store = OpenStore(ropts.store_spec, ropts.serve_store, ropts.timeout);
  if (!store.ok()) {
    std::cerr << "error: rank " << env.rank << ": " << store.status().message() << "\n";
    return kExitError;
  }
  std::unique_ptr<Store> health = (*store)->WithPrefix(HealthKeyPrefix(ropts.job_id));
  // Exits at once: a heartbeat thread stuck on a stalled store must not hold
  // the process (joining it could hang), and nothing else is left to do.
  auto fail = [&](const absl::Status& status) {
    const std::string message = absl::StrCat("rank ", env.rank, ": ", status.message());
    ReportFailure(*health, env.rank, message).IgnoreError();
    std::cout.flush();
    std::cerr << "error: " << message << std::endl;
    _exit(kExitError);
    return kExitError;
  };
  auto world_comm = Rendezvous(ropts, **store);
  if (!world_comm.ok()) return fail(world_comm.status());
  CommunicatorSet comms(*std::move(world_comm));
  if (auto s = ConnectGroups(ropts, **store, plan.topology().group(), &comms); !s.ok()) return fail(s);
  // Before NCCL's inits, which block without a deadline: a peer that dies
  // first then ends this rank through its heartbeat.
  auto monitor = HeartbeatMonitor::Start(HeartbeatOptions(env, ropts));
  if (!monitor.ok()) return fail(monitor.status());
  // A GPU per rank: collectives and transfers over NCCL (device_collectives.h).
  // Every plan's collectives decide the groups, so all members of a group
  // agree on joining it.
  const std::vector<int> nccl_groups = CollectiveGroups(result.plans, env.rank);
  const bool transfers = !TransferPeers(plan).empty();
  // Which GPU each rank opened decides NCCL or Gloo, for the world at once
  // (PlaceOnGpus); where a rank cannot name its GPU, each machine's guess
  // from its count stands, and ranks on machines that guessed differently
  // would wait in NCCL's init for peers that never come, so they agree
  // first and a difference is one error.
  bool nccl_collectives = false;
  if (device != nullptr) {
    // A UUID names one GPU across machines; containers with hostnames of
    // their own that share a GPU still see one UUID.
    absl::StatusOr<std::vector<std::string>> ids = AllGatherStrings(
        *comms.world(), device->physical_id(), absl::Seconds(absl::GetFlag(FLAGS_comm_timeout_s)));
    if (!ids.ok()) {
      return fail(absl::Status(ids.status().code(),
                               absl::StrCat("comparing the ranks' GPUs: ", ids.status().message())));
    }
    const GpuPlacement placed = PlaceOnGpus(placement, *ids);
    nccl_collectives = placed.nccl_collectives;
    if (env.rank == 0) std::cerr << "note: " << placed.note << "\n";
  }
  const bool nccl = nccl_collectives && device != nullptr && absl::GetFlag(FLAGS_nccl);
  if (auto s = AgreeOnSettings(*comms.world(),
                               {{"device transport", nccl ? "NCCL (a GPU per rank)" : "Gloo (host memory)"},
                                // Each rank's monitor names the others by it: a rank with a longer one
                                // would outwait what its peers call dead.
                                {"--heartbeat_timeout_s", absl::StrCat(absl::GetFlag(FLAGS_heartbeat_timeout_s))}},
                               absl::GetFlag(FLAGS_comm_timeout_s));
      !s.ok()) {
    return fail(s);
  }
  if (nccl && (!nccl_groups.empty() || transfers)) {
    std::shared_ptr<NcclApi> nccl = NewRegisteredNcclApi();
    if (nccl == nullptr) return fail(absl::FailedPreconditionError("--device gpu: this strata links no NCCL"));
    // The library loaded, for the first report of a run on several GPUs.
    if (env.rank == 0) std::cerr << "note: NCCL " << NcclApi::VersionString(nccl->Version()) << "\n";
    std::unique_ptr<Store> job_store = (*store)->WithPrefix(JobKeyPrefix(ropts.job_id));
    if (auto s = ConnectDeviceCollectives(nccl, *job_store, nccl_groups, device, ropts.timeout, &comms); !s.ok()) {
      return fail(s);
    }
    if (transfers) {
      if (auto s = ConnectDeviceTransfers(nccl, *job_store, plan, device, ropts.timeout, &comms); !s.ok()) {
        return fail(s);
      }
    }
  }

  TrainOptions options = TrainOptionsFromFlags(program_seed);
  options.comms = &comms;
  if (device != nullptr) options.device = device;
  if (!options.trace_path.empty()) options.trace_path = absl::StrCat(options.trace_path, ".rank", env.rank);
  // One note for the job: the launcher relays rank 0's stderr.
  if (env.rank == 0) options.notes = RunNotes(given);
  InstallStopHandler();
  auto report = Train(plan, options);
  if (!report.ok()) return fail(report.status());
  (*monitor)->Finish();
  // Every rank is done with the store: the job's keys go, so that the next
  // job with this id can meet in the same Redis server.
  if (comms.world()->Barrier()->Wait(absl::Seconds(absl::GetFlag(FLAGS_comm_timeout_s))).ok() && env.rank == 0) {
    (*store)->WithPrefix(JobKeyPrefix(ropts.job_id))->DeleteAll().IgnoreError();
  }
  PrintSummary(*report);
  if (report->stop_signal != 0) return ReportStopped(*report);
  return 0;
}

}  // namespace cli
}  // namespace strata
