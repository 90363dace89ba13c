// hmc-run, the installed command: the torch-free front. LibTorch brings about 290 shared
// libraries (~1 s of CPU to load and relocate), so the commands that need none of it (--help,
// --version, validate, list, compare, render, record, status where hmc speaks the store's
// protocol, and usage errors) run here; a scenario run, `_rank` and `shrink` exec the runner
// hmc-run-torch (main.cpp) with argv unchanged, so launchers
// (torchrun, mpirun, hmc-run's own) that start `hmc-run ...` see one process with the same
// pid, arguments, outputs and exit codes. Both parse the one command line of cli.hpp.
//
// The runner is found next to this executable (the build tree) or at
// HMC_RUNNER_FROM_BINDIR relative to it (an installed bin/ -> libexec/).

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli.hpp"
#include "hmc/world/signals.hpp"

namespace fs = std::filesystem;

namespace {

constexpr const char* kRunnerName = "hmc-run-torch";

// Paths where the runner may be, in the order they are tried.
std::vector<fs::path> runnerCandidates(const fs::path& self) {
  const fs::path dir = self.empty() ? fs::path(".") : self.parent_path();
  return {dir / kRunnerName, (dir / HMC_RUNNER_FROM_BINDIR).lexically_normal()};
}

// Replaces this process with the runner; returns only on failure, with the exit code.
int execRunner(char** argv) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) setenv(hmc::app::kFrontEnv, self.c_str(), 1);
  const auto candidates = runnerCandidates(ec ? fs::path() : self);
  std::string tried;
  for (const auto& candidate : candidates) {
    if (access(candidate.c_str(), X_OK) != 0) {
      tried += fmt::format("{}{} ({})", tried.empty() ? "" : ", ", candidate.string(),
                           std::strerror(errno));
      continue;
    }
    execv(candidate.c_str(), argv);
    tried += fmt::format("{}{} (exec: {})", tried.empty() ? "" : ", ", candidate.string(),
                         std::strerror(errno));
  }
  fmt::print(stderr,
             "hmc-run: cannot start the scenario runner {}: tried {}; build the target {} "
             "(cmake --build build --target hmc-run) or reinstall hmc\n",
             kRunnerName, tried, kRunnerName);
  return hmc::app::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  // As the runner does first (main.cpp); the mask and SIGPIPE's SIG_IGN hold across exec, and
  // a termination signal that arrives before the exec stays pending for the runner.
  hmc::world::blockTerminationSignals();
  std::signal(SIGPIPE, SIG_IGN);
  hmc::app::CommandLine cli;
  if (const auto code = cli.parse(argc, argv)) return *code;
  if (!cli.needsTorch()) return cli.runWithoutTorch();
  return execRunner(argv);
}
