#include "run_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <system_error>

#include "exit_codes.hpp"
#include "hmc/config.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/world/preflight.hpp"

namespace hmc::app {
namespace {

// The first step (nested ones too) that asks for CUDA itself, or null.
const scenario::Step* firstCudaStep(const std::vector<scenario::Step>& steps) {
  for (const auto& step : steps) {
    if (step.device == scenario::Device::kCuda) return &step;
    if (const auto* inner = firstCudaStep(step.steps)) return inner;
  }
  return nullptr;
}

}  // namespace

namespace {

// Makes `folder` (its parent must exist) and checks that it can be written; false after a
// usage error naming it.
bool writableFolder(const std::string& folder) {
  if ((::mkdir(folder.c_str(), 0755) != 0 && errno != EEXIST) ||
      ::access(folder.c_str(), W_OK | X_OK) != 0) {
    usageError(fmt::format("--record {}: cannot create or write to this folder: {}; give a "
                           "writable folder",
                           folder, std::system_category().message(errno)));
    return false;
  }
  return true;
}

}  // namespace

int recordFolders(const RunOptions& options, const std::vector<std::string>& files,
                  std::vector<std::optional<std::string>>* folders) {
  folders->assign(files.size(), std::nullopt);
  if (!options.recordDirectory) return 0;
  if (files.size() == 1) {
    folders->front() = *options.recordDirectory;
    return 0;
  }
  std::map<std::string, std::string> byStem;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string stem = std::filesystem::path(files[i]).stem().string();
    if (const auto [at, fresh] = byStem.emplace(stem, files[i]); !fresh) {
      usageError(fmt::format("--record {}: {} and {} would both record into {}/{}/; record them "
                             "in two runs",
                             *options.recordDirectory, at->second, files[i],
                             *options.recordDirectory, stem));
      return kExitUsage;
    }
    const std::string folder = (std::filesystem::path(*options.recordDirectory) / stem).string();
    if (!writableFolder(folder)) return kExitUsage;
    (*folders)[i] = folder;
  }
  return 0;
}

int planRun(const RunOptions& options, RunPlan* plan, const collective::EnvLookup& env) {
  try {
    plan->launch = collective::detectLaunch(env, {options.masterAddr, options.masterPort});
  } catch (const ValueError& error) {
    usageError(fmt::format("launcher environment: {}", error.what()));
    return kExitUsage;
  }
  const auto& launch = plan->launch;
  plan->transport = options.transport;
  if (launch) {
    if (plan->transport == collective::Transport::kThreads) {
      usageError(fmt::format(
          "--transport threads runs every rank in one process, but {} started this process as "
          "rank {} of {}: use --transport tcp, store or gloo (or auto)",
          launch->launcher, launch->rank, launch->worldSize));
      return kExitUsage;
    }
    if (plan->transport == collective::Transport::kAuto)
      plan->transport = collective::Transport::kTcp;
    if (options.overrides.worldSize && *options.overrides.worldSize != launch->worldSize) {
      usageError(fmt::format("--world-size {} disagrees with {}'s world of {} ranks",
                             *options.overrides.worldSize, launch->launcher, launch->worldSize));
      return kExitUsage;
    }
    plan->reporting = launch->rank == 0;
    plan->placement = world::RankPlacement::fromLaunch(*launch);
  } else if (plan->transport == collective::Transport::kAuto) {
    plan->transport = collective::Transport::kThreads;
  }
  if (plan->transport == collective::Transport::kNccl) {
    if (!HMC_HAVE_CUDA) {
      usageError(
          "--transport nccl: this hmc-run was built without CUDA (HMC_WITH_CUDA=OFF, or the CUDA "
          "toolkit or NCCL was not found); use --transport tcp, store or gloo");
      return kExitUsage;
    }
    plan->ncclDevices = resources::cudaDeviceUsable();
    if (!*plan->ncclDevices) {
      usageError(fmt::format("--transport nccl: {}; use --transport tcp, store or gloo",
                             plan->ncclDevices->reason));
      return kExitUsage;
    }
  }
  if (options.warmup && *options.warmup >= options.repetitions) {
    usageError(fmt::format("--warmup {} leaves no measured repetition of --repetitions {}",
                           *options.warmup, options.repetitions));
    return kExitUsage;
  }
  plan->warmup = options.warmup.value_or(options.repetitions > 1 ? 1 : 0);
  plan->flightCapacity = options.tracePath ? (1u << 16) : 64u;
  if (options.recordDirectory) {
    // Before anything runs: a folder that cannot be written is the user's to fix, not a failed
    // rank.
    if (!writableFolder(*options.recordDirectory)) return kExitUsage;
  }
  // Output paths are checked before anything runs, so a long run's results are not lost.
  if (plan->reporting) {
    for (const auto* path : {&options.reportPath, &options.tracePath, &options.htmlPath}) {
      if (!*path) continue;
      const std::string problem = scenario::checkOutputPath(**path);
      if (!problem.empty()) {
        usageError(problem);
        return kExitUsage;
      }
    }
    std::vector<std::string> onStdout;
    for (const auto& [path, flag] :
         {std::pair{&options.reportPath, "--report -"}, std::pair{&options.tracePath, "--trace -"},
          std::pair{&options.htmlPath, "--html -"}}) {
      if (*path && **path == "-") onStdout.emplace_back(flag);
    }
    if (onStdout.size() > 1) {
      usageError(fmt::format("{} would both write to standard output: give one a file",
                             fmt::join(onStdout, " and ")));
      return kExitUsage;
    }
  }
  return 0;
}

