#include "runtime/comm/tcp_store.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <list>
#include <stdexcept>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "runtime/comm/store.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kSet = 'S', kGet = 'G', kWait = 'W', kAdd = 'A', kDelete = 'D';
constexpr uint32_t kMaxKeys = 1 << 16;
constexpr uint32_t kMaxBytes = 64u << 20;  // per key or value: far above what rendezvous writes

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

void PutI64(std::string* out, int64_t v) {
  const uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

int64_t GetI64(const char* p) {
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return static_cast<int64_t>(u);
}

std::string Request(char op, const std::vector<std::string>& keys, const std::vector<char>* value) {
  std::string r(1, op);
  PutU32(&r, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    PutU32(&r, static_cast<uint32_t>(k.size()));
    r += k;
  }
  if (value != nullptr) {
    PutU32(&r, static_cast<uint32_t>(value->size()));
    r.append(value->begin(), value->end());
  }
  return r;
}

// A parsed request, or how many more bytes it needs.
struct Parsed {
  bool complete = false;
  bool malformed = false;
  size_t length = 0;  // bytes the request took
  char op = 0;
  std::vector<std::string> keys;
  std::vector<char> value;
  int64_t delta = 0;  // Add's
};

Parsed ParseRequest(const std::string& buf) {
  Parsed p;
  if (buf.size() < 5) return p;
  p.op = buf[0];
  const uint32_t n = GetU32(buf.data() + 1);
  const bool known = p.op == kSet || p.op == kGet || p.op == kWait || p.op == kAdd || p.op == kDelete;
  if (!known || n == 0 || n > kMaxKeys || (p.op != kWait && n != 1)) {
    p.malformed = true;
    return p;
  }
  size_t at = 5;
  // One length-prefixed field: 1 read, 0 not all here yet, -1 malformed.
  auto field = [&](const char** data, uint32_t* len) -> int {
    if (at + 4 > buf.size()) return 0;
    *len = GetU32(buf.data() + at);
    if (*len > kMaxBytes) return -1;
    if (at + 4 + *len > buf.size()) return 0;
    *data = buf.data() + at + 4;
    at += 4 + *len;
    return 1;
  };
  const char* data;
  uint32_t len;
  for (uint32_t i = 0; i < n + (p.op == kSet ? 1 : 0); ++i) {
    const int got = field(&data, &len);
    if (got <= 0) {
      p.malformed = got < 0;
      return p;
    }
    if (i < n) {
      p.keys.emplace_back(data, len);
    } else {
      p.value.assign(data, data + len);
    }
  }
  if (p.op == kAdd) {
    if (at + 8 > buf.size()) return p;
    p.delta = GetI64(buf.data() + at);
    at += 8;
  }
  p.complete = true;
  p.length = at;
  return p;
}

bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

int MillisLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30)));
}

}  // namespace

// The served data and the thread answering remote clients. Local calls (the
// serving rank's own) take the mutex and wait on the condition variable; the
// thread is woken through a pipe when a local set may complete remote waits.
struct TcpStore::Server {
  std::mutex mu;
  std::condition_variable changed;
  std::map<std::string, std::vector<char>> data;
  std::map<std::string, int64_t> counters;  // Add's, apart from Set's keys
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  bool stopping = false;
  std::thread thread;

  struct Client {
    int fd;
    std::string in;
    std::list<Parsed> waiting;  // Get/Wait requests not yet answerable, in order
  };

