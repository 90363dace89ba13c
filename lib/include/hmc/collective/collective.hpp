#pragma once
// The collective layer: what the lifecycle manager needs from "the other ranks".
//
// `exchange` all-gathers one byte string per rank; `collectiveCall` runs a function on every
// rank and raises on every rank when any rank failed (the reference's `_automatic`). Every
// collective carries a stage tag and a sequence number: when ranks enter different
// collectives, every rank raises CollectiveMismatch naming both stages, before any side
// effect of the collective. Every collective has a deadline (`timeout()`): past it the rank
// raises TimeoutError naming the stage and the ranks that did not arrive.
//
// Thread safety: one Collective belongs to one rank and is used from one thread at a time.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/enum_names.hpp"

namespace hmc::collective {

using Bytes = std::string;
using Clock = std::chrono::steady_clock;
// Every rank's payload in rank order, immutable: ranks of one process (the threads transport)
// share one vector per collective instead of a copy each.
using SharedPayloads = std::shared_ptr<const std::vector<Bytes>>;
// A pure function of every rank's payload (in rank order). Every rank of a collective must
// pass the same function: a transport may run only one rank's.
using Reducer = std::function<Bytes(const std::vector<Bytes>& payloads)>;

enum class CollectiveStatus { kOk, kTimeout, kMismatch, kRankFailure, kError };
// The flight recorder's `status` names (besides "in_flight", which is no CollectiveStatus).
inline constexpr EnumName<CollectiveStatus> kCollectiveStatusNames[] = {
    {CollectiveStatus::kOk, "ok"},
    {CollectiveStatus::kTimeout, "timeout"},
    {CollectiveStatus::kMismatch, "mismatch"},
    {CollectiveStatus::kRankFailure, "rank_failure"},
    {CollectiveStatus::kError, "error"},
};
constexpr EnumTable<CollectiveStatus> enumTable(CollectiveStatus) {
  return {"collective status", kCollectiveStatusNames};
}

// One collective as a rank saw it; what observers (flight recorder, timings) receive.
struct CollectiveRecord {
  std::uint64_t sequence = 0;
  std::string stage;
  std::size_t payloadBytes = 0;
  Clock::time_point start;
  Clock::time_point end;
  CollectiveStatus status = CollectiveStatus::kOk;
};

class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  virtual void onEnter(const CollectiveRecord& record) = 0;
  // Called once per onEnter, also when the collective raised (status says how it ended).
  virtual void onExit(const CollectiveRecord& record) = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  int rank() const noexcept { return rank_; }
  int worldSize() const noexcept { return worldSize_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  void setTimeout(std::chrono::milliseconds timeout);
  // Collectives entered so far; the next one gets this number.
  std::uint64_t sequence() const noexcept { return sequence_; }
  // The stage of the last collective entered ("" before the first): where a failure that a
  // collective raised happened, for the diagnosis (hmc/diagnostics/diagnosis.hpp).
  const std::string& lastStage() const noexcept { return lastStage_; }
  // The transport's name ("threads", "store", "gloo", "local").
  virtual std::string_view transportName() const noexcept = 0;

  // All-gather: every rank's payload in rank order. Blocking, collective, bounded by
  // timeout(). Throws CollectiveMismatch, TimeoutError or RankFailure.
  std::vector<Bytes> exchange(std::string_view stage, const Bytes& payload);
  // As exchange, without a copy per rank: with the threads transport every rank gets the same
  // vector (checked for agreement once per collective), so a collective costs time linear in
  // ranks instead of quadratic. Prefer it where the payloads are only read.
  SharedPayloads exchangeShared(std::string_view stage, const Bytes& payload);
  // exchangeShared, then `reduce` over the payloads; returns its result. With the threads
  // transport the reduction runs once per collective (on the rank that completes it) instead
  // of once per rank, so a reduction linear in ranks stays linear per collective. Throws as
  // exchange does; an exception of `reduce` reaches every rank as RuntimeError.
  Bytes exchangeReduced(std::string_view stage, const Bytes& payload, const Reducer& reduce);

  // Runs `fn` locally only after every rank has entered the same stage, then agrees on
  // success. When any rank's `fn` threw, every rank throws RuntimeError
  // "<stage> failed on ranks [r, ...]: <Class>: <message of the lowest failed rank>".
  void collectiveCall(std::string_view stage, const std::function<void()>& fn);

  // A plain barrier (an exchange of nothing).
  void barrier(std::string_view stage = "barrier");

  // Not owned; nullptr to detach. Must outlive its attachment.
  void setObserver(CollectiveObserver* observer) noexcept { observer_ = observer; }

  // The ranks whose end of their connection with this rank is closed, as this host's kernel
  // sees it now: the peer's process ended (killed, crashed, exited), its host's kernel closed
  // the socket, or it left the world. A function callable from any thread, also once the
  // transport is gone (it then returns nothing); null where the transport has no connection
  // per peer (threads, store, gloo).
  using ClosedPeers = std::function<std::vector<int>()>;
  virtual ClosedPeers closedPeers() const { return nullptr; }

 protected:
  Collective(int rank, int worldSize, std::chrono::milliseconds timeout);

  // Gathers `envelope` from every rank for collective number `sequence`, in rank order.
  // `stage` is given for error messages only. Throws TimeoutError (naming the stage and the
  // ranks that did not arrive) or RankFailure when the deadline passes or a peer is gone.
  virtual std::vector<Bytes> gather(std::uint64_t sequence, std::string_view stage,
                                    const Bytes& envelope, Clock::time_point deadline) = 0;

  // Every rank's `payload` for collective `sequence`, after checking that every rank entered
  // the same stage at the same sequence (else CollectiveMismatch, the same on every rank).
  // The default gathers envelopes with gather() and checks them on this rank; a transport
  // whose ranks share memory overrides it to check once per collective and share the result.
  virtual SharedPayloads gatherAgreed(std::uint64_t sequence, std::string_view stage,
                                      const Bytes& payload, Clock::time_point deadline);
  // gatherAgreed, then `reduce` (nullptr: none; returns an empty string). The default runs
  // it on this rank; the threads transport once per collective.
  virtual Bytes gatherReduced(std::uint64_t sequence, std::string_view stage, const Bytes& payload,
                              Clock::time_point deadline, const Reducer& reduce);

 private:
  int rank_;
  int worldSize_;
  std::chrono::milliseconds timeout_;
  std::uint64_t sequence_ = 0;
  std::string lastStage_;
  CollectiveObserver* observer_ = nullptr;
};

// A world of one rank: every collective returns at once (the reference without
// torch.distributed initialised).
class LocalCollective final : public Collective {
 public:
  explicit LocalCollective(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  std::string_view transportName() const noexcept override { return "local"; }

 protected:
  std::vector<Bytes> gather(std::uint64_t sequence, std::string_view stage, const Bytes& envelope,
                            Clock::time_point deadline) override;
};

// The longest collective deadline hmc accepts: 1e6 s (about 11.6 days), the scenario
// format's cap on `timeout_s`. Longer ones would overflow the clock's arithmetic.
inline constexpr double kMaxTimeoutSeconds = 1e6;

// `seconds` as a collective timeout, rounded up to whole milliseconds. The one place where
// seconds (scenario files, --timeout) become a deadline. Throws ValueError for NaN, infinity,
// zero, negative values and values above kMaxTimeoutSeconds.
std::chrono::milliseconds timeoutFromSeconds(double seconds);

// Python's repr of a list of ints: "[0, 2]".
std::string formatRankList(const std::vector<int>& ranks);

}  // namespace hmc::collective
