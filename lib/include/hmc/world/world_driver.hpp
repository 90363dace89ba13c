#pragma once
// One interface for every kind of world hmc-run runs a scenario on, as nccl-tests runs
// threads, several GPUs and MPI processes through one engine:
// - threads: every rank a thread of this process (the `threads` transport);
// - local processes: hmc-run's own launcher starts world_size rank processes (tcp, store,
//   gloo, nccl) and reads their result files;
// - launcher rank: torchrun, srun or mpirun started this process as one rank; rank 0 gathers
//   every rank's results through the store (or, when rank 0 is gone with the store, the
//   lowest live rank of its node).
// Each hands every repetition (every rank's result, in rank order) to one sink, in order, as
// the repetition ends; the caller folds them into the report (scenario::ReportBuilder).

#include <memory>
#include <optional>
#include <string>

#include "hmc/scenario/report.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/scenario/thread_driver.hpp"
#include "hmc/world/rank_launch.hpp"
#include "hmc/world/result_files.hpp"
#include "hmc/world/teardown.hpp"

namespace hmc::world {

// A scenario to run: parsed, and the bytes it was parsed from (rank processes run exactly
// these), and its path as the user gave it.
struct WorldInput {
  const scenario::Scenario& scenario;
  std::string file;
  std::string text;
};

struct WorldRun {
  // Whether this process reports: false on a rank of a launcher's world that does not (rank 0
  // reports, another rank only when rank 0 is gone with the store); the sink got nothing.
  bool reporting = true;
  // Ctrl-C, SIGTERM or SIGHUP stopped the ranks; what they did is in the sink.
  bool interrupted = false;
  // A rank that does not report and whose results no report will show (rank_process.hpp):
  // the outcome it exits with.
  std::optional<scenario::Outcome> unreported;
};

class WorldDriver {
 public:
  virtual ~WorldDriver() = default;
  // Runs `input` on the world and hands every repetition to `sink`. Blocks until every rank
  // ended; bounded by the scenario's deadlines. Throws hmc::Error when the world cannot be
  // formed at all (a rank process that cannot start, a store that cannot be joined).
  virtual WorldRun run(const WorldInput& input, const RepetitionSink& sink) = 0;
  // "threads", "local processes", "torchrun rank 3 of 8".
  virtual std::string describe() const = 0;
};

// What every driver needs, decided once for the run (hmc-run: app/run_plan.hpp's RunPlan).
struct WorldOptions {
  // Every rank's configuration: transport, overrides, repetitions, flight capacity, log
  // level, and under a launcher this process's placement (launch.placement.underLauncher()).
  RankLaunch launch;
  // hmc-run's own launcher: the program its rank processes run (`hmc-run _rank ...`), and
  // --master-port (else a free port).
  std::string executable;
  // Set: the rank processes are forked copies of this one that run it (LocalLaunchOptions).
  std::function<int(const RankLaunch& launch)> rankBody;
  std::optional<int> masterPort;
  // Thread ranks: called on rank 0's thread after each top-level step (progress).
  std::function<void(const scenario::StepResult& step)> onRankZeroStep;
  // Thread ranks: an interrupt the caller owns and forwards the signals to (shrink: one
  // SignalForwarder for all its trials rather than a thread per trial). Null: the driver
  // forwards the run's signals itself.
  scenario::ThreadInterrupt* interrupt = nullptr;
  // Under a launcher, the reporting rank stopped by a signal (teardown.hpp).
  InterruptedReport onInterrupted;
};

// The driver for the plan: a launcher rank under a launcher, threads for the threads
// transport, local processes otherwise.
std::unique_ptr<WorldDriver> makeWorldDriver(WorldOptions options);

// Whether a world ends after this repetition: after a hang or a crash there is no world to
// repeat with (rank processes agree on it through their end-of-run vote).
bool worldEnds(const std::vector<scenario::RankResult>& ranks);

}  // namespace hmc::world
