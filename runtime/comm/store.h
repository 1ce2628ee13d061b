#ifndef STRATA_RUNTIME_COMM_STORE_H_
#define STRATA_RUNTIME_COMM_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gloo {
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace strata {

// What Add and DeleteAll need beyond Gloo's store interface, one kind per
// backend (store.cc); a store's prefixed views share it.
class StoreBackend;

// A redis:// store's keys expire this long after their write unless
// OpenStore is told otherwise: a job's keys never outlive it by much, even
// when it is killed before its DeleteAll.
inline constexpr absl::Duration kDefaultRedisKeyTtl = absl::Hours(24);

// The key-value store ranks meet through at rendezvous: Gloo's stores behind
// a Status-returning surface (Gloo throws). Keys are write-once, like Gloo's.
//
// Specs:
//   file:///DIR         Gloo FileStore in DIR (created if missing), one machine
//   redis://HOST:PORT   Gloo RedisStore (PORT defaults to 6379), several machines
//   memory://NAME       Gloo HashStore shared by every Store opened on NAME in
//                       this process: ranks as threads in tests
//   tcp://HOST:PORT     TcpStore (tcp_store.h): served on PORT by the rank
//                       that opens it with `serve` (rank 0, like torchrun's
//                       MASTER_ADDR:MASTER_PORT), reached at HOST:PORT by the others
//
// A Store object is used by one thread at a time (Gloo's FileStore and
// RedisStore are not thread-safe); each rank opens its own.
//
// Besides the write-once keys, a store holds integer counters (Add), in a
// namespace of their own: c10d's add, atomic across every Store opened on the
// same spec, in any process on any machine. Where each backend keeps them:
//   file://   one file per counter in DIR ("counter-" and the FNV-1a of the
//             full key, holding the value and the key), updated under flock
//   redis://  the redis key "<full key>#counter", by INCRBY
//   memory:// beside the named store's keys, under its mutex
//   tcp://    in the serving rank's process (TcpStore's 'A' op)
// Every key and counter a redis:// store writes expires `key_ttl` after its
// write (OpenStore).
class Store {
 public:
  ~Store();

  // The spec this store was opened from, with its prefix ("redis://h:1/group").
  const std::string& spec() const { return spec_; }

  // Fails if the key is already set (keys are write-once).
  absl::Status Set(const std::string& key, const std::string& value);
  // Waits up to `timeout` for the key, then reads it.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout);
  // Waits up to `timeout` until every key is set. The file and redis stores
  // poll and measure in whole seconds, so they may overshoot by up to 1 s.
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);

  // c10d's add: atomically adds `delta` to the counter `key` (0 when absent)
  // and returns the new value; Add(key, 0) reads it without creating it.
  // A counter holding garbage is DataLoss; a sum that would overflow 64 bits
  // is OutOfRange and changes nothing.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  // Removes every key and counter under this store's prefix (a view's keys
  // under "prefix/", not those of a sibling "prefix2"), so that the next job
  // with the same prefix can set the same keys again. Meant for when every
  // rank is done: a rank still waiting on a key may then wait in vain. An
  // unprefixed redis:// store refuses (FailedPrecondition): the server may
  // hold other jobs' keys. Elsewhere an unprefixed store empties itself.
  absl::Status DeleteAll();

  // A view whose keys and counters live under "prefix/" (Gloo's
  // PrefixStore), so that each group gets its own keys in one store.
  std::unique_ptr<Store> WithPrefix(const std::string& prefix) const;

  // For Gloo's connectFullMesh.
  gloo::rendezvous::Store& gloo_store() const { return *store_; }

 private:
  Store(std::string spec, std::string key_prefix, std::shared_ptr<gloo::rendezvous::Store> store,
        std::shared_ptr<StoreBackend> backend);
  friend absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& spec, bool serve,
                                                          absl::Duration connect_timeout, absl::Duration key_ttl);

  // `key` as the unprefixed store names it ("a/b/key" in view "a" then "b").
  std::string FullKey(const std::string& key) const;

  std::string spec_;
  // What Gloo's PrefixStores put before a key: "" for the store OpenStore
  // returns, "a/b/" for its view "a" then "b".
  std::string key_prefix_;
  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::shared_ptr<StoreBackend> backend_;
};

// Opens the store a spec names. A malformed spec is InvalidArgument naming
// it; a store that cannot be reached (no redis server, unwritable folder) is
// Unavailable.
// Whether `spec` is well formed (the checks OpenStore makes before it opens
// anything): InvalidArgument naming the spec if not.
absl::Status CheckStoreSpec(const std::string& spec);

// Where a job's keys live in a shared store: "strata/<job_id>" (a job's
// rendezvous groups and health keys are below it).
std::string JobKeyPrefix(const std::string& job_id);

// The host and port of a tcp:// or redis:// spec; an empty host for the
// one-machine kinds (file://, memory://).
absl::Status StoreHostPort(const std::string& spec, std::string* host, int* port);

// "HOST:PORT", an IPv6 address in brackets ("[::1]:29500"), as a store spec
// writes it.
std::string HostPortText(const std::string& host, int port);

// `serve`: this process serves a tcp:// store (refused for other kinds).
// `connect_timeout`: how long a tcp:// client keeps trying to reach the
// server (which may start after it) on each call; for redis:// how long one
// command of the store's own connection (Set, Add, DeleteAll) may take.
// `key_ttl`: redis:// only (ignored by the others): how long each key and
// counter lives after its write; InfiniteDuration keeps them until
// DeleteAll. Not positive is InvalidArgument.
absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& spec, bool serve = false,
                                                 absl::Duration connect_timeout = absl::Minutes(5),
                                                 absl::Duration key_ttl = kDefaultRedisKeyTtl);

// Creates a fresh folder $TMPDIR/strata_store.XXXXXX (TMPDIR or /tmp) and
// returns its file:// spec: the default store of a one-machine job, removed
// by whoever asked for it when the job ends. The folder holds an owner.lock
// that this process keeps flock'ed for the rest of its life, so that
// RemoveStaleTempFileStores can tell an abandoned folder from a live job's.
// Calls RemoveStaleTempFileStores first (its failure is not this one's).
absl::StatusOr<std::string> MakeTempFileStoreSpec();

// Removes the strata_store.* folders under $TMPDIR (or /tmp) that
// MakeTempFileStoreSpec made for a process that has since died (SIGKILL
// leaves them behind) and returns how many. Death is proven by taking the
// folder's owner.lock: the kernel releases an flock exactly when its last
// holder exits, so unlike a recorded pid it cannot be fooled by a recycled
// pid or another pid namespace. A folder without owner.lock (another
// program's, or one being made), one whose lock is held, a symbolic link and
// another user's folder are left alone.
absl::StatusOr<int> RemoveStaleTempFileStores();

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_STORE_H_
