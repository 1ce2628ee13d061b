// One worker of `strata run`: a rank started by the launcher, torchrun or
// Slurm (runtime/worker_env.h), meeting the others before it trains.

#ifndef STRATA_TOOLS_RUN_WORKER_H_
#define STRATA_TOOLS_RUN_WORKER_H_

#include <cstdint>
#include <set>
#include <string>

#include "passes/compile.h"
#include "runtime/device.h"
#include "runtime/worker_env.h"

namespace strata {
namespace cli {

// The NCCL settings a worker's flags imply, in its environment, unless the
// user set them: NCCL_GRAPH_REGISTER=0 with --cuda_graph, NCCL_SOCKET_IFNAME
// from --socket_ifname. NCCL reads them at its first init; call it before
// the process opens its GPU, which starts CUDA's threads (a setenv beside a
// getenv on another thread is undefined).
void SetNcclEnvironment();

// The interface a rank listens on: --socket_ifname, else
// STRATA_SOCKET_IFNAME, else GLOO_SOCKET_IFNAME; "" when none is set.
// `from` gets which of them named it.
std::string SocketIfname(std::string* from);

// What the launcher can check before it starts --nproc workers, so a bad
// --socket_ifname, an uncreatable file:// --store or a damaged --load file
// is one error line, not one a rank: the interface has an address here, the
// store's folder can be made, the checkpoint's files hold their headers and
// data sections whole. 0, or the exit code once it printed why not.
int CheckWorkerSetup();

// A worker: this rank's plan, its communicator, then the same training loop.
// Every error after the store is open is recorded there before the rank
// exits, so the launcher names the first failure in time. `device` is the
// rank's GPU, or null for the host; on a GPU the ranks compare their GPUs
// (PlaceOnGpus, `placement` the count's guess where one cannot say), and
// the communicators stage device tensors through pinned host memory unless
// every rank has a GPU of its own and NCCL is linked in, when collectives
// and transfers go over NCCL (runtime/comm/device_collectives.h).
// Returns the exit code.
// A rank of a job of several that stops before it meets the others (a
// check of its flags, outputs or plan failed, its error already printed)
// tells them through the store, best effort, so they stop waiting for it
// within about a second (AbortRendezvous) instead of at --comm_timeout_s.
// It waits up to 5 s for another rank to arrive; nothing where none does
// (a start every rank fails leaves the store clean), where the store cannot
// be reached (a connect gives up after about 3 s), or where this rank would
// serve it (rank 0 of a tcp:// store).
void AnnounceWorkerExit(const WorkerEnv& env);

int RunWorker(const CompileResult& result, const WorkerEnv& env, uint64_t program_seed,
              const std::set<std::string>& given, Device* device = nullptr,
              const GpuPlacement& placement = GpuPlacement());

}  // namespace cli
}  // namespace strata

#endif  // STRATA_TOOLS_RUN_WORKER_H_
