// hmc-run's command line (app/cli.hpp) and the rank launch it hands to each rank process
// (app/rank_launch.hpp): what the parent writes with toArgs() the rank reads back with
// addOptions(), through the real parser. No processes, no torch.

#include "rank_launch.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"

using namespace std::chrono_literals;
using hmc::app::CommandLine;
using hmc::app::RankLaunch;

namespace {

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
  TEST_CASE("the join timeout survives the round trip to a rank process") {
    RankLaunch sent;
    sent.scenarioFile = "/tmp/scenario.json";
    sent.masterPort = 29500;
    sent.resultFile = "/tmp/result";
    sent.rank = 1;
    sent.worldSize = 4;
    sent.joinTimeoutS = 12.345;
    CommandLine cli;
    REQUIRE_FALSE(parse(cli, sent.toArgs()).has_value());
    const RankLaunch& got = cli.rankLaunch;
    CHECK(got.joinTimeoutS == sent.joinTimeoutS);
    CHECK(got.rank == 1);
    const auto options = got.transportOptions(2s);
    CHECK(options.timeout == 2s);
    REQUIRE(options.joinTimeout.has_value());
    CHECK(*options.joinTimeout == 12345ms);
    CHECK(got.joinTimeout() == 12345ms);
  }

  TEST_CASE("--join-timeout defaults to 300 s and reaches the rank launch") {
    CommandLine defaults;
    REQUIRE_FALSE(parse(defaults, {"scenario.json"}).has_value());
    CHECK(defaults.run.joinTimeoutS == 300.0);
    CHECK(RankLaunch().joinTimeout() == 300s);
    CommandLine given;
    REQUIRE_FALSE(parse(given, {"scenario.json", "--join-timeout", "45"}).has_value());
    CHECK(given.run.joinTimeoutS == 45.0);
  }

  TEST_CASE("--join-timeout that is not a positive number of seconds is a usage error") {
    for (const char* bad : {"0", "-1", "nan", "1e7", "later"}) {
      CAPTURE(bad);
      CommandLine cli;
      CHECK(parse(cli, {"scenario.json", "--join-timeout", bad}) == hmc::app::kExitUsage);
    }
  }
}
