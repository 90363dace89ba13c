#pragma once
// Internal to hmc_transports: the c10d side of StoreTransport, shared with GlooTransport
// (which rendezvouses through the same kind of store). Includes c10d headers.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "hmc/collective/store_transport.hpp"
#include "store_connection.hpp"

namespace hmc::detail {

using collective::StoreTransportOptions;

// Connects to (and, on the hosting rank, starts) the TCPStore of `options`, trying until
// options.joinBound() (a connection made after the world formed resets joinTimeout: then the
// timeout). `joining`: this connection forms the world, and a timeout says so (--join-timeout).
// Throws TimeoutError or BackendError naming host:port.
// Every request on the connection then has `readTimeout` (default: options.timeout) to be
// answered, and c10d's own store timeout is options.timeout.
c10::intrusive_ptr<c10d::TCPStore> connectTcpStore(
    const StoreTransportOptions& options, bool asServer, bool joining, int port,
    std::optional<std::chrono::milliseconds> readTimeout = std::nullopt);

// The world's barrier on `store`: sets "<prefix>/kv/joined/<rank>", counts itself in
// "<prefix>/kv/joined/count" and returns once every rank has. Throws TimeoutError at `deadline`
// naming the ranks that did not join, RankFailure at once when one of them was announced dead
// ("<prefix>/kv/dead/<rank>") or the store's server is gone. `endpoint` names the store.
// Requests on `store` wait up to the join deadline while it forms (a partition shorter than
// that delays the join), then the collective deadline again (options.timeout).
void joinWorld(c10d::TCPStore& store, const StoreTransportOptions& options,
               const std::string& endpoint, collective::Clock::time_point deadline,
               const std::string& liveness = std::string());

// Sets the read deadline of `store`'s connection: every later request on it has `timeout` to
// be answered (c10d 1.13 connects with none).
void boundReads(c10d::TCPStore& store, std::chrono::milliseconds timeout);

// "<prefix>/kv/dead/<rank>": the key a launcher sets when that rank's process died.
std::string deadKeyOf(const std::string& prefix, int rank);

// Leaving: every rank sets "<prefix>/bye/<rank>"; the hosting rank (whose store, server
// included, dies with it) waits up to the timeout for every other rank's, so that no rank
// loses the server while still reading the last exchange; ranks announced dead are not
// waited for. Never throws.
void leaveStore(c10d::Store& store, bool hostsServer,
                const StoreTransportOptions& options) noexcept;

// Deletes exchange keys, and writes read receipts, on its own connection and thread, off the
// exchange's critical path (each is a round trip to the server). Keys come in increasing
// sequence order. Stops and joins in its destructor; each request is bounded by the store
// timeout. After a failed request (the server gone) it drops what is queued and sends nothing
// more.
class KeyJanitor {
 public:
  explicit KeyJanitor(c10::intrusive_ptr<c10d::TCPStore> store);
  ~KeyJanitor();
  // Queues the delete of `key`, a key of this rank's of exchange `sequence`.
  void erase(std::uint64_t sequence, std::string key);
  // Queues the write of `key` (one byte), this rank's read receipt of exchange `sequence`.
  void set(std::uint64_t sequence, std::string key);
  // Waits until no delete of an exchange up to `through` is queued or in flight: then none can
  // reach the server after a later write of a key with the same name. Returns whether the key
  // of `through` itself was deleted (false: it was never queued, or the janitor stopped), or
  // nullopt when `deadline` passed first.
  std::optional<bool> settle(std::uint64_t through, std::chrono::steady_clock::time_point deadline);

 private:
  struct Pending {
    std::uint64_t sequence;
    std::string key;
    bool write = false;  // set(), not erase()
  };
  void queue(Pending next);
  void run();
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable settled_;
  std::deque<Pending> keys_;
  std::optional<std::uint64_t> inFlight_;
  std::set<std::uint64_t> deleted_;  // sequences deleted since the last settle() past them
  bool stop_ = false;
  std::thread thread_;
};

struct PeerAddressBook;  // store_transport.cpp

struct StoreTransportState {
  StoreTransportOptions options;
  int port = 0;
  // The first failure of an exchange (timeout, lost rank, the store's error): every later
  // exchange fails at once with it (StoreTransport::gather).
  std::optional<std::string> broken;
  // The hosting rank's store object owns the server; it is also the first client.
  c10::intrusive_ptr<c10d::TCPStore> server;
  // The connection exchanges write, read and poll on. Its read deadline stays the store
  // timeout: no wait runs on it.
  c10::intrusive_ptr<c10d::TCPStore> client;
  // The connection of the exchanges' first, short blocking wait. A separate one because
  // c10d's TCPStore::wait sets its connection's read deadline to the wait's timeout and
  // leaves it there (a "TODO" in 1.13's doWait): on the exchange connection every later
  // request then had 100 ms to be answered, and one answer later than that on a loaded host
  // failed the collective on that rank with "Socket Timeout" (scripts/soak --transport
  // store, after 30-76 repetitions). Replaced after a wait timed out (the server still owes
  // that wait an answer, which would desynchronise the next request).
  c10::intrusive_ptr<c10d::TCPStore> waiter;
  std::unique_ptr<KeyJanitor> janitor;
  // The hosting rank's: which ranks' processes have ended (StoreTransport::closedPeers).
  std::shared_ptr<PeerAddressBook> addressBook;
  // This rank's liveness connection to the store (store_connection.hpp's openLiveness), kept
  // until the transport goes (or its construction fails); -1 where it could not be made.
  Fd liveness;

  std::string endpoint() const { return options.host + ":" + std::to_string(port); }
  // "<prefix>/x/<sequence % keySlots>/<rank>": names are reused round robin (see
  // StoreTransportOptions::keySlots).
  std::string exchangeKey(std::uint64_t sequence, int rank) const;
  // "<prefix>/r/<sequence % keySlots>/<rank>": that rank has read every value of exchange
  // `sequence` (StoreTransport::gather: the hosting rank waits for these).
  std::string readKey(std::uint64_t sequence, int rank) const;
  // Replace `client` and `waiter` (reconnect), or `waiter` alone, by fresh connections;
  // throw RankFailure when the server is gone.
  void reconnect(std::string_view context);
  void reconnectWaiter(std::string_view context);
};

}  // namespace hmc::detail
