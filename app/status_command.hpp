#pragma once
// `hmc-run status`: attaches to a running or hung job's control store as a plain client,
// read-only, and prints where every rank is (diagnostics/job_status.hpp): state, step,
// stage and sequence number, seconds in it, last completed collective, and the same "who
// never arrived where" diagnosis as the report. Exit codes: 0 every rank progressing, 3 some
// rank waits past its deadline (or died, or stopped writing heartbeats), 2 bad usage or
// an unreachable store.
//
// Every wait is bounded by --timeout: the TCP connect (probed with a plain socket first, so
// that nothing listening fails at once and c10d logs no retries), then each store request.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

namespace hmc::app {

struct StatusOptions {
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
  bool json = false;
  double timeoutS = 5;
  std::string prefix = "hmc";  // the rank processes' control store prefix
};

// Adds the `status` subcommand to `app`, filling `options`; returns it (true once parsed).
CLI::App* addStatusCommand(CLI::App& app, StatusOptions& options);

// Runs `hmc-run status`; returns its exit code.
int runStatus(const StatusOptions& options);

}  // namespace hmc::app
