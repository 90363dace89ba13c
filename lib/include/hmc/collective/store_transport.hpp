#pragma once
// The `store` transport: ranks as processes (one or many hosts) meeting in a c10d TCPStore.
// The rendezvous and out-of-band channel of every multi-process transport (hang diagnosis);
// as a transport itself slower than `tcp` (tcp_transport.hpp), the default.
//
//   StoreTransportOptions options;
//   options.port = 29500;  options.rank = rank;  options.worldSize = world;
//   options.timeout = std::chrono::seconds(30);
//   StoreTransport transport(options);  // rank 0 hosts the store unless isServer says else
//   transport.exchange("recycle", payload);
//
// Construction is itself collective, the forming of the world: every rank connects to the
// store (retrying while the hosting rank does not listen yet), sets "<prefix>/kv/joined/<rank>"
// and waits until every rank has. It returns once every rank has joined, or throws
// TimeoutError after options.joinBound() naming the ranks that did not join ("rank 0 timed out
// after 300 s forming the world (--join-timeout): ranks [3] did not join ..."), RankFailure at
// once when a missing rank was announced dead ("<prefix>/kv/dead/<rank>"), BackendError when
// the server cannot be reached or its port cannot be bound. Every rank must use the same host,
// port, world size and prefix. The join deadline bounds only this; every exchange after it has
// options.timeout.
//
// An exchange writes this rank's envelope under "<prefix>/x/<sequence>/<rank>", waits for the
// others' keys (bounded by the collective's deadline, see Waiting) and reads them. Keys are
// namespaced by sequence number only, not by stage: ranks that entered different stages find
// each other's envelopes and raise CollectiveMismatch instead of timing out. A rank deletes
// its own key of sequence n-2 once it completed sequence n-1 (every rank has read it by then),
// so the store holds at most two generations of keys however long the run.
//
// Waiting: the first ~100 ms are one blocking store wait (the common case costs nothing more);
// after that the rank polls every 50 ms with two requests whatever the world size (all
// exchange keys there? "<prefix>/kv/dead/any" set?), and only once a death was announced
// reads the missing ranks' "<prefix>/kv/dead/<rank>" keys (key_value_store.hpp), which
// hmc-run's local launcher sets when a rank process exits abnormally.
//
// Errors: a deadline that passes raises TimeoutError naming the ranks whose keys are missing
// ("'recycle' #6 timed out on rank 0 after 10 s: ranks [1] did not arrive"). A missing rank
// announced dead raises RankFailure at once with the launcher's words ("rank 1 was announced
// dead in 'close validation' #1: rank 1 exited with status 17 (fault crash); ranks [1] did not
// arrive"); without a launcher that announces deaths (torchrun, srun, mpirun) a crashed rank
// is seen only at the deadline, as a timeout.
// The store server gone (its host rank died) raises RankFailure naming host:port.
//
// Destruction: the hosting rank's store server dies with it, so its destructor waits (up to
// the timeout) until every other rank has left ("<prefix>/bye/<rank>", set by every
// destructor) or been announced dead. Never throws.
//
// Thread safety: like every Collective, one thread at a time. keyValueStore() returns a
// separate connection that another thread (a watchdog) may use while an exchange blocks.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/key_value_store.hpp"

namespace hmc::detail {
struct StoreTransportState;
}  // namespace hmc::detail

