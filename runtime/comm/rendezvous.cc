#include "runtime/comm/rendezvous.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gloo/barrier.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/comm/gloo_message.h"
#include "runtime/comm/staged_communicator.h"

namespace strata {
namespace {

std::chrono::milliseconds Remaining(absl::Time deadline) {
  absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
  return absl::ToChronoMilliseconds(std::min(left, absl::Hours(24 * 30)));
}

// Gloo's connectFullMesh reads peers' keys with get(), which waits 30 s on
// the file and redis stores and not at all on the hash store; this view makes
// every read and wait honour the rendezvous deadline instead.
// A wait is cut into slices of at most kAbortPollPeriod, between which
// `aborted` says whether a member has given up (the rendezvous's abort
// counter): the waiting rank then fails with that reason (aborted_with) in
// about a second, not at the deadline.
constexpr absl::Duration kAbortPollPeriod = absl::Seconds(1);

class DeadlineStore : public gloo::rendezvous::Store {
 public:
  DeadlineStore(gloo::rendezvous::Store& inner, absl::Time deadline,
                std::function<std::string()> aborted)
      : inner_(inner), deadline_(deadline), aborted_(std::move(aborted)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, gloo::kNoTimeout); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const absl::Time until =
        timeout == gloo::kNoTimeout ? deadline_ : std::min(deadline_, absl::Now() + absl::FromChrono(timeout));
    while (true) {
      const absl::Time slice_end = std::min(until, absl::Now() + kAbortPollPeriod);
      try {
        inner_.wait(keys, Remaining(slice_end));
        return;
      } catch (const gloo::IoException& e) {
        if (!absl::StrContains(e.what(), "timeout") || absl::Now() >= until) throw;
        aborted_with_ = aborted_();
        if (!aborted_with_.empty()) throw;
      }
    }
  }

  // Why the last wait ended early: a member's abort ("" if none).
  const std::string& aborted_with() const { return aborted_with_; }

 private:
  gloo::rendezvous::Store& inner_;
  const absl::Time deadline_;
  const std::function<std::string()> aborted_;
  std::string aborted_with_;
};

// Gloo's device setup reads getaddrinfo's result even when the lookup failed
// (undefined behaviour), so the name is resolved here first.
absl::Status CheckResolvable(const std::string& hostname) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* result = nullptr;
  int rv = getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
  if (rv != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve hostname '", hostname, "': ", gai_strerror(rv)));
  }
  freeaddrinfo(result);
  return absl::OkStatus();
}

absl::Status Prefixed(const std::string& where, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(where, ": ", status.message()));
}

std::string AddressText(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof(text));
  } else if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      // ::ffff:a.b.c.d is IPv4 on the wire, and an interface has a.b.c.d,
      // which Gloo can listen on (it finds no interface for the mapped form).
      inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], text, sizeof(text));
      return text;
    }
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    // A link-local address means something only with its interface
    // ("fe80::1%eth0"), which getaddrinfo, and so Gloo, reads back.
    char ifname[IF_NAMESIZE] = {};
    if (in6->sin6_scope_id != 0 && if_indextoname(in6->sin6_scope_id, ifname) != nullptr) {
      return absl::StrCat(text, "%", ifname);
    }
  }
  return text;
}

absl::StatusOr<std::string> InterfaceAddress(const std::string& ifname) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot list the network interfaces: ", std::strerror(errno)));
  }
  std::string ipv4, ipv6;
  std::vector<std::string> names;
  for (const struct ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (std::find(names.begin(), names.end(), i->ifa_name) == names.end()) names.push_back(i->ifa_name);
    if (ifname != i->ifa_name) continue;
    if (i->ifa_addr->sa_family == AF_INET && ipv4.empty()) ipv4 = AddressText(i->ifa_addr);
    if (i->ifa_addr->sa_family == AF_INET6 && ipv6.empty()) ipv6 = AddressText(i->ifa_addr);
  }
  freeifaddrs(list);
  if (!ipv4.empty()) return ipv4;
  if (!ipv6.empty()) return ipv6;
  return absl::NotFoundError(absl::StrCat("network interface '", ifname, "' has no address here (interfaces: ",
                                          absl::StrJoin(names, ", "), ")"));
}

