#include "hmc/world/world_driver.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "hmc/scenario/thread_driver.hpp"
#include "hmc/world/local_launcher.hpp"
#include "hmc/world/rank_process.hpp"
#include "hmc/world/signals.hpp"

namespace hmc::world {
namespace {

// Every rank a thread of this process. Ctrl-C, SIGTERM or SIGHUP (recorded by the run's
// SignalScope) stops the ranks' collectives: through the caller's interrupt when it gives one
// (WorldOptions::interrupt), else through a SignalForwarder of this run.
class ThreadsWorld final : public WorldDriver {
 public:
  explicit ThreadsWorld(WorldOptions options) : options_(std::move(options)) {}

  WorldRun run(const WorldInput& input, const RepetitionSink& sink) override {
    scenario::ThreadRunOptions runOptions;
    runOptions.flightCapacity = options_.launch.flightCapacity;
    runOptions.recordDirectory = options_.launch.recordDirectory;
    if (options_.onRankZeroStep) {
      runOptions.onStep = [this](int rank, const scenario::StepResult& step) {
        if (rank == 0) options_.onRankZeroStep(step);
      };
    }
    // The caller's interrupt (it forwards the signals itself), else one for this run.
    scenario::ThreadInterrupt own;
    scenario::ThreadInterrupt& interrupt = options_.interrupt ? *options_.interrupt : own;
    runOptions.interrupt = &interrupt;
    std::optional<SignalForwarder> forwarder;
    if (!options_.interrupt) {
      forwarder.emplace([&interrupt](int, const std::string& why) { interrupt.interrupt(why); });
    }
    WorldRun ran;
    for (int repetition = 0; repetition < options_.launch.repetitions && !interrupt.interrupted();
         ++repetition) {
      auto ranks = scenario::runOnThreads(input.scenario, runOptions);
      runOptions.recordDirectory.reset();  // the first repetition only
      const bool last = worldEnds(ranks);
      sink(std::move(ranks));
      if (last) break;
    }
    ran.interrupted = interrupt.interrupted();
    return ran;
  }

  std::string describe() const override { return "threads"; }

 private:
  WorldOptions options_;
};

// hmc-run's own launcher: world_size rank processes of this program.
class LocalProcessWorld final : public WorldDriver {
 public:
  explicit LocalProcessWorld(WorldOptions options) : options_(std::move(options)) {}

  WorldRun run(const WorldInput& input, const RepetitionSink& sink) override {
    LocalLaunchOptions launch;
    launch.executable = options_.executable;
    launch.rankBody = options_.rankBody;
    launch.launch = options_.launch;
    launch.launch.displayFile = input.file;
    launch.scenarioText = input.text;
    launch.masterPort = options_.masterPort;
    launch.onRepetition = sink;
    WorldRun ran;
    ran.interrupted = launchLocalRanks(input.scenario, launch).interrupted;
    return ran;
  }

  std::string describe() const override { return "local processes"; }

 private:
  WorldOptions options_;
};

// One rank of a world that torchrun, srun or mpirun started.
class LauncherRankWorld final : public WorldDriver {
 public:
  explicit LauncherRankWorld(WorldOptions options) : options_(std::move(options)) {}

  WorldRun run(const WorldInput& input, const RepetitionSink& sink) override {
    RankLaunch launch = options_.launch;
    launch.scenarioFile = input.file;
    launch.displayFile = input.file;
    auto outcome = runRankProcess(input.scenario, launch, options_.onInterrupted);
    WorldRun ran;
    ran.reporting = outcome.merged.has_value();
    ran.unreported = outcome.unreported;
    if (ran.reporting) {
      for (auto& ranks : *outcome.merged) sink(std::move(ranks));
    }
    return ran;
  }

  std::string describe() const override {
    const auto& placement = options_.launch.placement;
    return fmt::format("{} rank {} of {}", placement.launcher, placement.rank, placement.worldSize);
  }

 private:
  WorldOptions options_;
};

}  // namespace

bool worldEnds(const std::vector<scenario::RankResult>& ranks) {
  return std::any_of(ranks.begin(), ranks.end(),
                     [](const scenario::RankResult& rank) { return rank.unfinished(); });
}

std::unique_ptr<WorldDriver> makeWorldDriver(WorldOptions options) {
  if (options.launch.placement.underLauncher())
    return std::make_unique<LauncherRankWorld>(std::move(options));
  if (!collective::ranksAreProcesses(options.launch.transport)) {
    return std::make_unique<ThreadsWorld>(std::move(options));
  }
  return std::make_unique<LocalProcessWorld>(std::move(options));
}

}  // namespace hmc::world
