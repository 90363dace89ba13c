#include "cli.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "hmc/collective/collective.hpp"
#include "hmc/collective/store_wire.hpp"
#include "hmc/config.hpp"
#include "hmc/error.hpp"
#include "hmc/log.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/text.hpp"
#include "hmc/world/signals.hpp"
#include "rank_options.hpp"

namespace fs = std::filesystem;

namespace hmc::app {
namespace {

int validateScenarioFiles(const std::vector<std::string>& files, std::optional<int> worldSize) {
  int invalid = 0;
  for (const auto& file : files) {
    try {
      hmc::scenario::ParseOptions parse;
      parse.worldSize = worldSize;
      const auto scenario = hmc::scenario::loadScenario(file, parse);
      fmt::print("ok       {}: '{}', {} steps, {} ranks\n", hmc::printable(file),
                 hmc::printable(scenario.name), scenario.steps.size(), scenario.worldSize);
    } catch (const ScenarioError& error) {
      ++invalid;
      fmt::print("invalid  {}\n", error.what());
    }
  }
  fmt::print("# {}: {} of {} file{} valid\n", invalid == 0 ? "OK" : "FAILED",
             files.size() - invalid, files.size(), files.size() == 1 ? "" : "s");
  return invalid == 0 ? 0 : kExitUsage;
}

int listScenarios(const std::string& directory) {
  bool anyDirectory = false;
  std::vector<std::string> files;
  try {
    files = expandPaths({directory}, &anyDirectory);
  } catch (const ScenarioError& error) {
    usageError(error.what());
    return kExitUsage;
  }
  int invalid = 0;
  fmt::print("# {:<36} {:>5} {:>5}  {}\n", "scenario", "ranks", "steps", "description");
  for (const auto& file : files) {
    try {
      const auto scenario = hmc::scenario::loadScenario(file);
      fmt::print("  {:<36} {:>5} {:>5}  {}\n", hmc::printable(scenario.name), scenario.worldSize,
                 scenario.steps.size(), hmc::printable(scenario.description));
    } catch (const ScenarioError& error) {
      ++invalid;
      fmt::print("# invalid: {}\n", error.what());
    }
  }
  return invalid == 0 ? 0 : kExitUsage;
}

// A deadline in seconds, as collective::timeoutFromSeconds takes it (0 < s <= 1e6).
CLI::Validator secondsValidator(const std::string& name) {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          (void)collective::timeoutFromSeconds(std::stod(text));
          return "";
        } catch (const std::exception&) {
          return "expected a number of seconds > 0 and <= 1e6, got '" + text + "'";
        }
      },
      "SECONDS", name);
}

