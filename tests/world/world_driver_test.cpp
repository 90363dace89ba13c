// One driver for every kind of world (hmc/world/world_driver.hpp): thread ranks and hmc-run's own
// rank processes (the real hmc-run, on 127.0.0.1) hand every repetition to the sink, and a
// ReportBuilder folds them into the report as hmc-run does. The launcher rank's driver runs
// under real launchers in tests/multirank/test_launchers.py.

#include "hmc/world/world_driver.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/store_transport.hpp"
#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/world/signals.hpp"

namespace {

using hmc::scenario::RankResult;
using hmc::world::WorldOptions;

const char* const kPass = R"({"format": "hmc-scenario/1", "name": "pass", "world_size": 3,
  "device": "cpu", "timeout_s": 20, "steps": [
  {"op": "create", "module": "a", "type": "scratch_linear", "features": 16},
  {"op": "forward", "module": "a"},
  {"op": "close_all"},
  {"op": "check", "groups": 0}]})";

// Rank 1 never enters the close: rank 0 hangs there at its deadline.
const char* const kHang = R"({"format": "hmc-scenario/1", "name": "hang", "world_size": 2,
  "device": "cpu", "timeout_s": 0.5, "steps": [
  {"op": "create", "module": "a"},
  {"op": "forward", "module": "a"},
  {"op": "close_all", "ranks": [0], "expect": "hang"}]})";

WorldOptions optionsFor(hmc::collective::Transport transport, int repetitions) {
  WorldOptions options;
  options.launch.transport = transport;
  options.launch.repetitions = repetitions;
  options.executable = HMC_RUN;
  return options;
}

struct Collected {
  std::vector<std::vector<RankResult>> repetitions;
  hmc::world::RepetitionSink sink() {
    return [this](std::vector<RankResult> ranks) { repetitions.push_back(std::move(ranks)); };
  }
};

}  // namespace

