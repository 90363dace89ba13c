#pragma once
// hmc-run's own launcher (like `torchrun --standalone`): starts world_size rank processes
// (this executable again, with the hidden `_rank` command), rank 0 hosting the store on a
// free port; reaps every child, stops survivors after a grace period when a rank fails,
// forwards Ctrl-C / SIGTERM to the whole tree and leaves no process behind.
//
// The launcher also joins rank 0's store as a plain client (retrying until rank 0 listens,
// bounded by the timeout plus 10 s). When a rank process exits abnormally it sets
// "hmc/kv/dead/<rank>" = "rank R exited with status 17 (fault crash)" (or "killed by signal 9
// (Killed)"), so the survivors' collectives raise rank_failure within ~100 ms instead of
// waiting for the deadline (store transport; the end-of-run vote of both transports). It
// keeps the flight records that ranks' watchdogs publish ("flight/<rank>") and attaches them
// to ranks that die without a result, for the hang diagnosis.
//
// Test hook: HMC_LAUNCH_PID_FILE=PATH writes the rank processes' pids there, one a line.

#include <string>
#include <vector>

#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::app {

struct LocalLaunchOptions {
  std::string executable;  // this program (/proc/self/exe)
  std::string scenarioFile;
  std::string transport = "tcp";         // "tcp", "store" or "gloo"
  std::vector<std::string> passThrough;  // options every rank gets (--device, --timeout, ...)
  int masterPort = 0;  // rank 0's store port (--master-port); 0: a free one (issue 9 item 5)
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
