#pragma once
// From the command line to what runs: a RunPlan decided once for the whole run (who starts
// the ranks, over which transport, who reports), then per scenario file a PreparedScenario
// (read once, parsed with the overrides, checked against what this host can run), and the
// world::WorldOptions of the driver that runs it (world_driver.hpp).

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/transport.hpp"
#include "hmc/error.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/world/rank_placement.hpp"
#include "hmc/world/world_driver.hpp"
#include "run_options.hpp"

namespace hmc::app {

// Who starts the ranks and who reports, decided once for the whole run.
struct RunPlan {
  std::optional<collective::LaunchEnv> launch;    // torchrun, srun or mpirun started us
  std::optional<world::RankPlacement> placement;  // where this process sits under it
  collective::Transport transport = collective::Transport::kThreads;  // resolved: never kAuto
  std::optional<resources::DeviceProbe> ncclDevices;
  bool reporting = true;  // this process prints and writes the results
  int warmup = 0;
  std::size_t flightCapacity = 64;
};

// Decides who starts the ranks, over which transport, and who reports, from the options and
// the launcher's variables in `env`. Returns 0, or the exit code of a usage error it printed
// (usageError).
int planRun(const RunOptions& options, RunPlan* plan,
            const collective::EnvLookup& env = collective::processEnvironment());

// Where each of `files` records its ranks' calls under --record DIR: DIR itself for one
// scenario; DIR/<file's stem>/ (created here) for several, so that one folder holds a whole
// suite's recordings, each one `hmc-run record merge DIR/<stem>` away from its replay. Fills
// `folders` (nullopt each without --record) and returns 0, or the exit code of a usage error
// it printed (two files with one stem, a folder that cannot be made).
int recordFolders(const RunOptions& options, const std::vector<std::string>& files,
                  std::vector<std::optional<std::string>>* folders);

// A scenario read once and parsed with the overrides, or why it cannot run here.
struct PreparedScenario {
  std::string text;
  scenario::Scenario scenario;
  std::optional<ScenarioError> error;
};
PreparedScenario prepareScenario(const std::string& file, const RunOptions& options,
                                 const RunPlan& plan);

// What hmc-run's own rank processes run: `executable` with the `_rank` command, or, for a
// scenario `forkable` accepts, a forked copy of the runner that calls `body` (LibTorch is not
// loaded again; main.cpp: the scenarios that do not use CUDA).
struct RankProgram {
  std::string executable;
  std::function<int(const world::RankLaunch& launch)> body;
  std::function<bool(const scenario::Scenario& scenario)> forkable;
};

// The driver's options for the plan and one scenario.
world::WorldOptions worldOptions(const RunPlan& plan, const RunOptions& options,
                                 const RankProgram& program, const scenario::Scenario& scenario);

}  // namespace hmc::app
