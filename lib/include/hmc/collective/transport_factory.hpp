#pragma once
// One rank of a world of processes: its control store and the collective its lifecycle runs
// on, built for a Transport (transport.hpp). Used by hmc-run's rank processes, the transport
// tests' peers and the benchmarks, so that the choice of transport is made in one place.
//
// Construction is collective (every rank must call it with the same transport, world size,
// master and prefix): it forms the world, bounded by `joinTimeout` (unset: `timeout`); every
// collective after it by `timeout`.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/store_transport.hpp"
#include "hmc/collective/transport.hpp"

namespace hmc::collective {

struct TransportOptions {
  int rank = 0;
  int worldSize = 1;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;  // the control store's port (0 on the hosting rank: a free port)
  int glooPort = 0;    // the gloo transport's own store; 0: masterPort + 1
  // Whether rank 0 hosts the control store (false: a launcher's agent hosts it, as torchrun's
  // does, and every rank is a client).
  bool rankZeroHostsStore = true;
  std::chrono::milliseconds timeout = std::chrono::seconds(30);  // each collective
  // Forming the world: connecting to the store, every rank joining, the tcp transport's
  // connections, the gloo group, the NCCL communicator. Unset: `timeout` (hmc-run passes
  // --join-timeout, 300 s by default).
  std::optional<std::chrono::milliseconds> joinTimeout;
  std::string prefix = "hmc";  // the control store's key namespace
  int glooThreads = 2;         // ProcessGroupGloo worker threads
  // gloo only: false puts the process group's own store on masterPort (prefix `prefix`) and
  // makes no control store (control is null): one transport on one port, as its tests and
  // benchmarks use it. tcp and store always have their control store.
  bool glooControlStore = true;
};

struct ProcessTransport {
  // The control store: rendezvous, out-of-band votes, results and diagnosis. It is also the
  // collective of the `store` transport. Null for gloo with glooControlStore false.
  std::shared_ptr<StoreTransport> control;
  // What the ranks exchange through (== control for `store`).
  std::shared_ptr<Collective> collective;
};

// Which peers' processes are gone, as the world's transport can tell (Collective::closedPeers):
// the collective's own connections (tcp), else the control store's (its hosting rank sees the
// connections of every rank: store, gloo); null where neither can tell.
inline Collective::ClosedPeers closedPeersOf(const ProcessTransport& transport) {
  Collective::ClosedPeers closed =
      transport.collective ? transport.collective->closedPeers() : nullptr;
  if (!closed && transport.control) closed = transport.control->closedPeers();
  return closed;
}

// Throws ValueError for kAuto or kThreads (not a rank-process transport), BackendError when
// this build lacks the transport (gloo without Gloo, nccl without CUDA), and what the
// transports throw when connecting fails.
ProcessTransport makeTransport(Transport transport, const TransportOptions& options);

// A c10d store that the ranks of a world meet in, as a launcher joins it to announce dead
// ranks (key_value_store.hpp): its port and the prefix of its key-value view.
struct WorldStore {
  int port = 0;
  std::string prefix;
};
// The stores a world of `transport` ranks uses: the control store, and for gloo the process
// group's own store, whose rendezvous and leaving also skip ranks announced dead.
std::vector<WorldStore> worldStores(Transport transport, const TransportOptions& options);

}  // namespace hmc::collective
