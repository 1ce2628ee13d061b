#ifndef STRATA_RUNTIME_COMM_TCP_STORE_H_
#define STRATA_RUNTIME_COMM_TCP_STORE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "gloo/rendezvous/store.h"

namespace strata {

// A key-value store served over TCP by one of the ranks, the way PyTorch's
// TCPStore serves torchrun's MASTER_ADDR:MASTER_PORT: rank 0 listens on the
// port, every rank (rank 0 too, in process) sets, gets and waits for keys.
// Gloo ships file, Redis and in-memory stores but no TCP one, so a job whose
// environment names only a master address needs this to meet.
//
// Wire format, one request per message: an op byte ('S'et, 'G'et, 'W'ait,
// 'A'dd, 'D'elete), a 32-bit key count, then each key as a 32-bit length and
// bytes; Set follows its key with a 32-bit value length and bytes, Add with
// its 64-bit delta. Delete's one key is a prefix: it erases every key and
// counter whose name starts with it ("group/"; all for ""). The server
// answers Set at once (a status byte: 0 stored, 1 already set), Add at once
// (a status byte: 0 added, 1 the sum would overflow and nothing changed;
// then the counter's value as 64 bits), Delete at once (a status byte 0),
// Get and Wait once every key is set (a status byte 0, and for Get the value
// as a 32-bit length and bytes). Integers are little-endian; counters are a
// namespace apart from the keys Set writes.
class TcpStore : public gloo::rendezvous::Store {
 public:
  // Serves on `port` (all interfaces, IPv6 and IPv4 where the machine has
  // IPv6, else IPv4) when `serve`; otherwise connects to
  // HOST:PORT, retrying for up to `connect_timeout` while the server starts.
  static absl::StatusOr<std::shared_ptr<TcpStore>> Create(const std::string& host, int port, bool serve,
                                                          std::chrono::milliseconds connect_timeout);
  ~TcpStore() override;

  // gloo::rendezvous::Store. Errors throw gloo::IoException ("Wait timeout"
  // on a timeout) or gloo::EnforceNotMet (a key set twice), as Gloo's do.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // c10d's add: adds `delta` to the counter `key` (0 when absent) and
  // returns the new value; a zero delta reads it without creating it. Throws
  // std::overflow_error when the sum would overflow, gloo::IoException when
  // the store cannot be reached.
  int64_t add(const std::string& key, int64_t delta);
  // Erases every key and counter whose name starts with `prefix` ("group/";
  // all of them for ""), so that the keys can be set again.
  void delete_under(const std::string& prefix);

  // The port served on (when serving; useful with port 0 in tests).
  int port() const { return port_; }

 private:
  struct Server;
  TcpStore(std::string host, int port, std::chrono::milliseconds connect_timeout);

  // What follows a reply's status byte.
  enum class ReplyShape { kStatus, kStatusAndValue, kStatusAndInt64 };
  // A client's round trip: sends `request` and returns the whole reply, the
  // status byte first; throws on timeout or a broken connection.
  std::string RoundTrip(const std::string& request, ReplyShape shape, std::chrono::milliseconds timeout,
                        const std::string& what);
  void Connect(std::chrono::steady_clock::time_point deadline, const std::string& what);
  void Disconnect();

  const std::string host_;
  int port_;
  const std::chrono::milliseconds connect_timeout_;
  std::unique_ptr<Server> server_;  // when serving: the data lives here
  int fd_ = -1;                     // when a client: the connection, opened on first use
  // A connect that waited out its whole deadline: the next try is brief (a
  // rank reporting its failure to a store it never reached waited the comm
  // timeout twice). A connect that succeeds clears it.
  bool never_answered_ = false;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_TCP_STORE_H_
