// hmc-run: runs hmc-scenario/1 files across ranks and reports mismatches, leaks, hangs and
// workspace reuse timings. Exit codes: 0 every expectation met, 1 an expectation failed,
// 2 bad input or usage, 3 an unexpected hang.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "hmc/config.hpp"
#include "hmc/error.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/scenario/reporters.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/scenario/thread_driver.hpp"

namespace fs = std::filesystem;
using hmc::scenario::Outcome;

namespace {

constexpr int kExitUsage = 2;

struct RunOptions {
  std::vector<std::string> paths;
  std::optional<int> worldSize;
  std::string transport = "auto";
  std::optional<std::string> device;
  std::optional<double> timeoutS;
  std::optional<std::string> reportPath;
  std::optional<std::string> tracePath;
  std::string logLevel = "warn";
  bool quiet = false;
};

void setUpLogging(const std::string& level) {
  auto logger = spdlog::get("hmc");
  if (!logger) logger = spdlog::stderr_color_mt("hmc");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [hmc] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

// Files a path names: the file itself, or a directory's *.json files in name order.
std::vector<std::string> expandPaths(const std::vector<std::string>& paths, bool* anyDirectory) {
  std::vector<std::string> files;
  for (const auto& path : paths) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      *anyDirectory = true;
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(path, ec)) {
        if (entry.path().extension() == ".json" && !entry.is_directory()) {
          found.push_back(entry.path().string());
        }
      }
      if (ec) throw hmc::ScenarioError(path, "", "cannot list directory: " + ec.message());
      std::sort(found.begin(), found.end());
      if (found.empty()) {
        throw hmc::ScenarioError(path, "", "no *.json scenario files in this directory");
      }
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(path);
    }
  }
  return files;
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
    fmt::print(stderr, "\r\033[K# {}: step {}/{} {} ", name, step.index + 1, total, step.op);
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

int runScenarios(const RunOptions& options, const std::vector<std::string>& command) {
  if (options.transport != "auto" && options.transport != "threads") {
    fmt::print(stderr,
               "hmc-run: --transport {}: this build runs ranks as threads only; multi-process "
               "transports (store, gloo) are not wired into hmc-run yet. Use --transport "
               "threads (or auto).\n",
               options.transport);
    return kExitUsage;
  }
  bool anyDirectory = false;
  std::vector<std::string> files;
  try {
    files = expandPaths(options.paths, &anyDirectory);
  } catch (const hmc::ScenarioError& error) {
    fmt::print(stderr, "hmc-run: {}\n", error.what());
    return kExitUsage;
  }
  hmc::scenario::limitTorchThreads(1);
  std::vector<std::unique_ptr<hmc::scenario::Reporter>> reporters;
  hmc::scenario::ConsoleOptions consoleOptions;
  consoleOptions.quiet = options.quiet;
  consoleOptions.directory = anyDirectory || files.size() > 1;
  reporters.push_back(hmc::scenario::makeConsoleReporter(std::cout, consoleOptions));
  if (options.reportPath) reporters.push_back(hmc::scenario::makeJsonReporter(*options.reportPath));
  if (options.tracePath) reporters.push_back(hmc::scenario::makeTraceReporter(*options.tracePath));

  Progress progress(!options.quiet && isatty(STDERR_FILENO) != 0);
  int exitCode = 0;
  auto worsen = [&](int code) {
    // invalid (2) > hang (3) > fail (1) > pass (0)
    auto severity = [](int c) { return c == 2 ? 3 : c == 3 ? 2 : c; };
    if (severity(code) > severity(exitCode)) exitCode = code;
  };
  std::size_t index = 0;
  for (const auto& file : files) {
    ++index;
    hmc::scenario::ParseOptions parse;
    parse.worldSize = options.worldSize;
    hmc::scenario::Scenario scenario;
    try {
      scenario = hmc::scenario::loadScenario(file, parse);
    } catch (const hmc::ScenarioError& error) {
      const auto report = hmc::scenario::invalidReport(file, "", error);
      for (auto& reporter : reporters) reporter->scenarioInvalid(file, report);
      worsen(kExitUsage);
      continue;
    }
    if (options.device) {
      scenario.device = *options.device == "cpu"    ? hmc::scenario::Device::kCpu
                        : *options.device == "cuda" ? hmc::scenario::Device::kCuda
                                                    : hmc::scenario::Device::kAuto;
    }
    if (options.timeoutS) scenario.timeoutS = *options.timeoutS;

    hmc::scenario::ThreadRunOptions runOptions;
    if (options.tracePath) runOptions.flightCapacity = 1 << 16;
    const std::size_t total = scenario.steps.size();
    runOptions.onStep = [&](int rank, const hmc::scenario::StepResult& step) {
      if (rank == 0) progress.step(scenario.name, step, total);
    };
    const auto start = std::chrono::steady_clock::now();
    std::vector<hmc::scenario::RankResult> ranks = hmc::scenario::runOnThreads(scenario, runOptions);
    progress.clear();

    hmc::scenario::RunInfo info;
    info.transport = "threads";
    info.device = std::string(hmc::scenario::toString(scenario.device));
    info.wallSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    info.startedAt = isoNow();
    info.host = hostName();
    info.torchVersion = hmc::scenario::torchVersion();
    info.command = command;
    const auto report = hmc::scenario::buildReport(scenario, ranks, info);
    for (auto& reporter : reporters) reporter->scenarioFinished(scenario, report, ranks);
    if (consoleOptions.directory && !options.quiet) {
      fmt::print("# [{}/{}] {}: {}\n", index, files.size(), scenario.name,
                 report["outcome"].get<std::string>());
    }
    worsen(hmc::scenario::exitCodeOf(hmc::scenario::computeOutcome(scenario, ranks)));
  }
  try {
    for (auto& reporter : reporters) reporter->finish();
  } catch (const hmc::Error& error) {
    fmt::print(stderr, "hmc-run: {}\n", error.what());
    return kExitUsage;
  }
  return exitCode;
}

