// `hmc-run status`'s command line, apart from the command itself: the torch-free front of
// hmc-run (front.cpp) declares every subcommand for --help and parsing, and must not link the
// c10d store that runStatus uses.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>

#include "hmc/collective/collective.hpp"

#include "status_command.hpp"

namespace hmc::app {

CLI::App* addStatusCommand(CLI::App& app, StatusOptions& options) {
  auto* status = app.add_subcommand(
      "status",
      "Attach to a running or hung multi-process job's store (read-only) and print where every "
      "rank is: state, step, stage, seconds in it, last completed collective, and who never "
      "arrived where. Exit 0 every rank progressing, 3 some rank waits past its deadline (or "
      "died), 2 store unreachable");
  status
      ->add_option("--master-addr", options.masterAddr,
                   "Host of the job's store (rank 0's host; default: MASTER_ADDR, else "
                   "127.0.0.1)")
      ->envname("MASTER_ADDR")
      ->capture_default_str();
  status
      ->add_option("--master-port", options.masterPort,
                   "Port of the job's store, as printed by hmc-run (\"# hmc-run: store at "
                   "...\") or the launcher's MASTER_PORT")
      ->envname("MASTER_PORT")
      ->required()
      ->check(CLI::Range(1, 65535));
  status->add_flag("--json", options.json, "Print one hmc-status/1 JSON document instead");
  status
      ->add_option_function<double>(
          "--timeout",
          [&options](const double& seconds) {
            options.timeout = collective::timeoutFromSeconds(seconds);
          },
          "Give up connecting or reading after this many seconds (0 < s <= 600)")
      ->check(CLI::Range(0.001, 600.0))
      ->default_str(fmt::format("{:g}", std::chrono::duration<double>(options.timeout).count()));
  status->footer(
      "Example: hmc-run scenarios/skipped-close-hang.json --transport tcp --master-port 29600 "
      "--timeout 60 &\n         hmc-run status --master-port 29600");
  return status;
}

}  // namespace hmc::app
