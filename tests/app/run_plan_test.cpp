// From the command line to what runs (app/run_plan.hpp): who starts the ranks, over which
// transport, who reports, the usage errors that stop a run before anything starts, and what a
// scenario needs that this host cannot give.

#include "run_plan.hpp"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace {

namespace fs = std::filesystem;
using hmc::app::RunOptions;
using hmc::app::RunPlan;
using hmc::collective::Transport;

hmc::collective::EnvLookup envOf(std::map<std::string, std::string> values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

const std::map<std::string, std::string> kTorchrunRank2 = {
    {"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "198.18.0.1"}, {"MASTER_PORT", "29400"}};

std::string name(Transport transport) { return std::string(hmc::collective::toString(transport)); }

// A scenario file in a fresh folder, removed with it.
class ScenarioFile {
 public:
  explicit ScenarioFile(const std::string& text) {
    std::string pattern = (fs::temp_directory_path() / "hmc-run-plan-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    folder_ = pattern;
    std::ofstream(path()) << text;
  }
  ~ScenarioFile() { fs::remove_all(folder_); }
  std::string path() const { return (folder_ / "s.json").string(); }

 private:
  fs::path folder_;
};

const char* const kTwoRanks = R"({"format": "hmc-scenario/1", "name": "two", "world_size": 2,
  "device": "cpu", "steps": [{"op": "create", "module": "a"}, {"op": "close_all"}]})";

}  // namespace

TEST_SUITE("run plan") {
  TEST_CASE("without a launcher: thread ranks by default, this process reports") {
    RunOptions options;
    RunPlan plan;
    REQUIRE(hmc::app::planRun(options, &plan, envOf({})) == 0);
    CHECK(name(plan.transport) == "threads");
    CHECK(plan.reporting);
    CHECK_FALSE(plan.launch.has_value());
    CHECK_FALSE(plan.placement.has_value());
    CHECK(plan.warmup == 0);
    CHECK(plan.flightCapacity == 64);
    options.repetitions = 5;
    options.tracePath = "trace.json";
    REQUIRE(hmc::app::planRun(options, &plan, envOf({})) == 0);
    CHECK(plan.warmup == 1);              // the first of several repetitions warms up
    CHECK(plan.flightCapacity == 65536);  // a trace wants every collective
  }

  TEST_CASE("under torchrun: tcp by default, placed by its variables, only rank 0 reports") {
    RunOptions options;
    RunPlan plan;
    REQUIRE(hmc::app::planRun(options, &plan, envOf(kTorchrunRank2)) == 0);
    CHECK(name(plan.transport) == "tcp");
    CHECK_FALSE(plan.reporting);
    REQUIRE(plan.placement.has_value());
    CHECK(plan.placement->rank == 2);
    CHECK(plan.placement->worldSize == 4);
    CHECK(plan.placement->masterAddr == "198.18.0.1");
    CHECK(plan.placement->masterPort == 29400);
    CHECK(plan.placement->launcher == "torchrun");
    const hmc::scenario::Scenario scenario;
    hmc::app::RankProgram program{"/bin/hmc-run", [](const hmc::world::RankLaunch&) { return 0; },
                                  [](const hmc::scenario::Scenario&) { return true; }};
    const auto world = hmc::app::worldOptions(plan, options, program, scenario);
    CHECK(world.launch.placement.underLauncher());
    CHECK(world.launch.placement.rank == 2);
    CHECK(name(world.launch.transport) == "tcp");
    CHECK(world.executable == "/bin/hmc-run");
    CHECK(static_cast<bool>(world.rankBody));  // forked ranks for a scenario that allows them
    program.forkable = [](const hmc::scenario::Scenario&) { return false; };
    CHECK_FALSE(static_cast<bool>(hmc::app::worldOptions(plan, options, program, scenario).rankBody));
  }

  TEST_CASE("usage errors stop a run before anything starts (exit 2)") {
    RunPlan plan;
    RunOptions threads;
    threads.transport = Transport::kThreads;
    CHECK(hmc::app::planRun(threads, &plan, envOf(kTorchrunRank2)) == 2);
    RunOptions disagree;
    disagree.overrides.worldSize = 8;
    CHECK(hmc::app::planRun(disagree, &plan, envOf(kTorchrunRank2)) == 2);
    RunOptions warmup;
    warmup.repetitions = 3;
    warmup.warmup = 3;
    CHECK(hmc::app::planRun(warmup, &plan, envOf({})) == 2);
    RunOptions bothStdout;
    bothStdout.reportPath = "-";
    bothStdout.tracePath = "-";
    CHECK(hmc::app::planRun(bothStdout, &plan, envOf({})) == 2);
    RunOptions halfTorchrun;
    CHECK(hmc::app::planRun(halfTorchrun, &plan, envOf({{"RANK", "1"}})) == 2);
    RunOptions nccl;  // no usable GPU here, or no CUDA in this build: refused either way
    nccl.transport = Transport::kNccl;
    if (!hmc::resources::cudaDeviceUsable()) CHECK(hmc::app::planRun(nccl, &plan, envOf({})) == 2);
  }

  TEST_CASE("a scenario is read once and parsed with the overrides") {
    ScenarioFile file(kTwoRanks);
    RunOptions options;
    options.overrides.worldSize = 3;
    options.overrides.timeoutS = 7.5;
    RunPlan plan;
    REQUIRE(hmc::app::planRun(options, &plan, envOf({})) == 0);
    const auto prepared = hmc::app::prepareScenario(file.path(), options, plan);
    REQUIRE_FALSE(prepared.error.has_value());
    CHECK(prepared.text == kTwoRanks);
    CHECK(prepared.scenario.worldSize == 3);
    CHECK(prepared.scenario.timeoutS == 7.5);
    // Under a launcher the world is the launcher's.
    RunOptions launched;
    REQUIRE(hmc::app::planRun(launched, &plan, envOf(kTorchrunRank2)) == 0);
    CHECK(hmc::app::prepareScenario(file.path(), launched, plan).scenario.worldSize == 4);
  }

  TEST_CASE("what cannot run here is an error naming the file and where") {
    RunOptions options;
    RunPlan plan;
    REQUIRE(hmc::app::planRun(options, &plan, envOf({})) == 0);
    ScenarioFile broken("{\"format\": \"hmc-scenario/1\", ");
    const auto invalid = hmc::app::prepareScenario(broken.path(), options, plan);
    REQUIRE(invalid.error.has_value());
    CHECK(std::string(invalid.error->what()).find(broken.path()) != std::string::npos);
    if (!hmc::resources::cudaDeviceUsable()) {
      ScenarioFile gpu(R"({"format": "hmc-scenario/1", "name": "g", "world_size": 2,
        "device": "cpu", "steps": [{"op": "create", "module": "a"},
        {"op": "forward", "module": "a", "device": "cuda"}]})");
      const auto refused = hmc::app::prepareScenario(gpu.path(), options, plan);
      REQUIRE(refused.error.has_value());
      const std::string what = refused.error->what();
      CHECK(what.find("/steps/1/device") != std::string::npos);
      CHECK(what.find("run the scenario on a GPU machine") != std::string::npos);
    }
  }
}
