#pragma once
// hmc-run's command line, declared once for both of its programs:
// - `hmc-run` (front.cpp), the installed command: links no LibTorch, so `--help`, `--version`,
//   `validate`, `list`, `compare`, `render`, `record` and (built against LibTorch 1.x, whose
//   store protocol hmc speaks) `status` start in milliseconds; for everything else it execs
// - `hmc-run-torch` (main.cpp, the runner): scenario runs, the hidden `_rank`, `shrink`,
//   with argv unchanged. The runner parses the same command line again and accepts every
//   command itself, so either program gives the same outputs and exit codes.

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "compare_command.hpp"
#include "record_command.hpp"
#include "exit_codes.hpp"
#include "hmc/collective/transport.hpp"
#include "hmc/world/rank_launch.hpp"
#include "render_command.hpp"
#include "run_options.hpp"
#include "shrink_command.hpp"
#include "status_command.hpp"

namespace hmc::app {

// Set by the front to its own path before it execs the runner; the runner starts its rank
// processes through it (`hmc-run _rank ...`).
inline constexpr const char* kFrontEnv = "HMC_RUN_FRONT";

// Every option and subcommand of hmc-run, writing into the fields below (so neither copyable
// nor movable).
struct CommandLine {
  CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  // Parses argv. Returns the exit code when parsing ended the command (--help and --version
  // printed, or a usage error printed to stderr), else nullopt.
  std::optional<int> parse(int argc, char** argv);
  // Whether the parsed command needs LibTorch: a scenario run, `_rank`, `shrink`, or `status`
  // where hmc has no client of this LibTorch's store protocol (2.x).
  bool needsTorch() const;
  // Runs a parsed command that needs no LibTorch (validate, list, compare, render, record,
  // status, or no command at all: the "no scenario given" usage error) and returns its exit
  // code. Only when !needsTorch().
  int runWithoutTorch();

  CLI::App app;
  RunOptions run;
  world::RankLaunch rankLaunch;
  StatusOptions status;
  CompareOptions compare;
  RecordOptions record;
  RenderOptions render;
  ShrinkOptions shrink;
  std::vector<std::string> validateFiles;
  std::optional<int> validateWorldSize;
  std::string listDirectory;

  CLI::App* rankCommand = nullptr;
  CLI::App* validateCommand = nullptr;
  CLI::App* statusCommand = nullptr;
  CLI::App* listCommand = nullptr;
  CLI::App* compareCommand = nullptr;
  CLI::App* recordCommand = nullptr;
  CLI::App* renderCommand = nullptr;
  CLI::App* shrinkCommand = nullptr;
};

// Files the paths name: a file itself, or a directory's *.json files in name order. Sets
// *anyDirectory when a path is a directory. Throws ScenarioError for a directory it cannot
// list or that holds no *.json.
std::vector<std::string> expandPaths(const std::vector<std::string>& paths, bool* anyDirectory);

}  // namespace hmc::app
