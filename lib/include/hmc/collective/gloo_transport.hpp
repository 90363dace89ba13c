#pragma once
// The `gloo` transport: ranks as processes exchanging through c10d's ProcessGroupGloo (the
// engine torch.distributed uses on CPU). Ranks rendezvous in a c10d TCPStore (rank 0 hosts
// it by default, as in StoreTransport); an exchange is one allgather of fixed-size slots
// (`slotBytes`) carrying each rank's envelope length and bytes, plus a second allgather of
// the largest envelope when any rank's did not fit.
//
// Only built when hmc/config.hpp says HMC_HAVE_GLOO.
//
// Construction forms the world within options.store.joinBound(): connecting to the store, every
// rank joining it (StoreTransport's barrier: a rank that never starts is named), and the
// process group's rendezvous; a timeout says it was the join ("forming the world").
//
// Deadlines. LibTorch 1.13 honours only the process group's timeout, not a per-operation
// one: once created, the group's collectives get options.store.timeout, and that value bounds
// every exchange. Collective::setTimeout on this transport changes when the caller stops waiting,
// but the allgather itself still runs until the group's timeout.
//
// After any failure (timeout, a peer gone) the process group is unusable: the transport is
// marked broken, closes its side of the group at once (so that a peer still waiting in the
// same allgather on this rank fails on the closed connection rather than at its deadline), and
// every later exchange throws BackendError until every rank calls rebuild() (collective),
// which creates a fresh group under new store keys.
//
// Errors: a timeout raises TimeoutError naming the stage and the ranks that had not entered
// the collective by this rank's deadline: after a failure each rank leaves a key in the store
// with the wall-clock times it entered and failed, and looks for the others' for up to
// min(timeout, 2 s) (nothing is written on the fast path); a rank whose key says it entered
// after the deadline counts as not arrived (ranks on different hosts compare within their
// clocks' skew). Less than the 2 s when every missing rank was announced dead
// ("<prefix>/gloo/kv/dead/<rank>" in this transport's store, as hmc-run's local launcher
// does): then it raises RankFailure with the announcement. A peer that closed its connection
// (crashed) before the deadline raises RankFailure naming the ranks that left no key. A rank
// that arrives after the others left the collective raises TimeoutError saying it was late and
// naming them.
//
// Thread safety: one thread at a time, like every Collective.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/store_transport.hpp"

namespace hmc::detail {
struct GlooTransportState;
}  // namespace hmc::detail

namespace hmc::collective {

struct GlooTransportOptions {
  // Rendezvous store, rank, world size, timeout (also the process group's collective timeout)
  // and join timeout (its creation).
  StoreTransportOptions store;
  // The address gloo binds and announces to its peers.
  std::string deviceHost = "127.0.0.1";
  // ProcessGroupGloo worker threads. Keep 2 (LibTorch's default): with 1, an exchange took
  // ~5 ms instead of ~0.2 ms on a 2-core machine (transport_bench, BM_GlooExchange/2/1).
  int threads = 2;
  // Envelopes up to slotBytes - 8 bytes travel in one allgather.
  std::size_t slotBytes = 1024;

  // Throws ValueError naming the first bad field.
  void validate() const;
};

class GlooTransport final : public Collective {
 public:
  explicit GlooTransport(const GlooTransportOptions& options);
  ~GlooTransport() override;

  std::string_view transportName() const noexcept override { return "gloo"; }
  // The rendezvous store's port (the bound one when options.store.port was 0).
  int port() const noexcept;
  // Whether an earlier failure left the process group unusable.
  bool broken() const noexcept;
  // Collective: every rank calls it; creates a fresh process group. Bounded by the timeout.
  void rebuild();

 protected:
  std::vector<Bytes> gather(std::uint64_t sequence, std::string_view stage, const Bytes& envelope,
                            Clock::time_point deadline) override;

 private:
  std::unique_ptr<hmc::detail::GlooTransportState> state_;
};

}  // namespace hmc::collective
