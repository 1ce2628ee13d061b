#include "runtime/comm/store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <chrono>
#include <exception>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/redis_store.h"
#include "gloo/rendezvous/store.h"
#include "hiredis.h"
#include "runtime/comm/tcp_store.h"

namespace strata {
namespace {

constexpr char kSpecHelp[] = "expected file:///DIR, redis://HOST:PORT, tcp://HOST:PORT or memory://NAME";

// Gloo's FileStore refuses to read an empty value, so every value is stored
// behind a one-byte marker.
constexpr char kValueMarker = 'v';

// Gloo reads a zero timeout as "wait forever".
std::chrono::milliseconds ToGlooTimeout(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return gloo::kNoTimeout;
  timeout = std::max(timeout, absl::Milliseconds(1));
  timeout = std::min(timeout, absl::Hours(24 * 30));
  return absl::ToChronoMilliseconds(timeout);
}

// Runs a Gloo store call; its exceptions become a Status prefixed by `what`.
template <typename F>
absl::Status GuardStore(const std::string& what, F&& body) {
  try {
    body();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    if (absl::StrContains(e.what(), "Wait timeout")) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": ", e.what()));
    }
    return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": unknown exception"));
  }
}

// memory:// stores: one HashStore per name for the life of the process.
std::shared_ptr<gloo::rendezvous::Store> MemoryStore(const std::string& name) {
  static std::mutex* mu = new std::mutex();
  static auto* stores =
      new absl::flat_hash_map<std::string, std::shared_ptr<gloo::rendezvous::Store>>();
  std::lock_guard<std::mutex> lock(*mu);
  auto& store = (*stores)[name];
  if (store == nullptr) store = std::make_shared<gloo::rendezvous::HashStore>();
  return store;
}

// Gloo's RedisStore constructor leaks its connection when it throws, so
// reachability is checked here first with the same client library.
absl::Status ProbeRedis(const std::string& host, int port) {
  struct timeval timeout = {2, 0};
  redisContext* probe = redisConnectWithTimeout(host.c_str(), port, timeout);
  if (probe == nullptr) return absl::UnavailableError("cannot allocate a redis connection");
  absl::Status status = absl::OkStatus();
  if (probe->err != 0) status = absl::UnavailableError(probe->errstr);
  redisFree(probe);
  return status;
}

// mkdir -p.
absl::Status MakeDirectories(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string prefix = path.substr(0, pos);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::UnavailableError(
          absl::StrCat("cannot create folder ", prefix, ": ", strerror(errno)));
    }
  }
  struct stat info;
  if (stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::UnavailableError(absl::StrCat(path, " is not a folder"));
  }
  return absl::OkStatus();
}

}  // namespace

Store::Store(std::string spec, std::shared_ptr<gloo::rendezvous::Store> store)
    : spec_(std::move(spec)), store_(std::move(store)) {}

Store::~Store() = default;

absl::Status Store::Set(const std::string& key, const std::string& value) {
  std::vector<char> data;
  data.reserve(value.size() + 1);
  data.push_back(kValueMarker);
  data.insert(data.end(), value.begin(), value.end());
  return GuardStore(absl::StrCat("store ", spec_, ": cannot set key '", key, "'"),
                    [&] { store_->set(key, data); });
}

absl::StatusOr<std::string> Store::Get(const std::string& key, absl::Duration timeout) {
  absl::Status waited = Wait({key}, timeout);
  if (!waited.ok()) return waited;
  std::vector<char> data;
  absl::Status status = GuardStore(absl::StrCat("store ", spec_, ": cannot read key '", key, "'"),
                                   [&] { data = store_->get(key); });
  if (!status.ok()) return status;
  if (data.empty() || data[0] != kValueMarker) {
    return absl::DataLossError(
        absl::StrCat("store ", spec_, ": key '", key, "' was not written through strata::Store"));
  }
  return std::string(data.begin() + 1, data.end());
}

absl::Status Store::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::Status status =
      GuardStore(absl::StrCat("store ", spec_, ": waiting for key(s) ", absl::StrJoin(keys, ", ")),
                 [&] { store_->wait(keys, ToGlooTimeout(timeout)); });
  if (absl::IsDeadlineExceeded(status)) {
    // A tcp:// store whose server never came up says so.
    const bool unreachable = absl::StrContains(status.message(), "cannot reach the store");
    return absl::DeadlineExceededError(absl::StrCat(
        "store ", spec_, ": key(s) ", absl::StrJoin(keys, ", "), " not set within ", absl::FormatDuration(timeout),
        unreachable ? " (cannot reach the store: is rank 0 running and MASTER_ADDR:MASTER_PORT right?)" : ""));
  }
  return status;
}

std::unique_ptr<Store> Store::WithPrefix(const std::string& prefix) const {
  std::shared_ptr<gloo::rendezvous::Store> parent = store_;
  // The deleter holds the parent: Gloo's PrefixStore keeps only a reference.
  std::shared_ptr<gloo::rendezvous::Store> prefixed(
      new gloo::rendezvous::PrefixStore(prefix, *parent),
      [parent](gloo::rendezvous::Store* store) { delete store; });
  return std::unique_ptr<Store>(new Store(absl::StrCat(spec_, "/", prefix), std::move(prefixed)));
}

