#pragma once
// "Who never arrived where": the hang diagnosis of the report (scenario/report.hpp's
// diagnoseHang, on finished ranks' results) and of `hmc-run status` (on live heartbeats),
// in one place so that both say it in the same words:
//   "rank 0 waits in 'close validation' #3 (step 4); rank 1 never arrived: last completed
//    'recycle' #2 (step 1), finished its steps"
// Pure functions; no store, no clock.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hmc/diagnostics/flight_recorder.hpp"

namespace hmc::diagnostics {

// Statuses of a flight entry that mean the rank waited: in_flight, timeout, rank_failure.
bool isWaitStatus(std::string_view status) noexcept;

// What the diagnosis knows of one rank.
struct RankWhereabouts {
  int rank = 0;
  std::vector<FlightEntry> flight;  // its last collectives, oldest first (the last two suffice)
  bool hung = false;                // it waits, or waited until its deadline, in a collective
  std::optional<std::string> gone;  // it crashed or died: how ("exited", "no heartbeat ...")
  // Its fate is not known here (its result had no way to the reporter): why.
  std::optional<std::string> unknown;
  // For a rank neither gone nor waiting: what it did instead ("finished its steps",
  // "stopped early", "runs step 3").
  std::string elsewhere;
  std::string host;  // where it runs, "" when unknown
};

// One line naming every rank: where the hung ones wait (with ", a peer failed" after a
// rank_failure), which crashed, and where the others are. Empty when no rank hung. When the
// ranks ran on more than one host, each is named with its host ("rank 4 (host h3) never
// arrived: ..."), and the line ends with the hosts of the ranks that did not wait: "; not
// waiting: host h3 (ranks 4-5)".
std::string diagnoseWaits(const std::vector<RankWhereabouts>& ranks);

}  // namespace hmc::diagnostics
