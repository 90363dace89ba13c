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
//
// The front (front.cpp) runs it without LibTorch through hmc's own client of the store's wire
// protocol (collective/store_wire.hpp) where the build has one (LibTorch 1.x); else the runner
// runs it through c10d's client.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "hmc/collective/key_value_store.hpp"

namespace hmc::app {

struct StatusOptions {
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
  bool json = false;
  std::chrono::milliseconds timeout{5000};  // --timeout
  std::string prefix = "hmc";  // the rank processes' control store prefix
};

// Adds the `status` subcommand to `app`, filling `options`; returns it (true once parsed).
CLI::App* addStatusCommand(CLI::App& app, StatusOptions& options);

// Opens the read-only view of the job's store at host:port under a prefix, every request
// bounded by the timeout (collective::connectKeyValueStoreWire or connectKeyValueStore).
using StoreConnector = std::function<std::shared_ptr<collective::KeyValueStore>(
    const std::string& host, int port, const std::string& prefix,
    std::chrono::milliseconds timeout)>;

// Runs `hmc-run status` on a store that `connect` opens; returns its exit code.
int runStatus(const StatusOptions& options, const StoreConnector& connect);

}  // namespace hmc::app
