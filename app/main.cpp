// hmc-run-torch, the runner of hmc-run (the torch-free front, front.cpp, execs it with argv
// unchanged): runs hmc-scenario/1 files across ranks and reports mismatches, leaks, hangs and
// workspace reuse timings. Exit codes: 0 every expectation met, 1 an expectation failed,
// 2 bad input or usage, 3 an unexpected hang, 130 interrupted.
//
// The data flow, top to bottom: the command line (RunOptions) -> a RunPlan (who starts the
// ranks, which transport, who reports: run_plan.hpp) -> per file: read once, parse with the
// overrides (PreparedScenario) -> one world::WorldDriver (world_driver.hpp: threads, hmc-run's own
// rank processes, or one rank of a launcher's world) hands every repetition to a
// ScenarioReporting (its ReportBuilder) -> one ScenarioReport -> the reporters (console, JSON,
// trace) on the reporting process only. A launcher's teardown of the reporting rank goes
// through the same ScenarioReporting, from the signal's thread.

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
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "hmc/collective/collective.hpp"
#include "hmc/collective/launch_env.hpp"
#include "hmc/collective/store_transport.hpp"
#include "hmc/collective/store_wire.hpp"
#include "hmc/collective/transport.hpp"
#include "hmc/config.hpp"
#include "hmc/error.hpp"
#include "hmc/host.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/scenario/output_file.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/scenario/reporters.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/text.hpp"
#include "hmc/world/rank_launch.hpp"
#include "hmc/world/rank_process.hpp"
#include "hmc/world/signals.hpp"
#include "hmc/world/world_driver.hpp"
#include "run_plan.hpp"
#include "status_command.hpp"
#include "terminal_line.hpp"

namespace fs = std::filesystem;
using hmc::collective::Transport;
using hmc::scenario::Outcome;
using hmc::scenario::RankResult;
using hmc::scenario::ScenarioReport;

