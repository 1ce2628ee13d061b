#include "runtime/comm/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/redis_store.h"
#include "gloo/rendezvous/store.h"
#include "hiredis.h"
#include "proto/fnv1a.h"
#include "runtime/comm/gloo_message.h"
#include "runtime/comm/tcp_store.h"

namespace strata {
namespace {

constexpr char kSpecHelp[] =
    "expected file:///DIR, redis://HOST:PORT, tcp://HOST:PORT (an IPv6 HOST in brackets) or memory://NAME";

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

// Runs a Gloo store call; its exceptions become a Status prefixed by `what`
// (when not empty).
template <typename F>
absl::Status GuardStore(const std::string& what, F&& body) {
  auto message = [&](const char* why) {
    return what.empty() ? GlooMessage(why) : absl::StrCat(what, ": ", GlooMessage(why));
  };
  try {
    body();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    if (absl::StrContains(e.what(), "Wait timeout")) return absl::DeadlineExceededError(message(e.what()));
    return absl::UnavailableError(message(e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::FailedPreconditionError(message(e.what()));
  } catch (const std::overflow_error& e) {  // TcpStore::add
    return absl::OutOfRangeError(message(e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(message(e.what()));
  } catch (...) {
    return absl::InternalError(message("unknown exception"));
  }
}

// Adds without overflowing: OutOfRange, and nothing changes, when it would.
absl::StatusOr<int64_t> AddChecked(int64_t value, int64_t delta) {
  int64_t sum;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return absl::OutOfRangeError(absl::StrCat("adding ", delta, " to ", value, " would overflow 64 bits"));
  }
  return sum;
}

absl::Status FileError(absl::string_view what, const std::string& path, int error) {
  return absl::UnavailableError(absl::StrCat("cannot ", what, " ", path, ": ", strerror(error)));
}

// An open file, closed (and so unlocked) when this goes.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// A lock's holder is only ever inside a few reads and writes; one that keeps
// it this long is stopped (SIGSTOP) or gone with a hung filesystem, and
// waiting on it forever would hang every rank (and their heartbeats).
constexpr absl::Duration kLockPatience = absl::Seconds(10);

absl::Status LockExclusive(int fd, const std::string& path) {
  const absl::Time deadline = absl::Now() + kLockPatience;
  absl::Duration pause = absl::Microseconds(100);
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return FileError("lock", path, errno);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("store file ", path, " stayed locked for ",
                                                      absl::FormatDuration(kLockPatience),
                                                      " (its holder is stopped or hung)"));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(10));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWhole(int fd, const std::string& path) {
  std::string content;
  char buf[1 << 14];
  while (true) {
    ssize_t r = pread(fd, buf, sizeof(buf), static_cast<off_t>(content.size()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return FileError("read", path, errno);
    if (r == 0) return content;
    content.append(buf, static_cast<size_t>(r));
  }
}

absl::Status WriteWholeAt(int fd, absl::string_view data, off_t offset, const std::string& path) {
  while (!data.empty()) {
    ssize_t w = pwrite(fd, data.data(), data.size(), offset);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return FileError("write", path, w < 0 ? errno : EIO);
    data.remove_prefix(static_cast<size_t>(w));
    offset += w;
  }
  return absl::OkStatus();
}

}  // namespace

// What a backend adds to Gloo's store interface. Keys here are full keys,
// the prefixes of the Store's views already joined ("a/b/key").
class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  // c10d's add on the counter of `key`; a zero delta reads without creating.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Removes every key and counter whose full key starts with `key_prefix`
  // (a view's prefix with its trailing '/'; "" for the unprefixed store).
  virtual absl::Status DeleteUnder(const std::string& key_prefix) = 0;
};

namespace {

// memory:// stores: Gloo's HashStore, with the counters beside its keys
// under its mutex. One per name for the life of the process.
class MemoryStore final : public gloo::rendezvous::HashStore, public StoreBackend {
 public:
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(m_);
    auto it = counters_.find(key);
    absl::StatusOr<int64_t> sum = AddChecked(it == counters_.end() ? 0 : it->second, delta);
    if (sum.ok() && delta != 0) counters_[key] = *sum;
    return sum;
  }

  absl::Status DeleteUnder(const std::string& key_prefix) override {
    std::lock_guard<std::mutex> lock(m_);
    for (auto it = map_.begin(); it != map_.end();) {
      it = absl::StartsWith(it->first, key_prefix) ? map_.erase(it) : std::next(it);
    }
    absl::erase_if(counters_, [&](const auto& entry) { return absl::StartsWith(entry.first, key_prefix); });
    return absl::OkStatus();
  }

 private:
  absl::flat_hash_map<std::string, int64_t> counters_;  // guarded by HashStore's m_
};

std::shared_ptr<MemoryStore> NamedMemoryStore(const std::string& name) {
  static std::mutex* mu = new std::mutex();
  static auto* stores = new absl::flat_hash_map<std::string, std::shared_ptr<MemoryStore>>();
  std::lock_guard<std::mutex> lock(*mu);
  auto& store = (*stores)[name];
  if (store == nullptr) store = std::make_shared<MemoryStore>();
  return store;
}

// file:// stores: Gloo's FileStore, which names each key's file by a hash of
// the key, plus keys.index, the keys set in order (so that DeleteUnder can
// find a prefix's files), and one file per counter. Every file is changed
// under its own flock, so that Stores in any process on this machine agree.
class FileStore final : public gloo::rendezvous::FileStore, public StoreBackend {
 public:
  explicit FileStore(const std::string& dir) : gloo::rendezvous::FileStore(dir) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    // Indexed first: a writer killed in between leaves an index entry
    // without a file, never a file that DeleteUnder cannot find.
    absl::Status indexed = AppendToIndex(key);
    if (!indexed.ok()) throw gloo::IoException(std::string(indexed.message()));
    gloo::rendezvous::FileStore::set(key, data);
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    const std::string path = CounterPath(key);
    ScopedFd fd(open(path.c_str(), delta == 0 ? O_RDONLY | O_CLOEXEC : O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      if (delta == 0 && errno == ENOENT) return 0;  // a read creates nothing
      return FileError("open", path, errno);
    }
    if (absl::Status s = LockExclusive(fd.get(), path); !s.ok()) return s;
    absl::StatusOr<std::string> content = ReadWhole(fd.get(), path);
    if (!content.ok()) return content.status();
    // Empty: just created, or its creator died before the first write, so
    // nothing was added yet.
    int64_t value = 0;
    if (!content->empty()) {
      absl::StatusOr<int64_t> parsed = ParseCounter(*content, key, path);
      if (!parsed.ok()) return parsed.status();
      value = *parsed;
    }
    if (delta == 0) return value;
    absl::StatusOr<int64_t> sum = AddChecked(value, delta);
    if (!sum.ok()) return sum.status();
    // The value has a fixed width, so one small pwrite replaces it whole and
    // the key after it is written once.
    std::string field = absl::StrFormat("%*d", kValueWidth, *sum);
    if (content->empty()) absl::StrAppend(&field, "\n", key);
    if (absl::Status s = WriteWholeAt(fd.get(), field, 0, path); !s.ok()) return s;
    return sum;
  }

  absl::Status DeleteUnder(const std::string& key_prefix) override {
    // Keys: under the index's lock, so that no Set indexes one meanwhile.
    const std::string index_path = IndexPath();
    ScopedFd index(open(index_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (index.get() < 0) return FileError("open", index_path, errno);
    if (absl::Status s = LockExclusive(index.get(), index_path); !s.ok()) return s;
    absl::StatusOr<std::string> text = ReadWhole(index.get(), index_path);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<std::string>> keys = ParseIndex(*text, index_path);
    if (!keys.ok()) return keys.status();
    std::string kept;
    absl::flat_hash_set<std::string> seen;
    for (const std::string& key : *keys) {
      if (!seen.insert(key).second) continue;  // a Set refused as a repeat indexed it again
      if (!absl::StartsWith(key, key_prefix)) {
        kept += IndexRecord(key);
        continue;
      }
      // The temporary file too: Gloo leaves it when its writer dies.
      for (const std::string& path : {objectPath(key), tmpPath(key)}) {
        if (unlink(path.c_str()) != 0 && errno != ENOENT) return FileError("remove", path, errno);
      }
    }
    if (ftruncate(index.get(), 0) != 0) return FileError("truncate", index_path, errno);
    if (absl::Status s = WriteWholeAt(index.get(), kept, 0, index_path); !s.ok()) return s;

    // Counters: each file names its key.
    DIR* dir = opendir(basePath_.c_str());
    if (dir == nullptr) return FileError("list", basePath_, errno);
    std::vector<std::string> counters;
    while (const dirent* entry = readdir(dir)) {
      if (absl::StartsWith(entry->d_name, kCounterFilePrefix)) counters.push_back(basePath_ + "/" + entry->d_name);
    }
    closedir(dir);
    for (const std::string& path : counters) {
      ScopedFd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (fd.get() < 0) continue;  // removed meanwhile
      if (absl::Status s = LockExclusive(fd.get(), path); !s.ok()) return s;
      absl::StatusOr<std::string> content = ReadWhole(fd.get(), path);
      if (!content.ok()) return content.status();
      // A counter whose key cannot be read is left: it may not be ours.
      if (content->size() <= kValueWidth || (*content)[kValueWidth] != '\n') continue;
      if (!absl::StartsWith(absl::string_view(*content).substr(kValueWidth + 1), key_prefix)) continue;
      if (unlink(path.c_str()) != 0 && errno != ENOENT) return FileError("remove", path, errno);
    }
    return absl::OkStatus();
  }

 private:
  static constexpr char kCounterFilePrefix[] = "counter-";
  static constexpr size_t kValueWidth = 20;  // "-9223372036854775808": any int64

  std::string IndexPath() const { return basePath_ + "/keys.index"; }
  std::string CounterPath(const std::string& key) const {
    return absl::StrCat(basePath_, "/", kCounterFilePrefix, absl::Hex(Fnv1a64(key), absl::kZeroPad16));
  }

  // "<length>:<key>\n": keys may hold any byte, newlines included.
  static std::string IndexRecord(const std::string& key) { return absl::StrCat(key.size(), ":", key, "\n"); }

  static absl::StatusOr<std::vector<std::string>> ParseIndex(absl::string_view text, const std::string& path) {
    std::vector<std::string> keys;
    while (!text.empty()) {
      const size_t colon = text.find(':');
      size_t length = 0;
      if (colon == absl::string_view::npos || !absl::SimpleAtoi(text.substr(0, colon), &length) ||
          text.size() - colon - 1 < length + 1 || text[colon + 1 + length] != '\n') {
        return absl::DataLossError(absl::StrCat("key index ", path, " holds garbage after ", keys.size(),
                                                " key(s) (expected <length>:<key> lines)"));
      }
      keys.emplace_back(text.substr(colon + 1, length));
      text.remove_prefix(colon + 2 + length);
    }
    return keys;
  }

  absl::Status AppendToIndex(const std::string& key) {
    const std::string path = IndexPath();
    ScopedFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (fd.get() < 0) return FileError("open", path, errno);
    if (absl::Status s = LockExclusive(fd.get(), path); !s.ok()) return s;
    // O_APPEND: the offset is ignored, every write lands at the end.
    return WriteWholeAt(fd.get(), IndexRecord(key), 0, path);
  }

  // The value of a counter file that must hold `key`.
  static absl::StatusOr<int64_t> ParseCounter(absl::string_view content, const std::string& key,
                                              const std::string& path) {
    int64_t value = 0;
    if (content.size() <= kValueWidth || content[kValueWidth] != '\n' ||
        !absl::SimpleAtoi(content.substr(0, kValueWidth), &value)) {
      return absl::DataLossError(absl::StrCat("counter file ", path, " holds garbage (expected a ", kValueWidth,
                                              "-character number, a newline and the key)"));
    }
    if (content.substr(kValueWidth + 1) != key) {
      return absl::DataLossError(absl::StrCat("counter file ", path, " holds the counter of another key, '",
                                              absl::CHexEscape(content.substr(kValueWidth + 1)),
                                              "' (their hashes collide)"));
    }
    return value;
  }
};

struct RedisReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using RedisReply = std::unique_ptr<redisReply, RedisReplyDeleter>;

// The store's own redis connection: Gloo's RedisStore keeps its own private.
// Prefixed views share it, so it locks. A broken connection is replaced on
// the next call.
class RedisConnection {
 public:
  RedisConnection(std::string host, int port, absl::Duration command_timeout)
      : host_(std::move(host)), port_(port), command_timeout_(command_timeout) {}
  ~RedisConnection() {
    if (context_ != nullptr) redisFree(context_);
  }

  // Sends `commands` in one go and returns their replies in order. Nothing
  // is sent twice: an INCRBY whose reply was lost may have been applied.
  absl::StatusOr<std::vector<RedisReply>> Run(const std::vector<std::vector<std::string>>& commands) {
    std::lock_guard<std::mutex> lock(mu_);
    if (context_ == nullptr) {
      if (absl::Status s = ConnectLocked(); !s.ok()) return s;
    }
    for (const auto& command : commands) {
      std::vector<const char*> argv;
      std::vector<size_t> lengths;
      for (const std::string& arg : command) {
        argv.push_back(arg.data());
        lengths.push_back(arg.size());
      }
      if (redisAppendCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data()) != REDIS_OK) {
        return BrokenLocked();
      }
    }
    std::vector<RedisReply> replies;
    for (size_t i = 0; i < commands.size(); ++i) {
      void* reply = nullptr;
      if (redisGetReply(context_, &reply) != REDIS_OK || reply == nullptr) return BrokenLocked();
      replies.emplace_back(static_cast<redisReply*>(reply));
    }
    return replies;
  }

 private:
  absl::Status ConnectLocked() {
    struct timeval connect_timeout = {2, 0};  // as Gloo's RedisStore
    context_ = redisConnectWithTimeout(host_.c_str(), port_, connect_timeout);
    if (context_ == nullptr) return absl::UnavailableError("cannot allocate a redis connection");
    if (context_->err == 0 && command_timeout_ != absl::InfiniteDuration()) {
      redisSetTimeout(context_, absl::ToTimeval(std::max(command_timeout_, absl::Milliseconds(1))));
    }
    if (context_->err != 0) return BrokenLocked();
    return absl::OkStatus();
  }

  absl::Status BrokenLocked() {
    const std::string why = context_->errstr;
    const bool timed_out = context_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
    redisFree(context_);
    context_ = nullptr;
    const std::string message = absl::StrCat("the redis server at ", HostPortText(host_, port_), ": ", why);
    return timed_out ? absl::DeadlineExceededError(absl::StrCat(message, " (no answer within ",
                                                                absl::FormatDuration(command_timeout_), ")"))
                     : absl::UnavailableError(message);
  }

  const std::string host_;
  const int port_;
  const absl::Duration command_timeout_;
  std::mutex mu_;
  redisContext* context_ = nullptr;
};

// "<key>#counter": a counter's redis key. Its own namespace as far as a
// suffix can make one (a key set as "x#counter" would meet counter "x": the
// two then fail, each on the other's value, rather than mix).
constexpr char kRedisCounterSuffix[] = "#counter";

// A redis glob matching `text` literally.
std::string EscapeGlob(absl::string_view text) {
  std::string escaped;
  for (char c : text) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') escaped.push_back('\\');
    escaped.push_back(c);
  }
  return escaped;
}

// redis:// stores: Gloo's RedisStore reads and waits; writes go through the
// store's own connection, each with its time to live in the same command
// (SET NX PX; INCRBY and PEXPIRE in one MULTI), so that no key of the store
// is ever left without one, Gloo's mesh keys (gloo_store()) included.
class RedisStore final : public gloo::rendezvous::Store, public StoreBackend {
 public:
  RedisStore(std::unique_ptr<gloo::rendezvous::RedisStore> reads, std::unique_ptr<RedisConnection> writes,
             absl::Duration key_ttl)
      : reads_(std::move(reads)), writes_(std::move(writes)), key_ttl_(key_ttl) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    std::vector<std::string> command = {"SET", key, std::string(data.begin(), data.end()), "NX"};
    if (key_ttl_ != absl::InfiniteDuration()) {
      command.insert(command.end(), {"PX", TtlMillis()});
    }
    absl::StatusOr<std::vector<RedisReply>> replies = writes_->Run({command});
    if (!replies.ok()) throw gloo::IoException(std::string(replies.status().message()));
    const redisReply& reply = *(*replies)[0];
    if (reply.type == REDIS_REPLY_ERROR) throw gloo::IoException(absl::StrCat("redis SET: ", reply.str));
    GLOO_ENFORCE(reply.type != REDIS_REPLY_NIL, "Key '", key, "' already set");
  }
  std::vector<char> get(const std::string& key) override { return reads_->get(key); }
  void wait(const std::vector<std::string>& keys) override { reads_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    reads_->wait(keys, timeout);
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    const std::string counter = key + kRedisCounterSuffix;
    if (delta == 0) {  // a read creates nothing
      absl::StatusOr<std::vector<RedisReply>> replies = writes_->Run({{"GET", counter}});
      if (!replies.ok()) return replies.status();
      const redisReply& reply = *(*replies)[0];
      if (reply.type == REDIS_REPLY_NIL) return 0;
      int64_t value = 0;
      if (reply.type == REDIS_REPLY_STRING && absl::SimpleAtoi(absl::string_view(reply.str, reply.len), &value)) {
        return value;
      }
      return CounterError(counter, reply);
    }
    const bool expires = key_ttl_ != absl::InfiniteDuration();
    std::vector<std::vector<std::string>> commands = {{"INCRBY", counter, absl::StrCat(delta)}};
    if (expires) commands = {{"MULTI"}, commands[0], {"PEXPIRE", counter, TtlMillis()}, {"EXEC"}};
    absl::StatusOr<std::vector<RedisReply>> replies = writes_->Run(commands);
    if (!replies.ok()) return replies.status();
    const redisReply* incremented = (*replies)[0].get();
    if (expires) {
      // EXEC answers with each queued command's reply, or an error when one
      // could not be queued (then that command's own reply says why).
      const redisReply& exec = *(*replies)[3];
      incremented = exec.type == REDIS_REPLY_ARRAY && exec.elements == 2 ? exec.element[0] : (*replies)[1].get();
    }
    if (incremented->type == REDIS_REPLY_INTEGER) return static_cast<int64_t>(incremented->integer);
    return CounterError(counter, *incremented);
  }

  absl::Status DeleteUnder(const std::string& key_prefix) override {
    if (key_prefix.empty()) {
      return absl::FailedPreconditionError(
          "an unprefixed redis store does not delete all: the server may hold other jobs' keys (delete through "
          "the job's view, Store::WithPrefix)");
    }
    const std::string pattern = EscapeGlob(key_prefix) + "*";
    std::string cursor = "0";
    do {
      absl::StatusOr<std::vector<RedisReply>> scanned =
          writes_->Run({{"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}});
      if (!scanned.ok()) return scanned.status();
      const redisReply& reply = *(*scanned)[0];
      if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 2 || reply.element[0]->type != REDIS_REPLY_STRING ||
          reply.element[1]->type != REDIS_REPLY_ARRAY) {
        return absl::InternalError(absl::StrCat("redis SCAN MATCH ", pattern, " answered ",
                                                reply.type == REDIS_REPLY_ERROR ? reply.str : "something else"));
      }
      cursor.assign(reply.element[0]->str, reply.element[0]->len);
      std::vector<std::string> del = {"DEL"};
      for (size_t i = 0; i < reply.element[1]->elements; ++i) {
        const redisReply& key = *reply.element[1]->element[i];
        del.emplace_back(key.str, key.len);
      }
      if (del.size() == 1) continue;
      absl::StatusOr<std::vector<RedisReply>> deleted = writes_->Run({del});
      if (!deleted.ok()) return deleted.status();
      if ((*deleted)[0]->type == REDIS_REPLY_ERROR) {
        return absl::InternalError(absl::StrCat("redis DEL: ", (*deleted)[0]->str));
      }
    } while (cursor != "0");
    return absl::OkStatus();
  }

 private:
  std::string TtlMillis() const {
    return absl::StrCat(std::max<int64_t>(1, absl::ToInt64Milliseconds(absl::Ceil(key_ttl_, absl::Milliseconds(1)))));
  }

  static absl::Status CounterError(const std::string& counter, const redisReply& reply) {
    if (reply.type != REDIS_REPLY_ERROR) {
      const std::string held = reply.type == REDIS_REPLY_STRING
                                   ? absl::StrCat(": '", absl::CHexEscape(absl::string_view(reply.str, reply.len)), "'")
                                   : "";
      return absl::DataLossError(absl::StrCat("redis key '", counter, "' does not hold an integer", held));
    }
    const std::string why(reply.str, reply.len);
    if (absl::StrContains(why, "overflow")) return absl::OutOfRangeError(absl::StrCat("redis: ", why));
    if (absl::StrContains(why, "not an integer") || absl::StrContains(why, "WRONGTYPE")) {
      return absl::DataLossError(absl::StrCat("redis key '", counter, "' does not hold an integer: ", why));
    }
    return absl::InternalError(absl::StrCat("redis: ", why));
  }

  std::unique_ptr<gloo::rendezvous::RedisStore> reads_;
  std::unique_ptr<RedisConnection> writes_;
  const absl::Duration key_ttl_;
};

// tcp:// stores: TcpStore holds the counters itself.
class TcpBackend final : public StoreBackend {
 public:
  explicit TcpBackend(std::shared_ptr<TcpStore> store) : store_(std::move(store)) {}

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    int64_t value = 0;
    absl::Status status = GuardStore("", [&] { value = store_->add(key, delta); });
    if (!status.ok()) return status;
    return value;
  }
  absl::Status DeleteUnder(const std::string& key_prefix) override {
    return GuardStore("", [&] { store_->delete_under(key_prefix); });
  }

 private:
  std::shared_ptr<TcpStore> store_;
};

// A status with `context` before its message.
absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
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

Store::Store(std::string spec, std::string key_prefix, std::shared_ptr<gloo::rendezvous::Store> store,
             std::shared_ptr<StoreBackend> backend)
    : spec_(std::move(spec)),
      key_prefix_(std::move(key_prefix)),
      store_(std::move(store)),
      backend_(std::move(backend)) {}

Store::~Store() = default;

std::string Store::FullKey(const std::string& key) const { return key_prefix_ + key; }

absl::StatusOr<int64_t> Store::Add(const std::string& key, int64_t delta) {
  absl::StatusOr<int64_t> value = backend_->Add(FullKey(key), delta);
  if (!value.ok()) {
    return WithContext(value.status(),
                       absl::StrCat("store ", spec_, ": cannot add ", delta, " to counter '", key, "'"));
  }
  return value;
}

absl::Status Store::DeleteAll() {
  absl::Status status = backend_->DeleteUnder(key_prefix_);
  if (!status.ok()) return WithContext(status, absl::StrCat("store ", spec_, ": cannot delete its keys"));
  return status;
}

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
  // PrefixStore joins "prefix/key": the full keys of Add and DeleteAll are
  // joined alike, so a view's counter "x" is its parent's "prefix/x".
  return std::unique_ptr<Store>(new Store(absl::StrCat(spec_, "/", prefix), absl::StrCat(key_prefix_, prefix, "/"),
                                          std::move(prefixed), backend_));
}

namespace {

// "HOST:PORT" of a redis:// or tcp:// spec; an IPv6 address goes in
// brackets, "[::1]:29500", as in a URL.
absl::Status ParseHostPort(const std::string& spec, absl::string_view rest, int default_port, std::string* host,
                           int* port) {
  const absl::string_view expected = default_port == 0 ? "HOST:PORT" : "HOST or HOST:PORT";
  absl::string_view h = rest;
  absl::string_view port_text;
  bool has_port = false;
  if (absl::ConsumePrefix(&h, "[")) {
    const size_t close = h.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("store spec '", spec, "': an IPv6 address's '[' has no ']', expected [ADDRESS]:PORT"));
    }
    absl::string_view after = h.substr(close + 1);
    h = h.substr(0, close);
    if (!after.empty()) {
      if (!absl::ConsumePrefix(&after, ":")) {
        return absl::InvalidArgumentError(
            absl::StrCat("store spec '", spec, "': expected [ADDRESS]:PORT, with a ':' after the ']'"));
      }
      port_text = after;
      has_port = true;
    }
    if (h.empty() || absl::StrContains(h, "[")) {
      return absl::InvalidArgumentError(absl::StrCat("store spec '", spec, "': expected [ADDRESS]:PORT"));
    }
  } else if (const size_t colon = rest.rfind(':'); colon != absl::string_view::npos) {
    h = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
    has_port = true;
    if (absl::StrContains(h, ':')) {
      return absl::InvalidArgumentError(absl::StrCat("store spec '", spec,
                                                     "': an IPv6 address goes in brackets, [ADDRESS]:PORT"));
    }
  }
  *port = default_port;
  if (has_port && (!absl::SimpleAtoi(port_text, port) || *port <= 0 || *port > 65535)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store spec '", spec, "': the port must be a number in 1..65535, ", expected));
  }
  if (!has_port && default_port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("store spec '", spec, "': expected ", absl::StartsWith(rest, "[") ? "[ADDRESS]:PORT" : expected));
  }
  if (h.empty() || absl::StrContains(h, "/") || absl::StrContains(h, "]")) {
    return absl::InvalidArgumentError(absl::StrCat("store spec '", spec, "': expected ", expected));
  }
  *host = std::string(h);
  return absl::OkStatus();
}

}  // namespace

