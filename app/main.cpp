// hmc-run: runs hmc-scenario/1 files across ranks and reports mismatches, leaks, hangs and
// workspace reuse timings. Exit codes: 0 every expectation met, 1 an expectation failed,
// 2 bad input or usage, 3 an unexpected hang.

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/launch_env.hpp"
#include "hmc/config.hpp"
#include "hmc/error.hpp"
#include "hmc/resources/cuda_device.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/scenario/reporters.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/scenario/thread_driver.hpp"
#include "compare_command.hpp"
#include "local_launcher.hpp"
#include "rank_process.hpp"

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
  std::optional<std::string> masterAddr;
  std::optional<int> masterPort;
};

// The hidden `_rank` command: one rank process of hmc-run's own local launch.
struct RankCommand {
  std::string file;
  int rank = 0;
  int worldSize = 1;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
  int glooPort = 0;
  std::string transport = "tcp";
  std::string resultFile;
  std::optional<std::string> device;
  std::optional<double> timeoutS;
  std::size_t flightCapacity = 64;
};

hmc::scenario::Device deviceFromName(const std::string& name) {
  return name == "cpu"    ? hmc::scenario::Device::kCpu
         : name == "cuda" ? hmc::scenario::Device::kCuda
                          : hmc::scenario::Device::kAuto;
}

std::string selfExecutable(const char* argv0) {
  std::error_code ec;
  const auto path = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : path.string();
}

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

