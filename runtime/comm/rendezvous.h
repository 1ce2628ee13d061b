#ifndef STRATA_RUNTIME_COMM_RENDEZVOUS_H_
#define STRATA_RUNTIME_COMM_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/plan.pb.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/comm/store.h"

namespace strata {

struct RendezvousOptions {
  int rank = 0;
  int world_size = 1;
  // Where ranks meet (see store.h): file:///DIR (the launcher's default, a
  // fresh folder from MakeTempFileStoreSpec), redis://HOST:PORT, memory://NAME.
  std::string store_spec;
  // This rank serves a tcp:// store (rank 0, as torchrun's master does).
  bool serve_store = false;
  // Keys live under "strata/<job_id>/<group>/" ("strata/<group>/" without a
  // job id), so several groups, and jobs, can meet in one store.
  std::string job_id;
  std::string group = "world";
  // Fingerprint of the compiled program set; every rank must bring the same.
  std::string fingerprint;
  // Address this rank's connections listen on: loopback when every rank is
  // on one machine; across machines, an address of this machine that the
  // other ranks can reach (on the network of MASTER_ADDR).
  std::string hostname = "127.0.0.1";
  // Bounds the whole rendezvous: a rank that never arrives is an error.
  absl::Duration timeout = absl::Seconds(300);
  // Bounds each collective inside Gloo (--comm_timeout_s).
  absl::Duration op_timeout = absl::Seconds(300);
  // The communicators move tensors of any device, staging those the host
  // cannot address through host memory (StagedCommunicator): several ranks
  // on one GPU. Off, Gloo refuses a GPU tensor.
  bool stage_device_tensors = false;
};

// The address this rank's connections listen on, as PyTorch's Gloo backend
// picks it: the IPv4 (else IPv6) address of interface `ifname` when one is
// named (--socket_ifname, STRATA_SOCKET_IFNAME or GLOO_SOCKET_IFNAME);
// otherwise the local address of the route to the store's host (tcp:// and
// redis:// stores), which is loopback only when the store is on this machine;
// and 127.0.0.1 for one-machine stores (file://, memory://). Errors name the
// interface (and the ones there are) or the host.
absl::StatusOr<std::string> ChooseListenAddress(const std::string& store_spec, const std::string& ifname);

// OK when `host` resolves to an address of this machine, IPv4 or IPv6 (a
// socket can bind to it; the store's server listens on both); else why not,
// naming the host. A tcp:// store under `run --nproc` is served by rank 0
// here, so its host must be one.
absl::Status CheckHostIsLocal(const std::string& host);

// Meets the other ranks and returns a connected GlooCommunicator.
//  1. Every rank publishes its fingerprint and waits for all others':
//     a missing rank is DeadlineExceeded naming it; a different fingerprint
//     is FailedPrecondition on every rank, naming both fingerprints and ranks.
//  2. Gloo connects the full TCP mesh, within what is left of the timeout.
// A store serves one rendezvous per group (keys are write-once).
absl::StatusOr<std::unique_ptr<Communicator>> Rendezvous(const RendezvousOptions& options);

// The same through an already-open store (options.store_spec is ignored).
absl::StatusOr<std::unique_ptr<Communicator>> Rendezvous(const RendezvousOptions& options,
                                                         Store& store);

// Tells the members of options' group (rank, job id, group) through `store`
// that this rank gives up, with `why`: a member waiting in Rendezvous for it
// stops within about a second and names it (the first reason stays). For a
// rank that fails before it meets the others (its checks, its listen
// address); Rendezvous calls it itself where it gives up. Nothing when no
// member arrives within `wait_for_arrival`, so a start that every rank
// fails leaves a clean store behind (a member arriving later waits out its
// timeout, naming the missing rank).
void AbortRendezvous(const RendezvousOptions& options, Store& store, const std::string& why,
                     absl::Duration wait_for_arrival = absl::ZeroDuration());

// Adds to `set` (whose world communicator came from Rendezvous with
// `options`) a communicator for each group of `groups` that this rank belongs
// to: null for a group of the whole world (the world's serves it); otherwise
// a rendezvous of the group's members alone, through the same store under the
// group's own prefix ("g<id>", c10d's PrefixStore per group), with the
// group's rank numbering. Every rank connects its groups in increasing id
// order, so the lowest group not yet connected always has all its members
// waiting for it and no two groups wait on each other. Errors name the group.
absl::Status ConnectGroups(const RendezvousOptions& options, Store& store,
                           const google::protobuf::RepeatedPtrField<CommGroup>& groups, CommunicatorSet* set);

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_RENDEZVOUS_H_