// The options of a run (the default command).
void addRunOptions(CLI::App& app, RunOptions& options) {
  app.add_option("scenario", options.paths,
                 "Scenario file(s) or directories (every *.json inside, in name order)");
  app.add_option_function<int>(
         "-n,--world-size", [&options](const int& n) { options.overrides.worldSize = n; },
         "Ranks to run, replacing the file's world_size (1..4096), e.g. --world-size 8")
      ->check(CLI::Range(1, scenario::kMaxWorldSize));
  app.add_option_function<std::string>(
         "--transport",
         [&options](const std::string& name) {
           options.transport = *collective::transportFromString(name);
         },
         "How ranks talk. threads: every rank a thread of this process (fast, deterministic, up "
         "to 4096 ranks). tcp: rank processes exchanging over direct TCP connections (a c10d "
         "TCPStore to rendezvous and for control). store: rank processes exchanging through a "
         "c10d TCPStore. gloo: rank processes over c10d ProcessGroupGloo. nccl: rank processes "
         "exchanging by NCCL all-gathers, one GPU per rank (rank r on GPU r % GPUs; the store "
         "stays the bootstrap and out-of-band channel); one GPU holds one NCCL rank, so runs "
         "with more ranks than GPUs share a GPU for workspaces and use tcp, store or gloo for "
         "control. auto (default): threads, or tcp when torchrun/srun/mpirun started this "
         "process. With tcp, store, gloo or nccl and no launcher, hmc-run starts world_size "
         "local rank processes itself (like torchrun --standalone).")
      ->check(CLI::IsMember(collective::transportNames()));
  app.add_option_function<std::string>(
         "--device",
         [&options](const std::string& name) {
           options.overrides.device = parseEnum<scenario::Device>(name);
         },
         "Replace the scenario's device: auto (cuda when usable), cpu or cuda")
      ->check(CLI::IsMember(enumNames<scenario::Device>()));
  app.add_option_function<double>(
         "--timeout", [&options](const double& seconds) { options.overrides.timeoutS = seconds; },
         "Deadline of every collective in seconds, replacing timeout_s (0 < s <= 1e6), "
         "e.g. --timeout 5")
      ->check(secondsValidator("timeout"));
  app.add_option_function<double>(
         "--join-timeout",
         [&options](const double& seconds) {
           options.joinTimeout = collective::timeoutFromSeconds(seconds);
         },
         "How long a rank process may take to join its world, in seconds (0 < s <= 1e6): "
         "start, load LibTorch, reach the store and meet every other rank; --timeout "
         "bounds each collective after that. The default suits a cluster, where ranks "
         "start one by one and load LibTorch from network file systems (like torchrun's "
         "rendezvous timeout); the ranks that did not join are named. Applies to rank "
         "processes (tcp, store, gloo, nccl); the threads transport forms no world and "
         "ignores it. e.g. --join-timeout 60")
      ->check(secondsValidator("join timeout"))
      ->default_str(
          fmt::format("{:g}", std::chrono::duration<double>(options.joinTimeout).count()));
  app.add_option("--repetitions", options.repetitions,
                 "Run each scenario this many times (same ranks, fresh managers); the report "
                 "keeps every repetition's raw timing samples, e.g. --repetitions 10")
      ->check(CLI::Range(1, 10000));
  app.add_option("--warmup", options.warmup,
                 "Repetitions left out of the timings (default 1 when --repetitions > 1, else 0)")
      ->check(CLI::Range(0, 9999));
  app.add_option("--report", options.reportPath,
                 "Write the hmc-report/1 JSON here (several scenarios: hmc-report-set/1); - for "
                 "standard output (the console table then goes to standard error)");
  app.add_option("--trace", options.tracePath,
                 "Write a Chrome trace (one track per rank; opens in Perfetto) here; - for "
                 "standard output");
  app.add_option("--record", options.recordDirectory,
                 "Record every rank's lifecycle calls (the first repetition) in this folder, "
                 "one file per rank (rank-N.hmcrec; several scenarios: one subfolder each, "
                 "named by the file's stem); `hmc-run record merge DIR -o FILE` makes a "
                 "scenario of them (docs/record-replay.md)");
  app.add_option("--html", options.htmlPath,
                 "Write the report as one self-contained HTML page here (a timeline of the steps "
                 "per rank, the hang's missing ranks, bind times, leaks, the environment; no "
                 "network needed to view it); - for standard output");
  app.add_option("--log-level", options.logLevel,
                 "Library log level on stderr: trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->envname("HMC_LOG_LEVEL")
      ->capture_default_str();
  app.add_flag("-q,--quiet", options.quiet, "Print only the final OK/FAILED line (and errors)");
  app.add_option("--master-addr", options.masterAddr,
                 "Host of rank 0's store under srun/mpirun (default: MASTER_ADDR; 127.0.0.1 when "
                 "every rank is on this node; srun: the first host of the node list)");
  app.add_option("--master-port", options.masterPort,
                 "Port of rank 0's store: under a launcher (default: MASTER_PORT, else under "
                 "mpirun/srun a port derived from the job id, else 29500), or of hmc-run's own "
                 "rank processes (default: a free port; printed on stderr for hmc-run status)")
      ->check(CLI::Range(1, 65535));
}

}  // namespace

void setUpLogging(const std::string& level) { hmc::setUpLogging(level); }

void usageError(const std::string& message) { fmt::print(stderr, "hmc-run: {}\n", message); }

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
      if (ec) throw ScenarioError(path, "", "cannot list directory: " + ec.message());
      std::sort(found.begin(), found.end());
      if (found.empty()) {
        throw ScenarioError(path, "", "no *.json scenario files in this directory");
      }
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(path);
    }
  }
  return files;
}

