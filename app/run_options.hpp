#pragma once
// The options of a scenario run (hmc-run's default command), apart from the command line that
// fills them (cli.hpp): the run plan (run_plan.hpp) and shrink's trials read them too. And the
// two helpers every command uses to set up its logger and to say a usage error.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/transport.hpp"
#include "hmc/world/rank_launch.hpp"

namespace hmc::app {

// The options of a run (the default command).
struct RunOptions {
  std::vector<std::string> paths;
  world::ScenarioOverrides overrides;  // --world-size, --device, --timeout
  collective::Transport transport = collective::Transport::kAuto;
  std::optional<std::string> reportPath;
  std::optional<std::string> tracePath;
  std::optional<std::string> htmlPath;  // --html: the report as one self-contained page
  std::string logLevel = "warn";
  bool quiet = false;
  std::optional<std::string> masterAddr;
  std::optional<int> masterPort;
  std::chrono::milliseconds joinTimeout = world::kDefaultJoinTimeout;  // --join-timeout
  int repetitions = 1;
  std::optional<int> warmup;  // default: 1 when repetitions > 1
  std::optional<std::string> recordDirectory;  // --record: each rank's lifecycle calls
};

// The `hmc` logger on stderr at `level` (trace ... off).
void setUpLogging(const std::string& level);

// "hmc-run: <message>" on stderr.
void usageError(const std::string& message);

}  // namespace hmc::app
