#pragma once
// Merging the ranks' results into an `hmc-report/1` document (scenario-format.md), with
// hmc's own sections: mismatches, leaks, timings, hang, environment.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hmc/error.hpp"
#include "hmc/scenario/runner.hpp"
#include "hmc/scenario/scenario.hpp"

namespace hmc::scenario {

inline constexpr const char* kReportFormat = "hmc-report/1";

enum class Outcome { kPass, kFail, kHang, kInvalid };
std::string_view toString(Outcome outcome) noexcept;
// Exit code of hmc-run for an outcome: 0 pass, 1 fail, 3 hang, 2 invalid.
int exitCodeOf(Outcome outcome) noexcept;

struct RunInfo {
  std::string transport;
  std::string device;  // the scenario's device as resolved ("cpu", "cuda")
  double wallSeconds = 0;
  std::string startedAt;  // ISO 8601, UTC
  std::string host;
  std::string torchVersion;
  std::vector<std::string> command;
};

// The reference runner's rule: a crashed rank fails a scenario without a top-level fault
// step; else pass when every step met its expectation; else hang when some step hung
// unexpectedly; else fail.
Outcome computeOutcome(const Scenario& scenario, const std::vector<RankResult>& ranks);

// "rank 0 waits in 'close validation' #3 (step 4); rank 1 never arrived: last completed
// 'recycle' #2 (step 1), finished its steps". Empty when no rank hung.
std::string diagnoseHang(const std::vector<RankResult>& ranks);

// {count, p50, p95, max} of samples in seconds (count 0 and nulls when empty).
nlohmann::json timingStats(std::vector<double> samples);

nlohmann::json buildReport(const Scenario& scenario, const std::vector<RankResult>& ranks,
                           const RunInfo& info);
// The report of a scenario that did not parse: outcome "invalid", no rank ran.
nlohmann::json invalidReport(const std::string& file, const std::string& name,
                             const ScenarioError& error);

}  // namespace hmc::scenario