  ~Server() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    Wake();
    if (thread.joinable()) thread.join();
    for (int fd : {listen_fd, wake[0], wake[1]}) {
      if (fd >= 0) close(fd);
    }
  }

  void Wake() {
    char c = 1;
    if (wake[1] >= 0) {
      ssize_t ignored = write(wake[1], &c, 1);
      (void)ignored;
    }
  }

  // Adds under `mu`: false, changing nothing, when the sum would overflow.
  bool AddLocked(const std::string& key, int64_t delta, int64_t* value) {
    auto it = counters.find(key);
    const int64_t old = it == counters.end() ? 0 : it->second;
    if (__builtin_add_overflow(old, delta, value)) {
      *value = old;
      return false;
    }
    if (delta != 0) counters[key] = *value;  // a read creates nothing
    return true;
  }

  // Erases under `mu` every key and counter whose name starts with `prefix`.
  void DeleteUnderLocked(const std::string& prefix) {
    auto erase = [&](auto& map) {
      for (auto it = map.lower_bound(prefix); it != map.end() && absl::StartsWith(it->first, prefix);) {
        it = map.erase(it);
      }
    };
    erase(data);
    erase(counters);
  }

  bool HasAll(const std::vector<std::string>& keys) {
    for (const auto& k : keys) {
      if (data.find(k) == data.end()) return false;
    }
    return true;
  }

  // Answers what the client's requests allow, in order; false when the
  // client must be dropped (a write failed or a request was malformed).
  bool Serve(Client& c) {
    while (true) {
      Parsed p = ParseRequest(c.in);
      if (p.malformed) return false;
      if (!p.complete) break;
      c.in.erase(0, p.length);
      c.waiting.push_back(std::move(p));
    }
    while (!c.waiting.empty()) {
      Parsed& p = c.waiting.front();
      std::string reply;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (p.op == kSet) {
          const bool fresh = data.emplace(p.keys[0], p.value).second;
          reply.push_back(fresh ? 0 : 1);
          if (fresh) changed.notify_all();
        } else if (p.op == kAdd) {
          int64_t value = 0;
          reply.push_back(AddLocked(p.keys[0], p.delta, &value) ? 0 : 1);
          PutI64(&reply, value);
        } else if (p.op == kDelete) {
          DeleteUnderLocked(p.keys[0]);
          reply.push_back(0);
        } else if (HasAll(p.keys)) {
          reply.push_back(0);
          if (p.op == kGet) {
            const auto& v = data[p.keys[0]];
            PutU32(&reply, static_cast<uint32_t>(v.size()));
            reply.append(v.begin(), v.end());
          }
        } else {
          break;  // later requests of this client wait behind it
        }
      }
      if (!WriteAll(c.fd, reply.data(), reply.size())) return false;
      c.waiting.pop_front();
    }
    return true;
  }

  void Loop() {
    std::list<Client> clients;
    while (true) {
      std::vector<pollfd> fds = {{wake[0], POLLIN, 0}, {listen_fd, POLLIN, 0}};
      for (const Client& c : clients) fds.push_back({c.fd, POLLIN, 0});
      if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) break;
      }
      if (fds[0].revents & POLLIN) {
        char buf[64];
        ssize_t ignored = read(wake[0], buf, sizeof(buf));
        (void)ignored;
      }
      if (fds[1].revents & POLLIN) {
        int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          clients.push_back({fd, "", {}});
        }
      }
      size_t i = 2;
      for (auto it = clients.begin(); it != clients.end(); ++i) {
        bool keep = true;
        if (i < fds.size() && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
          char buf[1 << 14];
          ssize_t r = recv(it->fd, buf, sizeof(buf), 0);
          if (r > 0) {
            it->in.append(buf, static_cast<size_t>(r));
          } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
            keep = false;
          }
        }
        // Every client is served each round: a set by anyone may answer its waits.
        if (keep) keep = Serve(*it);
        if (!keep) {
          close(it->fd);
          it = clients.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Client& c : clients) close(c.fd);
  }
};

