// A rank process's configuration (hmc/world/rank_launch.hpp, hmc/world/rank_placement.hpp): the
// `_rank` command line that hmc-run's launcher writes reads back as the same RankLaunch, and a
// launcher's environment gives the placement every other part reads.

#include "hmc/world/rank_launch.hpp"

#include <doctest/doctest.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "hmc/collective/launch_env.hpp"
#include "hmc/world/rank_placement.hpp"
#include "rank_options.hpp"

namespace {

using namespace std::chrono_literals;
using hmc::app::CommandLine;
using hmc::world::RankLaunch;
using hmc::world::RankPlacement;
using hmc::world::StoreHost;

// Parses `launch.toArgs()` as the rank process does.
RankLaunch roundTrip(const RankLaunch& launch) {
  CLI::App app("hmc-run");
  CLI::App* rank = app.add_subcommand("_rank");
  RankLaunch back;
  hmc::app::addRankOptions(*rank, back);
  std::vector<std::string> args = launch.toArgs();
  args.insert(args.begin(), "hmc-run");
  std::vector<const char*> argv;
  for (const auto& arg : args) argv.push_back(arg.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  REQUIRE(rank->parsed());
  return back;
}

// Parses `args` (after the program name) with hmc-run's command line; the exit code when
// parsing ended the command (a usage error), else nullopt.
std::optional<int> parse(CommandLine& cli, std::vector<std::string> args) {
  args.insert(args.begin(), "hmc-run");
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  return cli.parse(static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST_SUITE("rank launch") {
  TEST_CASE("the _rank command line reads back as the same configuration") {
    RankLaunch launch;
    launch.scenarioFile = "/tmp/hmc-run-x/scenario.json";
    launch.displayFile = "scenarios/with space.json";
    launch.overrides.worldSize = 6;
    launch.overrides.device = hmc::scenario::Device::kCpu;
    launch.overrides.timeoutS = 0.1 + 0.2;  // not exactly 0.3: must survive as is
    launch.repetitions = 12;
    launch.transport = hmc::collective::Transport::kGloo;
    launch.placement =
        RankPlacement{5, 6, "198.18.0.1", 29400, 29411, StoreHost::kLauncherAgent, ""};
    launch.flightCapacity = 65536;
    launch.resultFile = "/tmp/hmc-run-x/rank5";
    launch.logLevel = "debug";
    launch.joinTimeout = 12345ms;
    const RankLaunch back = roundTrip(launch);
    CHECK(back.scenarioFile == launch.scenarioFile);
    CHECK(back.displayFile == launch.displayFile);
    CHECK(back.overrides.worldSize == 6);
    CHECK(back.overrides.device.has_value());
    CHECK(hmc::scenario::toString(*back.overrides.device) == "cpu");
    CHECK(back.overrides.timeoutS == launch.overrides.timeoutS);
    CHECK(back.repetitions == 12);
    CHECK(hmc::collective::toString(back.transport) == "gloo");
    CHECK(back.placement.rank == 5);
    CHECK(back.placement.worldSize == 6);
    CHECK(back.placement.masterAddr == "198.18.0.1");
    CHECK(back.placement.masterPort == 29400);
    CHECK(back.placement.glooPort == 29411);
    CHECK((back.placement.storeHost == StoreHost::kLauncherAgent));
    CHECK(back.placement.launcher.empty());
    CHECK(back.flightCapacity == 65536);
    CHECK(back.resultFile == launch.resultFile);
    CHECK(back.logLevel == "debug");
    const auto options = back.transportOptions(2s);
    CHECK(options.timeout == 2s);
    REQUIRE(options.joinTimeout.has_value());
    CHECK(*options.joinTimeout == 12345ms);
    CHECK(back.joinTimeout == 12345ms);
  }

  TEST_CASE("without overrides none appear, and rank 0 hosts the store by default") {
    RankLaunch launch;
    launch.scenarioFile = "s.json";
    launch.resultFile = "r";
    const RankLaunch back = roundTrip(launch);
    CHECK_FALSE(back.overrides.worldSize.has_value());
    CHECK_FALSE(back.overrides.device.has_value());
    CHECK_FALSE(back.overrides.timeoutS.has_value());
    CHECK((back.placement.storeHost == StoreHost::kRankZero));
  }

  TEST_CASE("the transport's options come from the placement") {
    RankLaunch launch;
    launch.placement =
        RankPlacement{2, 4, "node1", 29500, 0, StoreHost::kLauncherAgent, "torchrun"};
    const auto options = launch.transportOptions(std::chrono::milliseconds(2500));
    CHECK(options.rank == 2);
    CHECK(options.worldSize == 4);
    CHECK(options.masterAddr == "node1");
    CHECK(options.masterPort == 29500);
    CHECK_FALSE(options.rankZeroHostsStore);
    CHECK(options.timeout == std::chrono::milliseconds(2500));
  }

  TEST_CASE("a launcher's environment places the rank; who hosts the store is decided once") {
    hmc::collective::LaunchEnv env;
    env.launcher = "torchrun";
    env.rank = 0;
    env.worldSize = 8;
    env.masterAddr = "h1";
    env.masterPort = 29500;
    env.agentHostsStore = true;
    RankPlacement placement = RankPlacement::fromLaunch(env);
    CHECK(placement.underLauncher());
    CHECK_FALSE(placement.hostsStore());  // torchrun's agent hosts it
    CHECK(placement.storeHostName() == "the store's host (the launcher's agent)");
    env.launcher = "mpirun";
    env.agentHostsStore = false;
    placement = RankPlacement::fromLaunch(env);
    CHECK(placement.hostsStore());
    CHECK(placement.storeHostName() == "the store's host (rank 0)");
    env.rank = 3;
    CHECK_FALSE(RankPlacement::fromLaunch(env).hostsStore());
    CHECK_FALSE(RankPlacement{}.underLauncher());  // hmc-run's own rank process
  }

  TEST_CASE("hmc-run's own parser reads a _rank command line back") {
    RankLaunch sent;
    sent.scenarioFile = "/tmp/scenario.json";
    sent.placement.masterPort = 29500;
    sent.placement.rank = 1;
    sent.placement.worldSize = 4;
    sent.resultFile = "/tmp/result";
    sent.joinTimeout = 7s;
    CommandLine cli;
    REQUIRE_FALSE(parse(cli, sent.toArgs()).has_value());
    CHECK(cli.rankLaunch.placement.rank == 1);
    CHECK(cli.rankLaunch.joinTimeout == 7s);
  }

  TEST_CASE("--join-timeout defaults to 300 s and reaches the rank launch") {
    CommandLine defaults;
    REQUIRE_FALSE(parse(defaults, {"scenario.json"}).has_value());
    CHECK(defaults.run.joinTimeout == 300s);
    CHECK(RankLaunch().joinTimeout == 300s);
    CommandLine given;
    REQUIRE_FALSE(parse(given, {"scenario.json", "--join-timeout", "45"}).has_value());
    CHECK(given.run.joinTimeout == 45s);
  }

  TEST_CASE("--join-timeout that is not a positive number of seconds is a usage error") {
    for (const char* bad : {"0", "-1", "nan", "1e7", "later"}) {
      CAPTURE(bad);
      CommandLine cli;
      CHECK(parse(cli, {"scenario.json", "--join-timeout", bad}) == hmc::app::kExitUsage);
    }
  }
}