PreparedScenario prepareScenario(const std::string& file, const RunOptions& options,
                                 const RunPlan& plan) {
  PreparedScenario prepared;
  world::ScenarioOverrides overrides = options.overrides;
  if (plan.launch) overrides.worldSize = plan.launch->worldSize;
  try {
    prepared.text = scenario::readScenarioFile(file);
    prepared.scenario = overrides.parse(prepared.text, file);
  } catch (const ScenarioError& error) {
    prepared.error = error;
    return prepared;
  }
  const auto& scenario = prepared.scenario;
  // What this machine cannot run is bad usage (exit 2), not a failed expectation: a GPU
  // scenario without a usable GPU, an NCCL world with more ranks than GPUs.
  if (scenario::usesCuda(scenario)) {
    const std::string reason = scenario::cudaUnusableReason();
    if (!reason.empty()) {
      // A step of its own asking for CUDA is named by its path: --device does not change it.
      const scenario::Step* step = firstCudaStep(scenario.steps);
      prepared.error =
          step != nullptr
              ? ScenarioError(
                    file, step->path + "/device",
                    fmt::format("this step puts its inputs on CUDA, but {}; run the scenario on "
                                "a GPU machine (scripts/device-check) or change the step's "
                                "\"device\"",
                                reason))
              : ScenarioError(
                    file, "/device",
                    fmt::format("the scenario puts its inputs on CUDA, but {}; run it on a GPU "
                                "machine (scripts/device-check) or pass --device cpu",
                                reason));
      return prepared;
    }
  }
  if (!prepared.error) {
    // What the run needs from this host (descriptors, tasks, memory), before any rank starts.
    world::RunShape shape;
    shape.processes = !plan.launch && collective::ranksAreProcesses(plan.transport);
    shape.hostsStore = plan.placement && plan.placement->hostsStore();
    shape.worldSize = scenario.worldSize;
    shape.recordedSteps = scenario.steps.size();
    shape.repetitions = options.repetitions;
    if (!plan.launch || shape.hostsStore) {
      if (std::string refusal = preflight(shape); !refusal.empty()) {
        prepared.error = ScenarioError(file, "", "this host cannot run it: " + refusal);
        return prepared;
      }
    }
  }
  if (plan.ncclDevices && !plan.launch && scenario.worldSize > plan.ncclDevices->deviceCount) {
    prepared.error = ScenarioError(
        file, "/world_size",
        fmt::format("--transport nccl needs one GPU per rank: {} ranks, {} GPU(s); run it with "
                    "--world-size {} or fewer, or use --transport tcp, store or gloo (the ranks "
                    "then share the GPU for workspaces)",
                    scenario.worldSize, plan.ncclDevices->deviceCount,
                    plan.ncclDevices->deviceCount));
  }
  return prepared;
}

world::WorldOptions worldOptions(const RunPlan& plan, const RunOptions& options,
                                 const RankProgram& program, const scenario::Scenario& scenario) {
  world::WorldOptions world;
  world.launch.overrides = options.overrides;
  world.launch.repetitions = options.repetitions;
  world.launch.transport = plan.transport;
  world.launch.flightCapacity = plan.flightCapacity;
  world.launch.logLevel = options.logLevel;
  world.launch.joinTimeout = options.joinTimeout;
  world.launch.recordDirectory = options.recordDirectory;
  if (plan.placement) world.launch.placement = *plan.placement;
  world.executable = program.executable;
  if (program.body && program.forkable && program.forkable(scenario)) world.rankBody = program.body;
  world.masterPort = options.masterPort;
  return world;
}

}  // namespace hmc::app
