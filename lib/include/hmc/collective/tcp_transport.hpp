#pragma once
// The `tcp` transport: ranks as processes (one or many hosts) exchanging over direct TCP
// connections, a full mesh. The c10d store (StoreTransport) is only the rendezvous and the
// out-of-band channel; exchanges never touch it.
//
//   TcpTransportOptions options;
//   options.store.port = 29500;  options.store.rank = rank;  options.store.worldSize = world;
//   options.store.timeout = std::chrono::seconds(30);  // each exchange
//   options.store.joinTimeout = std::chrono::minutes(5);  // forming the world
//   TcpTransport transport(options);  // or options.control = an existing StoreTransport
//   transport.exchange("recycle", payload);
//
// Construction is collective: every rank binds a listening socket to an ephemeral port on
// options.host, publishes "host port" under "<name>/addr/<rank>" in the store's key-value
// view, connects to every higher rank (TCP_NODELAY, a hello naming its rank) and accepts one
// connection from every lower rank. Ranks that announce the same address (one host) connect
// over a Unix-domain socket instead (options.localSockets): each also listens on an abstract
// socket of a random name, published after its port, and the rank connecting to it falls
// back to TCP when that name is not found (another network namespace or machine).
// localPeers() says which peers use one. Where every peer does (the whole world on one host),
// rank 0 then hands every rank a shared-memory region over those sockets, and exchanges go
// through it (options.sharedMemory, sharesMemory()); a rank that cannot map it declines, and
// then no rank uses it. Construction returns once all world - 1 connections stand, or
// throws TimeoutError after the store's join timeout (StoreTransport::joinTimeout(): setting up
// is part of forming the world) naming the ranks that did not publish or connect
// (BackendError when a socket call fails, ValueError for bad options). Every rank must use
// the same store, world size and name.
//
// An exchange sends this rank's envelope as one frame (u64 sequence, u64 length, bytes) to
// every peer and reads one frame from every peer, interleaving both under poll() bounded by
// the collective's deadline (nonblocking sockets; partial reads and writes resume). Bytes a
// fast peer already sent for a later exchange stay buffered for it. A frame whose sequence
// is not the current one is a protocol error (BackendError). Through shared memory, a rank
// writes its envelope (with the sequence) in its slot, marks itself arrived and sleeps on a
// futex until every rank has; an envelope over 64 KiB still travels on the sockets. Every
// 10 ms of waiting it looks for a closed socket among the ranks that have not arrived.
//
// Errors: a peer whose connection closes (EOF, ECONNRESET, EPIPE) raises RankFailure at once
// ("rank 1 closed its connection in 'recycle' #3: it ended, exited or crashed"); a deadline that
// passes raises TimeoutError naming the ranks whose frame did not come ("'recycle' #6 timed
// out on rank 0 after 10 s: ranks [1] did not arrive"). After either, or any socket error,
// a stream may hold a partial frame: the transport is broken and every later exchange
// throws BackendError saying why.
//
// Destruction closes the connections (never throws), then releases the store; an owned
// StoreTransport's hosting rank waits there for the others to leave (store_transport.hpp).
//
// Thread safety: like every Collective, one thread at a time. keyValueStore() returns a
// separate store connection that another thread (a watchdog) may use while an exchange
// blocks.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/key_value_store.hpp"
#include "hmc/collective/store_transport.hpp"

namespace hmc::detail {
struct TcpTransportState;
}  // namespace hmc::detail

namespace hmc::collective {

struct TcpTransportOptions {
  // The rendezvous: an existing StoreTransport (shared, e.g. hmc-run's control store), or
  // null to create one from `store`. Rank, world size, the timeout and the join timeout come
  // from it.
  std::shared_ptr<StoreTransport> control;
  // Used only when `control` is null.
  StoreTransportOptions store;
  // The address to listen on and announce to the peers (ranks on several hosts each announce
  // their own). Empty: HMC_ADVERTISE_ADDR when set, else the local address this host uses to
  // reach the store's host (collective::advertiseAddress; 127.0.0.1 for a loopback store).
  // An address that is not this host's fails construction with BackendError naming it.
  std::string host;
  // Namespace of the rendezvous keys in the store's key-value view; transports sharing a
  // store need distinct names.
  std::string name = "tcp";
  // Peers that announce this rank's address connect over a Unix-domain socket: a frame costs
  // a fraction of what the loopback TCP stack does (docs/multi-process.md). False, or
  // HMC_TCP_LOCAL_SOCKETS=0 in the environment: TCP to every peer (a pair uses TCP when
  // either rank says so).
  bool localSockets = true;
  // Where every rank of the world is on this host (every peer on a Unix-domain socket),
  // exchanges go through a shared-memory region and a futex instead of the sockets: the last
  // rank to arrive wakes the others with one call (docs/multi-process.md). False, or
  // HMC_TCP_SHARED_MEMORY=0 in the environment: the sockets (the world uses shared memory only
  // when every rank agrees).
  bool sharedMemory = true;

  // Throws ValueError naming the first bad field.
  void validate() const;
};

class TcpTransport final : public Collective {
 public:
  explicit TcpTransport(const TcpTransportOptions& options);
  ~TcpTransport() override;

  std::string_view transportName() const noexcept override { return "tcp"; }
  // The address and port this rank listens on.
  const std::string& host() const noexcept;
  int port() const noexcept;
  // The rendezvous store.
  StoreTransport& control() noexcept;
  // A new connection to the store, keys under "<prefix>/kv/" (StoreTransport::keyValueStore).
  std::shared_ptr<KeyValueStore> keyValueStore();
  // Whether an earlier failure left the connections unusable.
  bool broken() const noexcept;
  // The peers connected over a Unix-domain socket (the others: TCP), in rank order.
  std::vector<int> localPeers() const;
  // Whether exchanges go through shared memory (TcpTransportOptions::sharedMemory).
  bool sharesMemory() const noexcept;
  // Polls every peer's socket for its closed end (POLLRDHUP), without reading from it.
  ClosedPeers closedPeers() const override;

 protected:
  std::vector<Bytes> gather(std::uint64_t sequence, std::string_view stage, const Bytes& envelope,
                            Clock::time_point deadline) override;

 private:
  TcpTransport(const TcpTransportOptions& options, std::shared_ptr<StoreTransport> control);

  std::unique_ptr<hmc::detail::TcpTransportState> state_;
};

}  // namespace hmc::collective
