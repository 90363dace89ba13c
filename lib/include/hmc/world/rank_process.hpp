#pragma once
// One rank as a process: builds the rank's transport (collective::makeTransport) from its
// RankLaunch, runs the scenario's steps (once per repetition, fresh managers each time) with a
// watchdog that publishes its flight record out of band when a collective passes its
// deadline, agrees on each repetition's end-of-run shutdown out of band through the store (not
// waiting for ranks announced dead), and hands its results on:
// - under hmc-run's own launch, each repetition's result to its own file as it ends
//   (result_files.hpp: repetitionResultFile), read and removed by the launcher;
// - under an external launcher (RankPlacement::underLauncher), every repetition's to the store
//   at the end (run_keys.hpp), where rank 0 gathers them all (result_gatherer.hpp); when the
//   store's host is gone, through the local evidence folder to the lowest live rank of its
//   node, which then reports instead.
// A termination signal hands on what the rank did so far (teardown.hpp).

#include <optional>
#include <vector>

#include "hmc/scenario/rank_result.hpp"
#include "hmc/scenario/report.hpp"
#include "hmc/scenario/scenario.hpp"
#include "hmc/world/rank_launch.hpp"
#include "hmc/world/teardown.hpp"

namespace hmc::world {

// The exit status of a rank process that ran the `crash` fault.
inline constexpr int kCrashExitStatus = 17;

// What a rank process produced: on the reporting rank of an external launch, every rank's
// results (merged[repetition][rank]); nothing elsewhere (its results were handed on).
struct RankProcessOutcome {
  std::optional<std::vector<std::vector<scenario::RankResult>>> merged;
  // A rank that does not report and whose results no report will show (it lost the store and
  // has no evidence folder shared with a reporting rank): the outcome of what it saw itself,
  // for its exit status, so that a launcher does not read the job as passed.
  std::optional<scenario::Outcome> unreported;
};

// Runs one rank. The caller has blocked the termination signals (signals.hpp) before any
// thread started: a SIGTERM, SIGINT or SIGHUP makes the rank hand on what it did so far
// (teardown.hpp), the reporting rank of an external launch then calls `onInterrupted`, and the
// process exits with 128 + the signal within a few seconds. The `crash` fault ends the process
// at once with kCrashExitStatus.
RankProcessOutcome runRankProcess(const scenario::Scenario& scenario, const RankLaunch& launch,
                                  const InterruptedReport& onInterrupted = nullptr);

}  // namespace hmc::world
