#pragma once
// The `threads` transport: N ranks as threads of one process. For unit tests, fast
// deterministic runs and simulated large worlds (1,024 ranks on one machine).
//
//   auto world = ThreadWorld::create(4);
//   // on the thread of rank r:
//   auto collective = world->collective(r, std::chrono::seconds(10));
//
// Collectives meet by sequence number. A rank that passes its deadline abandons that
// collective: ranks that arrive later fail at once with TimeoutError instead of waiting for
// a rank that has left. `markFailed(r, why)` simulates a dead rank: every wait that needs it
// raises RankFailure.

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"

namespace hmc::collective {

class ThreadWorld : public std::enable_shared_from_this<ThreadWorld> {
 public:
  static std::shared_ptr<ThreadWorld> create(int worldSize);

  int worldSize() const noexcept { return worldSize_; }
  // The collective of rank `rank`; call once per rank. The world must outlive nothing: the
  // collective keeps it alive.
  std::unique_ptr<Collective> collective(int rank, std::chrono::milliseconds timeout);
  // Rank `rank` is gone (a simulated crash): waits that need it raise RankFailure.
  void markFailed(int rank, const std::string& reason);

  // Internal: used by the rank collectives. Every rank's payload of collective `sequence`;
  // the rank that completes the collective checks once that every rank entered `stage`
  // (else every rank raises the same CollectiveMismatch) and every rank gets the same
  // immutable vector: O(ranks) work per collective, not O(ranks^2).
  // With `reduce` (may be null), the completing rank also runs it once over the payloads and
  // every rank gets its result in `reduced` (an exception becomes RuntimeError everywhere).
  // `timeout` is the calling collective's, for the text of a timeout.
  struct Gathered {
    SharedPayloads payloads;
    std::shared_ptr<const Bytes> reduced;  // null without `reduce`
  };
  Gathered gatherAgreed(int rank, std::uint64_t sequence, std::string_view stage,
                        const Bytes& payload, Clock::time_point deadline,
                        std::chrono::milliseconds timeout, const Reducer* reduce = nullptr);

 private:
  explicit ThreadWorld(int worldSize);

  struct Slot {
    std::vector<Bytes> payloads;
    std::vector<std::string> stages;
    std::vector<char> present;  // rank arrived
    int arrived = 0;
    int departed = 0;
    std::optional<int> abandonedBy;
    SharedPayloads result;                   // set by the completing rank when stages agree
    std::shared_ptr<const Bytes> reduced;    // its reduction, when it passed one
    std::optional<std::string> reduceError;  // what the reduction threw
    std::optional<std::string> mismatch;     // set by the completing rank when they do not
  };

  int worldSize_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::uint64_t, Slot> slots_;
  std::vector<std::optional<std::string>> failed_;
  int failedCount_ = 0;  // ranks marked failed: the dead-peer scan runs only when > 0
};

}  // namespace hmc::collective
