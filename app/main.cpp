// hmc-run-torch, the runner of hmc-run (the torch-free front, front.cpp, execs it with argv
// unchanged): runs hmc-scenario/1 files across ranks and reports mismatches, leaks, hangs and
// workspace reuse timings. Exit codes: 0 every expectation met, 1 an expectation failed,
// 2 bad input or usage, 3 an unexpected hang, 130 interrupted.
//
// The data flow, top to bottom: the command line (RunOptions) -> a RunPlan (who starts the
// ranks, which transport, who reports) -> per file: read once, parse with the overrides
// (PreparedScenario) -> run on threads, on hmc-run's own rank processes or as one rank of a
// launcher's world (RankLaunch) -> every rank's results per repetition -> one ScenarioReport
// (buildReport) -> the reporters (console, JSON, trace) on the reporting process only.

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "hmc/collective/collective.hpp"
#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/transport.hpp"
#include "hmc/config.hpp"
#include "hmc/error.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/scenario/reporters.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/scenario/thread_driver.hpp"
#include "hmc/text.hpp"
#include "local_launcher.hpp"
#include "preflight.hpp"
#include "rank_launch.hpp"
#include "rank_process.hpp"
#include "signals.hpp"
#include "status_command.hpp"

namespace fs = std::filesystem;
using hmc::collective::Transport;
using hmc::scenario::Outcome;
using hmc::scenario::RankResult;
using hmc::scenario::ScenarioReport;

namespace {

using hmc::app::kExitUsage;
using hmc::app::RunOptions;
using hmc::app::usageError;
constexpr int kExitInterrupted = 130;

// Who starts the ranks and who reports, decided once for the whole run.
struct RunPlan {
  std::optional<hmc::collective::LaunchEnv> launch;  // torchrun, srun or mpirun started us
  Transport transport = Transport::kThreads;         // resolved: never kAuto
  std::optional<hmc::resources::DeviceProbe> ncclDevices;
  bool reporting = true;  // this process prints and writes the results
  int warmup = 0;
  std::size_t flightCapacity = 64;
};

// What hmc-run's own rank processes run: the front that exec'd this runner (it names itself in
// HMC_RUN_FRONT), so that they are `hmc-run _rank ...` as before, else this program.
std::string selfExecutable(const char* argv0) {
  if (const char* front = std::getenv(hmc::app::kFrontEnv);
      front != nullptr && *front != '\0' && access(front, X_OK) == 0) {
    return front;
  }
  std::error_code ec;
  const auto path = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : path.string();
}

std::string isoNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

std::string hostName() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof buffer - 1) != 0) return "unknown";
  return buffer;
}

// A live "step i/N" indicator on a terminal, for long runs.
class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled) {}
  void step(const std::string& name, const hmc::scenario::StepResult& step, std::size_t total) {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    fmt::print(stderr, "\r\033[K# {}: step {}/{} {} ", name, step.index + 1, total,
               hmc::scenario::toString(step.op));
    std::fflush(stderr);
  }
  void clear() {
    if (!enabled_) return;
    fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  std::mutex mutex_;
};