// Resolves the store's host and tries `attempt` on a socket of each of its
// addresses (of `family`) in turn: true once one attempt succeeds, false
// with the last failure's errno text in `why`; an error when the host does
// not resolve.
absl::StatusOr<bool> TryStoreHostAddresses(const std::string& host, int port, int family, int socktype,
                                           const std::function<bool(int fd, const struct addrinfo& a)>& attempt,
                                           std::string* why) {
  struct addrinfo hints = {};
  hints.ai_family = family;
  hints.ai_socktype = socktype;
  struct addrinfo* result = nullptr;
  const int rv = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
  if (rv != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve the store's host '", host, "': ", gai_strerror(rv)));
  }
  bool done = false;
  *why = "no address";
  for (const struct addrinfo* a = result; a != nullptr && !done; a = a->ai_next) {
    const int fd = socket(a->ai_family, socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    done = attempt(fd, *a);
    if (!done) *why = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(result);
  return done;
}

// The local address the kernel would send from to reach host:port (a UDP
// connect sends nothing; it only picks the route).
absl::StatusOr<std::string> RouteSourceAddress(const std::string& host, int port) {
  std::string address, why;
  const absl::StatusOr<bool> routed = TryStoreHostAddresses(
      host, port, AF_UNSPEC, SOCK_DGRAM,
      [&](int fd, const struct addrinfo& a) {
        struct sockaddr_storage local = {};
        socklen_t length = sizeof(local);
        if (connect(fd, a.ai_addr, a.ai_addrlen) != 0 ||
            getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) {
          return false;
        }
        address = AddressText(reinterpret_cast<const sockaddr*>(&local));
        return true;
      },
      &why);
  if (!routed.ok()) return routed.status();
  if (!*routed) {
    // fe80::/10 is the same on every link: the address alone names no route.
    struct in6_addr a6 = {};
    const bool link_local = inet_pton(AF_INET6, host.c_str(), &a6) == 1 && IN6_IS_ADDR_LINKLOCAL(&a6);
    return absl::UnavailableError(
        absl::StrCat("no route to the store's host '", host, "': ", why,
                     link_local ? " (a link-local address needs its interface: [fe80::1%eth0])" : ""));
  }
  return address;
}

// Why a rank's first key can already be in the store, for this kind of store.
std::string KeyTakenCauses(const RendezvousOptions& options, const std::string& spec, int rank) {
  const std::string job = options.job_id.empty() ? "no job id" : absl::StrCat("job id '", options.job_id, "'");
  const std::string twice = absl::StrCat("another process started as rank ", rank, " of this job");
  if (absl::StartsWith(spec, "tcp://")) {
    return absl::StrCat(twice, ", or another job's rank 0 still serves ", spec,
                        ": give each process its own rank, and each job its own port");
  }
  if (absl::StartsWith(spec, "redis://")) {
    // The command names the server, so pasted anywhere it deletes these keys.
    std::string host;
    int port = 0;
    const std::string server =
        StoreHostPort(spec, &host, &port).ok() ? absl::StrCat(" -h ", host, " -p ", port) : std::string();
    return absl::StrCat(twice, ", or an earlier job with ", job,
                        " left its keys in this store (a failed job's expire after a day): give this job another "
                        "--job_id, or delete them (redis-cli",
                        server, " --scan --pattern '", options.job_id.empty() ? "strata" : JobKeyPrefix(options.job_id),
                        "/*' | xargs redis-cli", server, " del)");
  }
  return absl::StrCat(twice, ", or an earlier job with ", job, " left its keys in ", spec.empty() ? "this store" : spec,
                      ": give this job another --job_id or an empty folder");
}

}  // namespace

absl::Status CheckHostIsLocal(const std::string& host) {
  // Any family: a tcp:// store's server listens on IPv6 and IPv4 (TcpStore).
  std::string why;
  const absl::StatusOr<bool> local = TryStoreHostAddresses(
      host, 0, AF_UNSPEC, SOCK_STREAM,
      [](int fd, const struct addrinfo& a) { return bind(fd, a.ai_addr, a.ai_addrlen) == 0; }, &why);
  if (!local.ok()) return local.status();
  if (!*local) {
    return absl::FailedPreconditionError(
        absl::StrCat("the store's host '", host, "' is not an address of this machine (", why, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ChooseListenAddress(const std::string& store_spec, const std::string& ifname) {
  if (!ifname.empty()) return InterfaceAddress(ifname);
  std::string host;
  int port = 0;
  if (absl::Status s = StoreHostPort(store_spec, &host, &port); !s.ok()) return s;
  if (host.empty()) return std::string("127.0.0.1");  // file:// and memory:// stores: one machine
  return RouteSourceAddress(host, port);
}

namespace {

// The view of `store` that options' group meets in.
std::unique_ptr<Store> GroupStore(const RendezvousOptions& options, Store& store) {
  return store.WithPrefix(options.job_id.empty() ? absl::StrCat("strata/", options.group)
                                                 : absl::StrCat(JobKeyPrefix(options.job_id), "/", options.group));
}

}  // namespace

void AbortRendezvous(const RendezvousOptions& options, Store& store, const std::string& why,
                     absl::Duration wait_for_arrival) {
  std::unique_ptr<Store> group_store = GroupStore(options, store);
  // Only where a member waits (one has published its fingerprint): with
  // nobody there the news would outlive this job in a file or redis store
  // and end the corrected rerun, which a store with nothing in it lets run.
  const absl::Time until = absl::Now() + wait_for_arrival;
  while (true) {
    absl::StatusOr<int64_t> arrived = group_store->Add("arrived", 0);
    if (!arrived.ok()) return;
    if (*arrived > 0) break;
    if (absl::Now() >= until) return;
    absl::SleepFor(absl::Milliseconds(100));
  }
  // The first reason stays (keys are write-once); the counter is what the
  // members look at, a counter because a rank may give up precisely because
  // its keys are taken.
  (void)group_store->Set("abort_reason", absl::StrCat("rank ", options.rank, " gave up: ", why));
  (void)group_store->Add("abort", 1);
}

absl::StatusOr<std::unique_ptr<Communicator>> Rendezvous(const RendezvousOptions& options) {
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore(options.store_spec, options.serve_store, options.timeout);
  if (!store.ok()) return store.status();
  return Rendezvous(options, **store);
}

absl::StatusOr<std::unique_ptr<Communicator>> Rendezvous(const RendezvousOptions& options,
                                                         Store& store) {
  const int rank = options.rank;
  const int world = options.world_size;
  const std::string where = absl::StrCat("rendezvous of group '", options.group, "' (rank ", rank,
                                         " of ", world, ", store ", store.spec(), ")");
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the rank must lie in [0, world size) and the world size be >= 1"));
  }
  if (options.group.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the group needs a name"));
  }
  if (options.hostname.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the hostname to listen on is empty (127.0.0.1 for one machine)"));
  }
  if (options.timeout <= absl::ZeroDuration() || options.op_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": timeouts must be positive"));
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  std::unique_ptr<Store> group_store = GroupStore(options, store);

  // A member that cannot join says so through the store (AbortRendezvous: a
  // counter any member may add to, and the first reason), so the others
  // stop waiting for it within about a second instead of at the deadline.
  // A counter left by an earlier job under the same keys ends this one the
  // same way, as the earlier job's keys would anyway.
  const auto give_up = [&](const absl::Status& why) {
    AbortRendezvous(options, store, std::string(why.message()));
    return why;
  };
  const auto aborted = [&]() -> std::string {
    absl::StatusOr<int64_t> count = group_store->Add("abort", 0);
    if (!count.ok() || *count <= 0) return "";
    absl::StatusOr<std::string> reason = group_store->Get("abort_reason", absl::Milliseconds(1));
    if (reason.ok()) return *reason;
    return "a rank gave up (or an earlier job's did, under the same keys: give another --job_id or an empty store)";
  };

  // Before publishing anything: peers then see a missing rank, not a stall.
  absl::Status resolvable = CheckResolvable(options.hostname);
  if (!resolvable.ok()) return give_up(Prefixed(where, resolvable));

  // 1. Fingerprints first, so a rank running another program never connects.
  absl::Status published =
      group_store->Set(absl::StrCat("fingerprint/", rank), options.fingerprint);
  if (absl::IsFailedPrecondition(published)) {
    return give_up(absl::FailedPreconditionError(absl::StrCat(where, ": cannot publish this rank's fingerprint (",
                                                              published.message(), "): ",
                                                              KeyTakenCauses(options, store.spec(), rank))));
  }
  if (absl::IsUnavailable(published) && absl::StartsWith(store.spec(), "file://")) {
    // A folder that is read-only or full fails at once: no wait to speak of.
    return give_up(absl::UnavailableError(
        absl::StrCat(where, ": cannot write this rank's fingerprint into the store's folder (", published.message(), ")")));
  }
  if (absl::IsDeadlineExceeded(published) || absl::IsUnavailable(published)) {
    return absl::DeadlineExceededError(absl::StrCat(where, ": cannot reach the store within ",
                                                    absl::FormatDuration(options.timeout), " (",
                                                    published.message(), ")"));
  }
  if (!published.ok()) return Prefixed(where, published);
  // A member waits from here: one that gives up tells it (AbortRendezvous).
  (void)group_store->Add("arrived", 1);
  std::vector<std::string> fingerprints(world);
  for (int i = 0; i < world; ++i) {
    while (true) {
      const absl::Duration slice = std::min(deadline - absl::Now(), kAbortPollPeriod);
      absl::StatusOr<std::string> fingerprint =
          group_store->Get(absl::StrCat("fingerprint/", i), std::max(slice, absl::Milliseconds(1)));
      if (fingerprint.ok()) {
        fingerprints[i] = *std::move(fingerprint);
        break;
      }
      if (!absl::IsDeadlineExceeded(fingerprint.status())) return Prefixed(where, fingerprint.status());
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            where, ": rank ", i, " did not arrive within ", absl::FormatDuration(options.timeout),
            options.job_id.empty() ? " (is it started, with this store?)"
                                   : absl::StrCat(" (is it started, with this store and job id '", options.job_id, "'?)")));
      }
      if (const std::string why = aborted(); !why.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(where, ": waiting for rank ", i, "'s fingerprint: ", why));
      }
    }
  }
  // Every member reads every fingerprint before rank 0, whose process may
  // serve a tcp:// store, leaves over a mismatch: a peer that had not read
  // rank 0's yet found the store gone and waited out its timeout.
  (void)group_store->Add("fingerprints_read", 1);
  const auto mismatch = [&](absl::Status why) {
    if (rank == 0) {
      const absl::Time until = std::min(deadline, absl::Now() + absl::Seconds(10));
      while (absl::Now() < until) {
        absl::StatusOr<int64_t> read = group_store->Add("fingerprints_read", 0);
        if (!read.ok() || *read >= world) break;
        absl::SleepFor(absl::Milliseconds(20));
      }
    }
    return why;
  };
  for (int i = 1; i < world; ++i) {
    if (fingerprints[i] != fingerprints[0]) {
      return mismatch(absl::FailedPreconditionError(absl::StrCat(
          "rank ", i, " compiled program set ", fingerprints[i], " but rank 0 compiled ",
          fingerprints[0], ": every rank must run the same compiled programs (the same program, strategy, "
          "--batch_size, --device, --disable_passes and STRATA_TENSOR_CORE_ATTENTION) (", where, ")")));
    }
  }

  // 2. The TCP mesh, through keys of its own and within the same deadline.
  std::unique_ptr<Store> mesh_store = group_store->WithPrefix("mesh");
  DeadlineStore bounded(mesh_store->gloo_store(), deadline, aborted);
  std::shared_ptr<gloo::rendezvous::Context> context;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(rank, world);
    context->setTimeout(Remaining(deadline));
    context->connectFullMesh(bounded, device);
    // Nobody leaves until every member has connected its mesh. Gloo's side
    // of a pair that connects is done once the kernel accepts the connection,
    // so a member could otherwise return, finish its work and close its
    // sockets before a slow peer's event loop has seen the connection: that
    // peer then reads end-of-file inside connectFullMesh ("Connection closed
    // by peer"), and a member still waiting for its connect waits out the
    // timeout (communicator_set_test failed 10 of 200 runs so under load). A
    // tcp:// store also lives in rank 0's process, which must not close it
    // early. The barrier runs on the bare context: the communicator's
    // collectives count from #0 after it.
    gloo::BarrierOptions connected(context);
    connected.setTimeout(Remaining(deadline) > std::chrono::milliseconds(0) ? Remaining(deadline)
                                                                            : std::chrono::milliseconds(1));
    gloo::barrier(connected);
    context->setTimeout(absl::ToChronoMilliseconds(options.op_timeout));
  } catch (const gloo::IoException& e) {
    if (!bounded.aborted_with().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": while the TCP mesh connected, ", bounded.aborted_with()));
    }
    // Store waits say "Wait timeout", TCP connects "Connect timeout", the
    // barrier "Timed out waiting".
    if (absl::StrContains(e.what(), "timeout") || absl::StrContains(e.what(), "Timed out")) {
      return absl::DeadlineExceededError(
          absl::StrCat(where, ": the TCP mesh did not connect within ", absl::FormatDuration(options.timeout),
                       " (a rank stopped after publishing its fingerprint?): ", GlooMessage(e.what())));
    }
    if (absl::StrContains(e.what(), "closed by peer") || absl::StrContains(e.what(), "reset by peer")) {
      // The peer connected, then left: it failed (or timed out) first.
      return absl::UnavailableError(absl::StrCat(where,
                                                 ": a peer left while the TCP mesh connected (its own error "
                                                 "comes first): ",
                                                 GlooMessage(e.what())));
    }
    return absl::UnavailableError(absl::StrCat(where, ": cannot connect the TCP mesh: this rank listened on ",
                                               options.hostname, " and tried to reach a peer: ", GlooMessage(e.what()),
                                               " (pick the interface with --socket_ifname)"));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(where, ": cannot connect the TCP mesh on ", options.hostname, ": ", GlooMessage(e.what())));
  } catch (...) {
    return absl::InternalError(absl::StrCat(where, ": unknown exception while connecting"));
  }
  auto comm = std::make_unique<GlooCommunicator>(std::move(context), options.op_timeout);
  if (options.stage_device_tensors) return std::unique_ptr<Communicator>(new StagedCommunicator(std::move(comm)));
  return std::unique_ptr<Communicator>(std::move(comm));
}

