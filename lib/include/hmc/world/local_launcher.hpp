#pragma once
// hmc-run's own launcher (like `torchrun --standalone`): starts world_size rank processes
// (this executable again, with the hidden `_rank` command, or a forked copy of this process:
// LocalLaunchOptions::rankBody), rank 0 hosting the store on a
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

#include <cstddef>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/world/rank_launch.hpp"

namespace hmc::world {

struct LocalLaunchOptions {
  std::string executable;  // this program (/proc/self/exe)
  // When set, each rank process is a forked copy of this one that runs `rankBody` (its return
  // value the exit status) instead of exec'ing `executable`: what is loaded here (LibTorch:
  // about 1 s of CPU and 160 MB a process) is not loaded again. Only where a forked child can
  // run a rank: no CUDA initialized here, no other thread holding a lock the rank needs. The
  // forked ranks are named hmc-rank-N (ps -e, top); their command line is the launcher's.
  std::function<int(const RankLaunch& launch)> rankBody;
  // Every rank's configuration but its place (rank, ports, result file): transport,
  // overrides, repetitions, flight capacity, log level, the file name to report.
  RankLaunch launch;
  // The scenario file's bytes as the parent read and parsed them: the ranks run exactly these.
  std::string scenarioText;
  std::optional<int> masterPort;  // --master-port: the control store's port (else a free one)
  // Called on the launcher's thread with each repetition's results, every rank's in rank order
  // (a rank that died without one is a crashed rank with its exit status), in the order of the
  // repetitions: while the ranks run, as soon as every rank has written its result of the next
  // repetition, and for the rest once every rank has exited. The launcher keeps none of them
  // (a long --repetitions run stays flat).
  std::function<void(std::vector<scenario::RankResult>)> onRepetition;
};

struct LocalLaunchResult {
  std::size_t repetitions = 0;  // handed to onRepetition (at least one)
  bool interrupted = false;     // Ctrl-C, SIGTERM or SIGHUP stopped the run
};

// Blocks until every rank process has exited. Throws RuntimeError when a rank cannot be
// started (no rank is left running then).
LocalLaunchResult launchLocalRanks(const scenario::Scenario& scenario,
                                   const LocalLaunchOptions& options);

// The header line of a self-launched multi-process run, to `out`:
// "# hmc-run: store at 127.0.0.1:PORT (attach: hmc-run status --master-port PORT)".
void printStoreAddress(std::FILE* out, const std::string& host, int port);

}  // namespace hmc::world
