#include "hmc/world/rank_launch.hpp"

#include <fmt/format.h>

namespace hmc::world {

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
  std::vector<std::string> args = {
      "_rank",
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
      fmt::format("{:.17g}", std::chrono::duration<double>(joinTimeout).count())};
  if (placement.storeHost == StoreHost::kLauncherAgent) args.push_back("--agent-hosts-store");
  if (recordDirectory) {
    args.push_back("--record");
    args.push_back(*recordDirectory);
  }
  const auto overrideArgs = overrides.toArgs();
  args.insert(args.end(), overrideArgs.begin(), overrideArgs.end());
  return args;
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
  options.joinTimeout = joinTimeout;
  return options;
}

}  // namespace hmc::world
