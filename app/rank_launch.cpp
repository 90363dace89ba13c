#include "rank_launch.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

namespace hmc::app {

scenario::Scenario ScenarioOverrides::parse(const std::string& text,
                                            const std::string& file) const {
  scenario::ParseOptions options;
  options.worldSize = worldSize;
  scenario::Scenario parsed = scenario::parseScenarioText(text, file, options);
  if (device) parsed.device = *device;
  if (timeoutS) parsed.timeoutS = *timeoutS;
  return parsed;
}

std::vector<std::string> ScenarioOverrides::toArgs() const {
  std::vector<std::string> args;
  if (worldSize) args.insert(args.end(), {"--world-size-override", std::to_string(*worldSize)});
  if (device) args.insert(args.end(), {"--device", std::string(scenario::toString(*device))});
  // {:.17g} round-trips a double exactly.
  if (timeoutS) args.insert(args.end(), {"--timeout", fmt::format("{:.17g}", *timeoutS)});
  return args;
}

std::vector<std::string> RankLaunch::toArgs() const {
  std::vector<std::string> args = {"_rank",
                                   scenarioFile,
                                   "--display-file",
                                   displayFile,
                                   "--transport",
                                   std::string(collective::toString(transport)),
                                   "--rank",
                                   std::to_string(placement.rank),
                                   "--world-size",
                                   std::to_string(placement.worldSize),
                                   "--master-addr",
                                   placement.masterAddr,
                                   "--master-port",
                                   std::to_string(placement.masterPort),
                                   "--gloo-port",
                                   std::to_string(placement.glooPort),
                                   "--repetitions",
                                   std::to_string(repetitions),
                                   "--flight-capacity",
                                   std::to_string(flightCapacity),
                                   "--result-file",
                                   resultFile,
                                   "--log-level",
                                   logLevel,
                                   "--join-timeout",
                                   fmt::format("{:.17g}", joinTimeoutS)};
  if (placement.storeHost == StoreHost::kLauncherAgent) args.push_back("--agent-hosts-store");
  const auto overrideArgs = overrides.toArgs();
  args.insert(args.end(), overrideArgs.begin(), overrideArgs.end());
  return args;
}

void RankLaunch::addOptions(CLI::App& command) {
  command.add_option("file", scenarioFile)->required();
  command.add_option("--display-file", displayFile);
  command
      .add_option_function<std::string>("--transport",
                                        [this](const std::string& name) {
                                          const auto parsed = collective::transportFromString(name);
                                          if (!parsed)
                                            throw CLI::ValidationError("--transport",
                                                                       "unknown transport " + name);
                                          transport = *parsed;
                                        })
      ->required();
  command.add_option("--rank", placement.rank)->required();
  command.add_option("--world-size", placement.worldSize)->required();
  command.add_option("--master-addr", placement.masterAddr);
  command.add_option("--master-port", placement.masterPort)->required();
  command.add_option("--gloo-port", placement.glooPort);
  command.add_option("--repetitions", repetitions);
  command.add_option("--flight-capacity", flightCapacity);
  command.add_option("--result-file", resultFile)->required();
  command.add_option("--log-level", logLevel);
  command.add_flag_function("--agent-hosts-store", [this](std::int64_t count) {
    placement.storeHost = count > 0 ? StoreHost::kLauncherAgent : StoreHost::kRankZero;
  });
  command.add_option("--join-timeout", joinTimeoutS);
  command.add_option_function<int>("--world-size-override",
                                   [this](const int& n) { overrides.worldSize = n; });
  command.add_option_function<std::string>("--device", [this](const std::string& name) {
    overrides.device = enumFromName<scenario::Device>(name);
    if (!overrides.device) throw CLI::ValidationError("--device", "unknown device " + name);
  });
  command.add_option_function<double>(
      "--timeout", [this](const double& seconds) { overrides.timeoutS = seconds; });
}

collective::TransportOptions RankLaunch::transportOptions(std::chrono::milliseconds timeout) const {
  collective::TransportOptions options;
  options.rank = placement.rank;
  options.worldSize = placement.worldSize;
  options.masterAddr = placement.masterAddr;
  options.masterPort = placement.masterPort;
  options.glooPort = placement.glooPort;
  options.rankZeroHostsStore = placement.storeHost == StoreHost::kRankZero;
  options.timeout = timeout;
  options.joinTimeout = joinTimeout();
  return options;
}

std::chrono::milliseconds RankLaunch::joinTimeout() const {
  return collective::timeoutFromSeconds(joinTimeoutS);
}

}  // namespace hmc::app
