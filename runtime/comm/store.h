#ifndef STRATA_RUNTIME_COMM_STORE_H_
#define STRATA_RUNTIME_COMM_STORE_H_

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

  // A view whose keys live under "prefix/" (Gloo's PrefixStore), so that each
  // group gets its own keys in one store.
  std::unique_ptr<Store> WithPrefix(const std::string& prefix) const;

  // For Gloo's connectFullMesh.
  gloo::rendezvous::Store& gloo_store() const { return *store_; }

 private:
  Store(std::string spec, std::shared_ptr<gloo::rendezvous::Store> store);
  friend absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& spec, bool serve,
                                                          absl::Duration connect_timeout);

  std::string spec_;
  std::shared_ptr<gloo::rendezvous::Store> store_;
};

// Opens the store a spec names. A malformed spec is InvalidArgument naming
// it; a store that cannot be reached (no redis server, unwritable folder) is
// Unavailable.
// Whether `spec` is well formed (the checks OpenStore makes before it opens
// anything): InvalidArgument naming the spec if not.
absl::Status CheckStoreSpec(const std::string& spec);

// The host and port of a tcp:// or redis:// spec; an empty host for the
// one-machine kinds (file://, memory://).
absl::Status StoreHostPort(const std::string& spec, std::string* host, int* port);

// `serve`: this process serves a tcp:// store (refused for other kinds).
// `connect_timeout`: how long a tcp:// client keeps trying to reach the
// server (which may start after it) on each call.
absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& spec, bool serve = false,
                                                 absl::Duration connect_timeout = absl::Minutes(5));

// Creates a fresh folder under $TMPDIR (or /tmp) and returns its file:// spec:
// the default store of a one-machine job. The launcher removes it afterwards.
absl::StatusOr<std::string> MakeTempFileStoreSpec();

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_STORE_H_