namespace hmc::collective {

struct StoreTransportOptions {
  std::string host = "127.0.0.1";
  // The store's port. 0 on the hosting rank binds a free port (read it back with port());
  // the other ranks then need the real port.
  int port = 0;
  int rank = 0;
  int worldSize = 1;
  // Whether this rank hosts the store server; by default rank 0 does.
  std::optional<bool> isServer;
  // The collective deadline: every exchange, and every request on the store's connections.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // The join deadline: how long construction may take to form the world (connect to the store,
  // wait for every rank to join). Unset: `timeout`. Ranks that start slowly (LibTorch loading
  // from a network file system, a busy node, a batch system starting tasks one by one) need
  // more than a collective does; torchrun's rendezvous timeout is the same idea.
  std::optional<std::chrono::milliseconds> joinTimeout;
  // Namespace of this transport's keys: transports sharing a store need distinct prefixes.
  std::string prefix = "hmc";
  // Exchange keys reuse this many names per rank, round robin (at least 3): c10d 1.13's
  // TCPStore server keeps a record of every key name ever set, deleted or not
  // (TCPStoreMasterDaemon::watchedSockets_), so a fresh name per collective grew the hosting
  // rank by ~100 bytes per key, without bound (scripts/soak --transport store: ~5 MB a
  // minute). A name is reused only after every rank has read, and this rank deleted, its
  // previous value.
  int keySlots = 64;
  // How long the hosting rank waits, after it has read an exchange's values, for every other
  // rank to confirm it read them too (the store, and the values, live in the host's process:
  // a host that crashed right after an exchange left a slower reader without them). Past it
  // the host goes on: a rank that has not confirmed by then is stopped or cut off, and the
  // next exchange names it at its deadline, as before. Short: what it waits is added to the
  // verdict of a partition that cuts readers off (at 500 ms a verdict came 4.2 s after a
  // partition, bound 4 s: chaos --modes hosts --run-seed 2064461991); a reader that is not
  // stopped confirms within milliseconds.
  std::chrono::milliseconds readReceiptWait{200};

  bool hostsServer() const noexcept { return isServer.value_or(rank == 0); }
  // The join deadline in force: joinTimeout, else timeout.
  std::chrono::milliseconds joinBound() const noexcept { return joinTimeout.value_or(timeout); }
  // Throws ValueError naming the first bad field.
  void validate() const;
};

// A client connection to the store of `options` (host, port, prefix, timeout) that is not a
// rank: for launchers and tools. Keys under "<prefix>/kv/", like StoreTransport's
// keyValueStore(). c10d retries a refused connection (the hosting rank may not listen yet)
// about once a second until options.joinBound() (rounded up to whole seconds), then this throws
// TimeoutError; BackendError for other failures. c10d logs each failed connect to stderr, so
// callers that poll for a server probe the port first.
std::shared_ptr<KeyValueStore> connectKeyValueStore(const StoreTransportOptions& options);

// Which ranks' processes have ended, told by the connection each rank keeps to the store for
// as long as it lives (its end written at its join: address/<rank>) against this network
// namespace's TCP table; asked where the store listens, on its port. Each rank's end is read
// from the store once and kept. Not thread-safe.
class LivenessTable {
 public:
  explicit LivenessTable(int port) : port_(port) {}
  // The ranks of `ranks` whose connection is no longer established (a rank whose end is not
  // in the store yet, or could not be read from it, is left out); empty where the TCP table
  // cannot be read.
  std::vector<int> ended(KeyValueStore& kv, const std::vector<int>& ranks);
  // Rank `rank`'s liveness end ("address:port") as read by ended(), if it was.
  std::optional<std::string> endOf(int rank) const {
    const auto it = ends_.find(rank);
    return it == ends_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }

 private:
  int port_;
  std::map<int, std::string> ends_;  // by rank, as read
};

class StoreTransport final : public Collective {
 public:
  explicit StoreTransport(const StoreTransportOptions& options);
  ~StoreTransport() override;

  std::string_view transportName() const noexcept override { return "store"; }
  // The port the store listens on (the bound one when options.port was 0).
  int port() const noexcept;
  const std::string& host() const noexcept;
  // The join deadline this transport was formed under (options.joinBound()).
  std::chrono::milliseconds joinTimeout() const noexcept;
  // A new connection to the same store, keys under "<prefix>/kv/". Safe to use from
  // another thread while this transport blocks in an exchange.
  std::shared_ptr<KeyValueStore> keyValueStore();
  // On the hosting rank: the ranks whose processes have ended (killed, crashed, their node
  // lost): each rank keeps a connection to the store that says nothing for as long as it
  // lives, whose end it wrote at its join (address/<rank>); the ones no longer established in
  // this network namespace's TCP table. Null on the other ranks.
  ClosedPeers closedPeers() const override;
  // Time spent waiting in the first, blocking slice of an exchange before polling starts.
  static constexpr std::chrono::milliseconds kFirstWait{100};
  static constexpr std::chrono::milliseconds kPollInterval{50};

 protected:
  std::vector<Bytes> gather(std::uint64_t sequence, std::string_view stage, const Bytes& envelope,
                            Clock::time_point deadline) override;

 private:
  std::unique_ptr<hmc::detail::StoreTransportState> state_;
};

}  // namespace hmc::collective
