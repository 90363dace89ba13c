#pragma once
// Runs a scenario with every rank as a thread of this process (the `threads` transport):
// fast, deterministic, and able to simulate large worlds. A `crash` fault marks the rank
// failed in the thread world (its peers see rank_failure) and ends its steps.

#include <functional>
#include <optional>
#include <vector>

#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::scenario {

struct ThreadRunOptions {
  std::size_t flightCapacity = 64;
  // Called from rank threads after each top-level step; must be thread-safe.
  std::function<void(int rank, const StepResult&)> onStep;
};

// Blocks until every rank thread has finished; bounded by the scenario's deadlines.
std::vector<RankResult> runOnThreads(const Scenario& scenario,
                                     const ThreadRunOptions& options = {});

}  // namespace hmc::scenario
