#pragma once
// Reporters: one interface, a console and a JSON implementation, plus the Chrome trace
// writer. They read finished ScenarioReports (report.hpp); only the reporting process (rank 0
// of a launch, or hmc-run itself) makes them.

#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hmc/scenario/report.hpp"

namespace hmc::scenario {

class Reporter {
 public:
  virtual ~Reporter() = default;
  // One finished scenario, also one that did not parse (report.invalid is set).
  virtual void report(const ScenarioReport& report) = 0;
  // After the last scenario; `interrupted`: Ctrl-C or SIGTERM ended the run early.
  virtual void finish(bool interrupted) = 0;
};

struct ConsoleOptions {
  bool quiet = false;      // only the final line(s)
  int maxRankColumns = 8;  // above it, a step's statuses are summarised
  bool directory = false;  // several scenarios: a progress line each and a summary table
  std::size_t total = 0;   // how many scenarios the run has (for "# [3/12] name: pass")
  // Where the error of an invalid scenario goes (an error, not a result: hmc-run passes
  // stderr); nullptr: the table's own stream.
  std::ostream* errors = nullptr;
};

// Human-readable tables on `out`: non-data lines start with "# "; ends with "# OK",
// "# FAILED (...)" or "# INTERRUPTED (...)". Names from files are printed with their control
// characters escaped.
std::unique_ptr<Reporter> makeConsoleReporter(std::ostream& out, ConsoleOptions options);

// Writes every report to `path` on finish() (output_file.hpp: "-" is stdout, streams and FIFOs
// are written directly, regular files atomically): one `hmc-report/1` document for one
// scenario, {"format": "hmc-report-set/1", "reports": [...]} for several.
std::unique_ptr<Reporter> makeJsonReporter(std::string path);

// Writes one self-contained HTML page of every report to `path` on finish(), as
// makeJsonReporter writes the JSON (the same document, drawn by hmc/render/html.hpp).
std::unique_ptr<Reporter> makeHtmlReporter(std::string path);

// Chrome trace event JSON (opens in Perfetto / chrome://tracing): one process track per
// rank, steps and collectives as slices, flow arrows joining one collective across ranks,
// error and hang markers.
nlohmann::json buildChromeTrace(const ScenarioReport& report);
std::unique_ptr<Reporter> makeTraceReporter(std::string path);

}  // namespace hmc::scenario