namespace {

// "HOST:PORT" of a redis:// or tcp:// spec.
absl::Status ParseHostPort(const std::string& spec, absl::string_view rest, int default_port, std::string* host,
                           int* port) {
  absl::string_view h = rest;
  *port = default_port;
  size_t colon = rest.rfind(':');
  if (colon != absl::string_view::npos) {
    h = rest.substr(0, colon);
    if (!absl::SimpleAtoi(rest.substr(colon + 1), port) || *port <= 0 || *port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("store spec '", spec, "': the port must be a number in 1..65535, HOST:PORT"));
    }
  } else if (default_port == 0) {
    return absl::InvalidArgumentError(absl::StrCat("store spec '", spec, "': expected HOST:PORT"));
  }
  if (h.empty() || absl::StrContains(h, "/")) {
    return absl::InvalidArgumentError(absl::StrCat("store spec '", spec, "': expected HOST:PORT"));
  }
  *host = std::string(h);
  return absl::OkStatus();
}

}  // namespace

absl::Status StoreHostPort(const std::string& spec, std::string* host, int* port) {
  absl::string_view rest = spec;
  host->clear();
  *port = 0;
  if (absl::ConsumePrefix(&rest, "tcp://")) return ParseHostPort(spec, rest, 0, host, port);
  if (absl::ConsumePrefix(&rest, "redis://")) return ParseHostPort(spec, rest, 6379, host, port);
  return CheckStoreSpec(spec);
}

absl::Status CheckStoreSpec(const std::string& spec) {
  absl::string_view rest = spec;
  std::string host;
  int port = 0;
  if (absl::ConsumePrefix(&rest, "tcp://")) return ParseHostPort(spec, rest, 0, &host, &port);
  if (absl::ConsumePrefix(&rest, "redis://")) return ParseHostPort(spec, rest, 6379, &host, &port);
  if (absl::ConsumePrefix(&rest, "file://")) {
    if (rest.empty() || rest[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("store spec '", spec, "': a file store needs an absolute folder, file:///DIR"));
    }
    return absl::OkStatus();
  }
  if (absl::ConsumePrefix(&rest, "memory://")) {
    if (rest.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("store spec '", spec, "': a memory store needs a name, memory://NAME"));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("store spec '", spec, "': ", kSpecHelp));
}

absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& spec, bool serve, absl::Duration connect_timeout) {
  // Well formed from here on: the branches only take the spec apart.
  if (auto s = CheckStoreSpec(spec); !s.ok()) return s;
  absl::string_view rest = spec;
  if (serve && !absl::StartsWith(spec, "tcp://")) {
    return absl::InvalidArgumentError(absl::StrCat("store spec '", spec, "': only a tcp:// store is served by a rank"));
  }
  if (absl::ConsumePrefix(&rest, "tcp://")) {
    std::string host;
    int port = 0;
    if (auto s = ParseHostPort(spec, rest, 0, &host, &port); !s.ok()) return s;
    auto store = TcpStore::Create(host, port, serve, ToGlooTimeout(connect_timeout));
    if (!store.ok()) return absl::UnavailableError(absl::StrCat("store spec '", spec, "': ", store.status().message()));
    return std::unique_ptr<Store>(new Store(spec, *std::move(store)));
  }
  if (absl::ConsumePrefix(&rest, "file://")) {
    std::string path(rest);
    absl::Status made = MakeDirectories(path);
    if (!made.ok()) {
      return absl::UnavailableError(absl::StrCat("store spec '", spec, "': ", made.message()));
    }
    std::shared_ptr<gloo::rendezvous::Store> store;
    absl::Status status = GuardStore(absl::StrCat("store spec '", spec, "'"), [&] {
      store = std::make_shared<gloo::rendezvous::FileStore>(path);
    });
    if (!status.ok()) return status;
    return std::unique_ptr<Store>(new Store(spec, std::move(store)));
  }
  if (absl::ConsumePrefix(&rest, "redis://")) {
    std::string host;
    int port = 6379;
    if (auto s = ParseHostPort(spec, rest, 6379, &host, &port); !s.ok()) return s;
    const std::string what =
        absl::StrCat("store spec '", spec, "': cannot reach the redis server at ", host, ":", port);
    absl::Status reachable = ProbeRedis(host, port);
    if (!reachable.ok())
      return absl::UnavailableError(absl::StrCat(what, ": ", reachable.message()));
    std::shared_ptr<gloo::rendezvous::Store> store;
    absl::Status status = GuardStore(what, [&] {
      store = std::make_shared<gloo::rendezvous::RedisStore>(host, port);
    });
    if (!status.ok()) return absl::UnavailableError(status.message());
    return std::unique_ptr<Store>(new Store(spec, std::move(store)));
  }
  absl::ConsumePrefix(&rest, "memory://");  // the one kind left
  return std::unique_ptr<Store>(new Store(spec, MemoryStore(std::string(rest))));
}

absl::StatusOr<std::string> MakeTempFileStoreSpec() {
  const char* tmpdir = getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmpdir != nullptr && tmpdir[0] == '/' ? tmpdir : "/tmp",
                                     "/strata-rendezvous-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a rendezvous folder ", pattern, ": ", strerror(errno)));
  }
  return absl::StrCat("file://", pattern);
}

}  // namespace strata
