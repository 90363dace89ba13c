#include "rank_options.hpp"

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/transport.hpp"
#include "hmc/enum_names.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::app {

void addRankOptions(CLI::App& command, world::RankLaunch& launch) {
  command.add_option("file", launch.scenarioFile)->required();
  command.add_option("--display-file", launch.displayFile);
  command
      .add_option_function<std::string>("--transport",
                                        [&launch](const std::string& name) {
                                          const auto parsed = collective::transportFromString(name);
                                          if (!parsed)
                                            throw CLI::ValidationError("--transport",
                                                                       "unknown transport " + name);
                                          launch.transport = *parsed;
                                        })
      ->required();
  command.add_option("--rank", launch.placement.rank)->required();
  command.add_option("--world-size", launch.placement.worldSize)->required();
  command.add_option("--master-addr", launch.placement.masterAddr);
  command.add_option("--master-port", launch.placement.masterPort)->required();
  command.add_option("--gloo-port", launch.placement.glooPort);
  command.add_option("--repetitions", launch.repetitions);
  command.add_option("--flight-capacity", launch.flightCapacity);
  command.add_option("--result-file", launch.resultFile)->required();
  command.add_option("--log-level", launch.logLevel);
  command.add_option("--record", launch.recordDirectory);
  command.add_flag_function("--agent-hosts-store", [&launch](std::int64_t count) {
    launch.placement.storeHost =
        count > 0 ? world::StoreHost::kLauncherAgent : world::StoreHost::kRankZero;
  });
  command.add_option_function<double>("--join-timeout", [&launch](const double& seconds) {
    launch.joinTimeout = collective::timeoutFromSeconds(seconds);
  });
  command.add_option_function<int>("--world-size-override",
                                   [&launch](const int& n) { launch.overrides.worldSize = n; });
  command.add_option_function<std::string>("--device", [&launch](const std::string& name) {
    launch.overrides.device = enumFromName<scenario::Device>(name);
    if (!launch.overrides.device) throw CLI::ValidationError("--device", "unknown device " + name);
  });
  command.add_option_function<double>(
      "--timeout", [&launch](const double& seconds) { launch.overrides.timeoutS = seconds; });
}

}  // namespace hmc::app