std::string HostPortText(const std::string& host, int port) {
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

std::string JobKeyPrefix(const std::string& job_id) { return absl::StrCat("strata/", job_id); }

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

absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& spec, bool serve, absl::Duration connect_timeout,
                                                 absl::Duration key_ttl) {
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
    std::shared_ptr<TcpStore> tcp = *std::move(store);
    return std::unique_ptr<Store>(new Store(spec, "", tcp, std::make_shared<TcpBackend>(tcp)));
  }
  if (absl::ConsumePrefix(&rest, "file://")) {
    std::string path(rest);
    absl::Status made = MakeDirectories(path);
    if (!made.ok()) {
      return absl::UnavailableError(absl::StrCat("store spec '", spec, "': ", made.message()));
    }
    std::shared_ptr<FileStore> store;
    absl::Status status =
        GuardStore(absl::StrCat("store spec '", spec, "'"), [&] { store = std::make_shared<FileStore>(path); });
    if (!status.ok()) return status;
    return std::unique_ptr<Store>(new Store(spec, "", store, store));
  }
  if (absl::ConsumePrefix(&rest, "redis://")) {
    std::string host;
    int port = 6379;
    if (auto s = ParseHostPort(spec, rest, 6379, &host, &port); !s.ok()) return s;
    if (key_ttl <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store spec '", spec, "': the key time-to-live must be positive, got ", absl::FormatDuration(key_ttl)));
    }
    const std::string what =
        absl::StrCat("store spec '", spec, "': cannot reach the redis server at ", HostPortText(host, port));
    // Our own connection first: it doubles as the probe that Gloo's
    // RedisStore needs (its constructor leaks its connection when it throws).
    auto writes = std::make_unique<RedisConnection>(host, port, connect_timeout);
    absl::StatusOr<std::vector<RedisReply>> pong = writes->Run({{"PING"}});
    if (!pong.ok()) return absl::UnavailableError(absl::StrCat(what, ": ", pong.status().message()));
    std::unique_ptr<gloo::rendezvous::RedisStore> reads;
    absl::Status status =
        GuardStore(what, [&] { reads = std::make_unique<gloo::rendezvous::RedisStore>(host, port); });
    if (!status.ok()) return absl::UnavailableError(status.message());
    auto store = std::make_shared<RedisStore>(std::move(reads), std::move(writes), key_ttl);
    return std::unique_ptr<Store>(new Store(spec, "", store, store));
  }
  absl::ConsumePrefix(&rest, "memory://");  // the one kind left
  std::shared_ptr<MemoryStore> store = NamedMemoryStore(std::string(rest));
  return std::unique_ptr<Store>(new Store(spec, "", store, store));
}

