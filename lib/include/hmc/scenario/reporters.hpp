#pragma once
// Reporters: one interface, a console and a JSON implementation, plus the Chrome trace
// writer. They read finished results; only rank 0 (the merging process) calls them.

#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::scenario {

class Reporter {
 public:
  virtual ~Reporter() = default;
  // One finished scenario: its merged `hmc-report/1` document and the ranks' results.
  virtual void scenarioFinished(const Scenario& scenario, const nlohmann::json& report,
                                const std::vector<RankResult>& ranks) = 0;
  // A scenario that did not parse.
  virtual void scenarioInvalid(const std::string& file, const nlohmann::json& report) = 0;
  // After the last scenario.
  virtual void finish() = 0;
};

struct ConsoleOptions {
  bool quiet = false;      // only the final line(s)
  int maxRankColumns = 8;  // above it, a step's statuses are summarised
  bool directory = false;  // several scenarios: also print a summary table
};

// Human-readable tables on `out`: non-data lines start with "# "; ends with "# OK" or
// "# FAILED (...)".
std::unique_ptr<Reporter> makeConsoleReporter(std::ostream& out, ConsoleOptions options);

// Writes every report to `path` on finish(): one `hmc-report/1` document for one scenario,
// {"format": "hmc-report-set/1", "reports": [...]} for several.
std::unique_ptr<Reporter> makeJsonReporter(std::string path);

// Chrome trace event JSON (opens in Perfetto / chrome://tracing): one process track per
// rank, steps and collectives as slices, flow arrows joining one collective across ranks,
// error and hang markers.
nlohmann::json buildChromeTrace(const Scenario& scenario, const std::vector<RankResult>& ranks);
std::unique_ptr<Reporter> makeTraceReporter(std::string path);

// Writes `text` to `path` through a temporary file and rename, so that a reader never sees
// half a file. Throws hmc::RuntimeError naming the path and the OS reason.
void writeFileAtomically(const std::string& path, const std::string& text);

}  // namespace hmc::scenario
