#pragma once
// Runs a scenario with every rank as a thread of this process (the `threads` transport):
// fast, deterministic, and able to simulate large worlds. A `crash` fault marks the rank
// failed in the thread world (its peers see rank_failure) and ends its steps.

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/threads_transport.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::scenario {

// Stops a thread run from another thread (Ctrl-C): every rank's pending and next collective
// raises rank_failure with `reason`, so each rank records a hang there and runs no further
// steps; steps that need no collective (sleep, stall) still end by themselves. Thread-safe.
class ThreadInterrupt {
 public:
  void interrupt(const std::string& reason);
  bool interrupted() const;

 private:
  friend std::vector<RankResult> runOnThreads(const Scenario&, const struct ThreadRunOptions&);
  void attach(std::shared_ptr<collective::ThreadWorld> world);
  void detach();

  mutable std::mutex mutex_;
  std::shared_ptr<collective::ThreadWorld> world_;
  std::optional<std::string> reason_;
};

struct ThreadRunOptions {
  std::size_t flightCapacity = 64;
  // Called from rank threads after each top-level step; must be thread-safe.
  std::function<void(int rank, const StepResult&)> onStep;
  // Optional; must outlive the run.
  ThreadInterrupt* interrupt = nullptr;
  // Sample the process once every rank thread ended (rank 0's RankResult::process, shared).
  bool sampleProcess = true;
  // Each rank records its lifecycle calls in this folder (rank-N.hmcrec); nullopt: none.
  std::optional<std::string> recordDirectory;
};

// Blocks until every rank thread has finished; bounded by the scenario's deadlines.
std::vector<RankResult> runOnThreads(const Scenario& scenario,
                                     const ThreadRunOptions& options = {});

}  // namespace hmc::scenario
