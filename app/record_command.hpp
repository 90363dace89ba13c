#pragma once
// `hmc-run record merge DIR -o FILE` and `hmc-run record show DIR`: the ranks' recordings of a
// run (HMC_RECORD=DIR in a program, `hmc-run --record DIR`; lib's hmc/record/) made into a
// scenario that replays the run on thread ranks, or printed side by side for a human (a table,
// hmc-record-show/1 JSON with --json, an HTML page with --html that `hmc-run render` draws
// from the JSON too). `show` names the first divergence on its first line and folds the rows
// every rank repeats before it (hmc/record/show.hpp; --all folds nothing).
//
// Exit codes: 0 done (merge: what could not be merged is listed on stderr, and the scenario
// holds the rest); 2 nothing readable, a bad option, or an output that cannot be written.

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

struct RecordOptions {
  std::string directory;
  std::string outputPath;          // merge: -o
  std::string expect = "program";  // merge: --expect program|observed
  int width = 44;                  // show: the width of a rank's column
  std::optional<int> limit;        // show: at most this many rows
  bool all = false;                // show: fold nothing (--all)
  bool json = false;               // show: hmc-record-show/1 JSON instead of the table
  std::optional<std::string> htmlPath;  // show: also write the page (- : stdout)
};

// Registers `record` with its `merge` and `show` subcommands on `app`.
CLI::App* addRecordCommand(CLI::App& app, RecordOptions& options);

// Runs the parsed subcommand of `record`; returns the exit code.
int runRecord(const CLI::App& record, const RecordOptions& options);