namespace {

constexpr char kTempStorePrefix[] = "strata_store.";
constexpr char kOwnerLock[] = "owner.lock";

std::string TempRoot() {
  const char* tmpdir = getenv("TMPDIR");
  return tmpdir != nullptr && tmpdir[0] == '/' ? tmpdir : "/tmp";
}

// Makes `dir` this process's for the rest of its life. owner.lock appears
// already locked (locked under another name, then renamed), so a cleaner
// never finds it unlocked while its owner lives.
absl::Status ClaimFolder(const std::string& dir) {
  const std::string staging = absl::StrCat(dir, "/.", kOwnerLock, ".new");
  const std::string lock = absl::StrCat(dir, "/", kOwnerLock);
  // Close-on-exec: the workers a launcher starts do not hold it, so the
  // folder is abandoned exactly when its maker dies.
  const int fd = open(staging.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return FileError("create", staging, errno);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    close(fd);
    return FileError("lock", staging, error);
  }
  // For people reading the folder; the lock is the proof.
  if (absl::Status s = WriteWholeAt(fd, absl::StrCat("pid ", getpid(), "\n"), 0, staging); !s.ok()) {
    close(fd);
    return s;
  }
  if (rename(staging.c_str(), lock.c_str()) != 0) {
    const int error = errno;
    close(fd);
    return FileError("rename into", lock, error);
  }
  // Never closed: the kernel drops the lock when this process ends.
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> MakeTempFileStoreSpec() {
  RemoveStaleTempFileStores().IgnoreError();  // tidying, not this call's job
  std::string pattern = absl::StrCat(TempRoot(), "/", kTempStorePrefix, "XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a rendezvous folder ", pattern, ": ", strerror(errno)));
  }
  if (absl::Status claimed = ClaimFolder(pattern); !claimed.ok()) {
    std::error_code ignored;
    std::filesystem::remove_all(pattern, ignored);
    return absl::UnavailableError(
        absl::StrCat("cannot claim the rendezvous folder ", pattern, ": ", claimed.message()));
  }
  return absl::StrCat("file://", pattern);
}

absl::StatusOr<int> RemoveStaleTempFileStores() {
  const std::string root = TempRoot();
  DIR* dir = opendir(root.c_str());
  if (dir == nullptr) return FileError("list", root, errno);
  std::vector<std::string> candidates;
  while (const dirent* entry = readdir(dir)) {
    if (absl::StartsWith(entry->d_name, kTempStorePrefix)) candidates.push_back(absl::StrCat(root, "/", entry->d_name));
  }
  closedir(dir);
  int removed = 0;
  for (const std::string& path : candidates) {
    struct stat info;
    // Only real folders of this user: never through a planted symbolic link.
    if (lstat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) || info.st_uid != geteuid()) continue;
    ScopedFd lock(open(absl::StrCat(path, "/", kOwnerLock).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (lock.get() < 0) continue;                             // no owner record: not provably abandoned
    if (flock(lock.get(), LOCK_EX | LOCK_NB) != 0) continue;  // its owner lives
    std::error_code error;
    std::filesystem::remove_all(path, error);  // removes links, never follows them
    if (!error) ++removed;
  }
  return removed;
}


}  // namespace strata