namespace {

using hmc::app::kExitUsage;
using hmc::app::planRun;
using hmc::app::PreparedScenario;
using hmc::app::prepareScenario;
using hmc::app::RunOptions;
using hmc::app::RunPlan;
using hmc::app::usageError;
constexpr int kExitInterrupted = 130;

// `hmc-run status`'s store: hmc's own client where it speaks this LibTorch's protocol (the front
// then runs status itself, and the runner only when started directly), else c10d's.
std::shared_ptr<hmc::collective::KeyValueStore> connectStatusStore(
    const std::string& host, int port, const std::string& prefix,
    std::chrono::milliseconds timeout) {
  if (hmc::collective::storeWireClientAvailable()) {
    return hmc::collective::connectKeyValueStoreWire(host, port, prefix, timeout);
  }
  hmc::collective::StoreTransportOptions client;
  client.host = host;
  client.port = port;
  client.prefix = prefix;
  client.timeout = timeout;
  return hmc::collective::connectKeyValueStore(client);
}

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

// A live indicator on a terminal (stderr a TTY; nothing in pipes and CI logs), for long runs:
// thread ranks' "step i/N", and over --repetitions "cycle i of N, elapsed, about T left".
class Progress {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Progress(bool enabled) : line_(enabled) {}
  // A scenario of `repetitions` cycles begins.
  void begin(std::size_t repetitions) {
    std::lock_guard<std::mutex> lock(mutex_);
    repetitions_ = repetitions;
    done_ = 0;
    began_ = Clock::now();
    shown_ = {};
  }
  void step(const std::string& name, const hmc::scenario::StepResult& step, std::size_t total) {
    if (!line_.enabled()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (repetitions_ > 1) return;  // the cycles say more
    line_.show(fmt::format("# {}: step {}/{} {} ", name, step.index + 1, total,
                           hmc::scenario::toString(step.op)));
  }
  // One more cycle ended; shown at most five times a second, and at the last.
  void cycle(const std::string& name) {
    if (!line_.enabled()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    ++done_;
    if (repetitions_ <= 1) return;
    const auto now = Clock::now();
    if (done_ < repetitions_ && now - shown_ < std::chrono::milliseconds(200)) return;
    shown_ = now;
    const double elapsed = std::chrono::duration<double>(now - began_).count();
    const double left =
        elapsed / static_cast<double>(done_) * static_cast<double>(repetitions_ - done_);
    line_.show(fmt::format("# {}: cycle {} of {}, {:.1f} s elapsed, about {:.0f} s left ", name,
                           done_, repetitions_, elapsed, left));
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    line_.clear();
  }

 private:
  hmc::app::TerminalLine line_;
  std::mutex mutex_;
  std::size_t repetitions_ = 1;
  std::size_t done_ = 0;
  Clock::time_point began_;
  Clock::time_point shown_;
};

hmc::scenario::RunInfo runInfo(const RunPlan& plan, const hmc::scenario::Scenario& scenario,
                               std::string startedAt, double wallSeconds,
                               const std::vector<std::string>& command) {
  hmc::scenario::RunInfo info;
  info.transport = std::string(hmc::collective::toString(plan.transport));
  info.device = hmc::scenario::resolvedDeviceName(scenario.device);
  info.wallSeconds = wallSeconds;
  info.startedAt = std::move(startedAt);
  info.host = hmc::hostName();
  info.torchVersion = hmc::scenario::torchVersion();
  info.command = command;
  return info;
}

// Whether --report -, --trace - or --html - puts a document on stdout (the table then goes to
// stderr).
bool jsonOnStdout(const RunOptions& options) {
  return (options.reportPath && *options.reportPath == "-") ||
         (options.tracePath && *options.tracePath == "-") ||
         (options.htmlPath && *options.htmlPath == "-");
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
  // Files first: a rank 0 stopped by a launcher may have only moments before SIGKILL, and the
  // report file is what survives.
  if (options.reportPath) reporters.push_back(hmc::scenario::makeJsonReporter(*options.reportPath));
  if (options.tracePath) reporters.push_back(hmc::scenario::makeTraceReporter(*options.tracePath));
  if (options.htmlPath) reporters.push_back(hmc::scenario::makeHtmlReporter(*options.htmlPath));
  std::ostream& table = console != nullptr      ? *console
                        : jsonOnStdout(options) ? std::cerr
                                                : std::cout;
  reporters.push_back(hmc::scenario::makeConsoleReporter(table, consoleOptions));
  return reporters;
}

// The reporters of the reporting process, made when it first publishes (under a launcher
// another rank than rank 0 reports when rank 0 is gone: it makes its reporters then).
class Publisher {
 public:
  Publisher(const RunOptions& options, bool directory, std::size_t total)
      : options_(options), directory_(directory), total_(total) {}

  void ensureReporters() {
    if (reporters_.empty()) reporters_ = makeReporters(options_, directory_, total_);
  }
  void publish(const ScenarioReport& report) {
    ensureReporters();
    for (auto& reporter : reporters_) reporter->report(report);
  }
  // A report made as the process is stopped: published and finished at once.
  void publishLast(const ScenarioReport& report) {
    ensureReporters();
    for (auto& reporter : reporters_) {
      reporter->report(report);
      reporter->finish(true);
    }
  }
  // Throws hmc::Error when a report file cannot be written.
  void finish(bool interrupted) {
    for (auto& reporter : reporters_) reporter->finish(interrupted);
  }
  std::size_t total() const noexcept { return total_; }

 private:
  const RunOptions& options_;
  bool directory_;
  std::size_t total_;
  std::vector<std::unique_ptr<hmc::scenario::Reporter>> reporters_;
};

// Every report of one scenario's run, whichever way the run ends, is built by build() from a
// ReportBuilder and handed to the one Publisher:
// - the run ends (pass, fail, hang, or a signal hmc-run's own launcher took): the driver hands
//   each repetition to add() on the main thread, and finish() publishes;
// - the reporting rank under a launcher that tears the job down: the world's termination
//   hand-off (teardown.hpp) calls interrupted() from the signal's thread with what every rank
//   did, before the process exits (the main thread is blocked in a collective). Under mpirun
//   the files are written at Open MPI's warning (kEarly) and the table, kept here, is printed
//   at its SIGTERM.
class ScenarioReporting {
 public:
  ScenarioReporting(const RunOptions& options, const RunPlan& plan,
                    const hmc::scenario::Scenario& scenario,
                    const std::vector<std::string>& command, Publisher& publisher)
      : options_(options),
        plan_(plan),
        scenario_(scenario),
        startedAt_(isoNow()),
        command_(command),
        publisher_(publisher),
        start_(std::chrono::steady_clock::now()),
        repetitions_(scenario, plan.warmup) {}

  // One repetition, every rank's result in rank order (the main thread).
  void add(std::vector<RankResult> ranks) { repetitions_.add(std::move(ranks)); }

  // The run ended: its report published (the main thread). Returns its outcome.
  Outcome finish(bool interrupted) {
    const ScenarioReport report = build(std::move(repetitions_), interrupted);
    publisher_.publish(report);
    return report.outcome;
  }

  // The signal's thread of the reporting rank under a launcher.
  void interrupted(std::vector<std::vector<RankResult>> merged, int signal,
                   hmc::world::InterruptMode mode) {
    if (mode == hmc::world::InterruptMode::kPublishEarly) {
      // Where makeReporters puts the table (a JSON on stdout, "-", was written with the
      // files at the warning: it cannot wait for a SIGTERM that leaves 20-50 ms).
      const std::string text = earlyTable_.str();
      std::fwrite(text.data(), 1, text.size(), jsonOnStdout(options_) ? stderr : stdout);
      std::fflush(stdout);
      said(signal);
      return;
    }
    hmc::scenario::ReportBuilder builder(scenario_, plan_.warmup);
    for (auto& ranks : merged) builder.add(std::move(ranks));
    const ScenarioReport report = build(std::move(builder), true);
    if (mode == hmc::world::InterruptMode::kEarly) {
      earlyTable_.str("");
      for (auto& reporter : makeReporters(options_, false, publisher_.total(), &earlyTable_)) {
        reporter->report(report);
        reporter->finish(true);
      }
      return;
    }
    publisher_.publishLast(report);
    said(signal);
    std::fflush(stdout);
  }

 private:
  ScenarioReport build(hmc::scenario::ReportBuilder builder, bool interrupted) const {
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    ScenarioReport report =
        std::move(builder).build(runInfo(plan_, scenario_, startedAt_, wall, command_));
    report.interrupted = interrupted;
    return report;
  }

  void said(int signal) const {
    fmt::print(stderr, "hmc-run: rank {} stopped by signal {} ({}); reported what every rank did\n",
               plan_.launch ? plan_.launch->rank : 0, signal, strsignal(signal));
  }

  const RunOptions& options_;
  const RunPlan& plan_;
  const hmc::scenario::Scenario& scenario_;
  const std::string startedAt_;
  const std::vector<std::string>& command_;
  Publisher& publisher_;
  const std::chrono::steady_clock::time_point start_;
  hmc::scenario::ReportBuilder repetitions_;
  std::ostringstream earlyTable_;
};

// A live "step i/N" indicator for thread ranks: rank 0's steps.
std::function<void(const hmc::scenario::StepResult&)> progressOf(
    Progress& progress, const hmc::scenario::Scenario& scenario) {
  return [&progress, &scenario](const hmc::scenario::StepResult& step) {
    progress.step(scenario.name, step, scenario.steps.size());
  };
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
int runRankCommand(const hmc::world::RankLaunch& launch) {
  hmc::scenario::Scenario scenario;
  try {
    scenario = launch.overrides.parse(
        hmc::scenario::readScenarioFile(launch.scenarioFile),
        launch.displayFile.empty() ? launch.scenarioFile : launch.displayFile);
  } catch (const hmc::ScenarioError& error) {
    fmt::print(stderr, "hmc-run rank {}: {}\n", launch.placement.rank, error.what());
    return kExitUsage;
  }
  try {
    hmc::scenario::limitTorchThreads(1);
    hmc::world::runRankProcess(scenario, launch);
  } catch (const std::exception& error) {
    fmt::print(stderr, "hmc-run rank {}: {}\n", launch.placement.rank, withLimitHint(error.what()));
    return 1;
  }
  return 0;
}

// A rank process forked from this runner (RankProgram::body): what main() does for
// `hmc-run _rank ...`, without loading the program and LibTorch again.
int forkedRankCommand(const hmc::world::RankLaunch& launch) {
  hmc::world::blockTerminationSignals();
  hmc::app::setUpLogging(launch.logLevel);
  return runRankCommand(launch);
}

// hmc-run's own rank processes: forked from this runner where the scenario uses no CUDA (a
// forked child cannot use a CUDA context of its parent, and deciding may create one), else
// `executable _rank ...`.
hmc::app::RankProgram rankProgram(const std::string& executable) {
  return {executable, forkedRankCommand, [](const hmc::scenario::Scenario& scenario) {
            return !hmc::scenario::usesCuda(scenario);
          }};
}

int runScenarios(const RunOptions& options, const std::vector<std::string>& command,
                 const hmc::app::RankProgram& program) {
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
  std::vector<std::optional<std::string>> recordFolders;
  if (const int code = hmc::app::recordFolders(options, files, &recordFolders); code != 0) {
    return code;
  }
  hmc::scenario::limitTorchThreads(1);
  Publisher publisher(options, anyDirectory || files.size() > 1, files.size());
  if (plan.reporting) publisher.ensureReporters();

  // Without a launcher this process takes Ctrl-C, SIGTERM and SIGHUP itself: it stops the
  // ranks and reports what they did. Under a launcher each rank's world::TerminationWatcher does
  // (teardown.hpp).
  std::optional<hmc::world::SignalScope> signals;
  if (!plan.launch) {
    signals.emplace();
    hmc::world::unblockTerminationSignals();
  }
  Progress progress(plan.reporting && !options.quiet && isatty(STDERR_FILENO) != 0);
  Outcome overall = Outcome::kPass;
  bool interrupted = false;
  for (std::size_t index = 0; index < files.size(); ++index) {
    const std::string& file = files[index];
    if (hmc::world::pendingSignal() != 0) {
      interrupted = true;
      break;
    }
    const PreparedScenario prepared = prepareScenario(file, options, plan);
    if (prepared.error) {
      overall = hmc::scenario::worse(overall, Outcome::kInvalid);
      if (plan.reporting) {
        publisher.publish(
            hmc::scenario::invalidReport(file, prepared.scenario.name, *prepared.error));
      } else {
        fmt::print(stderr, "hmc-run rank {}: invalid scenario {}\n", plan.launch->rank,
                   hmc::printable(prepared.error->what()));
      }
      continue;
    }
    hmc::world::WorldOptions world =
        hmc::app::worldOptions(plan, options, program, prepared.scenario);
    world.launch.recordDirectory = recordFolders[index];
    world.onRankZeroStep = progressOf(progress, prepared.scenario);
    auto reporting = std::make_shared<ScenarioReporting>(options, plan, prepared.scenario, command,
                                                         publisher);
    world.onInterrupted = [reporting](std::vector<std::vector<RankResult>> merged, int signal,
                                      hmc::world::InterruptMode mode) {
      reporting->interrupted(std::move(merged), signal, mode);
    };
    const auto driver = hmc::world::makeWorldDriver(std::move(world));
    progress.begin(static_cast<std::size_t>(options.repetitions));
    const hmc::world::WorldRun ran =
        driver->run({prepared.scenario, file, prepared.text},
                    [&reporting, &progress, &prepared](std::vector<RankResult> ranks) {
                      reporting->add(std::move(ranks));
                      progress.cycle(prepared.scenario.name);
                    });
    progress.clear();
    // A non-reporting rank: rank 0 reports (or nobody can report what this rank saw).
    if (!ran.reporting) return ran.unreported ? hmc::scenario::exitCodeOf(*ran.unreported) : 0;
    overall = hmc::scenario::worse(overall, reporting->finish(ran.interrupted));
    if (ran.interrupted) {
      interrupted = true;
      break;
    }
  }
  try {
    publisher.finish(interrupted);
  } catch (const hmc::Error& error) {
    usageError(error.what());
    return kExitUsage;
  }
  if (interrupted) {
    fmt::print(stderr,
               "hmc-run: interrupted by signal {} ({}); the ranks were stopped and what "
               "they did is reported above\n",
               hmc::world::pendingSignal(), strsignal(hmc::world::pendingSignal()));
    return kExitInterrupted;
  }
  return hmc::scenario::exitCodeOf(overall);
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread exists, so that every thread inherits it: termination signals reach
  // only the thread meant to take them (signals.hpp). The front (front.cpp) has done both
  // already when it exec'd this runner; they hold across exec, and are repeated for a runner
  // started directly.
  hmc::world::blockTerminationSignals();
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
  if (*cli.shrinkCommand) {
    hmc::app::setUpLogging(cli.shrink.logLevel);
    try {
      return hmc::app::runShrink(cli.shrink, rankProgram(selfExecutable(argv[0])));
    } catch (const std::exception& error) {
      fmt::print(stderr, "hmc-run: shrink: internal error: {}\n", withLimitHint(error.what()));
      return 1;
    }
  }
  const RunOptions& options = cli.run;
  hmc::app::setUpLogging(options.logLevel);
  if (*cli.statusCommand) {
    if (options.paths.empty()) hmc::world::unblockTerminationSignals();
    return hmc::app::runStatus(cli.status, connectStatusStore);
  }
  try {
    return runScenarios(options, command, rankProgram(selfExecutable(argv[0])));
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