CommandLine::CommandLine()
    : app{"hmc-run " HMC_VERSION
          ": run execution-resource lifecycle scenarios (hmc-scenario/1 JSON) across ranks and\n"
          "report manifest mismatches, leaks, hangs (which rank, which stage) and workspace reuse\n"
          "timings. Ranks run as threads of this process, as local processes, or as the ranks\n"
          "of a torchrun/srun/mpirun launch (--transport).",
          "hmc-run"} {
  app.footer(
      "Examples:\n"
      "  hmc-run scenarios/quickstart.json                 run one scenario, print a table\n"
      "  hmc-run scenarios/ --report out.json              run every scenario of a folder\n"
      "  hmc-run scenarios/reuse-churn.json --world-size 8 --trace trace.json\n"
      "                                                    open trace.json in ui.perfetto.dev\n"
      "  hmc-run scenarios/quickstart.json --transport tcp ranks as local processes\n"
      "  hmc-run scenarios/reuse-churn.json --repetitions 10 --report current.json\n"
      "                                                    raw samples for a regression gate\n"
      "  torchrun --standalone --nproc_per_node 4 --no_python hmc-run scenarios/quickstart.json\n"
      "                                                    each torchrun process is a rank (torch\n"
      "                                                    1.13; on Python 3.11 use the wrapper\n"
      "                                                    tests/support/torchrun; torch 2.x:\n"
      "                                                    --nproc-per-node 4 --no-python)\n"
      "  mpirun -np 4 hmc-run scenarios/quickstart.json    each MPI process is a rank; one node\n"
      "                                                    needs no --master-addr (as root:\n"
      "                                                    --allow-run-as-root)\n"
      "  hmc-run status --master-port 29500                where each rank of a running job is\n"
      "  hmc-run validate scenarios/*.json                 check files without running them\n"
      "  hmc-run list scenarios/                           names and descriptions\n"
      "  hmc-run scenarios/quickstart.json --html run.html one page: timeline, hang, binds, leaks\n"
      "  hmc-run render report.json --html report.html     draw a report written earlier\n"
      "  hmc-run shrink big-failing.json -o minimal.json   the smallest scenario that fails the\n"
      "                                                    same way (docs/shrink.md)\n"
      "  hmc-run scenario.json --record rec/               record each rank's lifecycle calls;\n"
      "  hmc-run record merge rec/ -o replay.json          then a scenario that replays them\n"
      "                                                    (docs/record-replay.md)\n"
      "\n"
      "Exit codes: 0 every expectation met, 1 an expectation failed, 2 bad input or usage,\n"
      "3 an unexpected hang, 130 interrupted. Formats: docs/scenario-format.md (hmc-scenario/1,\n"
      "hmc-report/1). Environment: HMC_LOG_LEVEL (like --log-level), TMPDIR, HMC_ADVERTISE_ADDR\n"
      "(the address a rank binds and announces), HMC_RANK_WARM_UP=0 (no LibTorch warm-up while\n"
      "the world forms), HMC_TCP_LOCAL_SOCKETS=0 and HMC_TCP_SHARED_MEMORY=0 (the tcp transport\n"
      "on one host: TCP, or sockets rather than shared memory): docs/multi-process.md.");
  app.set_version_flag("--version", std::string("hmc-run ") + HMC_VERSION);

  addRunOptions(app, run);

  rankCommand = app.add_subcommand("_rank", "internal: one rank process of a local launch");
  rankCommand->group("");  // hidden from --help
  addRankOptions(*rankCommand, rankLaunch);

  validateCommand = app.add_subcommand(
      "validate",
      "Parse and validate scenario files without running them; exit 2 if any is invalid");
  validateCommand->add_option("files", validateFiles, "Scenario files")->required();
  validateCommand
      ->add_option("-n,--world-size", validateWorldSize, "Validate rank lists against this world")
      ->check(CLI::Range(1, scenario::kMaxWorldSize));

  // `hmc-run status`: attaches to a running job's store (app/status_command.hpp).
  statusCommand = addStatusCommand(app, status);

  listCommand = app.add_subcommand("list", "Print the name and description of each scenario");
  listCommand->add_option("directory", listDirectory, "A directory of scenario files")->required();

  compareCommand = addCompareCommand(app, compare);  // app/compare_command.*
  renderCommand = addRenderCommand(app, render);     // app/render_command.*
  recordCommand = addRecordCommand(app, record);     // app/record_command.*

  shrinkCommand = addShrinkCommand(app, shrink);  // app/shrink_command.hpp
}

std::optional<int> CommandLine::parse(int argc, char** argv) {
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
  return std::nullopt;
}

bool CommandLine::needsTorch() const {
  if (*rankCommand || *shrinkCommand) return true;
  if (*compareCommand || *renderCommand || *recordCommand || *validateCommand || *listCommand) {
    return false;
  }
  // status: hmc's own store client where it speaks this LibTorch's protocol (store_wire.hpp).
  if (*statusCommand && run.paths.empty()) return !collective::storeWireClientAvailable();
  return *statusCommand || !run.paths.empty();
}

int CommandLine::runWithoutTorch() {
  if (*compareCommand) {
    world::unblockTerminationSignals();
    return runCompare(compare);  // before logging
  }
  if (*renderCommand) {
    world::unblockTerminationSignals();
    return runRender(render);
  }
  if (*recordCommand) {
    world::unblockTerminationSignals();
    return runRecord(*recordCommand, record);
  }
  setUpLogging(run.logLevel);
  world::unblockTerminationSignals();
  if (*statusCommand) return runStatus(status, collective::connectKeyValueStoreWire);
  if (*validateCommand) return validateScenarioFiles(validateFiles, validateWorldSize);
  if (*listCommand) return listScenarios(listDirectory);
  fmt::print(stderr,
             "hmc-run: no scenario given. Example: hmc-run scenarios/quickstart.json\n"
             "Run 'hmc-run --help' for usage.\n");
  return kExitUsage;
}

}  // namespace hmc::app
