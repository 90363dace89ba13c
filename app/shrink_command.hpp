#pragma once
// `hmc-run shrink IN.json -o OUT.json`: makes a failing scenario as small as it can while it
// still fails the same way (failure_signature.hpp), by delta debugging over its steps and ranks
// and simplifying what is left (shrinker.hpp), and writes the smallest one found. See
// docs/shrink.md.
//
// Trials run on thread ranks (or --transport's rank processes) with a short deadline; the
// result is confirmed once with the scenario's own deadline before it is written. Bounded by
// --max-seconds; Ctrl-C writes the best so far.
//
// Exit codes: 0 written (shrunk, or the best so far at --max-seconds); 1 the result did not
// fail the same way at the scenario's own deadline (nothing written); 2 usage or input errors,
// a scenario that does not fail among them; 130 interrupted (the best so far written).

#include <CLI/CLI.hpp>
#include <chrono>
#include <string>

#include "hmc/collective/transport.hpp"

namespace hmc::app {

struct ShrinkOptions {
  std::string input;
  std::string output;
  std::string same = "all";  // a SameLevel name (failure_signature.hpp), checked by the parser
  std::chrono::duration<double> trialTimeout{0.25};  // --trial-timeout
  collective::Transport transport = collective::Transport::kThreads;
  std::chrono::duration<double> budget{300};  // --max-seconds
  bool asTest = false;
  bool signatureOnly = false;
  std::string logLevel = "off";
};

// Registers the `shrink` subcommand on `app` (torch-free: the front parses it too).
CLI::App* addShrinkCommand(CLI::App& app, ShrinkOptions& options);

struct RankProgram;  // run_plan.hpp

// Runs the shrink (the runner only: it runs scenarios); returns the exit code. `program`: what
// rank processes run under --transport tcp/store/gloo.
int runShrink(const ShrinkOptions& options, const RankProgram& program);

}  // namespace hmc::app
