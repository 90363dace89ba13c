#pragma once
// The configuration of one rank process, written once: hmc-run's parent fills a RankLaunch,
// turns it into the hidden `_rank` command line (toArgs), and the rank process reads it back
// (hmc-run's app/rank_options.hpp): the same struct on both sides. Under torchrun, srun or
// mpirun each process fills it from the launcher's variables instead (and hmc::joinWorld
// does, for a user's program).
//
// ScenarioOverrides are what the command line replaces in a scenario (--world-size, --device,
// --timeout); loadScenario applies them in the one place where every process reads a scenario.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/transport.hpp"
#include "hmc/collective/transport_factory.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/world/rank_placement.hpp"

namespace hmc::world {

// --join-timeout's default: how long a rank may take to join its world (start, load LibTorch,
// reach the store, meet every other rank) before the run fails naming the ranks that did not
// join. 300 s, like torchrun's rendezvous timeout: on a cluster, ranks start one by one and load
// LibTorch from network file systems, which takes minutes on a busy one; a run whose ranks
// never start fails within 5 minutes all the same.
inline constexpr std::chrono::milliseconds kDefaultJoinTimeout{300'000};

struct ScenarioOverrides {
  std::optional<int> worldSize;            // --world-size (applied while parsing)
  std::optional<scenario::Device> device;  // --device
  std::optional<double> timeoutS;          // --timeout

  // `text` (a scenario file's bytes, read once) parsed with the overrides applied. `file` names
  // it in errors and reports. Throws ScenarioError.
  scenario::Scenario parse(const std::string& text, const std::string& file) const;
  // The options that carry these overrides to a rank process.
  std::vector<std::string> toArgs() const;
};

struct RankLaunch {
  // What to run: a file holding the exact bytes the parent parsed, and the path the user gave
  // (for errors and reports).
  std::string scenarioFile;
  std::string displayFile;
  ScenarioOverrides overrides;
  int repetitions = 1;

  // How the ranks exchange, and where this rank sits.
  collective::Transport transport = collective::Transport::kTcp;
  RankPlacement placement;
  // --join-timeout: the bound on forming the world, apart from the collective deadline.
  std::chrono::milliseconds joinTimeout = kDefaultJoinTimeout;

  // What to keep and where to put it.
  std::size_t flightCapacity = 64;
  // hmc-run's own launch: the stem of the rank's result files (repetitionResultFile).
  std::string resultFile;
  std::string logLevel = "warn";
  // --record: the folder where each rank records its lifecycle calls (the first repetition).
  std::optional<std::string> recordDirectory;

  // The `_rank` command line after the executable ("_rank", file, options...). The launcher
  // is not carried: a `_rank` process is always one of hmc-run's own launch.
  std::vector<std::string> toArgs() const;
  // The transport factory's options for this rank, with the scenario's collective timeout
  // and the join timeout.
  collective::TransportOptions transportOptions(std::chrono::milliseconds timeout) const;
};

}  // namespace hmc::world
