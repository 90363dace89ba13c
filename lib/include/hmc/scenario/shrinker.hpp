#pragma once
// The reductions behind `hmc-run shrink`, on a scenario document (`hmc-scenario/1` JSON): a
// Shrinker makes a failing scenario smaller while a caller-supplied test says it still fails
// the same way (the caller runs it and compares failure signatures, failure_signature.hpp).
// Only candidates that parse (parseScenario) reach the test, each distinct one once.
//
// The passes, in turn until none makes the scenario smaller or simpler:
// - ranks: ddmin over the world's ranks; the world shrinks and `ranks` lists are renumbered (a
//   step left without ranks goes);
// - steps: ddmin over every list of steps, the top level first, then inside `repeat` ops;
// - repeats: a step's `repeat` and a repeat op's `count` toward 1; a repeat op that runs once
//   is replaced by its steps;
// - sizes: `features`, `batch`, `workspace_bytes`, a fault's `count`, `seconds` toward small;
// - names: modules renamed a, b, c, ... in order of first use;
// - labels and the description dropped, `reference_differs` dropped; an `expect` or
//   `expect_error` dropped where the failure does not need it.
// Not thread-safe; the test runs on the calling thread.

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "hmc/scenario/rank_result.hpp"

namespace hmc::scenario {

// Steps (every step object, nested ones and repeat ops included) and ranks of a document.
struct ScenarioSize {
  std::size_t steps = 0;
  int ranks = 1;
};
ScenarioSize scenarioSize(const nlohmann::json& scenario);

class Shrinker {
 public:
  // Whether a candidate (a valid scenario document) still fails the same way.
  using Test = std::function<bool(const nlohmann::json& candidate)>;
  // Whether to stop now (a time budget, a signal); checked before every test.
  using Stop = std::function<bool()>;

  // `scenario` must fail the same way (it is never tested).
  Shrinker(nlohmann::json scenario, Test test, Stop stop = {});

  // Runs the passes until none changes the scenario or stop() holds; returns best().
  const nlohmann::json& run();
  // The smallest document found so far for which the test held (the input at first).
  const nlohmann::json& best() const noexcept { return best_; }
  std::size_t trials() const noexcept { return trials_; }  // test calls
  bool stopped() const noexcept { return stopped_; }

 private:
  bool attempt(const nlohmann::json& candidate);
  bool reduceRanks();
  bool reduceStepLists();
  bool reduceRepeats();
  bool reduceSizes();
  bool renameModules();
  bool dropDecorations();
  bool dropExpectations();
  // Tries smaller values of the integer at `pointer` (down to `floor`): the floor, then halves.
  bool shrinkNumber(const nlohmann::json::json_pointer& pointer, double floor);

  nlohmann::json best_;
  Test test_;
  Stop stop_;
  std::size_t trials_ = 0;
  bool stopped_ = false;
  std::unordered_map<std::string, bool> tried_;
};

// `scenario` with only the ranks in `kept` (ascending, distinct, in the world): world_size
// becomes kept.size() and every `ranks` list is renumbered; a step whose ranks all go, goes
// (and a repeat op left without steps); a list left naming every rank goes (the same as none).
nlohmann::json keepRanks(const nlohmann::json& scenario, const std::vector<int>& kept);

// `scenario` with every top-level step's expectation set to what it did in `ranks` (the
// results of running `scenario`): ok, hang, or error with the longest digit-free part of the
// message as `expect_error`. A step the ranks did differently is split into one copy per
// outcome, each with the ranks that did it (a rank runs exactly one copy, so what every rank
// runs is unchanged). Steps no rank ran (skipped, not run) keep their expectation.
nlohmann::json asTest(const nlohmann::json& scenario, const std::vector<RankResult>& ranks);

// The longest part of `message` without digits, trimmed of spaces and punctuation at its ends:
// an `expect_error` that matches the same error in a smaller or larger world.
std::string stableFragment(const std::string& message);

}  // namespace hmc::scenario