absl::StatusOr<std::shared_ptr<TcpStore>> TcpStore::Create(const std::string& host, int port, bool serve,
                                                           std::chrono::milliseconds connect_timeout) {
  if (port < 0 || port > 65535 || (!serve && port == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("tcp store: bad port ", port));
  }
  std::shared_ptr<TcpStore> store(new TcpStore(host, port, connect_timeout));
  if (!serve) return store;
  auto server = std::make_unique<Server>();
  // One dual-stack socket serves IPv6 and IPv4 clients (IPv4 ones as
  // ::ffff:a.b.c.d); a machine without IPv6 gets an IPv4 one.
  sockaddr_storage addr = {};
  socklen_t addr_len = 0;
  server->listen_fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (server->listen_fd >= 0) {
    int zero = 0;
    setsockopt(server->listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_any;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    addr_len = sizeof(sockaddr_in6);
  } else {
    server->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (server->listen_fd < 0) return absl::UnavailableError(absl::StrCat("tcp store: socket: ", strerror(errno)));
    auto* in4 = reinterpret_cast<sockaddr_in*>(&addr);
    in4->sin_family = AF_INET;
    in4->sin_addr.s_addr = htonl(INADDR_ANY);
    in4->sin_port = htons(static_cast<uint16_t>(port));
    addr_len = sizeof(sockaddr_in);
  }
  int one = 1;
  setsockopt(server->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(server->listen_fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) {
    return absl::UnavailableError(absl::StrCat("tcp store: cannot listen on port ", port, ": ", strerror(errno),
                                               " (another job on this MASTER_PORT?)"));
  }
  if (listen(server->listen_fd, 128) != 0) {
    return absl::UnavailableError(absl::StrCat("tcp store: listen: ", strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(server->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  store->port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (pipe2(server->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::UnavailableError(absl::StrCat("tcp store: pipe: ", strerror(errno)));
  }
  Server* raw = server.get();
  server->thread = std::thread([raw] { raw->Loop(); });
  store->server_ = std::move(server);
  return store;
}

TcpStore::TcpStore(std::string host, int port, std::chrono::milliseconds connect_timeout)
    : host_(std::move(host)), port_(port), connect_timeout_(connect_timeout) {}

TcpStore::~TcpStore() { Disconnect(); }

void TcpStore::Disconnect() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void TcpStore::Connect(Clock::time_point deadline, const std::string& what) {
  if (fd_ >= 0) return;
  std::string last_error = "no attempt";
  // A store that does not answer (rank 0, which serves it, not started yet,
  // or started with another port) is said on stderr after 10 s and each
  // minute after, not only when the wait times out (300 s by default).
  const Clock::time_point start = Clock::now();
  Clock::time_point next_note = start + std::chrono::seconds(10);
  if (never_answered_) deadline = std::min(deadline, start + std::chrono::seconds(1));
  while (true) {
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    int rc = getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found);
    if (rc != 0) {
      last_error = gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          fd_ = fd;
        } else {
          last_error = strerror(errno);
          close(fd);
        }
      }
      freeaddrinfo(found);
    }
    if (fd_ >= 0) {
      never_answered_ = false;
      return;
    }
    if (Clock::now() >= deadline) {
      never_answered_ = true;
      throw gloo::IoException(absl::StrCat(what, ": cannot reach the store at ", HostPortText(host_, port_), " (", last_error,
                                           "); Wait timeout"));
    }
    if (const Clock::time_point now = Clock::now(); now >= next_note) {
      const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - start).count();
      std::fprintf(stderr,
                   "note: no answer from the store at %s for %llds (%s); with tcp:// it is served by rank 0: "
                   "is rank 0 started, with the same --store or MASTER_ADDR:MASTER_PORT?\n",
                   HostPortText(host_, port_).c_str(), static_cast<long long>(waited), last_error.c_str());
      next_note = now + std::chrono::seconds(60);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, MillisLeft(deadline) + 1)));
  }
}

std::string TcpStore::RoundTrip(const std::string& request, ReplyShape shape, std::chrono::milliseconds timeout,
                                const std::string& what) {
  const Clock::time_point deadline =
      timeout == gloo::kNoTimeout ? Clock::time_point::max() : Clock::now() + timeout;
  Connect(std::min(deadline, Clock::now() + connect_timeout_), what);
  if (!WriteAll(fd_, request.data(), request.size())) {
    Disconnect();
    throw gloo::IoException(absl::StrCat(what, ": the store at ", HostPortText(host_, port_), " closed the connection"));
  }
  std::string reply;
  // Whether the whole reply is here (a Get's length is known after 5 bytes).
  auto complete = [&] {
    switch (shape) {
      case ReplyShape::kStatus:
        return reply.size() >= 1;
      case ReplyShape::kStatusAndInt64:
        return reply.size() >= 9;
      case ReplyShape::kStatusAndValue:
        return reply.size() >= 5 && reply.size() >= 5 + size_t{GetU32(reply.data() + 1)};
    }
    return false;
  };
  while (!complete()) {
    pollfd p = {fd_, POLLIN, 0};
    const int wait_ms = deadline == Clock::time_point::max() ? -1 : MillisLeft(deadline);
    int rc = poll(&p, 1, wait_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      // The answer may still come: this connection is no longer in step.
      Disconnect();
      throw gloo::IoException(absl::StrCat(what, ": Wait timeout after ", timeout.count(), " ms"));
    }
    char buf[1 << 14];
    ssize_t r = recv(fd_, buf, sizeof(buf), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      Disconnect();
      throw gloo::IoException(absl::StrCat(what, ": the store at ", HostPortText(host_, port_), " closed the connection"));
    }
    reply.append(buf, static_cast<size_t>(r));
  }
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  if (server_ != nullptr) {
    bool fresh;
    {
      std::lock_guard<std::mutex> lock(server_->mu);
      fresh = server_->data.emplace(key, data).second;
      if (fresh) server_->changed.notify_all();
    }
    server_->Wake();
    GLOO_ENFORCE(fresh, "key '", key, "' is already set");
    return;
  }
  const std::string reply =
      RoundTrip(Request(kSet, {key}, &data), ReplyShape::kStatus, connect_timeout_, "tcp store set");
  GLOO_ENFORCE(reply[0] == 0, "key '", key, "' is already set");
}

std::vector<char> TcpStore::get(const std::string& key) {
  if (server_ != nullptr) {
    std::unique_lock<std::mutex> lock(server_->mu);
    server_->changed.wait_for(lock, kDefaultTimeout, [&] { return server_->data.count(key) > 0; });
    auto it = server_->data.find(key);
    if (it == server_->data.end()) throw gloo::IoException(absl::StrCat("tcp store get '", key, "': Wait timeout"));
    return it->second;
  }
  const std::string reply = RoundTrip(Request(kGet, {key}, nullptr), ReplyShape::kStatusAndValue, kDefaultTimeout,
                                      absl::StrCat("tcp store get '", key, "'"));
  return std::vector<char>(reply.begin() + 5, reply.end());
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, kDefaultTimeout); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  const std::string what = absl::StrCat("tcp store wait for ", absl::StrJoin(keys, ", "));
  if (server_ != nullptr) {
    std::unique_lock<std::mutex> lock(server_->mu);
    auto ready = [&] { return server_->HasAll(keys); };
    if (timeout == gloo::kNoTimeout) {
      server_->changed.wait(lock, ready);
    } else if (!server_->changed.wait_for(lock, timeout, ready)) {
      throw gloo::IoException(absl::StrCat(what, ": Wait timeout after ", timeout.count(), " ms"));
    }
    return;
  }
  RoundTrip(Request(kWait, keys, nullptr), ReplyShape::kStatus, timeout, what);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  bool added;
  if (server_ != nullptr) {
    std::lock_guard<std::mutex> lock(server_->mu);
    added = server_->AddLocked(key, delta, &value);
  } else {
    std::string request = Request(kAdd, {key}, nullptr);
    PutI64(&request, delta);
    const std::string reply = RoundTrip(request, ReplyShape::kStatusAndInt64, connect_timeout_,
                                        absl::StrCat("tcp store add to '", key, "'"));
    added = reply[0] == 0;
    value = GetI64(reply.data() + 1);
  }
  if (!added) throw std::overflow_error(absl::StrCat("adding ", delta, " to ", value, " would overflow 64 bits"));
  return value;
}

void TcpStore::delete_under(const std::string& prefix) {
  if (server_ != nullptr) {
    std::lock_guard<std::mutex> lock(server_->mu);
    server_->DeleteUnderLocked(prefix);
    return;
  }
  RoundTrip(Request(kDelete, {prefix}, nullptr), ReplyShape::kStatus, connect_timeout_,
            absl::StrCat("tcp store delete under '", prefix, "'"));
}

}  // namespace strata