TEST_SUITE("world driver") {
  TEST_CASE("the plan picks the driver: a launcher's rank, threads, or local processes") {
    using hmc::collective::Transport;
    CHECK(hmc::world::makeWorldDriver(optionsFor(Transport::kThreads, 1))->describe() == "threads");
    CHECK(hmc::world::makeWorldDriver(optionsFor(Transport::kStore, 1))->describe() ==
          "local processes");
    WorldOptions launched = optionsFor(Transport::kTcp, 1);
    launched.launch.placement.launcher = "srun";
    launched.launch.placement.rank = 3;
    launched.launch.placement.worldSize = 8;
    CHECK(hmc::world::makeWorldDriver(launched)->describe() == "srun rank 3 of 8");
  }

  TEST_CASE("thread ranks hand every repetition to the sink, and ReportBuilder folds them") {
    hmc::world::SignalScope signals;  // as hmc-run: Ctrl-C is recorded, not fatal
    hmc::scenario::limitTorchThreads(1);
    const auto scenario = hmc::scenario::parseScenarioText(kPass, "pass.json");
    WorldOptions options = optionsFor(hmc::collective::Transport::kThreads, 3);
    int rankZeroSteps = 0;
    options.onRankZeroStep = [&](const hmc::scenario::StepResult&) { ++rankZeroSteps; };
    hmc::scenario::ReportBuilder builder(scenario, 1);
    Collected collected;
    const auto ran = hmc::world::makeWorldDriver(options)->run(
        {scenario, "pass.json", kPass}, [&](std::vector<RankResult> ranks) {
          collected.repetitions.push_back(ranks);
          builder.add(std::move(ranks));
        });
    CHECK(ran.reporting);
    CHECK_FALSE(ran.interrupted);
    REQUIRE(collected.repetitions.size() == 3);
    for (const auto& ranks : collected.repetitions) {
      REQUIRE(ranks.size() == 3);
      for (int rank = 0; rank < 3; ++rank) {
        CHECK(ranks[rank].rank == rank);
        CHECK_FALSE(ranks[rank].crashed);
        CHECK(ranks[rank].steps.size() == 4);
      }
    }
    CHECK(rankZeroSteps == 12);
    CHECK(builder.repetitions() == 3);
    const auto report = std::move(builder).build({});
    CHECK(hmc::scenario::toString(report.outcome) == "pass");
  }

  TEST_CASE("after a hang a world is not repeated") {
    hmc::world::SignalScope signals;
    hmc::scenario::limitTorchThreads(1);
    const auto scenario = hmc::scenario::parseScenarioText(kHang, "hang.json");
    Collected collected;
    const auto ran =
        hmc::world::makeWorldDriver(optionsFor(hmc::collective::Transport::kThreads, 5))
            ->run({scenario, "hang.json", kHang}, collected.sink());
    REQUIRE(collected.repetitions.size() == 1);
    CHECK(collected.repetitions[0][0].hung);
    CHECK(hmc::world::worldEnds(collected.repetitions[0]));
    CHECK_FALSE(ran.interrupted);
  }

  TEST_CASE("hmc-run's own rank processes hand every repetition to the sink in rank order") {
    const auto scenario = hmc::scenario::parseScenarioText(kPass, "pass.json");
    hmc::world::SignalScope signals;
    Collected collected;
    const auto ran = hmc::world::makeWorldDriver(optionsFor(hmc::collective::Transport::kTcp, 2))
                         ->run({scenario, "pass.json", kPass}, collected.sink());
    CHECK(ran.reporting);
    CHECK_FALSE(ran.interrupted);
    REQUIRE(collected.repetitions.size() == 2);
    for (const auto& ranks : collected.repetitions) {
      REQUIRE(ranks.size() == 3);
      for (int rank = 0; rank < 3; ++rank) {
        INFO("rank ", rank, ": ", ranks[rank].crashReason.value_or(""));
        CHECK(ranks[rank].rank == rank);
        CHECK_FALSE(ranks[rank].crashed);
        CHECK(ranks[rank].steps.size() == 4);
      }
    }
  }

  TEST_CASE("a rank process that dies is a crashed rank with its exit status, not a lost run") {
    const char* const text = R"({"format": "hmc-scenario/1", "name": "crash", "world_size": 2,
      "device": "cpu", "timeout_s": 20, "steps": [
      {"op": "create", "module": "a"},
      {"op": "forward", "module": "a"},
      {"op": "fault", "kind": "crash", "ranks": [1]},
      {"op": "close_all", "ranks": [0], "expect": "hang"}]})";
    const auto scenario = hmc::scenario::parseScenarioText(text, "crash.json");
    hmc::world::SignalScope signals;
    Collected collected;
    hmc::world::makeWorldDriver(optionsFor(hmc::collective::Transport::kStore, 3))
        ->run({scenario, "crash.json", text}, collected.sink());
    REQUIRE(collected.repetitions.size() == 1);  // no repetition after a crash
    const RankResult& rank1 = collected.repetitions[0][1];
    CHECK(rank1.crashed);
    REQUIRE(rank1.crashReason.has_value());
    CHECK(rank1.crashReason->rfind("exited with status 17 (fault crash)", 0) == 0);
    CHECK(rank1.leaks.reason == "the rank process died without a result: not checked");
  }

  TEST_CASE("Ctrl-C stops hmc-run's own rank processes, and what they did is handed on") {
    const char* const text = R"({"format": "hmc-scenario/1", "name": "sleep", "world_size": 2,
      "device": "cpu", "timeout_s": 30, "steps": [
      {"op": "create", "module": "a"},
      {"op": "forward", "module": "a"},
      {"op": "sleep", "seconds": 120}]})";
    const auto scenario = hmc::scenario::parseScenarioText(text, "sleep.json");
    hmc::world::SignalScope signals;
    WorldOptions options = optionsFor(hmc::collective::Transport::kTcp, 1);
    const auto held = hmc::collective::PortReservation::loopback();  // until rank 0 binds it
    options.masterPort = held.port();
    // The signal comes once every rank is seen sleeping in step 2 (their heartbeats in the
    // store, as `hmc-run status` reads them): the state the assertions below describe.
    std::atomic<bool> seen{false};
    std::thread user([&] {
      hmc::collective::StoreTransportOptions client;
      client.port = *options.masterPort;
      client.worldSize = 2;
      client.timeout = std::chrono::seconds(120);  // rank 0 starts the store once it runs
      try {
        auto kv = hmc::collective::connectKeyValueStore(client);
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        while (!seen && std::chrono::steady_clock::now() < end) {
          int sleeping = 0;
          for (int rank = 0; rank < 2; ++rank) {
            const auto key = hmc::diagnostics::heartbeatKey(rank);
            if (!kv->check({key})) continue;
            const auto beat = hmc::diagnostics::Heartbeat::fromJson(
                nlohmann::json::parse(kv->get(key, std::chrono::seconds(5))));
            if (beat.step == 2) ++sleeping;
          }
          seen = sleeping == 2;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      } catch (const std::exception& error) {
        MESSAGE("watching the ranks failed: ", error.what());
      }
      std::raise(SIGINT);  // as a user's Ctrl-C: recorded by the SignalScope
    });
    Collected collected;
    const auto ran =
        hmc::world::makeWorldDriver(options)->run({scenario, "sleep.json", text}, collected.sink());
    user.join();
    REQUIRE(seen);
    CHECK(ran.interrupted);
    REQUIRE(collected.repetitions.size() == 1);
    for (const auto& result : collected.repetitions[0]) {
      INFO("rank ", result.rank);
      CHECK(result.stopped);  // alive until the signal: stopped, not crashed
      CHECK_FALSE(result.crashed);
      CHECK(result.crashReason == "stopped by signal 15 (Terminated) in step 2");
      CHECK(result.steps.size() == 2);  // create and forward, done before the signal
      CHECK(result.leaks.reason == "the rank was stopped by a signal: not checked");
    }
    CHECK(hmc::world::pendingSignal() == SIGINT);
  }
}
