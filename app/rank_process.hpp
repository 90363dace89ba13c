#pragma once
// One rank as a process: builds the rank's transport (store, tcp, gloo or nccl) from a launcher's
// variables or hmc-run's own local launch, runs the scenario's steps with a watchdog that
// publishes its flight record out of band when a collective passes its deadline, agrees on
// the end-of-run shutdown out of band through the store (not waiting for ranks announced
// dead), and hands its results on.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::app {

struct RankProcessOptions {
  std::string transport = "tcp";  // "tcp", "store", "gloo" or "nccl"
  int rank = 0;
  int worldSize = 1;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
  int glooPort = 0;              // the gloo transport's own store; 0: masterPort + 1
  bool agentHostsStore = false;  // torchrun's agent hosts the store: rank 0 is a client too
  std::size_t flightCapacity = 64;
};

// What a rank process produced; `merged` is set on rank 0 of an external launch, which
// gathers every rank's result through the store.
struct RankProcessOutcome {
  scenario::RankResult result;
  std::optional<std::vector<scenario::RankResult>> merged;
};

// The exit status of a rank process that ran the `crash` fault.
inline constexpr int kCrashExitStatus = 17;

// The result of a rank that left none: crashed for `reason`, its leaks not checked for
// `leakReason`, and, when its watchdog published a flight record in `flights`, where it was
// ("; last seen in step S") and its last collectives.
scenario::RankResult missingRankResult(int rank, std::string reason, std::string leakReason,
                                       const std::map<int, diagnostics::PublishedFlight>& flights);

// Runs one rank. `gatherOnRankZero`: rank 0 collects every rank's result through the store
// (external launchers); otherwise each rank just returns its own (the local launcher reads
// result files). The `crash` fault ends the process at once with kCrashExitStatus.
RankProcessOutcome runRankProcess(const scenario::Scenario& scenario,
                                  const RankProcessOptions& options, bool gatherOnRankZero);

}  // namespace hmc::app