int runScenarios(const RunOptions& options, const std::vector<std::string>& command,
                 const std::string& executable) {
  // Who starts the ranks: a launcher (torchrun, srun, mpirun), hmc-run's own processes, or
  // threads of this process.
  std::optional<hmc::collective::LaunchEnv> launch;
  try {
    launch = hmc::collective::detectLaunch(hmc::collective::processEnvironment(),
                                           {options.masterAddr, options.masterPort});
  } catch (const hmc::ValueError& error) {
    fmt::print(stderr, "hmc-run: launcher environment: {}\n", error.what());
    return kExitUsage;
  }
  std::string transport = options.transport;
  if (launch) {
    if (transport == "threads") {
      fmt::print(stderr,
                 "hmc-run: --transport threads runs every rank in one process, but {} started "
                 "this process as rank {} of {}: use --transport tcp, store or gloo (or auto)\n",
                 launch->launcher, launch->rank, launch->worldSize);
      return kExitUsage;
    }
    if (transport == "auto") transport = "tcp";
    if (options.worldSize && *options.worldSize != launch->worldSize) {
      fmt::print(stderr, "hmc-run: --world-size {} disagrees with {}'s world of {} ranks\n",
                 *options.worldSize, launch->launcher, launch->worldSize);
      return kExitUsage;
    }
  } else if (transport == "auto") {
    transport = "threads";
  }
  std::optional<hmc::resources::DeviceProbe> ncclDevices;
  if (transport == "nccl") {
    if (!HMC_HAVE_CUDA) {
      fmt::print(stderr,
                 "hmc-run: --transport nccl: this hmc-run was built without CUDA "
                 "(HMC_WITH_CUDA=OFF, or the CUDA toolkit or NCCL was not found); use "
                 "--transport tcp, store or gloo\n");
      return kExitUsage;
    }
    ncclDevices = hmc::resources::cudaDeviceUsable();
    if (!*ncclDevices) {
      fmt::print(stderr, "hmc-run: --transport nccl: {}; use --transport tcp, store or gloo\n",
                 ncclDevices->reason);
      return kExitUsage;
    }
  }
  bool anyDirectory = false;
  std::vector<std::string> files;
  try {
    files = expandPaths(options.paths, &anyDirectory);
  } catch (const hmc::ScenarioError& error) {
    fmt::print(stderr, "hmc-run: {}\n", error.what());
    return kExitUsage;
  }
  if (launch && files.size() != 1) {
    fmt::print(stderr,
               "hmc-run: under {} pass exactly one scenario file (got {}); run a directory with "
               "hmc-run's own launcher (--transport tcp) instead\n",
               launch->launcher, files.size());
    return kExitUsage;
  }
  const bool reporting = !launch || launch->rank == 0;
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
    parse.worldSize = launch ? std::optional<int>(launch->worldSize) : options.worldSize;
    hmc::scenario::Scenario scenario;
    try {
      scenario = hmc::scenario::loadScenario(file, parse);
    } catch (const hmc::ScenarioError& error) {
      const auto report = hmc::scenario::invalidReport(file, "", error);
      for (auto& reporter : reporters) reporter->scenarioInvalid(file, report);
      worsen(kExitUsage);
      continue;
    }
    if (options.device) scenario.device = deviceFromName(*options.device);
    if (options.timeoutS) scenario.timeoutS = *options.timeoutS;
    // What this machine cannot run is bad usage (exit 2), not a failed expectation: a GPU
    // scenario without a usable GPU, an NCCL world with more ranks than GPUs.
    std::string unrunnable;
    std::string unrunnablePath = "/device";
    if (hmc::scenario::usesCuda(scenario)) {
      const std::string reason = hmc::scenario::cudaUnusableReason();
      if (!reason.empty()) {
        unrunnable = fmt::format(
            "the scenario puts its inputs on CUDA, but {}; run it on a GPU machine "
            "(scripts/device-check) or pass --device cpu",
            reason);
      }
    }
    if (unrunnable.empty() && ncclDevices && !launch &&
        scenario.worldSize > ncclDevices->deviceCount) {
      unrunnablePath = "/world_size";
      unrunnable = fmt::format(
          "--transport nccl needs one GPU per rank: {} ranks, {} GPU(s); run it with "
          "--world-size {} or fewer, or use --transport tcp, store or gloo (the ranks then share "
          "the "
          "GPU for workspaces)",
          scenario.worldSize, ncclDevices->deviceCount, ncclDevices->deviceCount);
    }
    if (!unrunnable.empty()) {
      const hmc::ScenarioError error(file, unrunnablePath, unrunnable);
      const auto report = hmc::scenario::invalidReport(file, scenario.name, error);
      for (auto& reporter : reporters) reporter->scenarioInvalid(file, report);
      worsen(kExitUsage);
      continue;
    }

    const std::size_t flightCapacity = options.tracePath ? (1u << 16) : 64u;
    const auto start = std::chrono::steady_clock::now();
    std::vector<hmc::scenario::RankResult> ranks;
    bool interrupted = false;
    if (launch) {
      hmc::app::RankProcessOptions rankOptions;
      rankOptions.transport = transport;
      rankOptions.rank = launch->rank;
      rankOptions.worldSize = launch->worldSize;
      rankOptions.masterAddr = launch->masterAddr;
      rankOptions.masterPort = launch->masterPort;
      rankOptions.agentHostsStore = launch->agentHostsStore;
      rankOptions.flightCapacity = flightCapacity;
      auto outcome = hmc::app::runRankProcess(scenario, rankOptions, true);
      if (!reporting) return 0;
      ranks = std::move(*outcome.merged);
    } else if (transport == "threads") {
      hmc::scenario::ThreadRunOptions runOptions;
      runOptions.flightCapacity = flightCapacity;
      const std::size_t total = scenario.steps.size();
      runOptions.onStep = [&](int rank, const hmc::scenario::StepResult& step) {
        if (rank == 0) progress.step(scenario.name, step, total);
      };
      ranks = hmc::scenario::runOnThreads(scenario, runOptions);
    } else {
      hmc::app::LocalLaunchOptions launchOptions;
      launchOptions.executable = executable;
      launchOptions.scenarioFile = file;
      launchOptions.transport = transport;
      launchOptions.passThrough = {"--log-level", options.logLevel, "--flight-capacity",
                                   std::to_string(flightCapacity)};
      if (options.device)
        launchOptions.passThrough.insert(launchOptions.passThrough.end(),
                                         {"--device", *options.device});
      if (options.timeoutS)
        launchOptions.passThrough.insert(launchOptions.passThrough.end(),
                                         {"--timeout", fmt::format("{}", *options.timeoutS)});
      auto launched = hmc::app::launchLocalRanks(scenario, launchOptions);
      ranks = std::move(launched.ranks);
      interrupted = launched.interrupted;
    }
    progress.clear();

    hmc::scenario::RunInfo info;
    info.transport = transport;
    info.device = hmc::scenario::resolvedDeviceName(scenario.device);
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
    if (interrupted) {
      fmt::print(stderr, "hmc-run: interrupted; every rank process was stopped\n");
      for (auto& reporter : reporters) reporter->finish();
      return 130;
    }
  }
  try {
    for (auto& reporter : reporters) reporter->finish();
  } catch (const hmc::Error& error) {
    fmt::print(stderr, "hmc-run: {}\n", error.what());
    return kExitUsage;
  }
  return exitCode;
}

