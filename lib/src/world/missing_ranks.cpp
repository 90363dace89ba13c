#include "hmc/world/missing_ranks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

namespace hmc::world {
namespace {

// The last collective every rank with results completed: a heartbeat that shows a rank
// waiting in an earlier one is stale (it died after writing it).
std::optional<std::uint64_t> completedByOthers(
    const std::vector<std::vector<scenario::RankResult>>& byRank) {
  std::optional<std::uint64_t> completed;
  for (const auto& results : byRank) {
    if (results.empty()) continue;
    for (const auto& entry : results.back().flight) {
      if (entry.status != "ok") continue;
      completed = std::max(completed.value_or(0), entry.sequence);
    }
  }
  return completed;
}

scenario::RankResult fromEvidence(int rank, MissingRankEvidence evidence,
                                  std::optional<std::uint64_t> completed) {
  scenario::RankResult result;
  result.rank = rank;
  result.host = std::move(evidence.host);
  result.pid = evidence.pid;
  if (result.host.empty() && evidence.heartbeat) {
    result.host = evidence.heartbeat->host;
    result.pid = evidence.heartbeat->pid;
  }
  result.leaks.reason = std::move(evidence.leakReason);
  if (const auto& beat = evidence.heartbeat) {
    if (beat->lastCompleted) result.flight.push_back(*beat->lastCompleted);
    if (beat->current &&
        (!beat->lastCompleted || beat->current->sequence != beat->lastCompleted->sequence)) {
      result.flight.push_back(*beat->current);
    }
    const bool stale = completed && beat->current && beat->current->sequence <= *completed;
    if (!evidence.ended && !evidence.silent && beat->state == diagnostics::RankState::kWaiting &&
        beat->current && !stale) {
      result.hung = true;
      return result;
    }
    if (evidence.atTeardown && !evidence.ended && !evidence.silent &&
        (beat->state == diagnostics::RankState::kRunning ||
         beat->state == diagnostics::RankState::kDone ||
         beat->state == diagnostics::RankState::kStarting)) {
      // Alive when the teardown began (starting, at work, or handing on its result after its
      // steps), not crashed: the launcher stopped it before its result came. (A run shorter
      // than the heartbeat's second may leave a rank's "starting" as its last word.)
      result.stopped = true;
      result.crashReason = fmt::format(
          "stopped by the launcher's teardown {} (alive then: its last heartbeat says {}; its "
          "result did not come before the report)",
          beat->state == diagnostics::RankState::kStarting ? std::string("as it started")
          : beat->step < 0                                  ? std::string("after its steps")
                           : fmt::format("while running step {}", beat->step),
          diagnostics::toString(beat->state));
      return result;
    }
    result.crashed = true;
    result.crashReason = fmt::format(
        "{}; last heartbeat ({}): {}", evidence.reason, diagnostics::toString(beat->state),
        beat->step < 0 ? std::string("outside its steps") : fmt::format("in step {}", beat->step));
    return result;
  }
  std::map<int, diagnostics::PublishedFlight> flights;
  if (evidence.flight) flights.emplace(rank, std::move(*evidence.flight));
  auto missing =
      missingRankResult(rank, std::move(evidence.reason), std::move(result.leaks.reason), flights);
  missing.host = std::move(result.host);
  missing.pid = result.pid;
  return missing;
}

}  // namespace

scenario::RankResult missingRankResult(int rank, std::string reason, std::string leakReason,
                                       const std::map<int, diagnostics::PublishedFlight>& flights) {
  scenario::RankResult result;
  result.rank = rank;
  result.crashed = true;
  result.leaks.reason = std::move(leakReason);
  if (auto it = flights.find(rank); it != flights.end()) {
    result.flight = it->second.entries;
    reason += it->second.step < 0 ? std::string("; last seen after its steps")
                                  : fmt::format("; last seen in step {}", it->second.step);
  }
  result.crashReason = std::move(reason);
  return result;
}

std::vector<std::vector<scenario::RankResult>> fillMissing(
    std::vector<std::vector<scenario::RankResult>> byRank, std::size_t minRepetitions,
    const EvidenceOf& evidenceOf) {
  const int world = static_cast<int>(byRank.size());
  std::size_t repetitions = minRepetitions;
  for (const auto& results : byRank) repetitions = std::max(repetitions, results.size());
  const auto completed = completedByOthers(byRank);
  std::vector<std::vector<scenario::RankResult>> merged(repetitions,
                                                        std::vector<scenario::RankResult>(world));
  for (int rank = 0; rank < world; ++rank) {
    auto& results = byRank[rank];
    std::optional<scenario::RankResult> missing;
    for (std::size_t r = 0; r < repetitions; ++r) {
      if (r < results.size()) {
        merged[r][rank] = std::move(results[r]);
        continue;
      }
      if (!missing) {
        missing = fromEvidence(rank, evidenceOf(rank), completed);
        if (missing->host.empty() && r > 0) {
          missing->host = merged[r - 1][rank].host;
          missing->pid = merged[r - 1][rank].pid;
        }
      }
      merged[r][rank] = *missing;
    }
  }
  return merged;
}

}  // namespace hmc::world
