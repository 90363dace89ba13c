#include "hmc/diagnostics/hang_diagnosis.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace hmc::diagnostics {
namespace {

std::string stepText(int step) {
  return step < 0 ? std::string("after its steps") : fmt::format("step {}", step);
}

}  // namespace

bool isWaitStatus(std::string_view status) noexcept {
  return status == "timeout" || status == "rank_failure" || status == "in_flight";
}

std::string diagnoseWaits(const std::vector<RankWhereabouts>& ranks) {
  bool anyWait = false;
  for (const auto& rank : ranks) {
    if (!rank.hung) continue;
    for (const auto& entry : rank.flight) anyWait = anyWait || isWaitStatus(entry.status);
  }
  if (!anyWait) return "";
  std::vector<std::string> parts;
  for (const auto& rank : ranks) {
    std::optional<FlightEntry> waiting;
    std::optional<FlightEntry> lastDone;
    for (auto it = rank.flight.rbegin(); it != rank.flight.rend(); ++it) {
      if (!waiting && !lastDone && isWaitStatus(it->status)) waiting = *it;
      if (!lastDone && !isWaitStatus(it->status)) lastDone = *it;
      if (lastDone) break;
    }
    const std::string last = lastDone ? fmt::format("last completed '{}' #{} ({})", lastDone->stage,
                                                    lastDone->sequence, stepText(lastDone->step))
                                      : std::string("no collective completed");
    if (rank.gone) {
      parts.push_back(fmt::format("rank {} crashed ({}); {}", rank.rank, *rank.gone, last));
    } else if (rank.hung && waiting) {
      parts.push_back(fmt::format("rank {} waits in '{}' #{} ({}){}", rank.rank, waiting->stage,
                                  waiting->sequence, stepText(waiting->step),
                                  waiting->status == "rank_failure" ? ", a peer failed" : ""));
    } else {
      parts.push_back(
          fmt::format("rank {} never arrived: {}, {}", rank.rank, last, rank.elsewhere));
    }
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace hmc::diagnostics