// Decides who starts the ranks, over which transport, and who reports. Returns 0, or the
// exit code of a usage error it printed.
int planRun(const RunOptions& options, RunPlan* plan) {
  try {
    plan->launch = hmc::collective::detectLaunch(hmc::collective::processEnvironment(),
                                                 {options.masterAddr, options.masterPort});
  } catch (const hmc::ValueError& error) {
    usageError(fmt::format("launcher environment: {}", error.what()));
    return kExitUsage;
  }
  const auto& launch = plan->launch;
  plan->transport = options.transport;
  if (launch) {
    if (plan->transport == Transport::kThreads) {
      usageError(fmt::format(
          "--transport threads runs every rank in one process, but {} started this process as "
          "rank {} of {}: use --transport tcp, store or gloo (or auto)",
          launch->launcher, launch->rank, launch->worldSize));
      return kExitUsage;
    }
    if (plan->transport == Transport::kAuto) plan->transport = Transport::kTcp;
    if (options.overrides.worldSize && *options.overrides.worldSize != launch->worldSize) {
      usageError(fmt::format("--world-size {} disagrees with {}'s world of {} ranks",
                             *options.overrides.worldSize, launch->launcher, launch->worldSize));
      return kExitUsage;
    }
    plan->reporting = launch->rank == 0;
  } else if (plan->transport == Transport::kAuto) {
    plan->transport = Transport::kThreads;
  }
  if (plan->transport == Transport::kNccl) {
    if (!HMC_HAVE_CUDA) {
      usageError(
          "--transport nccl: this hmc-run was built without CUDA (HMC_WITH_CUDA=OFF, or the CUDA "
          "toolkit or NCCL was not found); use --transport tcp, store or gloo");
      return kExitUsage;
    }
    plan->ncclDevices = hmc::resources::cudaDeviceUsable();
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
  // Output paths are checked before anything runs, so a long run's results are not lost.
  if (plan->reporting) {
    for (const auto* path : {&options.reportPath, &options.tracePath}) {
      if (!*path) continue;
      const std::string problem = hmc::scenario::checkOutputPath(**path);
      if (!problem.empty()) {
        usageError(problem);
        return kExitUsage;
      }
    }
    if (options.reportPath && options.tracePath && *options.reportPath == "-" &&
        *options.tracePath == "-") {
      usageError("--report - and --trace - would both write to standard output: give one a file");
      return kExitUsage;
    }
  }
  return 0;
}

// A scenario read once and parsed with the overrides, or why it cannot run here.
struct PreparedScenario {
  std::string text;
  hmc::scenario::Scenario scenario;
  std::optional<hmc::ScenarioError> error;
};

// The first step (nested ones too) that asks for CUDA itself, or null.
const hmc::scenario::Step* firstCudaStep(const std::vector<hmc::scenario::Step>& steps) {
  for (const auto& step : steps) {
    if (step.device == hmc::scenario::Device::kCuda) return &step;
    if (const auto* inner = firstCudaStep(step.steps)) return inner;
  }
  return nullptr;
}

PreparedScenario prepareScenario(const std::string& file, const RunOptions& options,
                                 const RunPlan& plan) {
  PreparedScenario prepared;
  hmc::app::ScenarioOverrides overrides = options.overrides;
  if (plan.launch) overrides.worldSize = plan.launch->worldSize;
  try {
    prepared.text = hmc::scenario::readScenarioFile(file);
    prepared.scenario = overrides.parse(prepared.text, file);
  } catch (const hmc::ScenarioError& error) {
    prepared.error = error;
    return prepared;
  }
  const auto& scenario = prepared.scenario;
  // What this machine cannot run is bad usage (exit 2), not a failed expectation: a GPU
  // scenario without a usable GPU, an NCCL world with more ranks than GPUs.
  if (hmc::scenario::usesCuda(scenario)) {
    const std::string reason = hmc::scenario::cudaUnusableReason();
    if (!reason.empty()) {
      // A step of its own asking for CUDA is named by its path: --device does not change it.
      const hmc::scenario::Step* step = firstCudaStep(scenario.steps);
      prepared.error =
          step != nullptr
              ? hmc::ScenarioError(
                    file, step->path + "/device",
                    fmt::format("this step puts its inputs on CUDA, but {}; run the scenario on "
                                "a GPU machine (scripts/device-check) or change the step's "
                                "\"device\"",
                                reason))
              : hmc::ScenarioError(
                    file, "/device",
                    fmt::format("the scenario puts its inputs on CUDA, but {}; run it on a GPU "
                                "machine (scripts/device-check) or pass --device cpu",
                                reason));
      return prepared;
    }
  }
  if (!prepared.error) {
    // What the run needs from this host (descriptors, tasks, memory), before any rank starts.
    hmc::app::RunShape shape;
    shape.processes = !plan.launch && plan.transport != Transport::kThreads;
    shape.hostsStore = plan.launch && plan.launch->rank == 0 && !plan.launch->agentHostsStore &&
                       plan.transport != Transport::kThreads;
    shape.worldSize = scenario.worldSize;
    shape.recordedSteps = scenario.steps.size();
    shape.repetitions = options.repetitions;
    if (!plan.launch || shape.hostsStore) {
      if (std::string refusal = hmc::app::preflight(shape); !refusal.empty()) {
        prepared.error = hmc::ScenarioError(file, "", "this host cannot run it: " + refusal);
        return prepared;
      }
    }
  }
  if (plan.ncclDevices && !plan.launch && scenario.worldSize > plan.ncclDevices->deviceCount) {
    prepared.error = hmc::ScenarioError(
        file, "/world_size",
        fmt::format("--transport nccl needs one GPU per rank: {} ranks, {} GPU(s); run it with "
                    "--world-size {} or fewer, or use --transport tcp, store or gloo (the ranks "
                    "then share the GPU for workspaces)",
                    scenario.worldSize, plan.ncclDevices->deviceCount,
                    plan.ncclDevices->deviceCount));
  }
  return prepared;
}

// Every rank's results, per repetition, folded into the report as each repetition ends (the
// report's samples and the repetition it shows, not every result: scripts/soak runs thousands).
struct RanResults {
  hmc::scenario::ReportBuilder repetitions;
  bool interrupted = false;
};

RanResults runOnThreads(const PreparedScenario& prepared, const RunOptions& options,
                        const RunPlan& plan, Progress& progress) {
  const auto& scenario = prepared.scenario;
  hmc::scenario::ThreadRunOptions runOptions;
  runOptions.flightCapacity = plan.flightCapacity;
  const std::size_t total = scenario.steps.size();
  runOptions.onStep = [&](int rank, const hmc::scenario::StepResult& step) {
    if (rank == 0) progress.step(scenario.name, step, total);
  };
  // Ctrl-C, SIGTERM or SIGHUP (recorded by the run's SignalScope) stops the ranks' collectives.
  hmc::scenario::ThreadInterrupt interrupt;
  runOptions.interrupt = &interrupt;
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done.load()) {
      if (const int signal = hmc::app::pendingSignal(); signal != 0) {
        interrupt.interrupt(
            fmt::format("interrupted by signal {} ({})", signal, strsignal(signal)));
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  struct JoinWatcher {
    std::atomic<bool>& done;
    std::thread& thread;
    ~JoinWatcher() {
      done = true;
      thread.join();
    }
  } join{done, watcher};
  RanResults ran{hmc::scenario::ReportBuilder(scenario, plan.warmup)};
  for (int repetition = 0; repetition < options.repetitions && !interrupt.interrupted();
       ++repetition) {
    auto ranks = hmc::scenario::runOnThreads(scenario, runOptions);
    // After a hang or a crash the world is not repeated (as with rank processes).
    const bool last = std::any_of(ranks.begin(), ranks.end(),
                                  [](const RankResult& rank) { return rank.hung || rank.crashed; });
    ran.repetitions.add(std::move(ranks));
    if (last) break;
  }
  ran.interrupted = interrupt.interrupted();
  return ran;
}

hmc::app::RankLaunch rankLaunchFor(const std::string& file, const RunOptions& options,
                                   const RunPlan& plan) {
  hmc::app::RankLaunch launch;
  launch.displayFile = file;
  launch.overrides = options.overrides;
  launch.repetitions = options.repetitions;
  launch.transport = plan.transport;
  launch.flightCapacity = plan.flightCapacity;
  launch.logLevel = options.logLevel;
  launch.joinTimeoutS = options.joinTimeoutS;
  if (plan.launch) {
    launch.scenarioFile = file;
    launch.rank = plan.launch->rank;
    launch.worldSize = plan.launch->worldSize;
    launch.masterAddr = plan.launch->masterAddr;
    launch.masterPort = plan.launch->masterPort;
    launch.agentHostsStore = plan.launch->agentHostsStore;
    launch.launcher = plan.launch->launcher;
  }
  return launch;
}

// Runs one scenario on the plan's ranks. nullopt on a non-reporting rank of a launcher's world
// (rank 0 has the results).
std::optional<RanResults> runPrepared(const std::string& file, const PreparedScenario& prepared,
                                      const RunOptions& options, const RunPlan& plan,
                                      const std::string& executable, Progress& progress,
                                      const hmc::app::InterruptedReport& onInterrupted) {
  if (plan.launch) {
    auto outcome = hmc::app::runRankProcess(prepared.scenario, rankLaunchFor(file, options, plan),
                                            true, onInterrupted);
    // Rank 0 reports; another rank only when rank 0 is gone with the store (rank_process.hpp).
    if (!outcome.merged) return std::nullopt;
    RanResults ran{hmc::scenario::ReportBuilder(prepared.scenario, plan.warmup)};
    for (auto& ranks : *outcome.merged) ran.repetitions.add(std::move(ranks));
    return ran;
  }
  if (plan.transport == Transport::kThreads) {
    return runOnThreads(prepared, options, plan, progress);
  }
  hmc::app::LocalLaunchOptions launchOptions;
  launchOptions.executable = executable;
  launchOptions.launch = rankLaunchFor(file, options, plan);
  launchOptions.scenarioText = prepared.text;
  launchOptions.masterPort = options.masterPort;
  RanResults ran{hmc::scenario::ReportBuilder(prepared.scenario, plan.warmup)};
  launchOptions.onRepetition = [&ran](std::vector<RankResult> ranks) {
    ran.repetitions.add(std::move(ranks));
  };
  ran.interrupted = hmc::app::launchLocalRanks(prepared.scenario, launchOptions).interrupted;
  return ran;
}

hmc::scenario::RunInfo runInfo(const RunPlan& plan, const hmc::scenario::Scenario& scenario,
                               std::string startedAt, double wallSeconds,
                               const std::vector<std::string>& command) {
  hmc::scenario::RunInfo info;
  info.transport = std::string(hmc::collective::toString(plan.transport));
  info.device = hmc::scenario::resolvedDeviceName(scenario.device);
  info.wallSeconds = wallSeconds;
  info.startedAt = std::move(startedAt);
  info.host = hostName();
  info.torchVersion = hmc::scenario::torchVersion();
  info.command = command;
  return info;
}

// The reporters of the reporting process. With --report - the JSON goes to stdout and the
// console table to stderr.
// `console`: where the table goes instead of stdout (stderr when JSON goes to stdout).
std::vector<std::unique_ptr<hmc::scenario::Reporter>> makeReporters(
    const RunOptions& options, bool directory, std::size_t total, std::ostream* console = nullptr) {
  std::vector<std::unique_ptr<hmc::scenario::Reporter>> reporters;
  hmc::scenario::ConsoleOptions consoleOptions;
  consoleOptions.quiet = options.quiet;
  consoleOptions.directory = directory;
  consoleOptions.total = total;
  consoleOptions.errors = &std::cerr;  // an invalid scenario's error; results stay on stdout
  const bool jsonOnStdout = (options.reportPath && *options.reportPath == "-") ||
                            (options.tracePath && *options.tracePath == "-");
  // Files first: a rank 0 stopped by a launcher may have only moments before SIGKILL, and the
  // report file is what survives.
  if (options.reportPath) reporters.push_back(hmc::scenario::makeJsonReporter(*options.reportPath));
  if (options.tracePath) reporters.push_back(hmc::scenario::makeTraceReporter(*options.tracePath));
  std::ostream& table = console != nullptr ? *console : jsonOnStdout ? std::cerr : std::cout;
  reporters.push_back(hmc::scenario::makeConsoleReporter(table, consoleOptions));
  return reporters;
}

int runScenarios(const RunOptions& options, const std::vector<std::string>& command,
                 const std::string& executable) {
  RunPlan plan;
  if (const int code = planRun(options, &plan); code != 0) return code;
  bool anyDirectory = false;
  std::vector<std::string> files;
  try {
    files = hmc::app::expandPaths(options.paths, &anyDirectory);
  } catch (const hmc::ScenarioError& error) {
    usageError(error.what());
    return kExitUsage;
  }
  if (plan.launch && files.size() != 1) {
    usageError(fmt::format(
        "under {} pass exactly one scenario file (got {}); run a directory with hmc-run's own "
        "launcher (--transport tcp) instead",
        plan.launch->launcher, files.size()));
    return kExitUsage;
  }
  hmc::scenario::limitTorchThreads(1);
  std::vector<std::unique_ptr<hmc::scenario::Reporter>> reporters;
  // Under a launcher another rank than rank 0 reports when rank 0 is gone: it makes its
  // reporters then.
  const auto ensureReporters = [&] {
    if (reporters.empty()) {
      reporters = makeReporters(options, anyDirectory || files.size() > 1, files.size());
    }
  };
  if (plan.reporting) ensureReporters();
  auto publish = [&](const ScenarioReport& report) {
    ensureReporters();
    for (auto& reporter : reporters) reporter->report(report);
  };

  // Without a launcher this process takes Ctrl-C, SIGTERM and SIGHUP itself: it stops the
  // ranks and reports what they did. Under a launcher each rank's TerminationWatcher does
  // (rank_process.hpp).
  std::optional<hmc::app::SignalScope> signals;
  if (!plan.launch) {
    signals.emplace();
    hmc::app::unblockTerminationSignals();
  }
  Progress progress(plan.reporting && !options.quiet && isatty(STDERR_FILENO) != 0);
  Outcome overall = Outcome::kPass;
  bool interrupted = false;
  for (const auto& file : files) {
    if (hmc::app::pendingSignal() != 0) {
      interrupted = true;
      break;
    }
    const PreparedScenario prepared = prepareScenario(file, options, plan);
    if (prepared.error) {
      overall = hmc::scenario::worse(overall, Outcome::kInvalid);
      if (plan.reporting) {
        publish(hmc::scenario::invalidReport(file, prepared.scenario.name, *prepared.error));
      } else {
        fmt::print(stderr, "hmc-run rank {}: invalid scenario {}\n", plan.launch->rank,
                   hmc::printable(prepared.error->what()));
      }
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    std::string startedAt = isoNow();
    // Rank 0 under a launcher that tears the job down: report what every rank did, from the
    // signal's thread, before the process exits (the main thread is blocked in a collective).
    // Under mpirun the files are written at Open MPI's warning (kEarly) and the table, kept
    // here, is printed at its SIGTERM (rank_process.hpp).
    std::ostringstream earlyTable;
    const hmc::app::InterruptedReport onInterrupted =
        [&](std::vector<std::vector<RankResult>> merged, int signal, hmc::app::InterruptMode mode) {
          const int rank = plan.launch ? plan.launch->rank : 0;
          const auto said = [&] {
            fmt::print(stderr,
                       "hmc-run: rank {} stopped by signal {} ({}); reported what every rank did\n",
                       rank, signal, strsignal(signal));
          };
          if (mode == hmc::app::InterruptMode::kPublishEarly) {
            // Where makeReporters puts the table (a JSON on stdout, "-", was written with the
            // files at the warning: it cannot wait for a SIGTERM that leaves 20-50 ms).
            const bool jsonOnStdout = (options.reportPath && *options.reportPath == "-") ||
                                      (options.tracePath && *options.tracePath == "-");
            const std::string text = earlyTable.str();
            std::fwrite(text.data(), 1, text.size(), jsonOnStdout ? stderr : stdout);
            std::fflush(stdout);
            said();
            return;
          }
          const double wall =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          ScenarioReport report = hmc::scenario::buildReport(
              prepared.scenario, std::move(merged), plan.warmup,
              runInfo(plan, prepared.scenario, startedAt, wall, command));
          report.interrupted = true;
          if (mode == hmc::app::InterruptMode::kEarly) {
            earlyTable.str("");
            for (auto& reporter : makeReporters(options, false, files.size(), &earlyTable)) {
              reporter->report(report);
              reporter->finish(true);
            }
            return;
          }
          ensureReporters();
          for (auto& reporter : reporters) {
            reporter->report(report);
            reporter->finish(true);
          }
          said();
          std::fflush(stdout);
        };
    auto ran = runPrepared(file, prepared, options, plan, executable, progress, onInterrupted);
    progress.clear();
    if (!ran) return 0;  // a non-reporting rank: rank 0 reports
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ScenarioReport report =
        std::move(ran->repetitions)
            .build(runInfo(plan, prepared.scenario, std::move(startedAt), wall, command));
    report.interrupted = ran->interrupted;
    publish(report);
    overall = hmc::scenario::worse(overall, report.outcome);
    if (ran->interrupted) {
      interrupted = true;
      break;
    }
  }
  try {
    for (auto& reporter : reporters) reporter->finish(interrupted);
  } catch (const hmc::Error& error) {
    usageError(error.what());
    return kExitUsage;
  }
  if (interrupted) {
    fmt::print(stderr,
               "hmc-run: interrupted by signal {} ({}); the ranks were stopped and what "
               "they did is reported above\n",
               hmc::app::pendingSignal(), strsignal(hmc::app::pendingSignal()));
    return kExitInterrupted;
  }
  return hmc::scenario::exitCodeOf(overall);
}

// EAGAIN from pthread_create or fork reaches a rank through c10d and std::thread as this text
// alone, whatever the failed call: say which limit that usually is.
std::string withLimitHint(std::string message) {
  if (message.find("Resource temporarily unavailable") != std::string::npos &&
      message.find("ulimit -u") == std::string::npos) {
    message +=
        " (a thread or process could not start: the limit on this user's processes and "
        "threads (ulimit -u) or the cgroup's pids.max is probably reached)";
  }
  return message;
}

// The hidden `_rank` command: one rank process of hmc-run's own local launch.
int runRankCommand(const hmc::app::RankLaunch& launch) {
  hmc::scenario::Scenario scenario;
  try {
    scenario = launch.overrides.parse(
        hmc::scenario::readScenarioFile(launch.scenarioFile),
        launch.displayFile.empty() ? launch.scenarioFile : launch.displayFile);
  } catch (const hmc::ScenarioError& error) {
    fmt::print(stderr, "hmc-run rank {}: {}\n", launch.rank, error.what());
    return kExitUsage;
  }
  try {
    hmc::scenario::limitTorchThreads(1);
    hmc::app::runRankProcess(scenario, launch, false);
  } catch (const std::exception& error) {
    fmt::print(stderr, "hmc-run rank {}: {}\n", launch.rank, withLimitHint(error.what()));
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread exists, so that every thread inherits it: termination signals reach
  // only the thread meant to take them (signals.hpp). The front (front.cpp) has done both
  // already when it exec'd this runner; they hold across exec, and are repeated for a runner
  // started directly.
  hmc::app::blockTerminationSignals();
  // A closed output pipe (a launcher that stopped forwarding output while it tears the job
  // down) must not kill the process before it writes --report: writes fail with EPIPE instead.
  std::signal(SIGPIPE, SIG_IGN);
  const std::vector<std::string> command(argv, argv + argc);
  hmc::app::CommandLine cli;
  if (const auto code = cli.parse(argc, argv)) return *code;
  if (!cli.needsTorch()) return cli.runWithoutTorch();

  if (*cli.rankCommand) {
    hmc::app::setUpLogging(cli.rankLaunch.logLevel);
    return runRankCommand(cli.rankLaunch);
  }
  const RunOptions& options = cli.run;
  hmc::app::setUpLogging(options.logLevel);
  if (*cli.statusCommand) {
    if (options.paths.empty()) hmc::app::unblockTerminationSignals();
    return hmc::app::runStatus(cli.status);
  }
  try {
    return runScenarios(options, command, selfExecutable(argv[0]));
  } catch (const hmc::Error& error) {
    // A rank that cannot join its world (no store at the master, a listener that is not one):
    // the message names what, where and what to do; it is not a bug of hmc-run.
    fmt::print(stderr, "hmc-run: {}\n", withLimitHint(error.what()));
    return 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "hmc-run: internal error: {}\n", withLimitHint(error.what()));
    return 1;
  }
}
