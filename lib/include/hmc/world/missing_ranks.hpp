#pragma once
// One rule for the ranks that left no result, shared by every world of rank processes
// (hmc-run's own launcher, and the reporting rank under torchrun, srun or mpirun): what the
// report says of a rank that died, was stopped or lost the store before it handed on its
// results, from what is known of it (its exit, its last heartbeat, the flight record its
// watchdog published). Pure functions: no store, no files.

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hmc/diagnostics/heartbeat.hpp"
#include "hmc/diagnostics/watchdog.hpp"
#include "hmc/scenario/rank_result.hpp"

namespace hmc::world {

// What is known of a rank that left no result.
struct MissingRankEvidence {
  std::string reason;      // why it has none: "killed by signal 9 (Killed)", "no result ..."
  std::string leakReason;  // its leak check's reason: "... : not checked"
  bool ended = false;      // its process is known to have ended
  bool silent = false;     // announced gone by another rank (it fell silent): never hung
  std::string host;        // where it ran, when the caller knows ("": from its heartbeat)
  std::int64_t pid = 0;
  std::optional<diagnostics::Heartbeat> heartbeat;     // its last heartbeat
  std::optional<diagnostics::PublishedFlight> flight;  // published by its watchdog
  // The report is made at a launcher's teardown (its signal, or Open MPI's warning): a rank
  // whose heartbeat shows it running a step, neither ended nor silent, was alive when the
  // teardown began and is stopped by it (its own hand-off may come too late: Open MPI's daemon
  // on another host signals its ranks about a second after rank 0's).
  bool atTeardown = false;
};
using EvidenceOf = std::function<MissingRankEvidence(int rank)>;

// A rank's results for the report: byRank[rank] holds the repetitions rank `rank` left, from
// the first on. Returns [repetition][rank]: max(minRepetitions, the most any rank left)
// repetitions. A rank missing from repetition k on is, in each repetition from k on
// (evidenceOf is called once per such rank):
// - hung, when its process is not known to have ended nor announced gone (silent) and its
//   heartbeat shows it waiting in a collective that no rank with results completed (the hang
//   diagnosis says where);
// - at a teardown (atTeardown), when its heartbeat shows it running a step and it is neither
//   ended nor silent: crashed, "stopped by the launcher's teardown while running step S
//   (...)", a rank that was alive;
// - else crashed for `reason`, saying where it was: its last heartbeat ("; last heartbeat
//   (waiting): in step 3", its last completed and current collective as its flight), else the
//   flight record its watchdog published ("; last seen in step 3", its entries).
// Its host and pid come from the evidence, else its heartbeat, else its earlier result.
std::vector<std::vector<scenario::RankResult>> fillMissing(
    std::vector<std::vector<scenario::RankResult>> byRank, std::size_t minRepetitions,
    const EvidenceOf& evidenceOf);

// A rank crashed for `reason`, its leaks not checked for `leakReason`; with a flight record in
// `flights`, where it was ("; last seen in step S") and its last collectives.
scenario::RankResult missingRankResult(int rank, std::string reason, std::string leakReason,
                                       const std::map<int, diagnostics::PublishedFlight>& flights);

}  // namespace hmc::world