int validateFiles(const std::vector<std::string>& files, std::optional<int> worldSize) {
  int invalid = 0;
  for (const auto& file : files) {
    try {
      hmc::scenario::ParseOptions parse;
      parse.worldSize = worldSize;
      const auto scenario = hmc::scenario::loadScenario(file, parse);
      fmt::print("ok       {}: '{}', {} steps, {} ranks\n", file, scenario.name,
                 scenario.steps.size(), scenario.worldSize);
    } catch (const hmc::ScenarioError& error) {
      ++invalid;
      fmt::print("invalid  {}\n", error.what());
    }
  }
  fmt::print("# {}: {} of {} file{} valid\n", invalid == 0 ? "OK" : "FAILED",
             files.size() - invalid, files.size(), files.size() == 1 ? "" : "s");
  return invalid == 0 ? 0 : kExitUsage;
}

int listDirectory(const std::string& directory) {
  bool anyDirectory = false;
  std::vector<std::string> files;
  try {
    files = expandPaths({directory}, &anyDirectory);
  } catch (const hmc::ScenarioError& error) {
    fmt::print(stderr, "hmc-run: {}\n", error.what());
    return kExitUsage;
  }
  int invalid = 0;
  fmt::print("# {:<36} {:>5} {:>5}  {}\n", "scenario", "ranks", "steps", "description");
  for (const auto& file : files) {
    try {
      const auto scenario = hmc::scenario::loadScenario(file);
      fmt::print("  {:<36} {:>5} {:>5}  {}\n", scenario.name, scenario.worldSize,
                 scenario.steps.size(), scenario.description);
    } catch (const hmc::ScenarioError& error) {
      ++invalid;
      fmt::print("# invalid: {}\n", error.what());
    }
  }
  return invalid == 0 ? 0 : kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> command(argv, argv + argc);
  CLI::App app{
      "hmc-run " HMC_VERSION
      ": run execution-resource lifecycle scenarios (hmc-scenario/1 JSON) across ranks and\n"
      "report manifest mismatches, leaks, hangs (which rank, which stage) and workspace reuse\n"
      "timings. Ranks run as threads of this process (--transport threads).",
      "hmc-run"};
  app.footer(
      "Examples:\n"
      "  hmc-run scenarios/quickstart.json                 run one scenario, print a table\n"
      "  hmc-run scenarios/ --report out.json              run every scenario of a folder\n"
      "  hmc-run scenarios/reuse-churn.json --world-size 8 --trace trace.json\n"
      "                                                    open trace.json in ui.perfetto.dev\n"
      "  hmc-run validate scenarios/*.json                 check files without running them\n"
      "  hmc-run list scenarios/                           names and descriptions\n"
      "\n"
      "Exit codes: 0 every expectation met, 1 an expectation failed, 2 bad input or usage,\n"
      "3 an unexpected hang. Formats: shared/scenario-format.md (hmc-scenario/1, hmc-report/1).\n"
      "Environment: HMC_LOG_LEVEL (like --log-level).");
  app.set_version_flag("--version", std::string("hmc-run ") + HMC_VERSION);

  RunOptions options;
  app.add_option("scenario", options.paths,
                 "Scenario file(s) or directories (every *.json inside, in name order)");
  app.add_option("-n,--world-size", options.worldSize,
                 "Ranks to run, replacing the file's world_size (1..4096), e.g. --world-size 8")
      ->check(CLI::Range(1, hmc::scenario::kMaxWorldSize));
  app.add_option("--transport", options.transport,
                 "How ranks talk: auto (= threads here) or threads: every rank a thread of this "
                 "process, collectives in shared memory")
      ->check(CLI::IsMember({"auto", "threads", "store", "gloo"}))
      ->capture_default_str();
  app.add_option("--device", options.device,
                 "Replace the scenario's device: auto (cuda when usable), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--timeout", options.timeoutS,
                 "Deadline of every collective in seconds, replacing timeout_s, e.g. --timeout 5")
      ->check(CLI::PositiveNumber);
  app.add_option("--report", options.reportPath,
                 "Write the hmc-report/1 JSON here (several scenarios: hmc-report-set/1)");
  app.add_option("--trace", options.tracePath,
                 "Write a Chrome trace (one track per rank; opens in Perfetto) here");
  app.add_option("--log-level", options.logLevel,
                 "Library log level on stderr: trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->envname("HMC_LOG_LEVEL")
      ->capture_default_str();
  app.add_flag("-q,--quiet", options.quiet, "Print only the final OK/FAILED line (and errors)");

  std::vector<std::string> validateFilesArg;
  std::optional<int> validateWorld;
  auto* validate = app.add_subcommand(
      "validate", "Parse and validate scenario files without running them; exit 2 if any is invalid");
  validate->add_option("files", validateFilesArg, "Scenario files")->required();
  validate->add_option("-n,--world-size", validateWorld, "Validate rank lists against this world")
      ->check(CLI::Range(1, hmc::scenario::kMaxWorldSize));

  std::string listDir;
  auto* list = app.add_subcommand("list", "Print the name and description of each scenario");
  list->add_option("directory", listDir, "A directory of scenario files")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    fmt::print(stderr, "Run 'hmc-run --help' for usage and examples.\n");
    return kExitUsage;
  }
  setUpLogging(options.logLevel);

  if (*validate) return validateFiles(validateFilesArg, validateWorld);
  if (*list) return listDirectory(listDir);
  if (options.paths.empty()) {
    fmt::print(stderr,
               "hmc-run: no scenario given. Example: hmc-run scenarios/quickstart.json\n"
               "Run 'hmc-run --help' for usage.\n");
    return kExitUsage;
  }
  try {
    return runScenarios(options, command);
  } catch (const std::exception& error) {
    fmt::print(stderr, "hmc-run: internal error: {}\n", error.what());
    return 1;
  }
}