absl::Status ConnectGroups(const RendezvousOptions& options, Store& store,
                           const google::protobuf::RepeatedPtrField<CommGroup>& groups, CommunicatorSet* set) {
  std::vector<const CommGroup*> sorted;
  for (const CommGroup& g : groups) sorted.push_back(&g);
  std::sort(sorted.begin(), sorted.end(), [](const CommGroup* a, const CommGroup* b) { return a->id() < b->id(); });
  // Every group is checked before any rendezvous, which would wait out its timeout.
  for (const CommGroup* g : sorted) {
    if (std::find(g->rank().begin(), g->rank().end(), options.rank) == g->rank().end()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " is not a member of group ", g->id(),
                                                     " (ranks ", absl::StrJoin(g->rank(), ", "), ")"));
    }
  }
  for (const CommGroup* g : sorted) {
    const auto me = std::find(g->rank().begin(), g->rank().end(), options.rank);
    if (g->rank_size() == options.world_size) {
      if (absl::Status s = set->Add(*g, nullptr); !s.ok()) return s;
      continue;
    }
    RendezvousOptions group_options = options;
    group_options.group = absl::StrCat("g", g->id());
    group_options.rank = static_cast<int>(me - g->rank().begin());
    group_options.world_size = g->rank_size();
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Rendezvous(group_options, store);
    if (!comm.ok()) {
      return absl::Status(comm.status().code(),
                          absl::StrCat("connecting group ", g->id(), " (", absl::StrJoin(g->axis(), ","), ": ranks ",
                                       absl::StrJoin(g->rank(), ", "), "): ", comm.status().message()));
    }
    if (absl::Status s = set->Add(*g, *std::move(comm)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace strata
