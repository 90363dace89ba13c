#pragma once
// hmc-run's own launcher (like `torchrun --standalone`): starts world_size rank processes
// (this executable again, with the hidden `_rank` command), rank 0 hosting the store on a
// free port; reaps every child, stops survivors after a grace period when a rank fails,
// forwards Ctrl-C / SIGTERM to the whole tree and leaves no process behind.

#include <string>
#include <vector>

#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::app {

struct LocalLaunchOptions {
  std::string executable;            // this program (/proc/self/exe)
  std::string scenarioFile;
  std::string transport = "store";   // "store" or "gloo"
  std::vector<std::string> passThrough;  // options every rank gets (--device, --timeout, ...)
};

struct LocalLaunchResult {
  std::vector<scenario::RankResult> ranks;
  bool interrupted = false;  // Ctrl-C or SIGTERM stopped the run
};

// Blocks until every rank process has exited. A rank that dies without a result is reported
// as crashed with its exit status or signal.
LocalLaunchResult launchLocalRanks(const scenario::Scenario& scenario,
                                   const LocalLaunchOptions& options);

}  // namespace hmc::app