int runRankCommand(const RankCommand& command) {
  hmc::scenario::ParseOptions parse;
  parse.worldSize = command.worldSize;
  hmc::scenario::Scenario scenario;
  try {
    scenario = hmc::scenario::loadScenario(command.file, parse);
  } catch (const hmc::ScenarioError& error) {
    fmt::print(stderr, "hmc-run rank {}: {}\n", command.rank, error.what());
    return kExitUsage;
  }
  if (command.device) scenario.device = deviceFromName(*command.device);
  if (command.timeoutS) scenario.timeoutS = *command.timeoutS;
  hmc::scenario::limitTorchThreads(1);
  hmc::app::RankProcessOptions options;
  options.transport = command.transport;
  options.rank = command.rank;
  options.worldSize = command.worldSize;
  options.masterAddr = command.masterAddr;
  options.masterPort = command.masterPort;
  options.glooPort = command.glooPort;
  options.flightCapacity = command.flightCapacity;
  try {
    auto outcome = hmc::app::runRankProcess(scenario, options, false);
    hmc::scenario::writeFileAtomically(command.resultFile, outcome.result.toJson().dump());
  } catch (const std::exception& error) {
    fmt::print(stderr, "hmc-run rank {}: {}\n", command.rank, error.what());
    return 1;
  }
  return 0;
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
      "timings. Ranks run as threads of this process, as local processes, or as the ranks\n"
      "of a torchrun/srun/mpirun launch (--transport).",
      "hmc-run"};
  app.footer(
      "Examples:\n"
      "  hmc-run scenarios/quickstart.json                 run one scenario, print a table\n"
      "  hmc-run scenarios/ --report out.json              run every scenario of a folder\n"
      "  hmc-run scenarios/reuse-churn.json --world-size 8 --trace trace.json\n"
      "                                                    open trace.json in ui.perfetto.dev\n"
      "  hmc-run scenarios/quickstart.json --transport tcp ranks as local processes\n"
      "  torchrun --nproc-per-node 4 --no-python hmc-run scenarios/quickstart.json\n"
      "                                                    each torchrun process is a rank\n"
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
                 "How ranks talk. threads: every rank a thread of this process (fast, "
                 "deterministic, up to 4096 ranks). tcp: rank processes exchanging over direct "
                 "TCP connections (a c10d TCPStore to rendezvous and for control). store: rank "
                 "processes exchanging through a c10d TCPStore. gloo: rank processes over c10d "
                 "ProcessGroupGloo. nccl: rank "
                 "processes exchanging by NCCL all-gathers, one GPU per rank (rank r on GPU r % "
                 "GPUs; the store stays the bootstrap and out-of-band channel); one GPU holds "
                 "one NCCL rank, so runs with more ranks than GPUs share a GPU for workspaces "
                 "and use tcp, store or gloo for control. auto: threads, or tcp when "
                 "torchrun/srun/mpirun started this process. With tcp, store, gloo or nccl and no "
                 "launcher, hmc-run starts world_size local rank processes itself (like "
                 "torchrun --standalone).")
      ->check(CLI::IsMember({"auto", "threads", "tcp", "store", "gloo", "nccl"}))
      ->capture_default_str();
  app.add_option("--device", options.device,
                 "Replace the scenario's device: auto (cuda when usable), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--timeout", options.timeoutS,
                 "Deadline of every collective in seconds, replacing timeout_s (0 < s <= 1e6), "
                 "e.g. --timeout 5")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              (void)hmc::collective::timeoutFromSeconds(std::stod(text));
              return "";
            } catch (const std::exception&) {
              return "expected a number of seconds > 0 and <= 1e6, got '" + text + "'";
            }
          },
          "SECONDS", "timeout"));
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
  app.add_option("--master-addr", options.masterAddr,
                 "Host of rank 0's store under srun/mpirun (default: MASTER_ADDR, or the first "
                 "host of SLURM_JOB_NODELIST)");
  app.add_option("--master-port", options.masterPort,
                 "Port of rank 0's store under a launcher (default: MASTER_PORT, else 29500)")
      ->check(CLI::Range(1, 65535));

  RankCommand rankCommand;
  auto* rankSub = app.add_subcommand("_rank", "internal: one rank process of a local launch");
  rankSub->group("");  // hidden from --help
  rankSub->add_option("file", rankCommand.file)->required();
  rankSub->add_option("--rank", rankCommand.rank)->required();
  rankSub->add_option("--world-size", rankCommand.worldSize)->required();
  rankSub->add_option("--master-addr", rankCommand.masterAddr);
  rankSub->add_option("--master-port", rankCommand.masterPort)->required();
  rankSub->add_option("--gloo-port", rankCommand.glooPort);
  rankSub->add_option("--transport", rankCommand.transport);
  rankSub->add_option("--result-file", rankCommand.resultFile)->required();
  rankSub->add_option("--device", rankCommand.device);
  rankSub->add_option("--timeout", rankCommand.timeoutS);
  rankSub->add_option("--flight-capacity", rankCommand.flightCapacity);
  rankSub->add_option("--log-level", options.logLevel);

  std::vector<std::string> validateFilesArg;
  std::optional<int> validateWorld;
  auto* validate = app.add_subcommand(
      "validate",
      "Parse and validate scenario files without running them; exit 2 if any is invalid");
  validate->add_option("files", validateFilesArg, "Scenario files")->required();
  validate->add_option("-n,--world-size", validateWorld, "Validate rank lists against this world")
      ->check(CLI::Range(1, hmc::scenario::kMaxWorldSize));

  std::string listDir;
  auto* list = app.add_subcommand("list", "Print the name and description of each scenario");
  list->add_option("directory", listDir, "A directory of scenario files")->required();

  CompareOptions compareOptions;  // hmc-run compare (app/compare_command.*)
  auto* compare = addCompareCommand(app, compareOptions);

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
  if (*compare) return runCompare(compareOptions);  // before logging and any torch use
  setUpLogging(options.logLevel);

  if (*rankSub) return runRankCommand(rankCommand);
  if (*validate) return validateFiles(validateFilesArg, validateWorld);
  if (*list) return listDirectory(listDir);
  if (options.paths.empty()) {
    fmt::print(stderr,
               "hmc-run: no scenario given. Example: hmc-run scenarios/quickstart.json\n"
               "Run 'hmc-run --help' for usage.\n");
    return kExitUsage;
  }
  try {
    return runScenarios(options, command, selfExecutable(argv[0]));
  } catch (const std::exception& error) {
    fmt::print(stderr, "hmc-run: internal error: {}\n", error.what());
    return 1;
  }
}
