#pragma once
// One rank as a process: builds the rank's transport (collective::makeTransport) from its
// RankLaunch, runs the scenario's steps (once per repetition, fresh managers each time) with a
// watchdog that publishes its flight record out of band when a collective passes its
// deadline, agrees on each repetition's end-of-run shutdown out of band through the store (not
// waiting for ranks announced dead), and hands its results on.

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/scenario/rank_result.hpp"
#include "hmc/scenario/scenario.hpp"
#include "rank_launch.hpp"

namespace hmc::app {

// What a rank process produced: under an external launch (gatherOnRankZero) its results, one
// per repetition, and on rank 0 `merged`, every rank's results gathered through the store
// (merged[repetition][rank]). Under hmc-run's own launch `results` stays empty: each
// repetition's result goes to its own file as it ends (repetitionResultFile) and is dropped.
struct RankProcessOutcome {
  std::vector<scenario::RankResult> results;
  std::optional<std::vector<std::vector<scenario::RankResult>>> merged;
};

// The exit status of a rank process that ran the `crash` fault.
inline constexpr int kCrashExitStatus = 17;

// The result of a rank that left none: crashed for `reason`, its leaks not checked for
// `leakReason`, and, when its watchdog published a flight record in `flights`, where it was
// ("; last seen in step S") and its last collectives.
scenario::RankResult missingRankResult(int rank, std::string reason, std::string leakReason,
                                       const std::map<int, diagnostics::PublishedFlight>& flights);

// The document a rank writes to its result file and to the store: every repetition's result
// (to the store), or one repetition's (to that repetition's file).
std::string rankResultsDocument(const std::vector<scenario::RankResult>& results);
// Under hmc-run's own launch, the file a rank writes its result of `repetition` (0-based) to:
// "<stem>.<repetition>.json", `stem` being RankLaunch::resultFile.
std::string repetitionResultFile(const std::string& stem, std::size_t repetition);
// Reads that document back. Throws (nlohmann::json or ValueError) on a malformed one.
std::vector<scenario::RankResult> parseRankResults(const std::string& text);

// How the reporting rank of an external launch reports when stopped by a signal.
enum class InterruptMode {
  kReport,        // stopped by `signal`: report `merged` (files and console), then exit
  kEarly,         // Open MPI's warning (SIGCONT, 1 s before SIGTERM): report `merged` as stopped
                  // by `signal` to the files, and keep the console's text for kPublishEarly
  kPublishEarly,  // the SIGTERM after kEarly (SIGKILL follows within 20-50 ms): print the kept
                  // text (`merged` is empty)
};
// Rank 0 of an external launch (or the lowest live rank of its node) stopped by `signal`: every
// rank's results so far (per repetition), to report before the process exits.
using InterruptedReport = std::function<void(std::vector<std::vector<scenario::RankResult>> merged,
                                             int signal, InterruptMode mode)>;

// Runs one rank. The caller has blocked the termination signals (signals.hpp) before any
// thread started: a SIGTERM, SIGINT or SIGHUP makes the rank hand on what it did so far (its
// result file, or the store), rank 0 of an external launch then calls `onInterrupted`, and
// the process exits with 128 + the signal within a few seconds. `gatherOnRankZero`: rank 0 collects
// every rank's results through the store (external launchers); otherwise each rank writes its
// result of every repetition to that repetition's file as it ends (repetitionResultFile; a
// signal writes the current repetition's as far as it got) and keeps none (hmc-run's own
// launch reads and removes them). The `crash` fault ends the process at once with
// kCrashExitStatus.
RankProcessOutcome runRankProcess(const scenario::Scenario& scenario, const RankLaunch& launch,
                                  bool gatherOnRankZero,
                                  const InterruptedReport& onInterrupted = nullptr);

}  // namespace hmc::app
